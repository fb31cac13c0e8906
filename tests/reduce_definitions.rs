//! What `reduce`'s figures mean, on run folders real runs wrote
//! (`tests/fixtures/schema4-967f27a`, made as its README says): a forced overlap keeps
//! what its rows say, a lone rank has no communication figures, a probe in another dtype
//! than the wire is no comparison.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schema4-967f27a")
        .join(rel)
}

/// `reduce --no-plots <runs> [--interconnect sweep] --out <out>`: report.json.
fn reduce_into(out: &Path, runs: &[PathBuf], sweep: bool) -> serde_json::Value {
    let mut args: Vec<String> = vec!["reduce".into(), "--no-plots".into()];
    args.extend(runs.iter().map(|r| path_str(r)));
    if sweep {
        args.extend(["--interconnect".into(), path_str(&fixture("sweep"))]);
    }
    args.extend(["--out".into(), path_str(out)]);
    ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>()).assert_ok();
    json(&out.join("report.json"))
}

/// The mean over the timed rank-steps of column `name` of the run in `dir`.
fn rows_mean(dir: &Path, name: &str) -> f64 {
    let (mut sum, mut n) = (0.0, 0.0);
    for r in 0..2 {
        let f = dir.join(format!("rank-{r:05}.csv"));
        if !f.exists() {
            break;
        }
        let (h, rows) = read_csv(&f);
        let w = h.iter().position(|c| c == "warmup").unwrap();
        let timed: Vec<Vec<String>> = rows.into_iter().filter(|row| row[w] == "0").collect();
        sum += col(&h, &timed, name).iter().sum::<f64>();
        n += timed.len() as f64;
    }
    sum / n
}

fn run_of<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["runs"].as_array().unwrap().iter().find(|r| r["run_id"] == id).unwrap()
}

fn summary_of<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["summary"].as_array().unwrap().iter().find(|r| r["run_id"] == id).unwrap()
}

/// `--overlap force`: the all-reduce thread time-sliced with backward on its core. Its
/// rows say how much of the all-reduce ran while backward did (comm_hidden_s): the
/// summary carries that, the compute-vs-communication columns add up (hidden + exposed =
/// transfer), and R, which would count the time-sliced work twice (inside backward_s and
/// in the transfer), is not defined, with why.
#[test]
fn a_forced_overlap_keeps_what_its_rows_say() {
    let d = tmp();
    let out = d.path().join("report");
    let r = reduce_into(&out, &[fixture("runs/two-force")], false);
    let rows_hidden = rows_mean(&fixture("runs/two-force"), "comm_hidden_s");
    assert!(rows_hidden > 0.01, "the fixture's rows hide {rows_hidden} s");
    let s = summary_of(&r, "two-force");
    let hidden = s["comm_hidden_s_mean"].as_f64().unwrap();
    assert!(
        (hidden - rows_hidden).abs() <= 1e-9 * rows_hidden,
        "summary {hidden} vs rows {rows_hidden}"
    );
    assert!(s["compute_comm_ratio"].is_null(), "{s}");
    let e = &run_of(&r, "two-force")["per_epoch"];
    let f = |k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{k} in {e}"));
    let (transfer, sum) = (f("comm_transfer_s"), f("comm_hidden_s") + f("comm_exposed_transfer_s"));
    assert!(
        (transfer - sum).abs() <= 1e-6 * transfer,
        "transfer {transfer}, hidden + exposed {sum}: {e}"
    );
    assert!(e["compute_comm_ratio"].is_null(), "{e}");
    let c = r["findings"]["compute_vs_comm"].as_str().unwrap();
    assert!(
        c.contains("two-force ran with --overlap force") && c.contains("R, which would count it twice, is not defined"),
        "{c}"
    );
    let b = r["findings"]["bandwidth"].as_str().unwrap();
    assert!(!b.contains("nothing ran during backward"), "{b}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("time-sliced with backward there rather than hid"), "{md}");
}

/// A lone rank all-reduces with nobody: no transfer, no share of the step in
/// communication, nobody waiting for it, no all-reduce measured at 1 × 1 in the projection.
#[test]
fn a_lone_rank_has_no_communication_figures_anywhere() {
    let d = tmp();
    let out = d.path().join("report");
    let r = reduce_into(&out, &[fixture("runs/one"), fixture("runs/two")], true);
    let s = summary_of(&r, "one");
    for k in [
        "comm_transfer_s_median",
        "comm_exposed_share",
        "comm_exposed_transfer_s_mean",
        "caused_wait_s_mean",
    ] {
        assert!(s[k].is_null(), "{k}: {}", s[k]);
    }
    let e = &run_of(&r, "one")["per_epoch"];
    for k in [
        "comm_s",
        "comm_transfer_s",
        "comm_hidden_s",
        "comm_exposed_transfer_s",
        "comm_wait_s",
    ] {
        assert!(e[k].is_null(), "{k}: {e}");
    }
    // The 2-rank run keeps its figures.
    assert!(summary_of(&r, "two")["comm_transfer_s_median"].as_f64().unwrap() > 0.0);
    let (h, rows) = read_csv(&out.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c}"));
    let alone: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[at("ranks")] == "1" && !r[at("measured_step_s")].is_empty())
        .collect();
    assert!(!alone.is_empty(), "{rows:?}");
    for row in alone {
        for c in ["measured_comm_s", "measured_wait_s", "measured_comm_exposed_s"] {
            assert_eq!(row[at(c)], "", "{c}: {row:?}");
        }
    }
}

/// A run whose gradients travel as bf16 but whose probe ran in fp32 (as every probe did
/// before it followed --grad-dtype): the same bytes at another element type are no
/// comparison, so training / probe is empty and the sentence says why.
#[test]
fn a_probe_in_another_dtype_than_the_wire_is_no_comparison() {
    let d = tmp();
    let run = d.path().join("two-bf16");
    std::fs::create_dir_all(&run).unwrap();
    // The same run under another id: its rows and end records name it too.
    for e in std::fs::read_dir(fixture("runs/two")).unwrap().map(|e| e.unwrap()) {
        let text = std::fs::read_to_string(e.path()).unwrap();
        let renamed = text
            .replace("\ntwo,", "\ntwo-bf16,")
            .replace("\"run_id\": \"two\"", "\"run_id\": \"two-bf16\"");
        std::fs::write(run.join(e.file_name()), renamed).unwrap();
    }
    let mut m = json(&run.join("manifest.json"));
    m["comm"]["grad_dtype"] = "bf16".into();
    m["comparison_key"]["grad_dtype"] = "bf16".into();
    m["run_id"] = "two-bf16".into();
    std::fs::write(run.join("manifest.json"), m.to_string()).unwrap();
    let out = d.path().join("report");
    let r = reduce_into(&out, &[run.clone(), fixture("runs/two")], false);
    let s = summary_of(&r, "two-bf16");
    assert_eq!(s["probe_dtype"], "fp32");
    assert!(
        s["probe_busbw_bytes_per_s"].as_f64().unwrap() > 0.0 && s["busbw_vs_probe"].is_null(),
        "{s}"
    );
    assert!(summary_of(&r, "two")["busbw_vs_probe"].as_f64().is_some());
    let b = r["findings"]["bandwidth"].as_str().unwrap();
    assert!(
        b.contains("two-bf16 probed the all-reduce in another dtype than its gradients travel in"),
        "{b}"
    );
}
