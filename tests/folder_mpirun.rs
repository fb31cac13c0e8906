//! One writer per folder, under real `mpirun -n 2` jobs: two jobs on one `--out` (or one
//! study folder) leave one writing and the other refused; a lock left by a killed job is
//! cleared by the stated rule; default run names never collide; a planted symlink or a
//! stray file in an output folder is refused, never written through; the study's dry run
//! times its workloads in a scratch folder nobody can predict, gone after SIGTERM.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(240);

const STEPS: usize = 12;

/// The folder lock's name.
const LOCK_FILE: &str = ".ddpbench.lock";

fn train_args(out: Option<&Path>) -> Vec<String> {
    let mut a: Vec<String> = [
        "--model",
        "mnist-cnn",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "4096",
        "--batch-size",
        "16",
        "--val-samples",
        "0",
        "--probe-iters",
        "0",
        "--warmup-steps",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(["--max-steps".into(), STEPS.to_string()]);
    if let Some(o) = out {
        a.extend(["--out".into(), path_str(o)]);
    }
    a
}

fn train_job(out: &Path, extra: &[&str]) -> Job {
    let mut args = train_args(Some(out));
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    train(2, &args, LIMIT)
}

/// Starts `cmd` now; its output goes to files under `log` (read by [`finish`]).
fn start(mut cmd: Command, log: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    cmd.stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .process_group(0);
    cmd.spawn().unwrap()
}

/// Waits for a job started with [`start`] (killing it past [`LIMIT`]).
fn finish(mut child: std::process::Child, log: &Path) -> Job {
    let began = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if began.elapsed() > LIMIT {
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Job {
        status,
        stdout: std::fs::read_to_string(log.with_extension("out")).unwrap_or_default(),
        stderr: std::fs::read_to_string(log.with_extension("err")).unwrap_or_default(),
        elapsed: began.elapsed(),
        timed_out: status.is_none(),
    }
}

/// Two jobs started at the same moment; returns (the one that succeeded, the other).
fn race(a: Command, b: Command, logs: &Path) -> (Job, Job) {
    let (la, lb) = (logs.join("a"), logs.join("b"));
    let (ca, cb) = (start(a, &la), start(b, &lb));
    let (ja, jb) = (finish(ca, &la), finish(cb, &lb));
    assert!(
        ja.ok() != jb.ok(),
        "exactly one job must succeed:\n--- a ({:?}):\n{}\n--- b ({:?}):\n{}",
        ja.status,
        ja.all(),
        jb.status,
        jb.all()
    );
    if ja.ok() {
        (ja, jb)
    } else {
        (jb, ja)
    }
}

fn train_cmd(args: &[String]) -> Command {
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("train").args(args);
    cmd
}

/// The refused job said why once, and never trained.
fn assert_refused_once(job: &Job, why: &str) {
    assert!(!job.ok(), "{}", job.all());
    assert_eq!(job.stderr.matches(why).count(), 1, "one message, naming why:\n{}", job.all());
    assert!(!job.all().contains("MPI_ABORT") && !job.all().contains("panicked"), "{}", job.all());
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A finished run folder of `ranks` ranks and `steps` steps, written by one run alone:
/// one run id in every row, each rank's rows once, clock.csv's rows each once, no lock
/// and no hidden file left, and nothing in it that a run does not write.
fn assert_one_whole_run(dir: &Path, ranks: usize, steps: usize) -> String {
    let m = json(&dir.join("manifest.json"));
    assert_eq!(m["status"], "completed", "{m}");
    let run_id = m["run_id"].as_str().unwrap().to_string();
    assert_eq!(run_id, dir.file_name().unwrap().to_string_lossy());
    for r in 0..ranks {
        let (h, rows) = read_csv(&dir.join(format!("rank-{r:05}.csv")));
        assert_eq!(rows.len(), steps, "rank {r}");
        let id = h.iter().position(|c| c == "run_id").unwrap();
        let step = h.iter().position(|c| c == "global_step").unwrap();
        assert!(
            rows.iter().all(|row| row.len() == h.len() && row[id] == run_id),
            "rank {r}: another run's rows"
        );
        let order: Vec<usize> = rows.iter().map(|row| row[step].parse().unwrap()).collect();
        assert_eq!(order, (0..steps).collect::<Vec<_>>(), "rank {r}");
        assert_eq!(json(&dir.join(format!("rank-{r:05}.end.json")))["status"], "completed");
    }
    let (h, rows) = read_csv(&dir.join("clock.csv"));
    let (sync, rank) = (
        h.iter().position(|c| c == "sync").unwrap(),
        h.iter().position(|c| c == "rank").unwrap(),
    );
    let mut pairs: Vec<(String, String)> = rows.iter().map(|r| (r[sync].clone(), r[rank].clone())).collect();
    let n = pairs.len();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), n, "clock.csv holds a row twice: {rows:?}");
    assert!(pairs.iter().filter(|(s, _)| s == "0").count() == ranks, "{rows:?}");
    let mut expected = vec!["clock.csv", "epochs.csv", "manifest.json", "model.safetensors", "trace"];
    let per_rank: Vec<String> = (0..ranks)
        .flat_map(|r| [format!("rank-{r:05}.csv"), format!("rank-{r:05}.end.json")])
        .collect();
    expected.extend(per_rank.iter().map(String::as_str));
    for name in names(dir) {
        assert!(
            expected.contains(&name.as_str()),
            "{name}: a file no run writes, or one left behind"
        );
    }
    run_id
}

#[test]
fn two_jobs_on_one_out_leave_one_run_whole_and_refuse_the_other() {
    let d = tmp();
    let out = d.path().join("run");
    let mut args = train_args(Some(&out));
    args.extend(["--trace".into(), "--save-model".into()]);
    let (won, lost) = race(train_cmd(&args), train_cmd(&args), d.path());
    // The loser met the winner's lock, or (started late) its finished run.
    let why = if lost.stderr.contains("is being written by another ddpbench job") {
        "is being written by another ddpbench job"
    } else {
        "already holds a run (manifest.json)"
    };
    assert_refused_once(&lost, why);
    assert!(won.all().contains("done:"), "{}", won.all());
    assert_one_whole_run(&out, 2, STEPS);
    assert!(out.join("model.safetensors").is_file() && out.join("trace/rank-00001.trace.json").is_file());
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    assert_eq!(unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) }, 0);
    String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap()]).into_owned()
}

