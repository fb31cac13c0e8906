//! `reduce` on run folders the schema-2 binary wrote (`tests/fixtures/schema2/`, made as
//! its README says), against the files that binary's own `reduce` wrote from them
//! (`expected/`): every cell of summary.csv, scaling.csv, ranks.csv and projection.csv
//! must stay as it was, numbers to 1e-9 relative, text exactly. A change to how
//! `reduce` is built must move no figure.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2")
}

/// Run folders and a sweep written by the binary just before schema 3.
fn fixtures_94331d7() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2-94331d7")
}

/// Compares two CSV files cell by cell; returns every difference, named.
/// projection.csv's projected figures (not measured ones, not the shape).
const PROJECTED: [&str; 11] = [
    "step_s",
    "step_low_s",
    "step_high_s",
    "samples_per_s",
    "speedup",
    "efficiency",
    "own_work_s",
    "comm_s",
    "comm_exposed_s",
    "error_pct",
    "algorithm",
];

/// scaling.csv's interval and the laws stated with it: since issue 35 a t-interval on
/// log throughput (none from one run per side), and serial fractions only with an
/// interval. Checked in reduce_fixtures and the interval's own tests.
const INTERVAL: [&str; 8] = [
    "speedup_low",
    "speedup_high",
    "interval_method",
    "within_noise",
    "karp_flatt",
    "amdahl_serial_fraction",
    "amdahl_speedup",
    "gustafson_serial_fraction",
];

/// scaling.csv's figures of the point estimate: since issue 35 the geometric mean over
/// repeats where it was their arithmetic mean (the mean step too, one estimator per
/// table), so they move only for points of repeats (or against a reference of repeats),
/// by no more than the two means differ.
const ESTIMATE: [&str; 5] = ["step_s_mean", "samples_per_s", "speedup", "efficiency", "ideal_samples_per_s"];
const LOSSES: [&str; 4] = [
    "loss_comm_samples_per_s",
    "loss_data_samples_per_s",
    "loss_straggler_samples_per_s",
    "loss_other_samples_per_s",
];

