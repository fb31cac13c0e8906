//! Helpers for tests that launch real `mpirun` jobs of the built binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ddpbench");

/// Result of a launched job.
pub struct Job {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub timed_out: bool,
}

impl Job {
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
    pub fn ok(&self) -> bool {
        self.status == Some(0)
    }
    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "job failed ({:?}) after {:?}:\n{}",
            self.status,
            self.elapsed,
            self.all()
        );
    }
}

/// Runs `cmd`, killing it (and its process group) after `limit`.
pub fn run_with_limit(mut cmd: Command, limit: Duration) -> Job {
    use std::os::unix::process::CommandExt;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id() as i32;
    let mut timed_out = false;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            timed_out = true;
            // The ranks first: each is in a process group of its own.
            for (p, _) in descendants(pid as u32) {
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out: Output = child.wait_with_output().unwrap();
    Job {
        status: if timed_out { None } else { out.status.code() },
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
        timed_out,
    }
}

/// `mpirun -n ranks <program...>` with the settings a 2-core CI machine needs.
pub fn mpirun_cmd(ranks: usize) -> Command {
    let mut cmd = mpirun_settings();
    cmd.args(["-n", &ranks.to_string()]);
    cmd
}

/// The quick tier (`job-scripts/run-tests.sh --quick`, and the first part of the full
/// suite) runs test files marked `// tier: quick` in parallel, with DDPBENCH_TEST_TIER
/// set to `quick`: such a file must launch no MPI job, and a test that does fails here,
/// naming what it launched, instead of contending for the cores with its neighbours.
pub fn refuse_mpi_in_quick_tier(what: &str) {
    if std::env::var("DDPBENCH_TEST_TIER").as_deref() == Ok("quick") {
        panic!(
            "this test launches {what}, but its file is marked `// tier: quick` (no MPI, run in parallel): remove the \
             marker, or test the arithmetic on runs written in-process"
        );
    }
}

/// `mpirun` with the settings a 2-core CI machine needs, before any `-n`.
fn mpirun_settings() -> Command {
    refuse_mpi_in_quick_tier("mpirun");
    let mut cmd = Command::new("mpirun");
    cmd.args(["--bind-to", "none", "--oversubscribe"])
        .args(["--mca", "btl", "self,vader,tcp"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    cmd
}

/// An MPMD launch, one rank per entry of `apps` (`mpirun -n 1 ddpbench A : -n 1 ddpbench
/// B`), each rank under a shell that prints `rank-exit <rank> <code>`.
pub fn mpmd_reporting_exits(apps: &[Vec<&str>], limit: Duration) -> Job {
    let mut cmd = mpirun_settings();
    for (i, args) in apps.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        cmd.args([
            "-n",
            "1",
            "sh",
            "-c",
            &format!("'{BIN}' {}; echo \"rank-exit $OMPI_COMM_WORLD_RANK $?\"", quoted.join(" ")),
        ]);
    }
    run_with_limit(cmd, limit)
}

/// [`mpirun_cmd`] with `env` set here and exported to every rank (`-x`, before the program).
pub fn mpirun_cmd_with_env(ranks: usize, env: &[(&str, &str)]) -> Command {
    let mut cmd = mpirun_cmd(ranks);
    for (k, v) in env {
        cmd.env(k, v).args(["-x", k]);
    }
    cmd
}

/// `mpirun -n ranks ddpbench train <args>`.
pub fn train(ranks: usize, args: &[&str], limit: Duration) -> Job {
    let mut cmd = mpirun_cmd(ranks);
    cmd.arg(BIN).arg("train").args(args);
    run_with_limit(cmd, limit)
}

/// Runs each rank under a shell that prints `rank-exit <rank> <code>`, so a test
/// can see every rank's own exit status.
pub fn train_reporting_exits(ranks: usize, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
    train_reporting_exits_in(&std::env::temp_dir(), ranks, args, env, limit)
}

/// As [`train_reporting_exits`], with the job's working folder `cwd`.
pub fn train_reporting_exits_in(cwd: &Path, ranks: usize, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let mut fixed = mpirun_cmd_with_env(ranks, env);
    fixed.args([
        "sh",
        "-c",
        &format!("'{BIN}' train {}; echo \"rank-exit $OMPI_COMM_WORLD_RANK $?\"", quoted.join(" ")),
    ]);
    fixed.current_dir(cwd);
    run_with_limit(fixed, limit)
}

/// The phase columns of a rank file, in the order a step runs through them: they add up
/// to `step_s`. The writer's own list (`record::Phase`), which the Python recorder's
/// column list is tested against.
pub fn phase_columns() -> Vec<&'static str> {
    ddpbench::record::Phase::ALL.iter().map(|p| p.column()).collect()
}

/// A process as `/proc/PID/stat` shows it: its parent, its state letter and its start
/// in clock ticks after boot; None when it is gone.
fn proc_stat(pid: u32) -> Option<(u32, char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces and parentheses: fields follow the last ')'.
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let state = rest.first()?.chars().next()?;
    Some((rest.get(1)?.parse().ok()?, state, rest.get(19)?.parse().ok()?))
}

/// Every process descended from `root` now (its children, theirs, …), each with its
/// start tick. A launcher's ranks are among them: Open MPI puts each rank in a process
/// group of its own, so the launcher's group does not hold them.
pub fn descendants(root: u32) -> Vec<(u32, u64)> {
    let all: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| proc_stat(pid).map(|(ppid, _, start)| (pid, ppid, start)))
        .collect();
    let mut found: Vec<(u32, u64)> = Vec::new();
    let mut parents = vec![root];
    while let Some(p) = parents.pop() {
        for &(pid, ppid, start) in &all {
            if ppid == p && !found.iter().any(|(f, _)| *f == pid) {
                found.push((pid, start));
                parents.push(pid);
            }
        }
    }
    found
}

