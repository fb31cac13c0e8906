//! Faults during training, for real: a rank killed with SIGKILL, the job sent SIGTERM.
//! Rows are on disk as each step ends, a stop signal ends the run as `interrupted`
//! after the same step on every rank, and each rank records how its part ended.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// Starts `mpirun -n 2 ddpbench train ...` in its own process group, output to `log`.
fn spawn(out: &Path, log: &Path, extra: &[&str]) -> Child {
    spawn_steps(out, log, 2000, extra)
}

/// [`spawn`] for `steps` steps.
fn spawn_steps(out: &Path, log: &Path, steps: usize, extra: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN)
        .arg("train")
        .args(["--max-steps", &steps.to_string(), "--val-samples", "100", "--out", &path_str(out)])
        .args(extra)
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(log.with_extension("err")).unwrap()))
        .process_group(0);
    cmd.spawn().expect("mpirun")
}

/// Rows in a rank file (header excluded), once it has at least `n`.
fn wait_for_rows(file: &Path, n: usize) -> usize {
    let start = Instant::now();
    loop {
        let rows = std::fs::read_to_string(file)
            .map(|t| t.lines().count().saturating_sub(1))
            .unwrap_or(0);
        if rows >= n {
            return rows;
        }
        assert!(start.elapsed() < LIMIT, "{} never reached {n} rows", file.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait(child: &mut Child) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > LIMIT {
            // SAFETY: kills the job's process group, which this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            panic!("the job did not end");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every line of a rank file is a whole row (no torn row), and global_step counts up.
fn assert_whole_rows(file: &Path) -> usize {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.ends_with('\n'), "{}: torn last row", file.display());
    let (h, rows) = read_csv(file);
    assert!(rows.iter().all(|r| r.len() == h.len()));
    let steps = col(&h, &rows, "global_step");
    assert_eq!(steps, (0..rows.len()).map(|i| i as f64).collect::<Vec<_>>());
    rows.len()
}

/// The pid of rank `rank` of the job writing to `out`.
fn rank_pid(out: &Path, rank: usize) -> i32 {
    rank_pid_of("train", out, rank)
}

/// The pid of rank `rank` of the `ddpbench <command> ... <out>` job this test started.
fn rank_pid_of(command: &str, out: &Path, rank: usize) -> i32 {
    let pids = Command::new("pgrep")
        .args(["-f", &format!("{command} .*{}", path_str(out))])
        .output()
        .unwrap()
        .stdout;
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    String::from_utf8(pids)
        .unwrap()
        .lines()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .find(|&p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .map(|e| e.split(|&b| b == 0).any(|v| v == want.as_bytes()))
                .unwrap_or(false)
        })
        .expect("the rank's process")
}

#[test]
fn a_killed_rank_keeps_its_rows_and_its_peer_records_the_signal() {
    let d = tmp();
    let out = d.path().join("run");
    let mut job = spawn(&out, &d.path().join("log"), &[]);
    wait_for_rows(&out.join("rank-00001.csv"), 20);
    // The rank processes are the job's ddpbench children; kill rank 1's outright.
    let rank1 = rank_pid(&out, 1);
    let killed_at = Instant::now();
    let rows_before = wait_for_rows(&out.join("rank-00001.csv"), 0);
    // SAFETY: a process of the job this test started.
    unsafe { libc::kill(rank1, libc::SIGKILL) };
    let code = wait(&mut job);
    assert_ne!(code, Some(0), "a killed rank fails the job");
    assert!(killed_at.elapsed() < Duration::from_secs(60), "the job ended promptly");
    // Both files hold whole rows only, and the killed rank kept every row it wrote
    // before the kill (each row is written when its step ends).
    let rows0 = assert_whole_rows(&out.join("rank-00000.csv"));
    let rows1 = assert_whole_rows(&out.join("rank-00001.csv"));
    assert!(rows1 >= rows_before, "rank 1 had {rows_before} rows before the kill, {rows1} after");
    assert!(rows0 + 1 >= rows1 && rows1 + 1 >= rows0, "{rows0} vs {rows1}");
    // The killed rank could record nothing: its end record still says running.
    let end1 = json(&out.join("rank-00001.end.json"));
    assert_eq!(end1["status"], "running", "{end1}");
    // Open MPI then sends SIGTERM to rank 0, blocked in the all-reduce, and SIGKILL a
    // second later: its signal handler's record says so, on its end record and the
    // manifest (or the watchdog's, with the wait, when the SIGKILL came after 2 s).
    let end0 = json(&out.join("rank-00000.end.json"));
    assert_eq!(end0["status"], "interrupted", "{end0}");
    let why = end0["error"].as_str().unwrap_or_default();
    assert!(
        why.starts_with(&format!("SIGTERM with {rows0} steps done")) || why.starts_with("SIGTERM while waiting"),
        "{end0}"
    );
    assert_eq!(end0["steps"], rows0, "{end0}");
    assert!(
        end0["time_utc"].as_str().is_some_and(|t| t.len() == 27 && t.ends_with('Z')),
        "{end0}"
    );
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "interrupted", "{m}");
    assert!(m["error"].as_str().unwrap_or_default().starts_with("SIGTERM "), "{m}");
    assert!(m["end_utc"].is_string() && m["ranks"].as_array().map(Vec::len) == Some(2), "{m}");
    // reduce says the run died and why it cannot be used, without a panic.
    let job = ddpbench(&["reduce", "--no-plots", &path_str(&out)]);
    assert_ne!(job.status, Some(0), "{}", job.all());
    assert!(
        job.stderr.contains("incomplete run")
            && job.stderr.contains("status is interrupted: SIGTERM")
            && job.stderr.contains("rank 1 recorded no end: killed"),
        "{}",
        job.stderr
    );
    assert!(!job.all().contains("panicked"));
}

#[test]
fn a_rank_0_killed_outright_leaves_a_manifest_that_reduce_settles() {
    let d = tmp();
    let out = d.path().join("run");
    let mut job = spawn(&out, &d.path().join("log"), &[]);
    wait_for_rows(&out.join("rank-00000.csv"), 20);
    // SAFETY: a process of the job this test started.
    unsafe { libc::kill(rank_pid(&out, 0), libc::SIGKILL) };
    assert_ne!(wait(&mut job), Some(0), "a killed rank fails the job");
    // Rank 0 wrote nothing more; its peer recorded its own end.
    assert_eq!(json(&out.join("manifest.json"))["status"], "running");
    assert_eq!(json(&out.join("rank-00000.end.json"))["status"], "running");
    let end1 = json(&out.join("rank-00001.end.json"));
    assert_ne!(end1["status"], "running", "{end1}");
    // Read later, as a user would: the end records are older than the settling delay.
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(120);
    for r in 0..2 {
        let f = std::fs::File::options()
            .write(true)
            .open(out.join(format!("rank-{r:05}.end.json")))
            .unwrap();
        f.set_modified(long_ago).unwrap();
    }
    let job = ddpbench(&["reduce", "--no-plots", &path_str(&out)]);
    assert!(!job.all().contains("panicked"), "{}", job.all());
    assert!(job.stderr.contains("manifest.json said running; it now says"), "{}", job.stderr);
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], end1["status"], "{m}");
    let error = m["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("rank 0 stopped without recording its end (killed outright?); rank 1 ended "),
        "{m}"
    );
    assert!(error.contains(end1["error"].as_str().unwrap()), "{m}");
    assert_eq!(m["end_utc"], end1["time_utc"], "{m}");
    assert_eq!(m["ranks"].as_array().map(Vec::len), Some(2), "the rest of the manifest stays: {m}");
}