/// The inode of this process's PID namespace, as a lock records it.
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}

/// A lock as a job of `host` and `pid` would have left it, with the fields the README
/// names.
fn plant_lock(dir: &Path, host: &str, pid: u32, job: Option<&str>) -> Vec<u8> {
    std::fs::create_dir_all(dir).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let h = serde_json::json!({
        "host": host, "pid": pid, "boot_id": boot.trim(), "process_start_ticks": 12345,
        "pid_namespace": pid_namespace(),
        "job": job, "start_utc": "2026-01-01T00:00:00.000000Z",
        "command": ["ddpbench", "train", "--out", path_str(dir)],
    });
    let bytes = serde_json::to_vec_pretty(&h).unwrap();
    std::fs::write(dir.join(LOCK_FILE), &bytes).unwrap();
    bytes
}

#[test]
fn a_killed_jobs_lock_is_cleared_on_its_host_and_needs_break_lock_from_another() {
    let d = tmp();
    // Same host, the process gone: cleared, and said so.
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let here = d.path().join("here");
    plant_lock(&here, &hostname(), dead, None);
    let job = train_job(&here, &[]);
    job.assert_ok();
    assert!(
        job.stderr.contains("cleared a stale lock") && job.stderr.contains(&format!("process {dead} no longer exists")),
        "{}",
        job.all()
    );
    assert_one_whole_run(&here, 2, STEPS);

    // Another host: refused, naming the flag and leaving the lock as it was.
    let there = d.path().join("there");
    let planted = plant_lock(&there, "node-that-is-not-here", std::process::id(), Some("Slurm job 4242"));
    let job = train_job(&there, &[]);
    assert_refused_once(&job, "is locked by another ddpbench job");
    for part in ["node-that-is-not-here", "Slurm job 4242", "--break-lock"] {
        assert!(job.stderr.contains(part), "{part}: {}", job.all());
    }
    assert_eq!(std::fs::read(there.join(LOCK_FILE)).unwrap(), planted);
    assert_eq!(names(&there), [LOCK_FILE]);
    let job = train_job(&there, &["--break-lock"]);
    job.assert_ok();
    assert_one_whole_run(&there, 2, STEPS);
}

