//! The folder a report goes into: one writer at a time (`reduce`, `compare`, `trace`
//! take the folder's lock), the report replaced whole, the files an earlier report
//! left that this one does not write removed (and nothing else), and nothing left
//! behind by an error or a stop signal. The runs are the schema-2 fixture runs.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema2/single")
        .join(name)
}

/// Copies the fixture run `name` to `to`.
fn copy_run(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().map(|e| e.unwrap()) {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Both fixture runs under `dir`/runs.
fn runs(dir: &Path) -> PathBuf {
    let runs = dir.join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    copy_run("single-2r", &runs.join("single-2r"));
    runs
}

fn ddpbench(args: &[&str]) -> Job {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_with_limit(cmd, Duration::from_secs(120))
}

fn spawn(args: &[String]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The run ids a table of `out` names, sorted and once each.
fn run_ids(out: &Path, table: &str) -> Vec<String> {
    let (h, rows) = read_csv(&out.join(table));
    let at = h.iter().position(|c| c == "run_id").unwrap();
    let mut ids: Vec<String> = rows.into_iter().map(|r| r[at].clone()).collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Every file of the report in `out` is of one `reduce`: summary.csv, ranks.csv and
/// report.json name the same runs, and report.md says as many complete runs.
fn assert_one_report(out: &Path) {
    let summary = run_ids(out, "summary.csv");
    assert_eq!(run_ids(out, "ranks.csv"), summary, "ranks.csv and summary.csv of two reports");
    let report = json(&out.join("report.json"));
    let mut in_json: Vec<String> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    in_json.sort();
    assert_eq!(in_json, summary, "report.json and summary.csv of two reports");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains(&format!("{} complete run(s)", summary.len())),
        "report.md of another report"
    );
}

/// Nothing a writer stages or locks with is left in `out` or beside it.
fn assert_nothing_left(out: &Path) {
    for n in names(out) {
        assert!(
            !n.ends_with(".tmp") && !n.contains("staging") && !n.starts_with(".ddpbench.lock"),
            "{n} left in {}",
            out.display()
        );
    }
    for n in names(out.parent().unwrap()) {
        assert!(!n.contains(".staging") && !n.contains(".old-"), "{n} left beside {}", out.display());
    }
}

/// Two `reduce` runs into one --out, ten times over: each either writes its whole report
/// or is refused naming the other job; the folder always holds one report.
#[test]
fn two_reduces_into_one_folder_leave_one_whole_report() {
    let d = tmp();
    let runs = runs(d.path());
    let out = d.path().join("out");
    let one = vec!["reduce".into(), "--out".into(), path_str(&out), path_str(&runs.join("single-1r"))];
    let both = vec!["reduce".into(), "--out".into(), path_str(&out), path_str(&runs)];
    for attempt in 0..10 {
        let (a, b) = if attempt % 2 == 0 { (&one, &both) } else { (&both, &one) };
        let (a, b) = (spawn(a), spawn(b));
        for child in [a, b] {
            let o = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() || err.contains("is being written by another ddpbench job"),
                "attempt {attempt}: failed without naming the other writer: {err}"
            );
        }
        assert_one_report(&out);
        assert_nothing_left(&out);
    }
    // While another job (this test process, alive) holds the folder's lock, a reduce is
    // refused naming it and writes nothing.
    let before = std::fs::read(out.join("summary.csv")).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string();
    // This process as a lock names it: its start (field 22 of /proc/self/stat) and its PID
    // namespace, so it is judged live.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let ticks: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let ns = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
    };
    let holder = serde_json::json!({"host": host, "pid": std::process::id(), "boot_id": boot, "process_start_ticks": ticks,
        "pid_namespace": ns, "job": null, "start_utc": "2026-01-01T00:00:00Z", "command": ["holder"]});
    std::fs::write(out.join(".ddpbench.lock"), holder.to_string()).unwrap();
    let job = ddpbench(&one.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        !job.ok() && job.stderr.contains("is being written by another ddpbench job"),
        "{}",
        job.all()
    );
    assert_eq!(
        std::fs::read(out.join("summary.csv")).unwrap(),
        before,
        "written under another job's lock"
    );
    std::fs::remove_file(out.join(".ddpbench.lock")).unwrap();
}

/// A second report into the folder of a first removes the first's files it does not
/// write again (a run's plot), and keeps a file ddpbench did not write.
#[test]
fn a_later_report_removes_what_the_earlier_one_wrote_and_nothing_else() {
    let d = tmp();
    let runs = runs(d.path());
    let out = d.path().join("out");
    ddpbench(&["reduce", "--out", &path_str(&out), &path_str(&runs)]).assert_ok();
    let plot = "step_time_per_rank-single-2r.svg";
    assert!(out.join(plot).exists(), "{:?}", names(&out));
    ddpbench(&["reduce", "--out", &path_str(&out), &path_str(&runs.join("single-1r"))]).assert_ok();
    assert!(!out.join(plot).exists(), "the first report's {plot} stayed: {:?}", names(&out));
    assert_one_report(&out);
    assert_nothing_left(&out);
    // A file of the user's stays, the report still replaces its own files.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    ddpbench(&["reduce", "--out", &path_str(&out), &path_str(&runs)]).assert_ok();
    ddpbench(&["reduce", "--no-plots", "--out", &path_str(&out), &path_str(&runs.join("single-1r"))]).assert_ok();
    assert!(!out.join(plot).exists() && !out.join("speedup.svg").exists(), "{:?}", names(&out));
    assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
    assert_one_report(&out);
    assert_nothing_left(&out);
}

/// A `reduce` stopped by SIGTERM, SIGINT, SIGHUP or SIGQUIT at any moment leaves no
/// temporary file, no staging folder and no lock; the folder holds one whole report
/// (the earlier one or the new one).
#[test]
fn a_stopped_reduce_leaves_nothing_behind() {
    let d = tmp();
    let runs = runs(d.path());
    let out = d.path().join("out");
    let args: Vec<String> = vec!["reduce".into(), "--out".into(), path_str(&out), path_str(&runs)];
    ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>()).assert_ok();
    let signals = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];
    for (i, delay_ms) in [50u64, 150, 300, 500, 800, 1200, 1700, 2500].into_iter().enumerate() {
        let child = spawn(&args);
        std::thread::sleep(Duration::from_millis(delay_ms));
        unsafe { libc::kill(child.id() as i32, signals[i % signals.len()]) };
        let _ = child.wait_with_output().unwrap();
        assert_nothing_left(&out);
        assert_one_report(&out);
    }
}