#[test]
fn sigterm_interrupts_after_the_same_step_and_keeps_every_row() {
    let d = tmp();
    let out = d.path().join("run");
    let mut job = spawn(&out, &d.path().join("log"), &[]);
    wait_for_rows(&out.join("rank-00000.csv"), 10);
    // SAFETY: the mpirun this test started; it passes SIGTERM on to the ranks.
    unsafe { libc::kill(job.id() as i32, libc::SIGTERM) };
    wait(&mut job);
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "interrupted", "{m}");
    assert!(m["error"].as_str().unwrap().starts_with("SIGTERM after step "), "{}", m["error"]);
    let rows0 = assert_whole_rows(&out.join("rank-00000.csv"));
    let rows1 = assert_whole_rows(&out.join("rank-00001.csv"));
    assert_eq!(rows0, rows1, "both ranks stop after the same step");
    for r in 0..2 {
        let end = json(&out.join(format!("rank-{r:05}.end.json")));
        assert_eq!(end["status"], "interrupted");
        assert_eq!(end["steps"], rows0);
        assert_eq!(end["run_id"], "run");
    }
}

#[test]
fn a_stopped_rank_is_named_by_the_watchdog_and_the_job_ends() {
    let d = tmp();
    let out = d.path().join("run");
    let log = d.path().join("log");
    let mut job = spawn(&out, &log, &["--watchdog-s", "5"]);
    wait_for_rows(&out.join("rank-00001.csv"), 10);
    let (err, line) = stop_rank_and_read_watchdog(&mut job, rank_pid(&out, 1), &log);
    assert!(
        line.starts_with("watchdog: rank 1 on ") && line.contains("has not entered all-reduce #"),
        "{line}"
    );
    assert_eq!(err.matches("watchdog: ").count(), 1, "printed once:\n{err}");
    assert!(out.join("rank-00000.flight.json").is_file());
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "failed");
    assert!(m["error"].as_str().unwrap().contains("rank 1 on "), "{}", m["error"]);
    // diagnose reads the flight records and says the same. Whether the stopped rank
    // wrote one of its own is a race with the job's end: without it, rank 0's record
    // says where rank 1 was last seen.
    let _ = std::fs::remove_file(out.join("rank-00001.flight.json"));
    let diag = ddpbench(&["diagnose", &path_str(&out)]);
    diag.assert_ok();
    let first = diag.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("rank 1 on ") && first.contains("has not entered all-reduce #"),
        "{}",
        diag.stdout
    );
    let named = |s: &str| {
        s.split("has not entered ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .map(String::from)
    };
    assert_eq!(named(first), named(&line), "the same collective:\n{line}\n{first}");
}