fn differences(name: &str, got: &Path, want: &Path) -> Vec<String> {
    let (gh, grows) = read_csv(got);
    let (wh, wrows) = read_csv(want);
    // Columns added since the fixture was made are new figures, not moved ones; every
    // column the fixture has must still be there.
    // Since issue 47 a projection stands on every repeat of its reference point:
    // `from_run` became `from_runs`, the point's runs.
    let renamed = |c: &str| if c == "from_run" { "from_runs".to_string() } else { c.to_string() };
    let Some(at): Option<Vec<usize>> = wh.iter().map(|c| gh.iter().position(|g| *g == renamed(c))).collect() else {
        return vec![format!("{name}: header {gh:?} lacks a column of {wh:?}")];
    };
    if grows.len() != wrows.len() {
        return vec![format!("{name}: {} rows, expected {}", grows.len(), wrows.len())];
    }
    let ranks_at = gh.iter().position(|c| c == "ranks");
    let run_at = gh.iter().position(|c| c == "run_id");
    let rows_of = |run: &str| run_at.map_or(0, |r| grows.iter().filter(|g| g[r] == run).count());
    let mut out = Vec::new();
    for (i, (g, w)) in grows.iter().zip(&wrows).enumerate() {
        for (c, b) in w.iter().enumerate() {
            let a = &g[at[c]];
            if wh[c] == "schema_version" {
                if a != &ddpbench::record::SCHEMA_VERSION.to_string() {
                    out.push(format!("{name} row {} schema_version: {a:?}", i + 1));
                }
                continue;
            }
            // A 1-rank run all-reduces with nobody: since issue 25 it has no R and no
            // arrival order (empty), where the older binary printed numbers.
            // ranks.csv has a row per rank of a run: one row, one rank.
            let one_rank = match ranks_at {
                Some(r) => g[r] == "1",
                None => run_at.is_some_and(|r| rows_of(&g[r]) == 1),
            };
            // Every communication figure of a lone rank is now empty too: its
            // transfer, its share of the step and what others wait for it, and in
            // projection.csv the measured all-reduce at 1 rank.
            const ALONE_EMPTY: [&str; 8] = [
                "compute_comm_ratio",
                "last_arrival_share",
                "comm_exposed_share",
                "comm_transfer_s_median",
                "comm_exposed_transfer_s_mean",
                "caused_wait_s_mean",
                "measured_comm_s",
                "measured_comm_exposed_s",
            ];
            if one_rank && ALONE_EMPTY.contains(&wh[c].as_str()) {
                if !a.is_empty() {
                    out.push(format!("{name} row {} column {}: {a:?}, expected empty for 1 rank", i + 1, wh[c]));
                }
                continue;
            }
            // The run to add is now the exact command, not a description.
            if wh[c] == "missing_reference" && !b.is_empty() {
                if !a.contains(" weak: `mpirun -n 1 ddpbench train ") {
                    out.push(format!("{name} row {} missing_reference: {a:?}, expected a command", i + 1));
                }
                continue;
            }
            // The exposed all-reduce projection.csv measures no longer holds the wait for
            // a late rank (now its own term, measured_wait_s).
            if name == "projection.csv" && wh[c] == "measured_comm_exposed_s" {
                continue;
            }
            // Issue 25 changed how a step is projected (own work as the step's common part
            // plus a straggler term; speedup against the measured 1-rank run): the projected
            // figures are checked in reduce_fixtures; here the shapes and what was measured
            // must not move.
            if name == "projection.csv" && PROJECTED.contains(&wh[c].as_str()) {
                continue;
            }
            if wh[c] == "from_run" {
                if !a.split(' ').any(|id| id == b) {
                    out.push(format!("{name} row {} from_runs: {a:?} lacks {b:?}", i + 1));
                }
                continue;
            }
            // Since issue 47 the measured figures of projection.csv are geometric means
            // over a shape's repeats, as scaling.csv's are, where they were arithmetic:
            // they move only for shapes of repeats, by no more than the two means differ.
            if name == "projection.csv" && wh[c].starts_with("measured_") {
                let (x, y) = (a.parse::<f64>().unwrap_or(f64::NAN), b.parse::<f64>().unwrap_or(f64::NAN));
                if !(a == b || (x - y).abs() <= 0.05 * y.abs()) {
                    out.push(format!("{name} row {} column {}: {a:?}, more than 5 % from {b:?}", i + 1, wh[c]));
                }
                continue;
            }
            if name == "scaling.csv" && INTERVAL.contains(&wh[c].as_str()) {
                continue;
            }
            let cell = |col: &str| wh.iter().position(|x| x == col).map_or("", |i| w[i].as_str());
            let of_repeats = cell("repeats") != "1" || !["0", "1"].contains(&cell("baseline_repeats"));
            if name == "scaling.csv" && of_repeats && LOSSES.contains(&wh[c].as_str()) {
                continue;
            }
            if name == "scaling.csv" && of_repeats && ESTIMATE.contains(&wh[c].as_str()) {
                let (x, y) = (a.parse::<f64>().unwrap_or(f64::NAN), b.parse::<f64>().unwrap_or(f64::NAN));
                if !((x - y).abs() <= 0.05 * y.abs()) {
                    out.push(format!("{name} row {} column {}: {a:?}, more than 5 % from {b:?}", i + 1, wh[c]));
                }
                continue;
            }
            // Schema 4 names the MPI all-reduce `mpi` where the key said `mpi-cpu-staged`;
            // a key now holds only the fields its model reads (mnist-cnn takes
            // no tokens: no seq_len, no vocab_size).
            let b = &b.replace("backend=mpi-cpu-staged", "backend=mpi");
            let b = &if wh[c] == "comparison" {
                b.split(' ')
                    .filter(|t| !t.starts_with("seq_len=") && !t.starts_with("vocab_size="))
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                b.clone()
            };
            let same = match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * y.abs().max(1e-300) || (x - y).abs() <= 5.000001e-10 || x == y,
                _ => a == b,
            };
            if !same {
                out.push(format!("{name} row {} column {}: {a:?}, expected {b:?}", i + 1, wh[c]));
            }
        }
    }
    out
}

/// Reduces the run folders `runs` of fixture `f` with its sweep into a new folder and
/// asserts that no cell of the four CSV files moved from `f/expected`; returns the folder.
fn reduce_and_compare(f: &Path, runs: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let d = tmp();
    let out = d.path().join("report");
    let mut args = vec!["reduce".to_string(), "--no-plots".into()];
    args.extend(runs.iter().map(|r| path_str(&f.join(r))));
    args.extend(["--interconnect".into(), path_str(&f.join("sweep")), "--out".into(), path_str(&out)]);
    ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>()).assert_ok();
    let mut all = Vec::new();
    for file in ["summary.csv", "scaling.csv", "ranks.csv", "projection.csv"] {
        all.extend(differences(file, &out.join(file), &f.join("expected").join(file)));
    }
    assert!(all.is_empty(), "{} cell(s) moved:\n{}", all.len(), all.join("\n"));
    (d, out)
}

