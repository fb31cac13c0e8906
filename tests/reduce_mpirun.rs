//! End to end: real `mpirun` runs at 1 and 2 ranks and a 2-rank run whose ranks
//! carry two node types, reduced together, the CSV files parsed back.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const ARGS: [&str; 10] = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "4096",
    "--max-steps",
    "25",
    "--val-samples",
    "0",
    "--batch-size",
    "32",
];

#[test]
fn scaling_across_real_runs_with_two_node_types() {
    let d = tmp();
    let out = |n: &str| path_str(&d.path().join(n));
    let mut a: Vec<&str> = ARGS.to_vec();
    let o1 = out("n1");
    a.extend(["--out", &o1]);
    train(1, &a, LIMIT).assert_ok();
    let mut a: Vec<&str> = ARGS.to_vec();
    let o2 = out("n2");
    a.extend(["--out", &o2]);
    train(2, &a, LIMIT).assert_ok();
    // MPMD: one rank labelled "fast-node", one "slow-node" (as V100 and A40 nodes in one job).
    let o3 = out("hetero");
    let mut cmd = mpirun_cmd(1);
    cmd.args([BIN, "train"]).args(ARGS).args(["--out", &o3, "--node-type", "fast-node"]);
    cmd.args([":", "-n", "1", BIN, "train"])
        .args(ARGS)
        .args(["--out", &o3, "--node-type", "slow-node"]);
    run_with_limit(cmd, LIMIT).assert_ok();

    let job = ddpbench(&["reduce", &path_str(d.path())]);
    job.assert_ok();
    assert!(
        job.stdout.contains("fast-node") && job.stdout.contains("slow-node"),
        "{}",
        job.stdout
    );

    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    assert_eq!(rows.len(), 3);
    let field = |row: &Vec<String>, c: &str| row[h.iter().position(|x| x == c).unwrap()].clone();
    for row in &rows {
        assert_eq!(field(row, "baseline_run_id"), "n1", "the 1-rank run is the default baseline");
        let expected_mode = if field(row, "run_id") == "n1" { "baseline" } else { "weak" };
        assert_eq!(field(row, "scaling_mode"), expected_mode);
        assert_eq!(field(row, "steps"), "20", "25 steps minus 5 warm-up");
    }
    let speedup = col(&h, &rows, "speedup");
    let eff = col(&h, &rows, "efficiency");
    let ranks = col(&h, &rows, "ranks");
    for i in 0..3 {
        assert!(speedup[i] > 0.0 && (eff[i] - speedup[i] / ranks[i]).abs() < 1e-6);
        if ranks[i] == 2.0 {
            let lo = field(&rows[i], "speedup_ci_low").parse::<f64>().unwrap();
            let hi = field(&rows[i], "speedup_ci_high").parse::<f64>().unwrap();
            assert!(lo <= speedup[i] * 1.0001 && speedup[i] <= hi * 1.0001, "{lo} {} {hi}", speedup[i]);
            let losses: f64 = [
                "loss_comm_samples_per_s",
                "loss_data_samples_per_s",
                "loss_straggler_samples_per_s",
                "loss_other_samples_per_s",
            ]
            .iter()
            .map(|c| field(&rows[i], c).parse::<f64>().unwrap())
            .sum();
            let gap = col(&h, &rows, "ideal_samples_per_s")[i] - col(&h, &rows, "samples_per_s")[i];
            assert!((losses - gap).abs() <= 1e-6 * gap.abs().max(1.0), "waterfall {losses} vs {gap}");
        }
    }
    let hetero = rows.iter().find(|r| field(r, "run_id") == "hetero").unwrap();
    assert_eq!(field(hetero, "node_types"), "2");
    let gate = field(hetero, "gating_node_type");
    assert!(gate == "fast-node" || gate == "slow-node");

    let (h, rows) = read_csv(&d.path().join("summary.csv"));
    let of_run: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == "hetero").collect();
    assert_eq!(of_run.len(), 2, "one summary row per node type");
    let gi = h.iter().position(|c| c == "gating").unwrap();
    assert_eq!(of_run.iter().filter(|r| r[gi] == "1").count(), 1, "exactly one type gates");
    let bi = h.iter().position(|c| c == "busbw_bytes_per_s").unwrap();
    let pi = h.iter().position(|c| c == "probe_busbw_bytes_per_s").unwrap();
    for r in &of_run {
        assert!(r[bi].parse::<f64>().unwrap() > 0.0 && r[pi].parse::<f64>().unwrap() > 0.0);
    }
    for plot in ["speedup", "efficiency", "phases", "bandwidth", "step_time_per_rank-hetero"] {
        let png = std::fs::read(d.path().join(format!("{plot}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(d.path().join(format!("{plot}.svg"))).unwrap();
        resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap();
    }
}
