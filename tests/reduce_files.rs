//! `reduce` on run folders it did not make itself: a run id that is a path, a run
//! reached twice (a copy, a symbolic link), special files in place of run files, and a
//! file system that fills up while the report is written. The runs are the schema-2
//! folders in tests/fixtures/schema2 (real runs of 1 and 2 ranks), copied and damaged.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema2/single")
        .join(name)
}

/// Copies the fixture run `name` to `to` (a folder created for it).
fn copy_run(name: &str, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap().map(|e| e.unwrap()) {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// `ddpbench reduce <args>`, killed after 60 s; into the last folder given unless
/// `args` name an `--out`.
fn reduce(args: &[&str]) -> Job {
    let mut cmd = Command::new(BIN);
    cmd.arg("reduce").args(args);
    if !args.contains(&"--out") {
        cmd.args(["--out"]).args(args.last());
    }
    run_with_limit(cmd, Duration::from_secs(60))
}

/// Sets the run id of run folder `dir` to `id`: in its manifest and in every row.
fn set_run_id(dir: &Path, id: &str) {
    let path = dir.join("manifest.json");
    let mut m = json(&path);
    m["run_id"] = id.into();
    std::fs::write(&path, m.to_string()).unwrap();
    for e in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        let name = e.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("rank-") && name.ends_with(".csv")) {
            continue;
        }
        let (h, rows) = read_csv(&e);
        let at = h.iter().position(|c| c == "run_id").unwrap();
        let mut w = csv::Writer::from_path(&e).unwrap();
        w.write_record(&h).unwrap();
        for mut row in rows {
            row[at] = id.into();
            w.write_record(&row).unwrap();
        }
        w.flush().unwrap();
    }
}

/// Every path under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap()) {
            out.push(e.path().strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// A run whose id climbs out of the output folder is refused, named with its manifest
/// and key, and nothing is written outside the output folder; the other run is reduced
/// and its plots drawn there.
#[test]
fn a_run_id_that_is_a_path_is_refused_and_nothing_lands_outside() {
    let d = tmp();
    let runs = d.path().join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    let evil = runs.join("evil");
    copy_run("single-2r", &evil);
    set_run_id(&evil, "x/../../escape_pwn");
    // A folder among the runs (the default output folder) that the path climbs through.
    std::fs::create_dir(runs.join("step_time_per_rank-x")).unwrap();
    let before = tree(d.path());
    let job = reduce(&[&path_str(&runs)]);
    job.assert_ok();
    let outside: Vec<String> = tree(d.path()).into_iter().filter(|p| !p.starts_with("runs")).collect();
    assert!(outside.is_empty(), "written outside the output folder: {outside:?}\n{}", job.all());
    assert!(!d.path().join("escape_pwn.svg").exists() && !d.path().join("escape_pwn.png").exists());
    let manifest = path_str(&evil.join("manifest.json"));
    assert!(
        job.stderr.contains(&manifest) && job.stderr.contains("run_id is \"x/../../escape_pwn\""),
        "{}",
        job.stderr
    );
    assert!(runs.join("step_time_per_rank-single-1r.png").is_file());
    assert_eq!(std::fs::read_dir(runs.join("step_time_per_rank-x")).unwrap().count(), 0);
    assert!(before.iter().all(|p| tree(d.path()).contains(p)));
    // A run id that is not its folder's name (a renamed copy) is refused the same way.
    let renamed = d.path().join("renamed");
    copy_run("single-1r", &renamed.join("other-name"));
    let job = reduce(&["--no-plots", "--out", &path_str(&d.path().join("out")), &path_str(&renamed)]);
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.stderr.contains("run_id is \"single-1r\"") && job.stderr.contains("other-name"),
        "{}",
        job.stderr
    );
}