#[test]
fn reduce_on_schema2_fixtures_moves_no_figure() {
    let (_d, out) = reduce_and_compare(&fixtures(), &["single", "study/runs"]);
    // The fixtures hold what the comparison must cover: 11 runs, 4 points (a baseline of
    // 3 repeats, weak and strong points, a 1-rank run of another thread count).
    let (h, rows) = read_csv(&out.join("scaling.csv"));
    assert_eq!(rows.len(), 4);
    assert_eq!(col(&h, &rows, "repeats").iter().sum::<f64>(), 11.0);
    // Their manifests recorded the transformer fields for mnist-cnn; its key holds neither.
    let at = h.iter().position(|c| c == "comparison").unwrap();
    for r in &rows {
        assert!(!r[at].contains("seq_len") && !r[at].contains("vocab_size"), "{}", r[at]);
    }
}

/// The folders of the binary before schema 3 (`elapsed_s`, `comm_start_s`,
/// `comm_last_start_s`, `rank0_elapsed_s`; a comparison key in the manifest) reduce to
/// the figures that binary's own reduce wrote.
#[test]
fn reduce_on_the_last_schema2_fixtures_moves_no_figure() {
    let (_d, out) = reduce_and_compare(&fixtures_94331d7(), &["single"]);
    let (h, rows) = read_csv(&out.join("summary.csv"));
    assert_eq!(rows.len(), 2);
    // Clock offsets read from rank0_elapsed_s: the 2-rank run has a measured wait.
    assert!(col(&h, &rows, "comm_wait_s_mean").iter().all(|w| w.is_finite()));
}

/// report.json is the report written whole: its top-level shape, and the same figures as
/// the CSV files written from it.
#[test]
fn report_json_holds_what_the_files_show() {
    let f = fixtures();
    let d = tmp();
    let out = d.path().join("report");
    let job = ddpbench(&[
        "reduce",
        "--no-plots",
        &path_str(&f.join("single")),
        &path_str(&f.join("study/runs")),
        "--interconnect",
        &path_str(&f.join("sweep")),
        "--out",
        &path_str(&out),
    ]);
    job.assert_ok();
    let r = json(&out.join("report.json"));
    let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    for k in [
        "report_version",
        "schema_version",
        "folders",
        "runs",
        "summary",
        "ranks",
        "scaling",
        "workloads",
        "findings",
        "projection",
        "incomplete",
        "skipped",
    ] {
        assert!(keys.contains(&k), "report.json lacks {k}: {keys:?}");
    }
    assert_eq!(r["runs"].as_array().unwrap().len(), 11);
    for run in r["runs"].as_array().unwrap() {
        assert!(run["comparison_key"]["threads"].is_array(), "{run}");
        assert!(run["samples_per_s"].as_f64().unwrap() > 0.0);
    }
    // The same numbers as the CSV files, as numbers, lists as lists, undefined as null.
    for (file, key) in [("scaling.csv", "scaling"), ("summary.csv", "summary"), ("ranks.csv", "ranks")] {
        let (h, rows) = read_csv(&out.join(file));
        let entries = r[key].as_array().unwrap();
        assert_eq!(entries.len(), rows.len(), "{key}");
        for (row, entry) in rows.iter().zip(entries) {
            for (name, cell) in h.iter().zip(row) {
                let v = &entry[name.as_str()];
                match (cell.parse::<f64>(), v) {
                    (Ok(x), serde_json::Value::Number(n)) => {
                        let y = n.as_f64().unwrap();
                        assert!((x - y).abs() <= 1e-9 * y.abs().max(1.0), "{key}.{name}: csv {x}, json {y}");
                    }
                    (_, serde_json::Value::Array(a)) => {
                        let joined: Vec<&str> = a.iter().map(|s| s.as_str().unwrap()).collect();
                        assert_eq!(joined.join(" "), *cell, "{key}.{name}");
                    }
                    (_, serde_json::Value::Null) => assert_eq!(cell, "", "{key}.{name}"),
                    (_, serde_json::Value::String(s)) => assert_eq!(s, cell, "{key}.{name}"),
                    (_, other) => assert_eq!(other.to_string(), *cell, "{key}.{name}"),
                }
            }
        }
    }
    let (_, projected) = read_csv(&out.join("projection.csv"));
    assert_eq!(r["projection"]["rows"].as_array().unwrap().len(), projected.len());
    assert!(r["findings"]["bandwidth"]
        .as_str()
        .unwrap()
        .starts_with("Inside training the all-reduce reaches"));
}
