//! The compute/communication grid of real runs: batch per rank × configuration, each
//! cell the compute and all-reduce seconds per epoch of report.json's runs and the
//! all-reduce's share, in compute_comm_grid.csv, report.md and report.html.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * y.abs().max(1.0)
}

#[test]
fn grid_of_two_batches_at_two_ranks_holds_each_runs_epoch() {
    let d = tmp();
    let mut runs = Vec::new();
    for batch in ["8", "16"] {
        let out = d.path().join(format!("b{batch}"));
        let o = path_str(&out);
        train(
            2,
            &[
                "--model",
                "mnist-cnn",
                "--dataset",
                "synthetic",
                "--max-steps",
                "6",
                "--warmup-steps",
                "1",
                "--val-samples",
                "0",
                "--probe-iters",
                "0",
                "--threads",
                "1",
                "--batch-size",
                batch,
                "--out",
                &o,
            ],
            LIMIT,
        )
        .assert_ok();
        runs.push(o);
    }
    let out = d.path().join("report");
    ddpbench(&["reduce", &runs[0], &runs[1], "--out", &path_str(&out), "--no-plots"]).assert_ok();

    let report = json(&out.join("report.json"));
    let (h, rows) = read_csv(&out.join("compute_comm_grid.csv"));
    assert_eq!(rows.len(), 2, "one cell per batch: {rows:?}");
    let at = |row: &[String], name: &str| row[h.iter().position(|c| c == name).unwrap_or_else(|| panic!("no {name}"))].clone();
    let mut batches = Vec::new();
    for row in &rows {
        let batch: u64 = at(row, "batch_per_rank").parse().unwrap();
        batches.push(batch);
        let run = report["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["batch_per_rank"].as_u64() == Some(batch))
            .unwrap();
        assert_eq!(at(row, "run_ids"), run["run_id"].as_str().unwrap());
        assert_eq!((at(row, "ranks").as_str(), at(row, "runs").as_str()), ("2", "1"));
        assert_eq!(at(row, "communication"), run["communication"].as_str().unwrap());
        let num = |name: &str| -> f64 { at(row, name).parse().unwrap() };
        let e = &run["per_epoch"];
        let (compute, comm) = (e["compute_s"].as_f64().unwrap(), e["comm_s"].as_f64().unwrap());
        assert!(compute > 0.0 && comm > 0.0, "{row:?}");
        assert!(close(num("compute_s_per_epoch"), compute), "{row:?}");
        assert!(close(num("comm_s_per_epoch"), comm), "{row:?}");
        assert!(close(num("comm_transfer_s_per_epoch"), e["comm_transfer_s"].as_f64().unwrap()));
        assert!(close(num("comm_wait_s_per_epoch"), e["comm_wait_s"].as_f64().unwrap()));
        assert!(close(num("comm_share"), comm / (compute + comm)), "{row:?}");
    }
    batches.sort();
    assert_eq!(batches, [8, 16]);

    // report.md: one configuration row, the two batches across.
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let section = md
        .split("## Compute and communication by batch and configuration")
        .nth(1)
        .unwrap_or_else(|| panic!("no grid in report.md:\n{md}"));
    let header = section.lines().find(|l| l.starts_with("| configuration |")).unwrap();
    assert_eq!(
        header,
        "| configuration | b8 compute s | b8 comm s | b8 share | b16 compute s | b16 comm s | b16 share |"
    );
    let body: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("|---"))
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(body.len(), 1, "{section}");
    assert!(body[0].starts_with("| 2 ranks, "), "{}", body[0]);
    assert_eq!(body[0].matches(" % |").count(), 2, "a share per batch: {}", body[0]);
    assert!(section.contains("The all-reduce takes the largest share with 2 ranks"), "{section}");
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(page.contains("<th>b16 comm s</th>"), "the grid is on the page");
    assert!(page.contains("href=\"compute_comm_grid.csv\""));
}
