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
            let same = match (a.parse::<f64>(), b.parse::<f64>()) {
                (Ok(x), Ok(y)) => (x - y).abs() <= 1e-9 * y.abs().max(1e-300) || x == y,
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