/// Waits until every process of `procs` (from [`descendants`]) has ended, at most
/// `limit`; panics past it. A zombie has ended; a pid that now names a process started
/// at another tick is another process.
pub fn wait_for_gone(procs: &[(u32, u64)], limit: Duration) {
    let start = Instant::now();
    let alive = |&(pid, tick): &(u32, u64)| proc_stat(pid).is_some_and(|(_, state, t)| t == tick && !matches!(state, 'Z' | 'X'));
    while let Some(p) = procs.iter().find(|p| alive(p)) {
        assert!(start.elapsed() < limit, "process {} still alive after {limit:?}", p.0);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ddpbench <args>` without MPI.
pub fn ddpbench(args: &[&str]) -> Job {
    if let Some(sub) = args.first().filter(|a| ["train", "study", "allreduce"].contains(*a)) {
        refuse_mpi_in_quick_tier(&format!("`ddpbench {sub}`"));
    }
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_with_limit(cmd, Duration::from_secs(120))
}

pub fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let headers = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r.records().map(|rec| rec.unwrap().iter().map(String::from).collect()).collect();
    (headers, rows)
}

/// Column `name` of `rows` parsed as f64.
pub fn col(headers: &[String], rows: &[Vec<String>], name: &str) -> Vec<f64> {
    let i = headers
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no column {name} in {headers:?}"));
    rows.iter()
        .map(|r| r[i].parse::<f64>().unwrap_or_else(|_| panic!("{name}={:?} is not a number", r[i])))
        .collect()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub fn join(p: &Path, s: &str) -> PathBuf {
    p.join(s)
}

/// The Python of the project's PyTorch venv (`job-scripts/setup.sh` exports it), which
/// tests use to write TorchScript files.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("DDPBENCH_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").expect("HOME");
    let p = Path::new(&home).join(".cache/ddpbench/venv/bin/python");
    assert!(p.exists(), "no PyTorch venv: source job-scripts/setup.sh first");
    p
}

/// The seed of an equality-of-training test: `default`, or `DDPBENCH_EQUALITY_SEED` when
/// set (`benchmarks/kernel_settings.sh` runs every such test at seeds 1 to 3 under each
/// CPU kernel setting and collects what [`equality_seen`] prints).
pub fn equality_seed(default: u64) -> u64 {
    match std::env::var("DDPBENCH_EQUALITY_SEED") {
        Ok(s) => s.parse().unwrap_or_else(|_| panic!("DDPBENCH_EQUALITY_SEED={s:?} is not a seed")),
        Err(_) => default,
    }
}

/// Another seed for the far side of an equality test: never one of seeds 1 to 3.
pub fn other_seed(seed: u64) -> u64 {
    seed + 100
}

/// Prints one line per compared pair, `equality TEST seed=S same=D other=O bound=B`,
/// before the test asserts anything, so the kernel-setting script records the
/// difference also when the bound fails. Then asserts both sides of the bound: the
/// pair that should agree lies under `bound`, and another seed at least 100 times
/// beyond it (so the comparison can fail).
pub fn assert_equal_training(test: &str, seed: u64, same: f64, other: f64, bound: f64) {
    let env = ["ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"]
        .map(|v| format!("{v}={}", std::env::var(v).unwrap_or_default()))
        .join(" ");
    eprintln!("equality {test} seed={seed} same={same:e} other={other:e} bound={bound:e} {env}");
    assert!(
        same < bound,
        "{test}: the pair that should agree differs by {same:e}, over the bound {bound:e}"
    );
    assert!(
        other > 100.0 * bound,
        "{test}: another seed ends only {other:e} away, not 100 × the bound {bound:e} beyond"
    );
}