/// A symbolic link to a run, the same folder named twice and a copy of a run in another
/// folder are one run: counted once, and said once which paths were the same run and
/// which one was kept.
#[test]
fn a_run_reached_twice_is_one_run_said_once() {
    let d = tmp();
    let runs = d.path().join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    copy_run("single-2r", &runs.join("single-2r"));
    std::os::unix::fs::symlink(runs.join("single-2r"), runs.join("link-2r")).unwrap();
    let copy = d.path().join("backup/single-2r");
    copy_run("single-2r", &copy);
    let out = d.path().join("out");
    let twice = path_str(&runs.join("../runs/single-2r"));
    let job = reduce(&["--no-plots", "--out", &path_str(&out), &path_str(&runs), &twice, &path_str(&copy)]);
    job.assert_ok();
    let (h, rows) = read_csv(&out.join("scaling.csv"));
    let ids = h.iter().position(|c| c == "run_ids").unwrap();
    let points: Vec<&str> = rows.iter().map(|r| r[ids].as_str()).collect();
    assert!(points.contains(&"single-2r"), "{points:?}");
    assert!(
        points.iter().all(|p| p.matches("single-2r").count() <= 1),
        "counted twice: {points:?}"
    );
    let (h, rows) = read_csv(&out.join("summary.csv"));
    let run = h.iter().position(|c| c == "run_id").unwrap();
    assert_eq!(rows.iter().filter(|r| r[run] == "single-2r").count(), 1, "one summary row");
    let kept = path_str(&runs.join("single-2r"));
    for dup in [path_str(&runs.join("link-2r")), path_str(&copy)] {
        let said: Vec<&str> = job.stderr.lines().filter(|l| l.contains(&dup)).collect();
        assert_eq!(said.len(), 1, "{dup} said once:\n{}", job.stderr);
        assert!(said[0].contains(&kept) && said[0].contains("kept"), "{}", said[0]);
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("## Runs reached twice") && report.contains(&path_str(&copy)),
        "{report}"
    );
    let json = json(&out.join("report.json"));
    // The link, the folder named again and the copy.
    assert_eq!(json["duplicates"].as_array().map(Vec::len), Some(3), "{}", json["duplicates"]);
}

/// A FIFO in place of a run file is named and leaves the run out (or the projection,
/// for a link model), at once: no reader waits for a writer that never comes.
#[test]
fn special_files_are_named_and_never_waited_on() {
    let d = tmp();
    let sweep = d.path().join("sweep");
    std::fs::create_dir(&sweep).unwrap();
    mkfifo(&sweep.join("link_model.json"));
    for file in ["clock.csv", "epochs.csv", "rank-00001.csv", "manifest.json", "rank-00000.gpu.csv"] {
        let runs = d.path().join(file);
        copy_run("single-1r", &runs.join("single-1r"));
        let damaged = runs.join("single-2r");
        copy_run("single-2r", &damaged);
        mkfifo(&damaged.join(file));
        let out = path_str(&d.path().join(format!("out-{file}")));
        let job = reduce(&["--no-plots", "--out", &out, &path_str(&runs)]);
        assert!(!job.timed_out, "{file}: reduce hung on a FIFO");
        job.assert_ok();
        let named = path_str(&damaged.join(file));
        assert!(
            job.stderr.lines().any(|l| l.contains(&named) && l.contains("FIFO")),
            "{file} not named:\n{}",
            job.stderr
        );
        let (h, rows) = read_csv(&Path::new(&out).join("summary.csv"));
        let run = h.iter().position(|c| c == "run_id").unwrap();
        assert!(rows.iter().all(|r| r[run] == "single-1r"), "{file}: the damaged run was used");
    }
    let runs = d.path().join("clock.csv");
    let out = path_str(&d.path().join("out-sweep"));
    let job = reduce(&["--no-plots", "--out", &out, "--interconnect", &path_str(&sweep), &path_str(&runs)]);
    assert!(!job.timed_out, "reduce hung on a FIFO link model");
    job.assert_ok();
    assert!(
        job.stderr.contains(&path_str(&sweep.join("link_model.json"))) && job.stderr.contains("FIFO"),
        "{}",
        job.stderr
    );
}

