//! `reduce` on run folders the schema-2 binary wrote (`tests/fixtures/schema2/`, made as
//! its README says), against the files that binary's own `reduce` wrote from them
//! (`expected/`): every cell of summary.csv, scaling.csv, ranks.csv and projection.csv
//! must stay as it was, numbers to 1e-9 relative, text exactly. A change to how
//! `reduce` is built must move no figure.

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
fn differences(name: &str, got: &Path, want: &Path) -> Vec<String> {
    let (gh, grows) = read_csv(got);
    let (wh, wrows) = read_csv(want);
    if gh != wh {
        return vec![format!("{name}: header {gh:?}, expected {wh:?}")];
    }
    if grows.len() != wrows.len() {
        return vec![format!("{name}: {} rows, expected {}", grows.len(), wrows.len())];
    }
    let mut out = Vec::new();
    for (i, (g, w)) in grows.iter().zip(&wrows).enumerate() {
        for (c, (a, b)) in g.iter().zip(w).enumerate() {
            // summary.csv names the schema it is written in: today's, whatever was read.
            if gh[c] == "schema_version" {
                if a != &ddpbench::record::SCHEMA_VERSION.to_string() {
                    out.push(format!("{name} row {} schema_version: {a:?}", i + 1));
                }
                continue;
            }
            // Every real number is written to 9 decimals (schema 3): older files held
            // more digits, which may round by half of the last decimal.
            let same = match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * y.abs().max(1e-300) || (x - y).abs() <= 5.000001e-10 || x == y,
                _ => a == b,
            };
            if !same {
                out.push(format!("{name} row {} column {}: {a:?}, expected {b:?}", i + 1, gh[c]));
            }
        }
    }
    out
}

#[test]
fn reduce_on_schema2_fixtures_moves_no_figure() {
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
    let mut all = Vec::new();
    for file in ["summary.csv", "scaling.csv", "ranks.csv", "projection.csv"] {
        all.extend(differences(file, &out.join(file), &f.join("expected").join(file)));
    }
    assert!(all.is_empty(), "{} cell(s) moved:\n{}", all.len(), all.join("\n"));
    // The fixtures hold what the comparison must cover: 11 runs, 4 points (a baseline of
    // 3 repeats, weak and strong points, a 1-rank run of another thread count).
    let (h, rows) = read_csv(&out.join("scaling.csv"));
    assert_eq!(rows.len(), 4);
    assert_eq!(col(&h, &rows, "repeats").iter().sum::<f64>(), 11.0);
}

/// The folders of the binary before schema 3 (`elapsed_s`, `comm_start_s`,
/// `comm_last_start_s`, `rank0_elapsed_s`; a comparison key in the manifest) reduce to
/// the figures that binary's own reduce wrote.
#[test]
fn reduce_on_the_last_schema2_fixtures_moves_no_figure() {
    let f = fixtures_94331d7();
    let d = tmp();
    let out = d.path().join("report");
    let job = ddpbench(&[
        "reduce",
        "--no-plots",
        &path_str(&f.join("single")),
        "--interconnect",
        &path_str(&f.join("sweep")),
        "--out",
        &path_str(&out),
    ]);
    job.assert_ok();
    let mut all = Vec::new();
    for file in ["summary.csv", "scaling.csv", "ranks.csv", "projection.csv"] {
        all.extend(differences(file, &out.join(file), &f.join("expected").join(file)));
    }
    assert!(all.is_empty(), "{} cell(s) moved:\n{}", all.len(), all.join("\n"));
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
