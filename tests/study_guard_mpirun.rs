//! What a study refuses or warns of before its points run, on real `mpirun -n 2` jobs
//! (one node): `node_fill = "spread"` on one node, the dry run's time budget, and the
//! warnings a dry run passes on from its timing runs.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn study(file: &Path, out: &Path, extra: &[&str]) -> Job {
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("study").arg(file).arg("--out").arg(out).args(extra);
    run_with_limit(cmd, LIMIT)
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    file
}

const SPREAD: &str = r#"
name = "spread"
models = ["mnist-cnn"]
datasets = ["synthetic"]
synthetic_samples = 600
batch_sizes = [8]
ranks = [1, 2]
node_fill = "spread"
max_steps = 30
probe_iters = 0
"#;

/// A "1 vs 2 nodes" study on one node: refused when it runs (one message naming the
/// allocation, non-zero exit, no point run, no MPI_Abort); a dry run warns and goes on,
/// and `--budget-s 0` leaves every workload untimed, saying why.
#[test]
fn spread_on_one_node_is_refused_and_a_dry_run_only_warns() {
    let d = tmp();
    let file = write(d.path(), "spread", SPREAD);
    let out = d.path().join("study");
    let job = study(&file, &out, &[]);
    assert!(!job.ok() && !job.timed_out, "{}", job.all());
    let all = job.all();
    let named = "but the allocation has 1 node (";
    assert_eq!(all.matches(named).count(), 1, "one message:\n{all}");
    assert!(all.contains("sbatch -N 2") && all.contains("node_fill = \"pack\""), "{all}");
    assert!(!all.contains("MPI_ABORT was invoked"), "{all}");
    assert!(!out.join("runs").exists(), "no point ran");

    let dry = study(&file, &out, &["--dry-run", "--budget-s", "0"]);
    dry.assert_ok();
    assert!(dry.stdout.contains("warning: node_fill = \"spread\""), "{}", dry.stdout);
    assert!(dry.stdout.contains("a dry run only warns"), "{}", dry.stdout);
    assert!(dry.stdout.contains("not timed: --budget-s 0 spent"), "{}", dry.stdout);
    assert!(dry.stdout.contains("2 point(s) not estimated"), "{}", dry.stdout);
}

/// `--nodes 16 --ranks-per-node 4` plans the cluster's allocation from a 1-rank job:
/// its 64-rank point laid over 16 planned hosts, said to be planned, and the flags are
/// refused without --dry-run.
#[test]
fn a_dry_run_plans_a_cluster_allocation_from_one_rank() {
    let d = tmp();
    let file = write(
        d.path(),
        "wide",
        &SPREAD
            .replace("ranks = [1, 2]", "ranks = [1, 4, 64]")
            .replace("node_fill = \"spread\"\n", ""),
    );
    let out = d.path().join("study");
    let mut cmd = mpirun_cmd(1);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out);
    cmd.args(["--dry-run", "--budget-s", "0", "--nodes", "16", "--ranks-per-node", "4"]);
    let dry = run_with_limit(cmd, LIMIT);
    dry.assert_ok();
    let text = &dry.stdout;
    assert!(
        text.contains("planned for 16 node(s) × 4 rank(s) (--nodes, --ranks-per-node), not this job's 1 rank(s)"),
        "{text}"
    );
    let wide = text
        .lines()
        .find(|l| l.contains("-r64 "))
        .unwrap_or_else(|| panic!("no 64-rank point:\n{text}"));
    assert!(
        wide.contains("64 ranks 0-63") && wide.contains("node000,") && wide.contains("node015"),
        "{wide}"
    );
    assert!(text.contains("3 point(s) not estimated"), "{text}");
    assert!(!out.exists(), "a dry run writes no study folder");
    let mut cmd = mpirun_cmd(1);
    cmd.arg(BIN)
        .arg("study")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .args(["--nodes", "16", "--ranks-per-node", "4"]);
    let refused = run_with_limit(cmd, LIMIT);
    assert!(!refused.ok() && refused.all().contains("--dry-run"), "{}", refused.all());
}

/// The dry run's timing run trains with fp16 on CPU: its warning is shown with the
/// estimate; and each point of 3 steps (5 of them warm-up) is said to measure too few.
#[test]
fn a_dry_run_shows_fp16_on_cpu_and_too_few_measured_steps() {
    let d = tmp();
    let file = write(
        d.path(),
        "fp16",
        r#"
name = "fp16"
models = ["mnist-cnn"]
datasets = ["synthetic"]
synthetic_samples = 600
batch_sizes = [8]
ranks = [1, 2]
amp = "fp16"
max_steps = 3
probe_iters = 0
"#,
    );
    let dry = study(&file, &d.path().join("study"), &["--dry-run"]);
    dry.assert_ok();
    let text = &dry.stdout;
    assert_eq!(
        text.matches("  warning: --amp fp16 on CPU").count(),
        1,
        "once, for its workload:\n{text}"
    );
    assert_eq!(
        text.matches("warning: 0 measured step(s) per rank (3 in all, 5 of warm-up)")
            .count(),
        2,
        "for each point:\n{text}"
    );
    assert!(text.contains("estimate: about"), "{text}");
}

/// Each point binds its ranks anew: the CPUs a rank is compared with Slurm's allocation
/// by are those the launcher gave it, not the previous point's binding (the 1-rank
/// point binds rank 0 to half the cores; the 2-rank point must not call it starved).
#[test]
fn a_later_point_is_not_called_starved_by_an_earlier_points_binding() {
    let d = tmp();
    let file = write(
        d.path(),
        "cores",
        r#"
name = "cores"
models = ["mnist-cnn"]
datasets = ["synthetic"]
synthetic_samples = 600
batch_sizes = [8]
ranks = [1, 2]
max_steps = 3
warmup_steps = 1
min_measured_steps = 0
val_samples = 0
probe_iters = 0
"#,
    );
    let out = d.path().join("study");
    // Slurm's allocation: every CPU this machine has, which mpirun gives each rank.
    let cpus = std::thread::available_parallelism().unwrap().get().to_string();
    let mut cmd = mpirun_cmd_with_env(2, &[("SLURM_CPUS_PER_TASK", &cpus)]);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out);
    let job = run_with_limit(cmd, LIMIT);
    job.assert_ok();
    let manifests: Vec<serde_json::Value> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| json(&e.unwrap().path().join("manifest.json")))
        .collect();
    assert_eq!(manifests.len(), 2);
    for m in &manifests {
        assert_eq!(m["warnings"], serde_json::json!([]), "{}: {}", m["run_id"], m["warnings"]);
    }
    assert!(!job.all().contains("Slurm allocated"), "{}", job.all());
}