/// `compare` that cannot write its files (a full disk) leaves no --out behind, so that
/// the same command runs again once there is room.
#[test]
fn a_compare_that_cannot_write_leaves_no_folder() {
    let d = tmp();
    let runs = runs(d.path());
    let report = d.path().join("report");
    ddpbench(&["reduce", "--no-plots", "--out", &path_str(&report), &path_str(&runs)]).assert_ok();
    let mnt = d.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs", &path_str(&mnt)])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("filler")).unwrap();
        while f.write(&[0u8; 4096]).is_ok_and(|k| k > 0) {}
    }
    let out = mnt.join("cmp");
    let job = ddpbench(&["compare", &path_str(&report), &path_str(&report), "--out", &path_str(&out)]);
    assert!(!job.ok(), "{}", job.all());
    assert!(!out.exists(), "compare left {} behind: {:?}", out.display(), names(&mnt));
    assert_eq!(names(&mnt), ["filler"]);
    std::fs::remove_file(mnt.join("filler")).unwrap();
    ddpbench(&["compare", &path_str(&report), &path_str(&report), "--out", &path_str(&out)]).assert_ok();
    assert!(out.join("compare.md").exists());
}

/// A traced run: the 2-rank fixture with a trace file per rank of `events` events.
fn traced_run(dir: &Path, events: usize) -> PathBuf {
    let run = dir.join("traced");
    copy_run("single-2r", &run);
    std::fs::create_dir_all(run.join("trace")).unwrap();
    for rank in 0..2 {
        let mut text = String::from("{\"traceEvents\":[\n");
        for i in 0..events {
            text.push_str(&format!(
                "{{\"ph\":\"X\",\"name\":\"forward_s\",\"cat\":\"step\",\"pid\":{rank},\"tid\":0,\"ts\":{},\"dur\":5.0}},\n",
                i * 10
            ));
        }
        text.push_str(
            "{\"ph\":\"X\",\"name\":\"end\",\"cat\":\"step\",\"pid\":0,\"tid\":0,\"ts\":0,\"dur\":0}\n]}\n"
                .replace("\"pid\":0", &format!("\"pid\":{rank}"))
                .as_str(),
        );
        std::fs::write(run.join("trace").join(format!("rank-{rank:05}.trace.json")), text).unwrap();
    }
    run
}

/// Two `ddpbench trace` of one run at once, ten times over: timeline.json is always one
/// whole JSON document, and a merge that did not write says so.
#[test]
fn two_traces_of_one_run_never_tear_the_timeline() {
    let d = tmp();
    let run = traced_run(d.path(), 20_000);
    let args = vec!["trace".to_string(), path_str(&run)];
    for attempt in 0..10 {
        let (a, b) = (spawn(&args), spawn(&args));
        for child in [a, b] {
            let o = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() || err.contains("is being written by another ddpbench job"),
                "attempt {attempt}: {err}"
            );
        }
        let text = std::fs::read_to_string(run.join("timeline.json")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("attempt {attempt}: torn timeline.json: {e}"));
        assert!(
            doc["traceEvents"].as_array().is_some_and(|e| e.len() >= 40_000),
            "attempt {attempt}"
        );
        for n in names(&run) {
            assert!(!n.ends_with(".tmp") && n != ".ddpbench.lock", "{n} left in the run folder");
        }
    }
}