/// Whether this test may make PID namespaces (`unshare -p` needs root).
fn can_unshare() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_live_lock_taken_in_another_pid_namespace_is_refused_not_cleared() {
    if !can_unshare() {
        eprintln!("skipped: needs root and unshare(1) to make a PID namespace");
        return;
    }
    let d = tmp();
    let out = d.path().join("run");
    // A job in a container of its own (same host name and boot, its own PID namespace),
    // training long enough to be met while it runs.
    let mut args = train_args(Some(&out));
    let at = args.iter().position(|a| a == "--max-steps").unwrap();
    args[at + 1] = "100000".into();
    args.extend(["--epochs".into(), "1000".into()]);
    let mut inside = Command::new("unshare");
    inside.args(["--pid", "--fork", "--mount-proc"]);
    let mpirun = mpirun_cmd(1);
    inside.arg(mpirun.get_program()).args(mpirun.get_args());
    for (k, v) in mpirun.get_envs() {
        if let Some(v) = v {
            inside.env(k, v);
        }
    }
    inside.arg(BIN).arg("train").args(&args);
    let log = d.path().join("inside");
    let child = start(inside, &log);
    let began = Instant::now();
    while !out.join("rank-00000.csv").exists() {
        assert!(began.elapsed() < LIMIT, "the job in its namespace never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let planted = std::fs::read(out.join(LOCK_FILE)).unwrap();
    let held: serde_json::Value = serde_json::from_slice(&planted).unwrap();
    assert_ne!(held["pid_namespace"].as_u64(), Some(pid_namespace()), "{held}");
    // From this namespace its pid means another process: refused, never cleared.
    let job = train_job(&out, &[]);
    let mut child = child;
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
    let stopping = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if stopping.elapsed() > Duration::from_secs(30) {
            // SAFETY: as above.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_refused_once(&job, "is locked by another ddpbench job");
    assert!(
        job.stderr.contains("another PID namespace") && job.stderr.contains("--break-lock"),
        "{}",
        job.all()
    );
    assert!(!job.stderr.contains("cleared a stale lock"), "{}", job.all());
    assert!(std::fs::read_to_string(log.with_extension("err")).is_ok());
}

#[test]
fn default_run_names_of_two_jobs_started_at_once_differ_and_carry_the_job_id() {
    let d = tmp();
    // The job id only in the ranks' environment: mpirun itself would take it for a
    // Slurm allocation.
    let cmd = || {
        let quoted: Vec<String> = train_args(None).iter().map(|a| format!("'{a}'")).collect();
        let mut c = mpirun_cmd(2);
        c.args(["sh", "-c", &format!("SLURM_JOB_ID=4242 exec '{BIN}' train {}", quoted.join(" "))])
            .current_dir(d.path())
            .stdin(Stdio::null());
        c
    };
    let logs = tmp();
    let (la, lb) = (logs.path().join("a"), logs.path().join("b"));
    let (ca, cb) = (start(cmd(), &la), start(cmd(), &lb));
    let (ja, jb) = (finish(ca, &la), finish(cb, &lb));
    ja.assert_ok();
    jb.assert_ok();
    let runs = names(&d.path().join("results"));
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in &runs {
        assert!(r.starts_with("mnist-cnn-synthetic-n2-") && r.contains("-j4242-"), "{r}");
        assert_eq!(assert_one_whole_run(&d.path().join("results").join(r), 2, STEPS), *r);
    }
}

#[test]
fn a_planted_symlink_or_a_stray_file_in_out_is_refused_and_nothing_is_written_through() {
    let d = tmp();
    let outside = d.path().join("outside.txt");
    std::fs::write(&outside, "keep").unwrap();
    let out = d.path().join("linked");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("rank-00000.csv")).unwrap();
    let job = train_job(&out, &[]);
    assert_refused_once(&job, "already holds rank-00000.csv");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
    assert_eq!(names(&out), ["rank-00000.csv"], "the lock went with the refusal");

    let stray = d.path().join("stray");
    std::fs::create_dir(&stray).unwrap();
    std::fs::write(stray.join("clock.csv"), "mine").unwrap();
    std::fs::write(stray.join("slurm-1.out"), "the job's log").unwrap();
    let job = train_job(&stray, &[]);
    assert_refused_once(&job, "already holds clock.csv");
    assert_eq!(std::fs::read_to_string(stray.join("clock.csv")).unwrap(), "mine");

    // The sweep's folder: the same rule.
    let sweep = d.path().join("sweep");
    std::fs::create_dir(&sweep).unwrap();
    std::os::unix::fs::symlink(&outside, sweep.join("link_model.json")).unwrap();
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).args(["allreduce", "--max-bytes", "64", "--out", &path_str(&sweep)]);
    let job = run_with_limit(cmd, LIMIT);
    assert_refused_once(&job, "already holds link_model.json");
    assert_eq!(names(&sweep), ["link_model.json"]);
}

const STUDY: &str = r#"
name = "one"
models = ["mnist-cnn"]
datasets = ["synthetic"]
synthetic_samples = 2048
batch_sizes = [16]
ranks = [1, 2]
max_steps = 6
val_samples = 0
probe_iters = 0
"#;

fn study_cmd(file: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("study").arg(file).arg("--out").arg(out).args(extra);
    cmd
}

#[test]
fn two_studies_into_one_folder_leave_one_and_the_study_resumes_after_it() {
    let d = tmp();
    let file = d.path().join("one.toml");
    std::fs::write(&file, STUDY).unwrap();
    let out = d.path().join("study");
    let (won, lost) = race(study_cmd(&file, &out, &[]), study_cmd(&file, &out, &[]), d.path());
    assert_refused_once(&lost, "is being written by another ddpbench job");
    assert!(won.stdout.contains("2 run(s) completed"), "{}", won.all());
    let (h, rows) = read_csv(&out.join("points.csv"));
    let status = h.iter().position(|c| c == "status").unwrap();
    assert_eq!(
        rows.iter().map(|r| r[status].as_str()).collect::<Vec<_>>(),
        ["completed", "completed"]
    );
    assert!(!out.join("discarded").exists(), "{:?}", names(&out));
    assert!(!out.join(LOCK_FILE).exists());
    for run in names(&out.join("runs")) {
        assert_one_whole_run(&out.join("runs").join(&run), if run.ends_with("r2-rep0") { 2 } else { 1 }, 6);
    }
    // Once the first job has ended, the same study resumes: nothing runs again.
    let again = run_with_limit(study_cmd(&file, &out, &[]), LIMIT);
    again.assert_ok();
    let (_, rows) = read_csv(&out.join("points.csv"));
    assert_eq!(rows.len(), 4);
    assert!(
        rows[2..].iter().all(|r| r[status].starts_with("skipped (completed earlier)")),
        "{rows:?}"
    );
}

/// The pid of the rank 0 whose environment has `TMPDIR=tmpdir`.
fn rank_zero_with_tmpdir(tmpdir: &Path) -> Option<i32> {
    let want = format!("TMPDIR={}", tmpdir.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |v: &str| vars.contains(&v.as_bytes());
        let exe = std::fs::read_link(e.path().join("exe")).ok()?;
        (has(&want) && has("OMPI_COMM_WORLD_RANK=0") && exe.file_name()? == "ddpbench").then_some(pid)
    })
}