/// A tmpfs mounted at `dir`/tiny, unmounted when dropped; None (the test then says so
/// and passes) where mounting needs a root this process is not.
struct Tmpfs(PathBuf);

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
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The files of `dir` and their bytes, hidden ones included.
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A report that does not fit replaces none of the previous one: every file keeps its
/// bytes, no temporary file stays, and the error names the file it could not write.
#[test]
fn a_full_disk_replaces_no_file_of_the_previous_report() {
    let d = tmp();
    let Some(fs) = Tmpfs::mount(d.path(), "256k") else { return };
    let runs = d.path().join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    copy_run("single-2r", &runs.join("single-2r"));
    let out = fs.0.join("report");
    // The previous report: the 1-rank run alone.
    reduce(&["--no-plots", "--out", &path_str(&out), &path_str(&runs.join("single-1r"))]).assert_ok();
    let before = contents(&out);
    assert!(before.iter().any(|(n, _)| n == "report.md"), "{before:?}");
    // Fill the file system but for 8 KiB: the new report (both runs) starts to fit.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(fs.0.join("filler")).unwrap();
        let mut n = 0u64;
        while let Ok(k) = f.write(&[0u8; 4096]) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        f.set_len(n - 8192).unwrap();
    }
    let job = reduce(&["--no-plots", "--out", &path_str(&out), &path_str(&runs)]);
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.stderr.contains(&path_str(&out)) && job.stderr.contains("No space left"),
        "{}",
        job.stderr
    );
    assert!(!job.all().contains("panicked"), "{}", job.all());
    let after = contents(&out);
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&after), names(&before), "files added or left behind");
    for ((name, was), (_, is)) in before.iter().zip(&after) {
        assert!(was == is, "{name} was replaced ({} bytes, was {})", is.len(), was.len());
    }
    // With room again, the new report replaces the old one whole.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    reduce(&["--no-plots", "--out", &path_str(&out), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&out.join("summary.csv"));
    let run = h.iter().position(|c| c == "run_id").unwrap();
    assert!(rows.iter().any(|r| r[run] == "single-2r"));
    assert_eq!(names(&contents(&out)), names(&before));
}

/// `ddpbench reduce <args>` (killed after 120 s) with its stderr and its peak resident
/// memory in bytes, from the kernel's account of that one child (`wait4`).
fn reduce_peak_memory(args: &[&str]) -> (String, u64) {
    let d = tmp();
    let err = d.path().join("stderr");
    // The child is reaped below by `wait4`, which also gives its peak memory.
    #[allow(clippy::zombie_processes)]
    let mut child = Command::new(BIN)
        .arg("reduce")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let start = std::time::Instant::now();
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    loop {
        // SAFETY: waits for this test's own child, writing into locals.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("reduce did not end in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (std::fs::read_to_string(&err).unwrap(), usage.ru_maxrss as u64 * 1024)
}

/// A sparse 3 GiB manifest (it costs no disk) took 3.27 GB of memory and 16 s to be
/// refused: it is now refused from its size alone, the bound named, memory untouched.
#[test]
fn a_manifest_larger_than_its_bound_is_refused_unread() {
    let d = tmp();
    let runs = d.path().join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    let huge = runs.join("single-2r");
    copy_run("single-2r", &huge);
    let f = std::fs::OpenOptions::new().write(true).open(huge.join("manifest.json")).unwrap();
    f.set_len(3 << 30).unwrap();
    drop(f);
    let out = path_str(&d.path().join("out"));
    let (stderr, peak) = reduce_peak_memory(&["--no-plots", "--out", &out, &path_str(&runs)]);
    assert!(
        stderr.contains(&path_str(&huge.join("manifest.json"))) && stderr.contains("is 3 GiB, over the 256 MiB a manifest may hold"),
        "{stderr}"
    );
    assert!(peak < 256 << 20, "reduce held {peak} bytes at its peak:\n{stderr}");
    let (h, rows) = read_csv(&Path::new(&out).join("summary.csv"));
    assert!(rows.iter().all(|r| r[h.iter().position(|c| c == "run_id").unwrap()] == "single-1r"));
}

/// A rank file with one row of 1 GiB (sparse: it costs no disk) took 2.2 GB of memory:
/// a row is now refused past its bound, the file named, and the run left out.
#[test]
fn a_rank_row_longer_than_its_bound_is_refused_unheld() {
    use std::io::{Seek, SeekFrom, Write};
    let d = tmp();
    let runs = d.path().join("runs");
    copy_run("single-1r", &runs.join("single-1r"));
    let long = runs.join("single-2r");
    copy_run("single-2r", &long);
    let rank = long.join("rank-00001.csv");
    let mut f = std::fs::OpenOptions::new().write(true).open(&rank).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + (1 << 30)).unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"\n").unwrap();
    drop(f);
    let out = path_str(&d.path().join("out"));
    let (stderr, peak) = reduce_peak_memory(&["--no-plots", "--out", &out, &path_str(&runs)]);
    assert!(
        stderr.contains(&path_str(&long)) && stderr.contains("rank-00001.csv row") && stderr.contains("a row of over 64 KiB"),
        "{stderr}"
    );
    assert!(peak < 256 << 20, "reduce held {peak} bytes at its peak:\n{stderr}");
    let (h, rows) = read_csv(&Path::new(&out).join("summary.csv"));
    assert!(rows.iter().all(|r| r[h.iter().position(|c| c == "run_id").unwrap()] == "single-1r"));
}
