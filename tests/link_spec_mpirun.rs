//! Planning a cluster from one node: `reduce --link SPEC` projects real 1-node runs
//! across nodes from a link's specification alone, writes the recommendation (its
//! sentence made of its table's figures), and bad specs are refused with the forms.

// tier: quiet (a measured step inside a projected band: job-scripts/run-tests.sh runs this file alone)

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const ARGS: [&str; 14] = [
    "--dataset",
    "synthetic",
    "--synthetic-samples",
    "2048",
    "--max-steps",
    "15",
    "--val-samples",
    "0",
    "--batch-size",
    "32",
    "--threads",
    "1",
    "--bucket-mb",
    "0.5",
];

/// The links of both levels given by specification, and the shape projected to.
const SPEC_LINKS: &[&str] = &["--link", "roce-100g", "--link-intra", "10GB/s,2us", "--project-shape", "4x2"];

/// The cells of the markdown table row of report.md that starts with `label`, in the
/// section after `after`.
fn row_cells(md: &str, after: &str, label: &str) -> Vec<String> {
    let section = &md[md.find(after).unwrap_or_else(|| panic!("no {after:?} in:\n{md}"))..];
    let line = section
        .lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{section}"));
    line.trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect()
}

#[test]
fn reduce_with_a_link_spec_projects_one_node_across_nodes_and_recommends_a_shape() {
    let d = tmp();
    let runs = d.path().join("runs");
    for (ranks, name) in [(1, "n1"), (2, "n2")] {
        let o = path_str(&runs.join(name));
        let mut a = ARGS.to_vec();
        a.extend(["--out", &o]);
        train(ranks, &a, LIMIT).assert_ok();
    }
    // Only specifications: no sweep at all.
    let out = path_str(&d.path().join("spec"));
    let runs_arg = path_str(&runs);
    let job = ddpbench(
        &[
            &["reduce", "--no-plots"],
            SPEC_LINKS,
            &["--price-per-gpu-hour", "2.5", "--out", &out, &runs_arg],
        ]
        .concat(),
    );
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("spec/projection.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let weak: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[at("scaling")] == "weak" && r[at("from_runs")] == "n2")
        .collect();
    let shapes: Vec<String> = weak
        .iter()
        .map(|r| format!("{}x{}", r[at("nodes")], r[at("ranks_per_node")]))
        .collect();
    assert_eq!(shapes, ["1x1", "1x2", "2x2", "4x2"], "the ladder of 4x2");
    let report = json(&d.path().join("spec/report.json"));
    let p = &report["projection"];
    let levels = p["levels"].to_string();
    assert!(
        levels.contains("inter-node nominal, from the specification roce-100g") && levels.contains("optimistic bound"),
        "{levels}"
    );
    assert!(levels.contains("intra-node nominal, from the specification 10GB/s,2us"), "{levels}");
    let recs = p["recommendations"].as_array().unwrap();
    let rec = recs.iter().find(|r| r["from_runs"] == "n2").unwrap_or_else(|| panic!("{recs:?}"));
    assert_eq!(rec["shapes"].as_array().unwrap().len(), 4);
    assert_eq!(rec["target_efficiency"], 0.8);
    assert_eq!(rec["nominal"], true);
    // One reference for every column: the 1-rank row (speedup 1), efficiency is speedup / ranks, and the epoch saved against the row above is
    // 1 − its speedup / this speedup, on every row.
    let shapes = rec["shapes"].as_array().unwrap();
    assert_eq!(shapes[0]["speedup"].as_f64(), Some(1.0), "{rec}");
    for w in shapes.windows(2) {
        let (before, this) = (w[0]["speedup"].as_f64().unwrap(), w[1]["speedup"].as_f64().unwrap());
        let saved = w[1]["epoch_saved_fraction"].as_f64().unwrap();
        assert!((saved - (1.0 - before / this)).abs() < 1e-9, "{w:?}");
        let eff = w[1]["efficiency"].as_f64().unwrap() * w[1]["ranks"].as_f64().unwrap();
        assert!((eff - this).abs() < 1e-9 * this, "{w:?}");
    }
    for s in rec["shapes"].as_array().unwrap() {
        // GPU-hours per epoch are ranks × epoch hours, the cost 2.5 per GPU-hour.
        let (ranks, epoch, gpuh) = (
            s["ranks"].as_f64().unwrap(),
            s["epoch_s"].as_f64().unwrap(),
            s["gpu_hours_per_epoch"].as_f64().unwrap(),
        );
        assert!((gpuh - ranks * epoch / 3600.0).abs() <= 1e-12 * gpuh.max(1.0), "{s}");
        assert!(
            (s["cost_per_epoch"].as_f64().unwrap() - 2.5 * gpuh).abs() <= 1e-12 * gpuh.max(1.0),
            "{s}"
        );
    }
    // The sentence is in report.md and on the terminal, and its figures are its table's.
    let sentence = rec["sentence"].as_str().unwrap();
    let md = std::fs::read_to_string(d.path().join("spec/report.md")).unwrap();
    assert!(md.contains(sentence) && job.stdout.contains(sentence), "{sentence}\n{md}");
    // The table follows its own sentence (the 1-rank run is a workload of its own).
    let heading = sentence;
    let label = |s: &serde_json::Value| format!("{} × {}", s["nodes"], s["ranks_per_node"]);
    let fastest = row_cells(&md, heading, &label(&rec["shortest_epoch"]));
    assert!(
        sentence.contains(&format!(
            "The shortest epoch is {} at {} ({} GPU-hours)",
            fastest[4], fastest[0], fastest[5]
        )),
        "{sentence}\n{fastest:?}"
    );
    if rec["keeps_target"].is_null() {
        assert!(sentence.contains("at no shape beyond 1 rank"), "{sentence}");
    } else {
        let keep = row_cells(&md, heading, &label(&rec["keeps_target"]));
        let words = format!(
            "up to {} ({} efficiency, {} per epoch, {} GPU-hours per epoch)",
            keep[0], keep[3], keep[4], keep[5]
        );
        assert!(sentence.contains(&words), "{sentence}\nwants {words}");
    }
    if let Some((_, rest)) = sentence.split_once("saves at most ") {
        let saved = rest.split(" of the epoch").next().unwrap();
        assert!(md.contains(&format!("| {saved} |")), "{saved} not in the table:\n{md}");
    }

    // One target for both: the per-shape answers under the projection's tables aim at
    // --target-efficiency, as the recommendation does (80 % by default, 37 % here).
    let aims_at = |md: &str, pct: &str| {
        let answers: Vec<&str> = md.lines().filter(|l| l.starts_with("- At ") && l.contains(" node(s) × ")).collect();
        assert!(!answers.is_empty(), "no per-shape answer in:\n{md}");
        answers.iter().all(|a| {
            [
                format!("at or above {pct}"),
                format!("{pct} needs a per-rank batch"),
                format!("reaches {pct}"),
            ]
            .iter()
            .any(|w| a.contains(w.as_str()))
        })
    };
    assert!(aims_at(&md, "80 %"), "{md}");
    let out3 = path_str(&d.path().join("target"));
    let job = ddpbench(
        &[
            &["reduce", "--no-plots"],
            SPEC_LINKS,
            &["--target-efficiency", "0.37", "--out", &out3, &runs_arg],
        ]
        .concat(),
    );
    job.assert_ok();
    let md3 = std::fs::read_to_string(d.path().join("target/report.md")).unwrap();
    assert!(aims_at(&md3, "37 %"), "{md3}");
    let recs = json(&d.path().join("target/report.json"))["projection"]["recommendations"].clone();
    let rec3 = recs.as_array().unwrap().iter().find(|r| r["from_runs"] == "n2").unwrap().clone();
    assert_eq!(rec3["target_efficiency"], 0.37);
    assert!(rec3["sentence"].as_str().unwrap().contains("≥ 37 % efficiency"), "{rec3}");

    // Two fabrics side by side, and the decision phrased as a target and a budget.
    let out4 = path_str(&d.path().join("fabrics"));
    let job = ddpbench(&[
        "reduce",
        "--no-plots",
        "--link",
        "roce-100g",
        "--link",
        "ib-ndr,efficiency=0.9",
        "--link-intra",
        "10GB/s,2us",
        "--project-shape",
        "4x2",
        "--epoch-time-target",
        "1h",
        "--gpu-hour-budget",
        "1",
        "--out",
        &out4,
        &runs_arg,
    ]);
    job.assert_ok();
    let report = json(&d.path().join("fabrics/report.json"));
    let recs: Vec<&serde_json::Value> = report["projection"]["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["from_runs"] == "n2")
        .collect();
    let links: Vec<&str> = recs.iter().map(|r| r["link"].as_str().unwrap()).collect();
    assert!(
        links.len() == 2 && links[0].starts_with("roce-100g") && links[1].starts_with("ib-ndr"),
        "{links:?}"
    );
    let (h, rows) = read_csv(&d.path().join("fabrics/projection.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    for link in ["roce-100g", "ib-ndr,efficiency=0.9"] {
        let four = rows
            .iter()
            .find(|r| r[at("link")] == link && r[at("scaling")] == "weak" && r[at("nodes")] == "4")
            .unwrap_or_else(|| panic!("no 4-node row on {link}"));
        let f = |c: &str| four[at(c)].parse::<f64>().unwrap();
        // The expected all-reduce is never faster than the line rate; the band holds the
        // step, its optimistic end never below the bound.
        assert!(
            f("comm_s") >= f("comm_bound_s") && f("step_low_s") <= f("step_s") && f("step_s") <= f("step_high_s"),
            "{four:?}"
        );
        assert!(four[at("link_basis")].contains("nominal"), "{four:?}");
    }
    let md = std::fs::read_to_string(d.path().join("fabrics/report.md")).unwrap();
    assert!(
        md.contains("### Fabrics side by side: ") && md.contains("| ib-ndr,efficiency=0.9 (50.000 GB/s"),
        "{md}"
    );
    for r in &recs {
        let sentence = r["sentence"].as_str().unwrap();
        assert_eq!(r["epoch_time_target_s"], 3600.0, "{r}");
        assert!(
            sentence.contains("epoch-time target of") || sentence.contains("meets the target of"),
            "{sentence}"
        );
        assert!(
            sentence.contains("within the budget of 1") && sentence.contains(" GPU-hours per epoch is "),
            "{sentence}"
        );
    }

    // With a sweep on the one node: its intra-node level is measured, the inter-node nominal.
    let sw = path_str(&runs.join("sweep"));
    let mut cmd = mpirun_cmd(2);
    cmd.args([
        BIN,
        "allreduce",
        "--max-bytes",
        "4M",
        "--iters",
        "5",
        "--budget-s",
        "0.3",
        "--out",
        &sw,
    ]);
    run_with_limit(cmd, LIMIT).assert_ok();
    let out2 = path_str(&d.path().join("swept"));
    let job = ddpbench(&["reduce", "--no-plots", "--link", "100Gbit/s,5us", "--out", &out2, &path_str(&runs)]);
    job.assert_ok();
    let levels = json(&d.path().join("swept/report.json"))["projection"]["levels"].to_string();
    assert!(
        levels.contains("intra-node measured by `ddpbench allreduce`") && levels.contains("inter-node nominal"),
        "{levels}"
    );
    let (h, rows) = read_csv(&d.path().join("swept/projection.csv"));
    let nodes = h.iter().position(|c| c == "nodes").unwrap();
    assert!(rows.iter().any(|r| r[nodes] != "1"), "projected across nodes from one node");
}

#[test]
fn bad_link_specs_shapes_targets_and_prices_are_refused_before_anything_is_written() {
    let d = tmp();
    let out = d.path().join("out");
    let o = path_str(&out);
    let runs = path_str(d.path());
    for (flag, value, says) in [
        ("--link", "fast", "'fast' is no preset"),
        ("--link", "100Gbit", "'100Gbit' has no latency"),
        ("--link", "-5Gbit/s,5us", "a bandwidth is above 0"),
        ("--link", "0GB/s,1us", "a bandwidth is above 0"),
        ("--link", "10GB/s,2s", "a latency lies from 0 to 1 s"),
        ("--link", "ib-xdr", "'ib-xdr' is no preset"),
        ("--link-intra", "fast", "'fast' is no preset"),
        ("--project-shape", "16", "NODESxRANKS_PER_NODE"),
        ("--project-shape", "0x4", "NODESxRANKS_PER_NODE"),
        ("--target-efficiency", "0", "above 0 and at most 1"),
        ("--target-efficiency", "1.5", "above 0 and at most 1"),
        ("--project-shape", "-2x4", "NODESxRANKS_PER_NODE"),
        ("--target-efficiency", "-0.5", "above 0 and at most 1"),
        ("--price-per-gpu-hour", "-1", "a number from 0"),
        ("--link", "100Gbit/s,5us,efficiency=0", "no fraction of line rate"),
        ("--link", "roce-100g,efficiency=1.5", "no fraction of line rate"),
        ("--link", "100Gbit/s,5us,efficiency=NaN", "no fraction of line rate"),
        ("--epoch-time-target", "0", "is no epoch time"),
        ("--epoch-time-target", "-5min", "is no epoch time"),
        ("--epoch-time-target", "soon", "is no epoch time"),
        ("--epoch-time-target", "nan", "is no epoch time"),
        ("--gpu-hour-budget", "0", "is no GPU-hour budget"),
        ("--gpu-hour-budget", "-2", "is no GPU-hour budget"),
        ("--gpu-hour-budget", "inf", "is no GPU-hour budget"),
    ] {
        let job = ddpbench(&["reduce", flag, value, "--out", &o, &runs]);
        let err = &job.stderr;
        assert_eq!(job.status, Some(2), "{flag} {value}: {}", job.all());
        assert!(err.contains(says), "{flag} {value}: {err}");
        assert_eq!(err.matches("error:").count(), 1, "one message: {err}");
        if flag.starts_with("--link") {
            assert!(err.contains("BANDWIDTH,LATENCY") && err.contains("eth-10g, eth-25g"), "{err}");
        }
        assert!(!out.exists(), "{flag} {value}: something was written");
    }
}

/// projection.csv's weak row at 1 × `ranks` under `dir`, as column name → cell.
fn weak_row(dir: &std::path::Path, ranks: usize) -> std::collections::BTreeMap<String, String> {
    let (h, rows) = read_csv(&dir.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let row = rows
        .iter()
        .find(|r| r[at("scaling")] == "weak" && r[at("nodes")] == "1" && r[at("ranks")] == ranks.to_string())
        .unwrap_or_else(|| panic!("no weak 1 x {ranks} row in {rows:?}"));
    h.iter().cloned().zip(row.iter().cloned()).collect()
}

fn num(row: &std::collections::BTreeMap<String, String>, c: &str) -> f64 {
    row[c].parse().unwrap_or_else(|_| panic!("{c}={:?} in {row:?}", row[c]))
}

#[test]
fn a_study_with_one_busy_repeat_projects_from_every_repeat_and_its_1_rank_row_holds_the_measured_step() {
    // Two 1-rank repeats, and three 2-rank repeats of which the last ran on a "busy
    // machine": every rank sleeps 15 ms in every forward pass, a delay the comparison key
    // leaves out, so the slow run is a repeat of the quiet ones.
    let d = tmp();
    let busy = [("DDPBENCH_TEST_BUSY_FORWARD", "15")];
    let launches: [(usize, &str, &[(&str, &str)]); 5] = [
        (1, "one/r1-0", &[]),
        (1, "one/r1-1", &[]),
        (2, "quiet/r2-0", &[]),
        (2, "quiet/r2-1", &[]),
        (2, "busy/r2-busy", &busy),
    ];
    for (ranks, name, env) in launches {
        let o = path_str(&d.path().join(name));
        // One comparison key at 1 and 2 ranks (the defaults of overlap and slots follow
        // the rank count), and enough steps for a point to claim a direction.
        let mut a: Vec<&str> = ARGS.iter().copied().filter(|x| *x != "--max-steps" && *x != "15").collect();
        a.extend(["--overlap", "off", "--node-slots", "2", "--max-steps", "30", "--out", &o]);
        let mut cmd = mpirun_cmd_with_env(ranks, env);
        cmd.arg(BIN).arg("train").args(&a);
        run_with_limit(cmd, LIMIT).assert_ok();
    }
    let reduce_into = |out: &str, inputs: &[&str]| {
        let folder = d.path().join(out);
        let out = path_str(&folder);
        let inputs: Vec<String> = inputs.iter().map(|i| path_str(&d.path().join(i))).collect();
        let mut a = vec![
            "reduce",
            "--no-plots",
            "--link",
            "roce-100g",
            "--link-intra",
            "10GB/s,2us",
            "--out",
            &out,
        ];
        a.extend(inputs.iter().map(String::as_str));
        ddpbench(&a).assert_ok();
        folder
    };
    let measured = reduce_into("measured", &["one", "quiet", "busy"]);
    let all = reduce_into("all", &["quiet", "busy"]);
    let quiet = reduce_into("quiet-only", &["quiet"]);
    // Every repeat of the 2-rank point stands behind the projection, the busy one too.
    let two = weak_row(&all, 2);
    assert_eq!(two["from_repeats"], "3", "{two:?}");
    for id in ["r2-0", "r2-1", "r2-busy"] {
        assert!(two["from_runs"].split(' ').any(|r| r == id), "{id} not in {two:?}");
    }
    // The busy repeat was slower, by structure: every rank slept 15 ms in every forward pass.
    let (h, rows) = read_csv(&d.path().join("busy/r2-busy/rank-00000.csv"));
    assert!(!rows.is_empty() && h.iter().any(|c| c == "forward_s"), "{h:?}");
    let slept: Vec<f64> = col(&h, &rows, "forward_s");
    assert!(slept.iter().all(|s| *s >= 0.015), "every forward slept 15 ms: {slept:?}");
    // Projected from the three repeats, the 1-rank row holds the measured 1-rank step.
    let single = weak_row(&all, 1);
    assert_eq!(single["step_basis"], "projected", "{single:?}");
    let one = weak_row(&measured, 1);
    assert_eq!(one["step_basis"], "measured", "{one:?}");
    let step = num(&one, "step_s");
    eprintln!(
        "measured 1-rank {step} s; projected from 3 repeats {} s ({}–{} s); from the 2 quiet ones {} s",
        single["step_s"],
        single["step_low_s"],
        single["step_high_s"],
        weak_row(&quiet, 1)["step_s"]
    );
    assert!(
        num(&single, "step_low_s") <= step && step <= num(&single, "step_high_s"),
        "measured 1-rank step {step} s outside the projected band: {single:?}"
    );
    // The busy repeat moves the projected 1-rank step by less than the band's half-width.
    let without = weak_row(&quiet, 1);
    let moved = (num(&single, "step_s") - num(&without, "step_s")).abs();
    let half = (num(&single, "step_high_s") - num(&single, "step_low_s")) / 2.0;
    assert!(moved < half, "moved {moved} s, half-width {half} s: {single:?} {without:?}");
}
