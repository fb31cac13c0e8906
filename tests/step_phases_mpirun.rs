//! The exposed all-reduce is part of the all-reduce: on every row of real 2-rank runs
//! (overlap off and `force`, several buckets) `comm_exposed_s` ≤ `comm_s`, the
//! bookkeeping around the all-reduce being counted in `other_s`; and report.md's
//! communication columns add up as their header says.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

#[test]
fn exposed_communication_never_exceeds_the_all_reduce() {
    let d = tmp();
    for overlap in ["off", "force"] {
        let out = path_str(&d.path().join(overlap));
        // mnist-cnn's gradients in buckets of 0.05 MiB: several buckets per step.
        let args = [
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "2048",
            "--max-steps",
            "30",
            "--val-samples",
            "0",
            "--batch-size",
            "16",
            "--threads",
            "1",
            "--bucket-mb",
            "0.05",
            "--overlap",
            overlap,
            "--out",
            &out,
        ];
        train(2, &args, LIMIT).assert_ok();
        let m = json(&d.path().join(overlap).join("manifest.json"));
        assert!(m["buckets"].as_u64().unwrap() >= 3, "{overlap}: {}", m["buckets"]);
        for rank in 0..2 {
            let (h, rows) = read_csv(&d.path().join(overlap).join(format!("rank-{rank:05}.csv")));
            let exposed = col(&h, &rows, "comm_exposed_s");
            let comm = col(&h, &rows, "comm_s");
            assert!(rows.len() >= 30, "{overlap} rank {rank}: {} rows", rows.len());
            let over: Vec<String> = exposed
                .iter()
                .zip(&comm)
                .enumerate()
                .filter(|(_, (e, c))| **e > **c + 1e-9)
                .map(|(i, (e, c))| format!("row {i}: exposed {e} > comm {c}"))
                .collect();
            assert!(
                over.is_empty(),
                "{overlap} rank {rank}: {} row(s):\n{}",
                over.len(),
                over.join("\n")
            );
        }
    }
    let rep = d.path().join("report");
    ddpbench(&["reduce", "--no-plots", &path_str(d.path()), "--out", &path_str(&rep)]).assert_ok();
    // report.json's per-epoch figures: the transfer column leaves the wait out (shown
    // apart), so transfer + waiting is the all-reduce's whole time.
    let report = json(&rep.join("report.json"));
    for run in report["runs"].as_array().unwrap() {
        let e = &run["per_epoch"];
        let f = |k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{k}: {e}"));
        let whole = f("comm_transfer_s") + f("comm_wait_s");
        assert!(
            (whole - f("comm_s")).abs() <= 0.05 * f("comm_s") + 1e-6,
            "transfer {} + waiting {} vs all-reduce {}",
            f("comm_transfer_s"),
            f("comm_wait_s"),
            f("comm_s")
        );
        assert!(f("comm_exposed_transfer_s") <= f("comm_transfer_s") + 1e-9, "{e}");
    }
    let md = std::fs::read_to_string(rep.join("report.md")).unwrap();
    assert!(md.contains("| transfer s/epoch |"), "{md}");
}
