//! What makes runs comparable, end to end on real `mpirun` jobs: an environment variable
//! that changes a run is in its key (never pooled with runs without it), and the run
//! `reduce` says to add for a point without a reference is a command that, run as
//! written, gives the point its reference.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

/// A few small steps of mnist-cnn on synthetic data, no validation.
const SMALL: [&str; 16] = [
    "--model",
    "mnist-cnn",
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "512",
    "--max-steps",
    "6",
    "--warmup-steps",
    "1",
    "--val-samples",
    "0",
    "--probe-iters",
    "2",
    "--batch-size",
    "8",
];

/// `mpirun -n ranks ddpbench train SMALL extra --out out` with `env` exported to every rank.
fn train_with(ranks: usize, env: &[(&str, &str)], extra: &[&str], out: &Path) -> Job {
    let mut cmd = mpirun_cmd_with_env(ranks, env);
    cmd.arg(BIN).arg("train").args(SMALL).args(extra).arg("--out").arg(out);
    run_with_limit(cmd, Duration::from_secs(240))
}

/// `reduce --no-plots runs`: scaling.csv's header and rows.
fn scaling_of(runs: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    ddpbench(&["reduce", "--no-plots", &path_str(runs), "--out", &path_str(runs)]).assert_ok();
    read_csv(&runs.join("scaling.csv"))
}

/// The commands in backticks in `text`, in order.
fn commands(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(String::from).collect()
}

/// Runs `command` as `reduce` advised it (`[NAME=value ...] mpirun [-x NAME ...] -n 1
/// ddpbench train <flags>`), the binary under test for `ddpbench`, writing into `out`.
fn run_advised(command: &str, out: &Path) -> Job {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "mpirun")
        .unwrap_or_else(|| panic!("no mpirun in {command}"));
    let env: Vec<(&str, &str)> = words[..at].iter().map(|w| w.split_once('=').unwrap()).collect();
    let mut rest = &words[at + 1..];
    while rest.first() == Some(&"-x") {
        assert!(
            env.iter().any(|(n, _)| *n == rest[1]),
            "{command}: -x {} without its value",
            rest[1]
        );
        rest = &rest[2..];
    }
    assert_eq!(&rest[..4], ["-n", "1", "ddpbench", "train"], "{command}");
    let mut cmd = mpirun_cmd_with_env(1, &env);
    cmd.arg(BIN).arg("train").args(&rest[4..]).arg("--out").arg(out);
    run_with_limit(cmd, Duration::from_secs(240))
}

/// A forced overlap with two micro-batches per step, bf16 on the wire and a slowed rank
/// (a test hook): the run records the hook in its key, probes in bf16, and logs no
/// validation it did not run. `reduce` finds no reference and names two commands (weak,
/// strong); run as written, each makes the 1-rank run that is the point's reference.
#[test]
fn the_advised_commands_give_a_point_its_references() {
    let d = tmp();
    let runs = d.path().join("runs");
    let env = [("DDPBENCH_SLOW_FORWARD", "1:2")];
    let flags = [
        "--threads",
        "1",
        "--overlap",
        "force",
        "--bucket-mb",
        "1",
        "--grad-accum",
        "2",
        "--grad-dtype",
        "bf16",
    ];
    let job = train_with(2, &env, &flags, &runs.join("two"));
    job.assert_ok();
    assert!(
        !job.all().contains("val loss NaN") && job.all().contains("no validation (--val-samples 0)"),
        "{}",
        job.all()
    );
    let m = json(&runs.join("two/manifest.json"));
    assert_eq!(
        m["comparison_key"]["env"],
        serde_json::json!(["DDPBENCH_SLOW_FORWARD=1:2"]),
        "{}",
        m["comparison_key"]
    );
    for r in m["ranks"].as_array().unwrap() {
        assert_eq!(r["run_env"], serde_json::json!(["DDPBENCH_SLOW_FORWARD=1:2"]), "{r}");
    }
    // The probe puts the bytes training puts on the wire: bf16, 2 bytes a gradient.
    let (h, rows) = read_csv(&runs.join("two/rank-00000.csv"));
    let wire = col(&h, &rows, "bytes")[0];
    assert_eq!(wire, 2.0 * m["parameters"].as_f64().unwrap());
    assert_eq!(m["allreduce_probe"]["dtype"], "bf16", "{}", m["allreduce_probe"]);
    assert_eq!(m["allreduce_probe"]["bytes"].as_f64(), Some(wire));

    let (h, rows) = scaling_of(&runs);
    let at = |c: &str| h.iter().position(|x| x == c).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let advice = &rows[0][at("missing_reference")];
    let [weak, strong] = <[String; 2]>::try_from(commands(advice)).unwrap_or_else(|c| panic!("{c:?} in {advice}"));
    assert!(
        weak.contains(" --batch-size 8 ") && strong.contains(" --batch-size 16 "),
        "{advice}"
    );
    for (name, command) in [("weak-ref", &weak), ("strong-ref", &strong)] {
        run_advised(command, &runs.join(name)).assert_ok();
    }
    // A lone rank puts nothing on a wire.
    let (h1, rows1) = read_csv(&runs.join("weak-ref/rank-00000.csv"));
    assert!(col(&h1, &rows1, "bytes").iter().all(|&b| b == 0.0), "{rows1:?}");

    let (h, rows) = scaling_of(&runs);
    let at = |c: &str| h.iter().position(|x| x == c).unwrap();
    let compared: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r[at("run_ids")] == "two")
        .map(|r| (r[at("scaling_mode")].as_str(), r[at("baseline_run_ids")].as_str()))
        .collect();
    assert_eq!(compared, [("weak", "weak-ref"), ("strong", "strong-ref")], "{rows:?}");
}

/// Two 2-rank runs of one configuration, one with a rank slowed by a test hook: the hook
/// is recorded and in the key, so the two are two points, never repeats of one. Where the
/// all-reduce thread would share a rank's only core with its only compute thread, the
/// log does not advise `--threads 1`.
#[test]
fn a_run_changing_environment_is_recorded_and_never_pooled() {
    let d = tmp();
    let runs = d.path().join("runs");
    let plain = train_with(2, &[], &["--threads", "1"], &runs.join("plain"));
    plain.assert_ok();
    train_with(2, &[("DDPBENCH_SLOW_FORWARD", "1:2")], &["--threads", "1"], &runs.join("slowed")).assert_ok();
    let m = json(&runs.join("plain/manifest.json"));
    assert!(m["comparison_key"].get("env").is_none(), "{}", m["comparison_key"]);
    let (h, rows) = scaling_of(&runs);
    let at = |c: &str| h.iter().position(|x| x == c).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r[at("run_ids")].as_str()).collect();
    assert_eq!(ids.len(), 2, "{rows:?}");
    assert!(ids.contains(&"plain") && ids.contains(&"slowed"), "{ids:?}");
    let slowed = rows.iter().find(|r| r[at("run_ids")] == "slowed").unwrap();
    assert!(slowed[at("comparison")].ends_with(" env=DDPBENCH_SLOW_FORWARD=1:2"), "{slowed:?}");
    let log = plain.all();
    if log.contains("would share this rank's 1 core(s) with its 1 compute thread(s)") {
        assert!(
            !log.contains("(--threads 1)") && log.contains("give each rank a second core"),
            "{log}"
        );
    }
}
