//! `ddpbench diagnose` on hostile run folders: a world size or a rank number no job can
//! have is refused with the file and key named, before anything is sized by it (the
//! binary runs under an address-space limit to prove it).

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::Path;

/// Address space `diagnose` runs in: libtorch's libraries alone map about 500 MiB at
/// start-up, so this leaves some hundreds of MiB for the command itself.
const LIMIT_KIB: u64 = 1 << 20;

/// `ddpbench diagnose DIR` under `ulimit -v` [`LIMIT_KIB`].
fn diagnose_limited(dir: &Path) -> Job {
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!("ulimit -v {LIMIT_KIB} && exec \"$0\" diagnose \"$1\""),
        BIN,
        &path_str(dir),
    ]);
    run_with_limit(cmd, std::time::Duration::from_secs(60))
}

/// A manifest of `world_size` ranks with one rank entry whose launcher saw `launched` ranks.
fn write_manifest_launched(dir: &Path, world_size: &str, launched: &str) {
    write_manifest(dir, world_size);
    let path = dir.join("manifest.json");
    let rank = format!(
        r#"{{"rank":0,"local_rank":0,"host":"node1","node_type":"T","device":"Cpu","binding":"auto: 0","threads":1,
        "cpu_model":"x","gpus":[],"launcher_env":[["OMPI_COMM_WORLD_SIZE","{launched}"]]}}"#
    );
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(r#""ranks":[]"#, &format!(r#""ranks":[{rank}]"#));
    std::fs::write(path, text).unwrap();
}

fn write_manifest(dir: &Path, world_size: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        r#"{{"run_id":"hung","status":"failed","error":"hang","ddpbench_version":"0.1.0","libtorch_version":"2.11.0",
        "mpi_library":"x","command_line":[],"config":{{}},"model":"mnist-cnn","dataset":"fashion-mnist","dataset_source":"",
        "parameters":1,"gradient_bytes":4,"comm_backend":"mpi-cpu-staged","buckets":1,"world_size":{world_size},"nodes":1,
        "batch_size_per_rank":64,"global_batch_size":128,"steps_per_epoch":10,"start_utc":"2026-11-01T00:00:00.000000Z",
        "end_utc":null,"wall_s":null,"final_param_l2":null,"final_val_accuracy":null,"allreduce_probe":null,"ranks":[]}}"#
    );
    std::fs::write(dir.join("manifest.json"), text).unwrap();
}

/// `file` holding the flight record of `rank`, waiting in all-reduce #7.
fn write_flight(dir: &Path, file: &str, rank: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        r#"{{"status":{{"rank":{rank},"host":"node1","pending":{{"seq":7,"kind":"all-reduce","detail":"bucket 0","epoch":0,
        "step":3,"state":"started","scheduled_s":1.0,"started_s":1.0,"completed_s":null}},"waited_s":30.0,
        "last_completed":6,"silent_s":0.0,"idle":false}},"message":"","time_utc":"2026-11-01T00:01:00Z","records":[]}}"#
    );
    std::fs::write(dir.join(file), text).unwrap();
}

/// The command ran to its own end (no signal), exited 1, and said `named` without a panic.
fn refused(job: &Job, named: &[&str]) {
    assert_eq!(job.status, Some(1), "{}", job.all());
    assert!(
        !job.all().contains("panicked") && !job.all().contains("memory allocation"),
        "{}",
        job.all()
    );
    for n in named {
        assert!(job.stderr.contains(n), "{n:?} not in {}", job.stderr);
    }
}

#[test]
fn diagnose_refuses_a_huge_world_size_without_allocating() {
    let d = tmp();
    // The limit leaves room for a real diagnosis.
    let good = d.path().join("good");
    write_manifest(&good, "2");
    write_flight(&good, "rank-00000.flight.json", "0");
    let job = diagnose_limited(&good);
    job.assert_ok();
    assert!(
        job.stdout.contains("rank 1 (no report) has not entered all-reduce #7"),
        "{}",
        job.stdout
    );

    let huge = d.path().join("huge");
    write_manifest(&huge, "1000000000000");
    write_flight(&huge, "rank-00000.flight.json", "0");
    refused(
        &diagnose_limited(&huge),
        &[&format!("{}: world_size is 1000000000000", path_str(&huge.join("manifest.json")))],
    );
}

#[test]
fn diagnose_refuses_a_rank_beyond_the_world() {
    let d = tmp();
    // Beyond the manifest's world size.
    let beyond = d.path().join("beyond");
    write_manifest(&beyond, "2");
    write_flight(&beyond, "rank-00001.flight.json", "1000000000000000");
    refused(
        &diagnose_limited(&beyond),
        &[&format!(
            "{}: status.rank is 1000000000000000",
            path_str(&beyond.join("rank-00001.flight.json"))
        )],
    );
    // Without a manifest the world is sized by the largest rank found.
    let alone = d.path().join("alone");
    write_flight(&alone, "rank-00001.flight.json", "1000000000000000");
    refused(
        &diagnose_limited(&alone),
        &[&format!(
            "{}: status.rank is 1000000000000000",
            path_str(&alone.join("rank-00001.flight.json"))
        )],
    );
    // A record under another rank's name.
    let misnamed = d.path().join("misnamed");
    write_manifest(&misnamed, "4");
    write_flight(&misnamed, "rank-00001.flight.json", "3");
    refused(&diagnose_limited(&misnamed), &["rank-00001.flight.json: status.rank is 3"]);
    // A study point's watchdog numbers ranks in the job that ran the study: rank 5 of
    // a launch of 8 is one of them, rank 8 is not.
    let point = d.path().join("point");
    write_manifest_launched(&point, "2", "8");
    write_flight(&point, "rank-00005.flight.json", "5");
    let job = diagnose_limited(&point);
    job.assert_ok();
    assert!(job.stdout.contains("rank 5 on node1"), "{}", job.stdout);
    write_flight(&point, "rank-00008.flight.json", "8");
    refused(
        &diagnose_limited(&point),
        &["rank-00008.flight.json: status.rank is 8: the run has ranks 0 to 7"],
    );
}

/// `ddpbench diagnose DIR`, killed after 20 s.
fn diagnose_quick(dir: &Path) -> Job {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["diagnose", &path_str(dir)]);
    run_with_limit(cmd, std::time::Duration::from_secs(20))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// A FIFO in place of a flight record or the manifest is named at once, never waited on:
/// a flight record is refused; without a readable manifest the records are diagnosed
/// alone, as without one.
#[test]
fn diagnose_names_special_files_and_never_waits_on_them() {
    let d = tmp();
    let flight = d.path().join("flight");
    write_manifest(&flight, "2");
    write_flight(&flight, "rank-00000.flight.json", "0");
    mkfifo(&flight.join("rank-00001.flight.json"));
    let job = diagnose_quick(&flight);
    assert!(!job.timed_out, "diagnose hung on a FIFO flight record");
    refused(&job, &[&path_str(&flight.join("rank-00001.flight.json")), "FIFO"]);

    let manifest = d.path().join("manifest");
    write_manifest(&manifest, "2");
    write_flight(&manifest, "rank-00000.flight.json", "0");
    mkfifo(&manifest.join("manifest.json"));
    let job = diagnose_quick(&manifest);
    assert!(!job.timed_out, "diagnose hung on a FIFO manifest");
    job.assert_ok();
    assert!(
        job.stderr.contains(&path_str(&manifest.join("manifest.json"))) && job.stderr.contains("FIFO"),
        "{}",
        job.stderr
    );
    assert!(job.stdout.contains("all-reduce #7"), "{}", job.stdout);
}