/// A tmpfs of `size` mounted at `dir`/tiny, unmounted when dropped; None (the test
/// then says so and passes) where mounting needs a root this process is not.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let mnt = dir.join("tiny");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &path_str(&mnt)])
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: mounting a tmpfs needs root");
        }
        mounted.then_some(Tmpfs(mnt))
    }

    /// Writes `filler` until the file system refuses more; returns the bytes written.
    fn fill(&self) -> usize {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let chunk = [0u8; 4096];
        let mut n = 0;
        while let Ok(k) = f.write(&chunk) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }

    /// The names in `dir` (relative to the mount), sorted, hidden ones included.
    fn names(&self, dir: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.0.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // An aborted rank can linger for a moment: retry, then detach it lazily.
        let unmounted = (0..20).any(|_| {
            let ok = Command::new("umount")
                .arg(&self.0)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                std::thread::sleep(Duration::from_millis(250));
            }
            ok
        });
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// A file system already full at the start: refused with a clear error, and nothing of
/// the attempt stays behind (no `.write-test`, no folder ddpbench created).
#[test]
fn a_full_disk_at_the_start_is_refused_and_leaves_nothing_behind() {
    let d = tmp();
    let Some(fs) = Tmpfs::mount(d.path(), "64k") else { return };
    assert!(fs.fill() > 0);
    let out = fs.0.join("new/run");
    let job = train(2, &["--max-steps", "5", "--val-samples", "0", "--out", &path_str(&out)], LIMIT);
    assert_ne!(job.status, Some(0), "{}", job.all());
    assert!(job.stderr.contains("is not writable"), "{}", job.all());
    assert_eq!(job.stderr.matches("is not writable").count(), 1, "{}", job.stderr);
    assert!(!job.all().contains("panicked") && !job.all().contains("MPI_ABORT"), "{}", job.all());
    assert_eq!(fs.names(""), ["filler"], "only the filler stays");
}

