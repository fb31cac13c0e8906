//! A stderr nobody reads never stops training: `ddpbench train` (one process, no
//! launcher) with stdout and stderr on a pipe of 4 KiB that the test does not read,
//! or on a full terminal (progress bars and colours drawn), finishes, and says what it
//! dropped: in the manifest, and where the lines went missing once the pipe is read
//! again.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longer than any run here takes; a run that blocks on its log never ends.
const LIMIT: Duration = Duration::from_secs(180);
const STEPS: usize = 80;

/// A pipe whose buffer holds 4 KiB (the least Linux allows): (read end, write end).
fn small_pipe() -> (File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which are owned below and nowhere else.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: as above.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ on a pipe this process owns.
    assert!(unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096) } >= 4096);
    (read, write)
}

/// A pseudo-terminal whose screen side (the master) nobody reads, already full:
/// (master, the terminal a program writes to).
fn full_terminal() -> (OwnedFd, OwnedFd) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors, owned below and nowhere else.
    let made = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(made, 0, "openpty");
    // SAFETY: as above.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let name = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&slave))).unwrap();
    let mut filler = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(name)
        .unwrap();
    let mut written = 0;
    loop {
        match filler.write(&[b'x'; 1024]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the terminal: {e}"),
        }
    }
    assert!(written > 0);
    (master, slave)
}

/// `ddpbench train` with a log line per step, stdout and stderr into `write`, and a
/// queue of 1 KiB for the lines stderr has not taken yet.
fn spawn_train(out: &Path, write: OwnedFd) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(BIN);
    cmd.args(["train", "--dataset", "synthetic", "--batch-size", "1", "--threads", "1"])
        .args(["--max-steps", &STEPS.to_string(), "--log-every", "1", "--val-samples", "0"])
        .args(["--out", &path_str(out)])
        .env("DDPBENCH_LOG_BUFFER_BYTES", "1024")
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write.try_clone().unwrap()))
        .stderr(Stdio::from(write))
        .process_group(0);
    cmd.spawn().expect("ddpbench")
}

/// Waits for `child` to end within [`LIMIT`]; kills it and fails after.
fn wait_bounded(child: &mut Child, why: &str) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > LIMIT {
            // SAFETY: the process group this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            panic!("{why}: still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rows(file: &Path) -> usize {
    std::fs::read_to_string(file)
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

#[test]
fn a_pipe_nobody_reads_neither_stops_training_nor_loses_the_count() {
    let d = tmp();
    let out = d.path().join("run");
    let (read, write) = small_pipe();
    let mut job = spawn_train(&out, write);
    // The read end stays open and unread: writes block rather than fail.
    let code = wait_bounded(&mut job, "training blocked on its full stderr");
    drop(read);
    assert_eq!(code, Some(0));
    let (_, steps) = read_csv(&out.join("rank-00000.csv"));
    assert_eq!(steps.len(), STEPS, "every step ran");
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "completed", "{m}");
    // 80 lines of about 95 bytes do not fit in 4 KiB of pipe and 1 KiB of queue.
    let dropped = m["log_lines_dropped"].as_u64().unwrap_or_else(|| panic!("{m}"));
    assert!(dropped > 0 && dropped <= STEPS as u64 + 10, "{dropped} lines dropped");
}

#[test]
fn a_terminal_nobody_reads_stops_neither_training_nor_its_progress_bar() {
    let d = tmp();
    let out = d.path().join("run");
    let (master, slave) = full_terminal();
    let mut job = spawn_train(&out, slave);
    let code = wait_bounded(&mut job, "training blocked on its full terminal");
    drop(master);
    assert_eq!(code, Some(0));
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "completed", "{m}");
    assert!(m["log_lines_dropped"].as_u64().is_some_and(|n| n > 0), "{m}");
}

#[test]
fn a_pipe_read_late_gets_the_count_of_lines_dropped_where_they_went_missing() {
    let d = tmp();
    let out = d.path().join("run");
    let (mut read, write) = small_pipe();
    let mut job = spawn_train(&out, write);
    // Unread until training is well past what the pipe and the queue hold.
    let start = Instant::now();
    while rows(&out.join("rank-00000.csv")) < STEPS * 3 / 4 {
        assert!(start.elapsed() < LIMIT, "training stopped while stderr was full");
        assert!(job.try_wait().unwrap().is_none(), "the job ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut bytes = Vec::new();
    read.read_to_end(&mut bytes).unwrap();
    assert_eq!(wait_bounded(&mut job, "the job did not end"), Some(0));
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let m = json(&out.join("manifest.json"));
    let dropped = m["log_lines_dropped"].as_u64().unwrap();
    assert!(dropped > 0, "{m}");
    // The step lines present, and at each gap a note of exactly the lines it lost.
    let (mut next, mut said) = (0u64, 0u64);
    for line in text.lines() {
        if let Some(n) = line
            .split(" step ")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .and_then(|s| s.parse::<u64>().ok())
        {
            assert_eq!(n, next, "step line {n} after {next} missing lines without a note:\n{text}");
            next += 1;
        } else if let Some(gap) = note_count(line, "dropped here") {
            said += gap;
            next += gap;
        }
    }
    assert_eq!(next, STEPS as u64, "every step line is there or counted:\n{text}");
    assert_eq!(said, dropped, "the notes and the manifest agree:\n{text}");
    let last = text.lines().last().unwrap_or_default();
    assert_eq!(note_count(last, "dropped in all"), Some(dropped), "the end says the total:\n{text}");
}

/// N in "ddpbench rank 0: N log line(s) <what>: stderr was full ...", when `line` is that note.
fn note_count(line: &str, what: &str) -> Option<u64> {
    let rest = line.strip_prefix("ddpbench rank 0: ")?;
    let (n, tail) = rest.split_once(" log line(s) ")?;
    tail.starts_with(what).then(|| n.parse().ok()).flatten()
}
