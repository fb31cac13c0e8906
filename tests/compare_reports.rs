//! `ddpbench compare A B`: two reports of real runs side by side, their ratios
//! recomputed from both report.json files; a pair that shares no point refused naming
//! what differs; every bad input refused with one message, exit 2, nothing written.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const FIXTURE4: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/schema4-967f27a/runs");
const FIXTURE2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/schema2/single");

/// The flags of the schema-4 fixture's runs (its README), at 8 steps.
const ARGS: [&str; 16] = [
    "--model",
    "mnist-cnn",
    "--dataset",
    "synthetic",
    "--max-steps",
    "8",
    "--warmup-steps",
    "2",
    "--val-samples",
    "0",
    "--probe-iters",
    "3",
    "--batch-size",
    "16",
    "--threads",
    "1",
];

/// `reduce` of `runs` (copied into `dir/name-runs` first, so fixtures stay as they are)
/// into `dir/name`, without plots.
fn reduce_copy(dir: &Path, name: &str, runs: &[&Path]) -> std::path::PathBuf {
    let copies = dir.join(format!("{name}-runs"));
    std::fs::create_dir_all(&copies).unwrap();
    let mut args = vec!["reduce".to_string()];
    for r in runs {
        let to = copies.join(r.file_name().unwrap());
        let ok = Command::new("cp").arg("-r").arg(r).arg(&to).status().unwrap().success();
        assert!(ok, "cp {}", r.display());
        args.push(path_str(&to));
    }
    let out = dir.join(name);
    args.extend(["--out".into(), path_str(&out), "--no-plots".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ddpbench(&args).assert_ok();
    out
}

/// Two reports of the schema-4 fixtures (1 and 2 ranks, mnist-cnn on synthetic, batch
/// 16) and of the schema-2 fixtures (Fashion-MNIST, batch 32).
fn fixture_reports(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let f4 = Path::new(FIXTURE4);
    let f2 = Path::new(FIXTURE2);
    let a = reduce_copy(dir, "synthetic16", &[&f4.join("one"), &f4.join("two")]);
    let b = reduce_copy(dir, "fashion32", &[&f2.join("single-1r"), &f2.join("single-2r")]);
    (a, b)
}

fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// Per run of report.json at `ranks`: (samples_per_s, global_batch, backward_s).
fn runs_at(report: &serde_json::Value, ranks: u64) -> Vec<(f64, f64, f64)> {
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ranks"].as_u64() == Some(ranks))
        .map(|r| {
            (
                r["samples_per_s"].as_f64().unwrap(),
                r["global_batch"].as_f64().unwrap(),
                r["per_step"]["backward_s"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * y.abs().max(1.0)
}

#[test]
#[cfg_attr(not(feature = "train"), ignore = "trains its runs: needs the `train` feature")]
fn two_reports_of_real_runs_side_by_side_with_ratios_and_intervals() {
    let d = tmp();
    // Two repeats per side, each a real 2-rank run of the same settings.
    let mut reports = Vec::new();
    for side in ["a", "b"] {
        let mut runs = Vec::new();
        for k in 1..=2 {
            let out = d.path().join(format!("runs-{side}/r{k}"));
            let mut args: Vec<&str> = ARGS.to_vec();
            let o = path_str(&out);
            args.extend(["--out", &o]);
            train(2, &args, LIMIT).assert_ok();
            runs.push(out);
        }
        let out = d.path().join(format!("report-{side}"));
        let mut args = vec!["reduce".to_string()];
        args.extend(runs.iter().map(|r| path_str(r)));
        args.extend(["--out".into(), path_str(&out), "--no-plots".into()]);
        ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>()).assert_ok();
        reports.push(out);
    }
    let out = d.path().join("cmp");
    // A as its folder, B as its report.json: both forms are read.
    let job = ddpbench(&[
        "compare",
        &path_str(&reports[0]),
        &path_str(&reports[1].join("report.json")),
        "--out",
        &path_str(&out),
    ]);
    job.assert_ok();
    assert!(
        job.stdout
            .contains("The biggest difference is mnist-cnn on synthetic, 2 ranks × 16 per rank"),
        "{}",
        job.stdout
    );

    let (ja, jb) = (json(&reports[0].join("report.json")), json(&reports[1].join("report.json")));
    let (ra, rb) = (runs_at(&ja, 2), runs_at(&jb, 2));
    assert_eq!((ra.len(), rb.len()), (2, 2));
    let thr = |r: &[(f64, f64, f64)]| geomean(&r.iter().map(|x| x.0).collect::<Vec<_>>());
    let backward = |r: &[(f64, f64, f64)]| geomean(&r.iter().map(|x| x.2).collect::<Vec<_>>());
    let (h, rows) = read_csv(&out.join("compare.csv"));
    assert_eq!(rows.len(), 1, "one shared point: {rows:?}");
    let c = |name: &str| col(&h, &rows, name)[0];
    assert_eq!((c("ranks"), c("batch_per_rank"), c("runs_a"), c("runs_b")), (2.0, 16.0, 2.0, 2.0));
    assert!(close(c("samples_per_s_a"), thr(&ra)) && close(c("samples_per_s_b"), thr(&rb)));
    let ratio = thr(&rb) / thr(&ra);
    assert!(close(c("samples_per_s_ratio"), ratio), "{} vs {ratio}", c("samples_per_s_ratio"));
    // The step is the global batch over the geometric mean throughput: its ratio is the inverse.
    assert!(close(c("step_s_a"), ra[0].1 / thr(&ra)) && close(c("step_s_ratio"), 1.0 / ratio));
    // Phases are geometric means over the runs, like throughput.
    assert!(close(c("backward_s_ratio"), backward(&rb) / backward(&ra)));
    let text = |name: &str| rows[0][h.iter().position(|x| x == name).unwrap_or_else(|| panic!("no {name}"))].clone();
    // Two repeats on each side: an interval around each ratio, and the one direction rule
    // (a time's interval below 1 is B faster).
    for (stem, time) in [
        ("samples_per_s", false),
        ("step_s", true),
        ("forward_s", true),
        ("backward_s", true),
    ] {
        let r = c(&format!("{stem}_ratio"));
        let (low, high) = (c(&format!("{stem}_ratio_low")), c(&format!("{stem}_ratio_high")));
        assert!(low < r && r < high, "{stem}: {low} < {r} < {high}");
        let (faster, slower) = if time { (high < 1.0, low > 1.0) } else { (low > 1.0, high < 1.0) };
        let expected = if faster {
            "faster"
        } else if slower {
            "slower"
        } else {
            "within noise"
        };
        assert_eq!(text(&format!("{stem}_direction")), expected, "{stem}");
    }
    // The step is the global batch over throughput: its interval is throughput's inverted.
    assert!(close(c("step_s_ratio_low") * c("samples_per_s_ratio_high"), 1.0));
    assert!(!h.iter().any(|x| x == "speedup_ratio_low"), "a speedup has no value per run");
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(
        md.contains("| figure | A | B | B / A | 95 % interval of B / A | direction |"),
        "{md}"
    );
    // Each side's header names what it ran on: the fixtures' runs are on one CPU node.
    for side in ["A: `", "B: `"] {
        let line = md.lines().find(|l| l.starts_with(side)).unwrap_or_else(|| panic!("{md}"));
        assert!(
            line.contains("node type \"") && line.contains("device cpu") && line.contains("1 node(s) at most"),
            "{line}"
        );
        // And with what software, as the runs' manifests say.
        assert!(line.contains("versions ddpbench ") && line.contains(", libtorch "), "{line}");
    }
    assert!(
        job.stdout.lines().any(|l| l.starts_with("A: ") && l.contains("device cpu")),
        "{}",
        job.stdout
    );
    // Bus bandwidth reads in GB/s where a person reads it; compare.csv keeps bytes/s.
    let busbw = md
        .lines()
        .find(|l| l.starts_with("| bus bandwidth (GB/s) |"))
        .unwrap_or_else(|| panic!("{md}"));
    let shown: f64 = busbw.split('|').nth(2).unwrap().trim().parse().unwrap();
    // Printed to 4 decimals (3 digits past 1000): within half the last one.
    assert!((shown - c("busbw_bytes_per_s_a") / 1e9).abs() <= 5.1e-5, "{busbw}");
    assert!(
        job.stdout.contains("bus bandwidth (GB/s)") && !job.stdout.contains("(B/s)"),
        "{}",
        job.stdout
    );
    // A direction word stands only where the row's interval excludes 1.
    for line in md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| figure")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let (interval, direction) = (cells[4], cells[5]);
        if let Some((low, high)) = interval.split_once('–').filter(|_| interval != "–") {
            let (low, high): (f64, f64) = (low.parse().unwrap(), high.parse().unwrap());
            // Printed to 3 decimals: an end within rounding of 1 is not checked.
            if (low - 1.0).abs() > 1e-3 && (high - 1.0).abs() > 1e-3 {
                let holds_1 = low < 1.0 && high > 1.0;
                assert_eq!(direction == "within noise", holds_1, "{line}");
            }
        } else {
            assert_eq!(direction, "", "no interval, no direction: {line}");
        }
    }
}

#[test]
fn reports_of_other_settings_are_refused_naming_what_differs() {
    let d = tmp();
    let (a, b) = fixture_reports(d.path());
    let out = d.path().join("cmp");
    let job = ddpbench(&["compare", &path_str(&a), &path_str(&b), "--out", &path_str(&out)]);
    assert_eq!(job.status, Some(2), "{}", job.all());
    assert!(job.stderr.contains("not comparable"), "{}", job.stderr);
    assert!(
        job.stderr.contains("dataset (\"synthetic\" in A, \"fashion-mnist\" in B)"),
        "{}",
        job.stderr
    );
    assert!(job.stderr.contains("batch per rank (16 in A, 32 in B)"), "{}", job.stderr);
    assert!(!out.exists(), "nothing written");

    // The same report twice is comparable: without --out, ./compare, then ./compare-2.
    for expected in ["compare", "compare-2"] {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(d.path()).args(["compare", &path_str(&a), &path_str(&a)]);
        run_with_limit(cmd, Duration::from_secs(60)).assert_ok();
        let (h, rows) = read_csv(&d.path().join(expected).join("compare.csv"));
        assert_eq!(col(&h, &rows, "ranks"), vec![1.0, 2.0]);
        assert_eq!(col(&h, &rows, "samples_per_s_ratio"), vec![1.0, 1.0]);
        // One run per side: no interval, so no direction.
        assert_eq!(
            rows[0][h.iter().position(|x| x == "samples_per_s_direction").unwrap()],
            "no interval"
        );
        assert_eq!(rows[0][h.iter().position(|x| x == "step_s_direction").unwrap()], "no interval");
    }
}

#[test]
fn each_bad_input_is_one_message_exit_2_and_nothing_written() {
    let d = tmp();
    let (a, _) = fixture_reports(d.path());
    let good = std::fs::read_to_string(a.join("report.json")).unwrap();
    let bad = |name: &str, text: &str| {
        let dir = d.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("report.json"), text).unwrap();
        dir
    };
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let fifo = d.path().join("fifo");
    std::fs::create_dir(&fifo).unwrap();
    let ok = Command::new("mkfifo").arg(fifo.join("report.json")).status().unwrap().success();
    assert!(ok);
    let link = d.path().join("link");
    std::fs::create_dir(&link).unwrap();
    std::os::unix::fs::symlink(a.join("report.json"), link.join("report.json")).unwrap();
    let truncated = bad("truncated", &good[..good.len() / 2]);
    let newer = bad("newer", &good.replacen("\"report_version\": 2", "\"report_version\": 99", 1));
    let newer_schema = bad("newer-schema", &good.replacen("\"schema_version\": 4", "\"schema_version\": 99", 1));
    let wrong_type = bad("wrong-type", &good.replacen("\"ranks\": 1,", "\"ranks\": \"one\",", 1));
    let unversioned = bad("unversioned", &good.replacen("\"report_version\": 2,", "", 1));
    let taken = d.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("compare.md"), "mine").unwrap();

    let a_s = path_str(&a);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![a_s.clone()], "required arguments were not provided"),
        (vec![a_s.clone(), path_str(&empty)], "holds no report.json"),
        (vec![a_s.clone(), path_str(&d.path().join("absent"))], "does not exist"),
        (vec![a_s.clone(), path_str(&fifo)], "is a FIFO"),
        (vec![a_s.clone(), path_str(&link)], "is a symbolic link"),
        (vec![path_str(&truncated), a_s.clone()], "damaged or truncated"),
        (
            vec![a_s.clone(), path_str(&newer)],
            "report_version 99, written by a newer ddpbench",
        ),
        (vec![a_s.clone(), path_str(&newer_schema)], "schema 99, written by a newer ddpbench"),
        (vec![a_s.clone(), path_str(&wrong_type)], "expected usize"),
        (vec![a_s.clone(), path_str(&unversioned)], "has no report_version"),
        (vec![a_s.clone(), a_s.clone(), "--out".into(), path_str(&taken)], "exists already"),
    ];
    for (args, expected) in cases {
        let out = d.path().join("never");
        let mut full = vec!["compare".to_string()];
        full.extend(args.iter().cloned());
        if !args.contains(&"--out".to_string()) {
            full.extend(["--out".into(), path_str(&out)]);
        }
        let job = ddpbench(&full.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(job.status, Some(2), "{args:?}: {}", job.all());
        assert!(job.stderr.contains(expected), "{args:?}: {}", job.stderr);
        let errors = job
            .stderr
            .lines()
            .filter(|l| l.starts_with("Error") || l.starts_with("error"))
            .count();
        assert_eq!(errors, 1, "{args:?}: one message: {}", job.stderr);
        assert!(!out.exists(), "{args:?}: nothing written");
    }
    assert_eq!(std::fs::read_to_string(taken.join("compare.md")).unwrap(), "mine");
    assert_eq!(std::fs::read_dir(&taken).unwrap().count(), 1);
}