/// A file system that fills up during training: the run ends at once with a clear
/// error, the manifest says failed (space for it was kept), every row on disk is whole
/// (a short write is cut back) and no temporary file stays behind.
#[test]
fn a_disk_that_fills_during_training_fails_the_run_and_keeps_whole_records() {
    let d = tmp();
    let Some(fs) = Tmpfs::mount(d.path(), "1m") else { return };
    let out = fs.0.join("run");
    let log = d.path().join("log");
    let mut job = spawn(&out, &log, &[]);
    wait_for_rows(&out.join("rank-00000.csv"), 5);
    let filled_at = Instant::now();
    fs.fill();
    let code = wait(&mut job);
    let took = filled_at.elapsed();
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap();
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("is the file system full or gone?"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "failed", "{m}");
    let error = m["error"].as_str().unwrap_or_default();
    assert!(error.contains("No space left"), "{m}");
    let names = fs.names("run");
    assert!(names.iter().all(|n| !n.starts_with('.')), "hidden files left: {names:?}");
    for r in 0..2 {
        assert_whole_rows(&out.join(format!("rank-{r:05}.csv")));
    }
    // The rank that met the full disk recorded it.
    let named = (0..2)
        .find(|r| error.starts_with(&format!("rank {r} (")))
        .expect("the failing rank");
    let end = json(&out.join(format!("rank-{named:05}.end.json")));
    assert_eq!(end["status"], "failed", "{end}");
    // The other one, ended by the job's abort, recorded that (its signal handler's record).
    let other = json(&out.join(format!("rank-{:05}.end.json", 1 - named)));
    assert!(other["status"] == "interrupted" || other["status"] == "failed", "{other}");
}

/// `ddpbench allreduce` has the same watchdog: a rank stopped in the middle of a size's
/// timed loop is named, its collective is the sweep's, and the job ends.
#[test]
fn a_stopped_rank_in_the_allreduce_sweep_is_named_and_the_job_ends() {
    use std::os::unix::process::CommandExt;
    let d = tmp();
    let out = d.path().join("sweep");
    let log = d.path().join("log");
    // One size whose timed loop would last 60 s: the stop lands inside it.
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN)
        .args(["allreduce", "--min-bytes", "4K", "--max-bytes", "4K", "--iters", "1000000"])
        .args(["--budget-s", "60", "--watchdog-s", "6", "--out", &path_str(&out)])
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(log.with_extension("err")).unwrap()))
        .process_group(0);
    let mut job = cmd.spawn().expect("mpirun");
    // The header on rank 0's stdout means the sweep has begun.
    let start = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("#wrong") {
        assert!(start.elapsed() < LIMIT, "the sweep never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (err, line) = stop_rank_and_read_watchdog(&mut job, rank_pid_of("allreduce", &out, 1), &log);
    assert!(line.contains("rank 1 on ") && line.contains("sweep 4096 B"), "{line}");
    assert_eq!(err.matches("watchdog: ").count(), 1, "printed once:\n{err}");
    let flight = json(&out.join("rank-00000.flight.json"));
    assert!(flight["message"].as_str().unwrap().contains("rank 1 on "), "{flight}");
    let diag = ddpbench(&["diagnose", &path_str(&out)]);
    diag.assert_ok();
    assert!(
        diag.stdout.contains("rank 1 on ") && diag.stdout.contains("sweep 4096 B"),
        "{}",
        diag.stdout
    );
}

/// Starts `mpirun -n 2 ddpbench <args>` in its own process group, output to `log`.
fn spawn_job(args: &[&str], log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN)
        .args(args)
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(log.with_extension("err")).unwrap()))
        .process_group(0);
    cmd.spawn().expect("mpirun")
}

/// SIGTERM to each rank of the `ddpbench <command>` job writing to `out`, as Slurm's
/// scancel sends it (mpirun's own SIGTERM is followed by SIGKILL a second later, which
/// one size of a sweep on a loaded machine may outlast).
fn sigterm_ranks(command: &str, out: &Path) {
    for r in 0..2 {
        // SAFETY: a process of the job this test started.
        unsafe { libc::kill(rank_pid_of(command, out, r), libc::SIGTERM) };
    }
}

