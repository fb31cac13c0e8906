//! End to end: real `mpirun` runs at 1 and 2 ranks and a 2-rank run whose ranks
//! carry two node types, reduced together, the CSV files parsed back.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
// One intra-op thread everywhere: the 1-rank runs are then comparable with the 2-rank
// runs, whose ranks each have one core of this 2-core machine.
const ARGS: [&str; 12] = [
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
    "--threads",
    "1",
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
    // 1-rank references of each node type of that job.
    for t in ["fast-node", "slow-node"] {
        let o = out(t);
        let mut a: Vec<&str> = ARGS.to_vec();
        a.extend(["--out", &o, "--node-type", t]);
        train(1, &a, LIMIT).assert_ok();
    }

    let job = ddpbench(&["reduce", &path_str(d.path()), "--out", &path_str(d.path())]);
    job.assert_ok();
    assert!(
        job.stdout.contains("fast-node") && job.stdout.contains("slow-node"),
        "{}",
        job.stdout
    );

    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    assert_eq!(rows.len(), 5, "3 baselines, and each 2-rank run in weak scaling");
    let field = |row: &Vec<String>, c: &str| row[h.iter().position(|x| x == c).unwrap()].clone();
    let row = |id: &str| {
        rows.iter()
            .find(|r| field(r, "run_ids") == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    };
    for id in ["n1", "fast-node", "slow-node"] {
        assert_eq!(field(row(id), "scaling_mode"), "baseline");
    }
    assert_eq!(
        (field(row("n2"), "scaling_mode"), field(row("n2"), "baseline_run_ids")),
        ("weak".into(), "n1".into())
    );
    // A job on two node types is compared with a 1-rank run of each.
    let hetero = row("hetero");
    assert_eq!(field(hetero, "scaling_mode"), "weak");
    assert_eq!(field(hetero, "baseline_run_ids"), "fast-node slow-node");
    assert_eq!(field(hetero, "node_types"), "fast-node ×1 + slow-node ×1");
    let gate = field(hetero, "gating_node_type");
    assert!(gate == "fast-node" || gate == "slow-node");
    for r in &rows {
        assert_eq!(field(r, "steps"), "20", "25 steps minus 5 warm-up");
        let [speedup, eff, ranks] = [field(r, "speedup"), field(r, "efficiency"), field(r, "ranks")].map(|v| v.parse::<f64>().unwrap());
        assert!(speedup > 0.0 && (eff - speedup / ranks).abs() < 1e-6);
        if ranks == 2.0 {
            // Single runs: no run-to-run spread, so no interval and no direction; a lower
            // bound on the repeats a direction needs, from within-run noise.
            assert_eq!((field(r, "speedup_low"), field(r, "speedup_high")), (String::new(), String::new()));
            assert_eq!(field(r, "direction"), "no interval");
            let method = field(r, "interval_method");
            assert!(method.starts_with("none: one run per side"), "{method}");
            assert!(method.contains("at least") || method.contains("add repeats"), "{method}");
        }
    }
    let n2 = row("n2");
    let losses: f64 = [
        "loss_comm_samples_per_s",
        "loss_data_samples_per_s",
        "loss_straggler_samples_per_s",
        "loss_other_samples_per_s",
    ]
    .iter()
    .map(|c| field(n2, c).parse::<f64>().unwrap())
    .sum();
    let gap = field(n2, "ideal_samples_per_s").parse::<f64>().unwrap() - field(n2, "samples_per_s").parse::<f64>().unwrap();
    assert!((losses - gap).abs() <= 1e-6 * gap.abs().max(1.0), "waterfall {losses} vs {gap}");

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
    // The phases are one panel per model and batch per rank: phases-MODEL-bBATCH.
    let phases = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("phases-") && n.ends_with(".svg"))
        .expect("a phases-MODEL-bBATCH.svg panel");
    let phases = phases.trim_end_matches(".svg");
    for plot in ["speedup", "efficiency", phases, "bandwidth", "step_time_per_rank-hetero"] {
        let png = std::fs::read(d.path().join(format!("{plot}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(d.path().join(format!("{plot}.svg"))).unwrap();
        resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap();
    }
}

/// `train` writes the key of what ran into the manifest: the overlap in effect (`force`
/// sharing backward's core is neither `on` nor `off`), the threads bound, the backend
/// `auto` chose; the same key a manifest without it derives; and `reduce` keeps a
/// forced run and one without overlap apart.
#[test]
fn train_writes_the_key_of_what_ran_and_force_is_not_off() {
    use ddpbench::record::{ComparisonKey, Manifest};
    let d = tmp();
    let mut outs = Vec::new();
    for overlap in ["force", "off"] {
        let o = path_str(&d.path().join(overlap));
        let mut a: Vec<&str> = ARGS.to_vec();
        a.extend(["--out", &o, "--overlap", overlap, "--bucket-mb", "1"]);
        train(2, &a, LIMIT).assert_ok();
        outs.push(o);
    }
    let m = Manifest::read(&d.path().join("force")).unwrap();
    let key = m.comparison_key.clone().expect("a new manifest records its key");
    let json = serde_json::to_value(&key).unwrap();
    assert_eq!(
        (&json["overlap"], &json["threads"], &json["backend"], &json["device"]),
        (
            &serde_json::json!("force"),
            &serde_json::json!([1]),
            &serde_json::json!("mpi"),
            &serde_json::json!("cpu")
        ),
        "{json}"
    );
    assert!(
        m.comm.overlap_shares_core,
        "2 ranks of 1 thread on 2 cores: the all-reduce thread shares a core"
    );
    assert_eq!(
        ComparisonKey::derive(&m).unwrap(),
        key,
        "derived from the other fields, the key is the same"
    );
    let off = Manifest::read(&d.path().join("off")).unwrap();
    assert_eq!(serde_json::to_value(off.comparison_key.unwrap()).unwrap()["overlap"], "off");

    let job = ddpbench(&["reduce", "--no-plots", &path_str(d.path()), "--out", &path_str(d.path())]);
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    let ids = h.iter().position(|c| c == "run_ids").unwrap();
    let mut points: Vec<&str> = rows.iter().map(|r| r[ids].as_str()).collect();
    points.sort_unstable();
    assert_eq!(points, ["force", "off"], "two points, not two repeats of one");
}