/// Entries of `dir` named like the dry run's scratch folder that are real folders.
fn scratch_folders(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("ddpbench-estimate-"))
        .filter(|p| std::fs::symlink_metadata(p).unwrap().is_dir())
        .collect()
}

#[test]
fn the_dry_runs_scratch_folder_is_unpredictable_followed_through_no_link_and_gone_after_sigterm() {
    let d = tmp();
    let file = d.path().join("one.toml");
    std::fs::write(&file, STUDY).unwrap();
    let out = d.path().join("study");
    // Every name the next few thousand processes would give a folder named after its
    // pid is planted as a symlink to a folder outside.
    let tmpdir = d.path().join("tmp");
    let outside = d.path().join("outside");
    std::fs::create_dir_all(&tmpdir).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(std::process::id());
    for pid in last + 1..last + 20_000 {
        std::os::unix::fs::symlink(&outside, tmpdir.join(format!("ddpbench-estimate-{pid}"))).unwrap();
    }
    let with_tmp = |cmd: &mut Command, t: &Path| {
        cmd.env("TMPDIR", t).args(["-x", "TMPDIR"]);
    };
    let mut cmd = mpirun_cmd(2);
    with_tmp(&mut cmd, &tmpdir);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out).arg("--dry-run");
    let dry = run_with_limit(cmd, LIMIT);
    dry.assert_ok();
    assert!(dry.stdout.contains("ms per step at batch 16 on 1 rank"), "{}", dry.all());
    assert_eq!(names(&outside), Vec::<String>::new(), "the timing run wrote through a planted link");
    assert!(scratch_folders(&tmpdir).is_empty(), "{:?}", scratch_folders(&tmpdir));
    assert!(!out.exists(), "a dry run writes no study folder");

    // SIGTERM to mpirun while a workload is timed: the scratch folder goes too.
    let tmpdir = d.path().join("tmp2");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let mut cmd = mpirun_cmd(2);
    with_tmp(&mut cmd, &tmpdir);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out).arg("--dry-run");
    let log = d.path().join("term");
    let child = start(cmd, &log);
    let began = Instant::now();
    let scratch = loop {
        if let Some(s) = scratch_folders(&tmpdir).pop() {
            break s;
        }
        assert!(began.elapsed() < LIMIT, "no scratch folder appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&scratch).unwrap().permissions().mode() & 0o077,
        0,
        "private to its user"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let job = finish(child, &log);
    assert!(!job.ok(), "{}", job.all());
    assert!(scratch_folders(&tmpdir).is_empty(), "left behind: {:?}", scratch_folders(&tmpdir));

    // SIGHUP (the terminal closed) and SIGQUIT to rank 0 itself, the process whose pid
    // names the scratch folder: gone too.
    for (sig, name) in [(libc::SIGHUP, "hup"), (libc::SIGQUIT, "quit")] {
        let tmpdir = d.path().join(format!("tmp-{name}"));
        std::fs::create_dir_all(&tmpdir).unwrap();
        let mut cmd = mpirun_cmd(2);
        with_tmp(&mut cmd, &tmpdir);
        // A shell's background job starts with SIGQUIT (and under nohup SIGHUP) ignored,
        // and ddpbench keeps an ignored one ignored by design: the job is given both at
        // their default, so the signal it is sent here is one it can receive.
        use std::os::unix::process::CommandExt;
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
        cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out).arg("--dry-run");
        let log = d.path().join(name);
        let child = start(cmd, &log);
        let began = Instant::now();
        let scratch = loop {
            if let Some(s) = scratch_folders(&tmpdir).pop() {
                break s;
            }
            assert!(began.elapsed() < LIMIT, "{name}: no scratch folder appeared");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(scratch.is_dir());
        let pid = rank_zero_with_tmpdir(&tmpdir).expect("rank 0 of the dry run");
        unsafe { libc::kill(pid, sig) };
        let job = finish(child, &log);
        assert!(!job.ok(), "{name}: {}", job.all());
        assert!(
            scratch_folders(&tmpdir).is_empty(),
            "{name}: left behind: {:?}",
            scratch_folders(&tmpdir)
        );
    }
}