/// `ddpbench allreduce` stops on SIGTERM as `train` does: every rank after the same
/// size, the sizes measured kept in allreduce.csv and allreduce.json (status
/// `interrupted`, the signal in `error`), and no link model fitted from part of a sweep.
#[test]
fn sigterm_interrupts_the_allreduce_sweep_after_a_size_and_keeps_its_rows() {
    let d = tmp();
    let out = d.path().join("sweep");
    let log = d.path().join("log");
    // 8 B to 1 GiB by 2: 28 sizes at up to 0.3 s each, far more than the test waits for.
    let args = [
        "allreduce",
        "--min-bytes",
        "8",
        "--max-bytes",
        "1G",
        "--budget-s",
        "0.3",
        "--out",
        &path_str(&out),
    ];
    let mut job = spawn_job(&args, &log);
    wait_for_rows(&out.join("allreduce.csv"), 6);
    sigterm_ranks("allreduce", &out);
    let code = wait(&mut job);
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap();
    // As an interrupted training run: the ranks end normally, the files say how.
    assert_eq!(code, Some(0), "{err}");
    let (h, rows) = read_csv(&out.join("allreduce.csv"));
    assert!(rows.len() % 2 == 0 && rows.len() < 2 * 28, "{} rows", rows.len());
    let j = json(&out.join("allreduce.json"));
    let why = j["error"].as_str().unwrap_or_default();
    assert_eq!(j["status"], "interrupted", "error {why:?}\n{err}");
    assert!(why.starts_with("SIGTERM after "), "{why:?}");
    // Both ranks stopped after the same size: the last row rank 0 wrote is the size named.
    let last_bytes = col(&h, &rows, "bytes").last().copied().unwrap();
    assert!(why.contains(&format!(" {last_bytes} B ")), "{why} vs {last_bytes}");
    assert_eq!(j["rows"].as_array().map(Vec::len), Some(rows.len()));
    assert!(
        !out.join("link_model.json").exists() && !out.join("allreduce_model.json").exists(),
        "a link model fitted from part of a sweep"
    );
    assert_eq!(err.matches("interrupted by SIGTERM").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// SIGTERM during a study's sweep stops the sweep after a size and the study before its
/// first point: the sweep says it was interrupted, has no model (so a resumed study
/// sweeps again), and no point ran.
#[test]
fn sigterm_during_a_studys_sweep_ends_the_study_before_its_points() {
    let d = tmp();
    let out = d.path().join("study");
    let log = d.path().join("log");
    let o = path_str(&out);
    let args = [
        "study",
        "--name",
        "stop",
        "--ranks",
        "1,2",
        "--datasets",
        "synthetic",
        "--repeats",
        "1",
        "--allreduce-sweep",
        "--out",
        &o,
        "--",
        "--max-steps",
        "15",
        "--synthetic-samples",
        "1024",
        "--val-samples",
        "0",
    ];
    let mut job = spawn_job(&args, &log);
    // Four sizes measured, of the sweep's 24.
    wait_for_rows(&out.join("allreduce/allreduce.csv"), 8);
    sigterm_ranks("study", &out);
    wait(&mut job);
    let all = std::fs::read_to_string(&log).unwrap() + &std::fs::read_to_string(log.with_extension("err")).unwrap();
    let sweep = json(&out.join("allreduce/allreduce.json"));
    let (status, why) = (&sweep["status"], &sweep["error"]);
    assert_eq!(status, "interrupted", "error {why}\n{all}");
    assert!(why.as_str().is_some_and(|e| e.starts_with("SIGTERM after ")), "{why}");
    assert!(!out.join("allreduce/link_model.json").exists(), "{all}");
    let runs: Vec<_> = std::fs::read_dir(out.join("runs"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "points ran after the stop: {runs:?}\n{all}");
    assert!(all.contains("study interrupted"), "{all}");
    assert!(!all.contains("panicked"), "{all}");
}

/// SIGSTOPs `rank` (a process id), waits for the job to end, then checks that it ended
/// with a failure within 30 s and returns its stderr and the watchdog's line in it.
fn stop_rank_and_read_watchdog(job: &mut Child, rank: i32, log: &Path) -> (String, String) {
    let stopped_at = Instant::now();
    // SAFETY: a process of the job the test started; it is killed below in any case.
    unsafe { libc::kill(rank, libc::SIGSTOP) };
    let code = wait(job);
    let took = stopped_at.elapsed();
    // SAFETY: as above (it may already be gone).
    unsafe { libc::kill(rank, libc::SIGKILL) };
    assert_ne!(code, Some(0));
    assert!(took < Duration::from_secs(30), "the job ended {took:?} after the stop");
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap();
    let line = err
        .lines()
        .find(|l| l.starts_with("watchdog: "))
        .unwrap_or_else(|| panic!("no watchdog message:\n{err}"))
        .to_string();
    (err, line)
}

/// Rank 0's watchdog address, from the line its log gives it (`the watchdog listens on
/// 127.0.0.1:PORT for ...`).
fn watchdog_address(err_log: &Path) -> std::net::SocketAddr {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(err_log).unwrap_or_default();
        if let Some(rest) = text.split("the watchdog listens on ").nth(1) {
            let addr = rest.split([' ', ',']).next().unwrap_or_default();
            return addr.parse().unwrap_or_else(|_| panic!("not an address: {addr:?}"));
        }
        assert!(start.elapsed() < LIMIT, "rank 0 never said where its watchdog listens:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Open descriptors of a process.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Resident memory of a process, in bytes.
fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// One JSON line that the watchdog of earlier versions took as rank 1's report of a
/// hang, sent from 127.0.0.1 to a healthy job: the job finishes as if nothing came, and
/// rank 0 listens on loopback only (every rank is on its node).
#[test]
fn a_forged_report_from_127_0_0_1_cannot_end_a_healthy_job() {
    use std::io::{Read, Write};
    let d = tmp();
    let out = d.path().join("run");
    let log = d.path().join("log");
    let mut job = spawn_steps(&out, &log, 150, &["--watchdog-s", "20"]);
    let addr = watchdog_address(&log.with_extension("err"));
    assert!(addr.ip().is_loopback(), "rank 0 listens on {addr}, not only where its peers are");
    wait_for_rows(&out.join("rank-00001.csv"), 5);
    let forged = r#"{"rank":1,"host":"vm","pending":{"seq":999999,"kind":"all-reduce","detail":"bucket 0","epoch":0,"step":3,"state":"started","scheduled_s":0.0,"started_s":0.0,"completed_s":null},"waited_s":1e9,"last_completed":1,"silent_s":0.0,"idle":false}"#;
    for line in [
        forged.to_string(),
        // A hello with a made-up proof gets no further.
        "ddpbench-watchdog 2 hello 1 00112233445566778899aabbccddeeff".to_string(),
    ] {
        let mut s = std::net::TcpStream::connect(addr).expect("the watchdog's port");
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        if line.contains("hello") {
            let mut answer = [0u8; 512];
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let n = s.read(&mut answer).unwrap_or(0);
            let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
            assert!(answer.contains(" challenge "), "{answer:?}");
            s.write_all(format!("ddpbench-watchdog 2 auth {}\n", "ab".repeat(32)).as_bytes())
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    let code = wait(&mut job);
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("watchdog: "), "{err}");
    assert!(err.contains("the watchdog refused a connection"), "{err}");
    assert_eq!(json(&out.join("manifest.json"))["status"], "completed");
}

/// Floods on the watchdog's port (64 MB of newlines, 256 MB without one, 2,000
/// connect-and-close cycles) leave rank 0 with its memory and descriptors, and its
/// watchdog still names a rank stopped afterwards. The floods are several times the
/// 64 MB margin, which covers what rank 0's training itself allocates meanwhile: a
/// watchdog that buffered a flood would grow by more than the margin.
#[test]
fn floods_on_the_watchdog_port_leave_it_bounded_and_working() {
    use std::io::Write;
    let d = tmp();
    let out = d.path().join("run");
    let log = d.path().join("log");
    let mut job = spawn(&out, &log, &["--watchdog-s", "5"]);
    let addr = watchdog_address(&log.with_extension("err"));
    wait_for_rows(&out.join("rank-00001.csv"), 5);
    let rank0 = rank_pid(&out, 0);
    let (fds_before, rss_before) = (open_fds(rank0), rss_bytes(rank0));
    let flood = |byte: u8, total_bytes: usize| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let chunk = vec![byte; 1 << 20];
        // The watchdog closes the connection early: a failed write is what it should do.
        for _ in 0..total_bytes / chunk.len() {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    };
    flood(b'\n', 64 << 20);
    flood(b'x', 256 << 20);
    for _ in 0..2000 {
        if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            drop(s);
        }
    }
    // Closed connections are released within a few of the watchdog's ticks.
    let start = Instant::now();
    while open_fds(rank0) > fds_before + 4 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (fds_after, rss_after) = (open_fds(rank0), rss_bytes(rank0));
    assert!(fds_after <= fds_before + 4, "descriptors {fds_before} → {fds_after}");
    assert!(
        rss_after < rss_before + (64 << 20),
        "rank 0 grew from {rss_before} to {rss_after} bytes"
    );
    let (err, line) = stop_rank_and_read_watchdog(&mut job, rank_pid(&out, 1), &log);
    assert!(line.starts_with("watchdog: rank 1 on "), "{line}\n{err}");
}

/// The `train` flags of a small synthetic run into `out`, then `extra`.
fn small_run<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        "train",
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "4096",
        "--val-samples",
        "64",
    ];
    base.iter()
        .chain(&["--probe-iters", "0", "--out", out])
        .chain(extra)
        .copied()
        .collect()
}

/// Ranks started with different flags (an MPMD launch) are refused at start-up: one
/// message names the flag, its values and their ranks, every rank exits non-zero, and
/// no run folder is made. A flag that may differ per rank (`--node-type`) runs.
#[test]
fn ranks_started_with_different_flags_are_refused_naming_the_rank_and_the_flag() {
    let d = tmp();
    let o = path_str(&d.path().join("run"));
    // 32 steps per epoch: rank 0 would stop after 10, rank 1 after 20.
    let job = mpmd_reporting_exits(
        &[small_run(&o, &["--max-steps", "10"]), small_run(&o, &["--max-steps", "20"])],
        LIMIT,
    );
    let all = job.all();
    assert!(!job.timed_out, "the job hung:\n{all}");
    assert!(job.elapsed < Duration::from_secs(60), "refused after {:?}:\n{all}", job.elapsed);
    assert_eq!(all.matches("the ranks were started with different flags").count(), 1, "{all}");
    assert!(all.contains("--max-steps is 10 on rank 0 but 20 on rank 1."), "{all}");
    assert!(all.contains("only --node-type may differ between ranks"), "{all}");
    for r in 0..2 {
        assert!(all.contains(&format!("rank-exit {r} 1")), "rank {r}'s exit:\n{all}");
    }
    assert!(!d.path().join("run").join("manifest.json").exists(), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    // Each rank labels its own node: the job runs, and the manifest says which is which.
    let o = path_str(&d.path().join("typed"));
    let job = mpmd_reporting_exits(
        &[
            small_run(&o, &["--max-steps", "3", "--node-type", "fast"]),
            small_run(&o, &["--max-steps", "3", "--node-type", "slow"]),
        ],
        LIMIT,
    );
    let all = job.all();
    assert!(all.contains("rank-exit 0 0") && all.contains("rank-exit 1 0"), "{all}");
    let m = json(&d.path().join("typed/manifest.json"));
    assert_eq!(m["status"], "completed", "{m}");
    let types: Vec<&str> = m["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, vec!["fast", "slow"]);
}

/// `allreduce` and `study` launches are compared the same way: a study's train option
/// (after `--`) is named as such, and a study file's key as its flag.
#[test]
fn allreduce_and_study_ranks_with_different_flags_are_refused() {
    let d = tmp();
    let o = path_str(&d.path().join("sweep"));
    let sweep = |iters: &'static str| vec!["allreduce", "--max-bytes", "4K", "--iters", iters, "--out", o.as_str()];
    let job = mpmd_reporting_exits(&[sweep("5"), sweep("6")], LIMIT);
    let all = job.all();
    assert!(!job.timed_out, "the job hung:\n{all}");
    assert!(all.contains("--iters is 5 on rank 0 but 6 on rank 1."), "{all}");
    assert!(all.contains("rank-exit 0 1") && all.contains("rank-exit 1 1"), "{all}");
    let o = path_str(&d.path().join("study"));
    let study = |steps: &'static str| {
        vec![
            "study",
            "--ranks",
            "1,2",
            "--datasets",
            "synthetic",
            "--out",
            o.as_str(),
            "--",
            "--max-steps",
            steps,
        ]
    };
    let job = mpmd_reporting_exits(&[study("3"), study("4")], LIMIT);
    let all = job.all();
    assert!(!job.timed_out, "the job hung:\n{all}");
    assert!(all.contains("-- --max-steps is 3 on rank 0 but 4 on rank 1."), "{all}");
    assert!(all.contains("rank-exit 0 1") && all.contains("rank-exit 1 1"), "{all}");
    assert!(!d.path().join("study").exists(), "{all}");
}

/// A rank that stalls in the job's teardown (stopped after its records are final, before
/// MPI_Finalize, as a rank stuck closing files would stay) is named with the teardown
/// stage, the job ends instead of leaving mpirun waiting, and the run's records stay as
/// they were: completed.
#[test]
fn a_rank_stopped_in_teardown_is_named_and_the_completed_run_stays_completed() {
    let d = tmp();
    let out = d.path().join("run");
    let o = path_str(&out);
    let mut cmd = mpirun_cmd_with_env(2, &[("DDPBENCH_STOP_AT_EXIT", "1")]);
    cmd.arg(BIN).args(small_run(&o, &["--max-steps", "3", "--watchdog-s", "5"]));
    let job = run_with_limit(cmd, LIMIT);
    let all = job.all();
    assert!(!job.timed_out, "the job did not end:\n{all}");
    assert_eq!(job.status, Some(3), "{all}");
    assert!(all.contains("done: "), "{all}");
    let line = job
        .stderr
        .lines()
        .find(|l| l.ends_with("Aborting the job"))
        .unwrap_or_else(|| panic!("no watchdog message:\n{all}"));
    assert!(
        line.starts_with("watchdog: rank 1 on ") && line.contains("has not entered MPI_Finalize #") && line.contains("(teardown)"),
        "{line}"
    );
    assert_eq!(job.stderr.matches("Aborting the job").count(), 1, "printed once:\n{all}");
    assert!(all.contains("the run's records were final before the stall and are kept"), "{all}");
    let m = json(&out.join("manifest.json"));
    assert_eq!((&m["status"], &m["error"]), (&"completed".into(), &serde_json::Value::Null), "{m}");
    for r in 0..2 {
        let end = json(&out.join(format!("rank-{r:05}.end.json")));
        assert_eq!(end["status"], "completed", "{end}");
    }
    // The flight records say the same afterwards. The stopped rank may write one of its
    // own once the job's end wakes it (SIGCONT before SIGTERM): without it, rank 0's
    // record says where rank 1 was last seen.
    let _ = std::fs::remove_file(out.join("rank-00001.flight.json"));
    let diag = ddpbench(&["diagnose", &o]);
    diag.assert_ok();
    let first = diag.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("rank 1 on ") && first.contains("MPI_Finalize #"),
        "{}",
        diag.stdout
    );
}

/// A forward pass that never returns is named with its phase: on one rank of two (its
/// peer waits for it in the all-reduce) and on a job's only rank, where no collective is
/// pending at all.
#[test]
fn a_forward_that_never_returns_is_named_with_its_phase() {
    for (ranks, slow) in [(2usize, 1usize), (1, 0)] {
        let d = tmp();
        let out = d.path().join("run");
        let o = path_str(&out);
        let spec = format!("{slow}:100000000");
        let mut cmd = mpirun_cmd_with_env(ranks, &[("DDPBENCH_SLOW_FORWARD", spec.as_str())]);
        cmd.arg(BIN).args(small_run(&o, &["--max-steps", "3", "--watchdog-s", "3"]));
        let job = run_with_limit(cmd, LIMIT);
        let all = job.all();
        assert!(!job.timed_out, "{ranks} rank(s): the job did not end:\n{all}");
        assert_ne!(job.status, Some(0), "{all}");
        let line = job
            .stderr
            .lines()
            .find(|l| l.starts_with("watchdog: "))
            .unwrap_or_else(|| panic!("no watchdog message:\n{all}"));
        assert!(
            line.contains(&format!("rank {slow} on ")) && line.contains("in forward of epoch 0 step 0"),
            "{ranks} rank(s): {line}"
        );
        let m = json(&out.join("manifest.json"));
        assert_eq!(m["status"], "failed", "{m}");
        assert!(m["error"].as_str().unwrap_or_default().contains("forward of epoch 0 step 0"), "{m}");
    }
}
