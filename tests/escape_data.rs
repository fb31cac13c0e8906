//! Text from run data reaches the terminal with its control characters escaped and
//! report.md with its HTML escaped: a node type (`reduce`), a model in report.json
//! (`compare`), a host and a watchdog's message in a flight record (`diagnose`), each
//! planted with an OSC title, a clear-screen and a `<script>` tag.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What a hostile writer of run data plants.
const PLANTED: &str = "X\u{1b}]0;pwned\u{7}\u{1b}[2J<script>alert(1)</script>";

fn ddpbench(args: &[&str]) -> Job {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_with_limit(cmd, Duration::from_secs(120))
}

/// No escape character in `text`.
fn assert_no_escape(text: &str, what: &str) {
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{what} holds a control sequence: {text:?}"
    );
}

/// The fixture run `single-2r` at `to`, its node type replaced by [`PLANTED`].
fn planted_run(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/single/single-2r");
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().map(|e| e.unwrap()) {
        let text = std::fs::read_to_string(e.path()).unwrap();
        let planted = if e.file_name() == "manifest.json" {
            let quoted = serde_json::to_string(PLANTED).unwrap();
            text.replace("Intel(R) Xeon(R) Processor 2c 24GiB", quoted.trim_matches('"'))
        } else {
            text.replace("Intel(R) Xeon(R) Processor 2c 24GiB", PLANTED)
        };
        std::fs::write(to.join(e.file_name()), planted).unwrap();
    }
}

#[test]
fn reduce_and_compare_escape_planted_text() {
    let d = tmp();
    let run = d.path().join("single-2r");
    planted_run(&run);
    let out = d.path().join("report");
    let job = ddpbench(&["reduce", "--no-plots", "--out", &path_str(&out), &path_str(&run)]);
    job.assert_ok();
    assert!(
        job.stdout.contains("X\\x1b]0;pwned"),
        "the node type is not shown escaped: {}",
        job.stdout
    );
    assert_no_escape(&job.all(), "reduce's output");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(!md.contains("<script>"), "report.md carries raw HTML");
    assert!(md.contains("&lt;script&gt;"), "report.md lost the node type");
    assert_no_escape(&md, "report.md");
    // A model's name in report.json, as compare reads it.
    let path = out.join("report.json");
    let mut report = json(&path);
    for r in report["runs"].as_array_mut().unwrap() {
        r["model"] = PLANTED.into();
    }
    std::fs::write(&path, report.to_string()).unwrap();
    let cmp = d.path().join("cmp");
    let job = ddpbench(&["compare", &path_str(&out), &path_str(&out), "--out", &path_str(&cmp)]);
    job.assert_ok();
    assert!(job.stdout.contains("pwned"), "{}", job.stdout);
    assert_no_escape(&job.all(), "compare's output");
}

#[test]
fn diagnose_escapes_planted_hosts_and_messages() {
    let d = tmp();
    let dir = d.path().join("hung");
    std::fs::create_dir_all(&dir).unwrap();
    let planted = serde_json::to_string(PLANTED).unwrap();
    let manifest = r#"{"run_id":"hung","status":"failed","error":"hang","ddpbench_version":"0.1.0","libtorch_version":"2.11.0",
        "mpi_library":"x","command_line":[],"config":{},"model":"mnist-cnn","dataset":"fashion-mnist","dataset_source":"",
        "parameters":1,"gradient_bytes":4,"comm_backend":"mpi-cpu-staged","buckets":1,"world_size":2,"nodes":1,
        "batch_size_per_rank":64,"global_batch_size":128,"steps_per_epoch":10,"start_utc":"2026-11-01T00:00:00.000000Z",
        "end_utc":null,"wall_s":null,"final_param_l2":null,"final_val_accuracy":null,"allreduce_probe":null,"ranks":[]}"#;
    std::fs::write(dir.join("manifest.json"), manifest).unwrap();
    let flight = format!(
        r#"{{"status":{{"rank":0,"host":{planted},"pending":{{"seq":7,"kind":{planted},"detail":{planted},"epoch":0,
        "step":3,"state":"started","scheduled_s":1.0,"started_s":1.0,"completed_s":null}},"waited_s":30.0,
        "last_completed":6,"silent_s":0.0,"idle":false}},"message":{planted},"time_utc":"2026-11-01T00:01:00Z","records":[]}}"#
    );
    std::fs::write(dir.join("rank-00000.flight.json"), flight).unwrap();
    let job = ddpbench(&["diagnose", &path_str(&dir)]);
    job.assert_ok();
    assert!(job.stdout.contains("pwned"), "{}", job.stdout);
    assert_no_escape(&job.all(), "diagnose's output");
}
