//! The output schema under real runs: every CSV file ddpbench writes (a study's run
//! folders, points.csv, study.csv and report, a sweep's allreduce.csv, reduce's tables with
//! a projection, the loader's file) holds plain decimals only; a rank file's header is
//! the phases of `Phase::ALL` among the other columns, in order.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn csv_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            csv_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "csv") {
            out.push(p);
        }
    }
}

/// A cell that a spreadsheet would not read as a plain number: an exponent, or NaN or
/// infinity spelled out.
fn not_plain(cell: &str) -> bool {
    let number_like = cell.parse::<f64>().is_ok();
    let lower = cell.to_ascii_lowercase();
    number_like && (lower.contains('e') || lower.contains("nan") || lower.contains("inf"))
}

const STUDY: &str = r#"
name = "plain"
models = ["mnist-cnn"]
datasets = ["fashion-mnist"]
batch_sizes = [32]
ranks = [1, 2]
scaling = "weak"
repeats = 1
max_steps = 8
val_samples = 64
probe_iters = 2
threads_per_rank = 1
"#;

#[test]
fn no_csv_ddpbench_writes_has_an_exponent_or_nan_text() {
    let d = tmp();
    let out = d.path().join("study");
    let file = d.path().join("plain.toml");
    std::fs::write(&file, STUDY).unwrap();
    let mut study = mpirun_cmd(2);
    study.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out);
    run_with_limit(study, LIMIT).assert_ok();
    // Sizes down to 8 bytes make bandwidths of a few kB/s and times of microseconds.
    let sweep_dir = d.path().join("sweep");
    let mut sweep = mpirun_cmd(2);
    sweep.arg(BIN).arg("allreduce").args([
        "--min-bytes",
        "8",
        "--max-bytes",
        "64K",
        "--factor",
        "8",
        "--iters",
        "10",
        "--budget-s",
        "0.05",
        "--out",
        &path_str(&sweep_dir),
    ]);
    run_with_limit(sweep, LIMIT).assert_ok();
    // reduce on the runs, with the sweep: projection.csv.
    let report = d.path().join("reduced");
    ddpbench(&[
        "reduce",
        "--no-plots",
        &path_str(&out.join("runs")),
        "--interconnect",
        &path_str(&sweep_dir),
        "--out",
        &path_str(&report),
    ])
    .assert_ok();
    // The loader's file, from a folder of two tiny images.
    let images = d.path().join("images");
    for split in ["train", "val"] {
        let dir = images.join(split).join("a");
        std::fs::create_dir_all(&dir).unwrap();
        let img = tch::Tensor::randint(256, [3, 40, 60], (tch::Kind::Uint8, tch::Device::Cpu));
        tch::vision::image::save(&img, dir.join("0.jpg")).unwrap();
    }
    let loader_csv = d.path().join("loader.csv");
    ddpbench(&[
        "loader",
        "--data-dir",
        &path_str(&images),
        "--workers",
        "1",
        "--repeats",
        "1",
        "--out",
        &path_str(&loader_csv),
    ])
    .assert_ok();

    let mut files = Vec::new();
    csv_files(d.path(), &mut files);
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for must in [
        "rank-00000.csv",
        "rank-00001.csv",
        "epochs.csv",
        "clock.csv",
        "allreduce.csv",
        "points.csv",
        "study.csv",
        "summary.csv",
        "scaling.csv",
        "ranks.csv",
        "projection.csv",
        "loader.csv",
    ] {
        assert!(names.iter().any(|n| n == must), "no {must} among {names:?}");
    }
    // A rank file's columns: the other columns around one per phase, in Phase::ALL's order.
    let phases = ddpbench::record::Phase::ALL.map(|p| p.column());
    let mut want = vec![
        "run_id",
        "rank",
        "node_type",
        "epoch",
        "step",
        "global_step",
        "warmup",
        "time_utc",
        "step_start_at_s",
        "samples",
    ];
    want.extend(phases);
    want.extend([
        "step_s",
        "comm_s",
        "comm_stage_d2h_s",
        "comm_stage_h2d_s",
        "comm_hidden_s",
        "comm_start_at_s",
        "comm_last_start_at_s",
        "loss",
        "bytes",
        "loss_scale",
        "step_skipped",
        "noise_batch_small",
        "grad_sq_small",
        "noise_batch_big",
        "grad_sq_big",
    ]);
    for f in files.iter().filter(|f| f.file_name().unwrap() == "rank-00001.csv") {
        assert_eq!(read_csv(f).0, want, "{}", f.display());
    }
    let mut bad = Vec::new();
    for f in &files {
        let (h, rows) = read_csv(f);
        for (i, row) in rows.iter().enumerate() {
            for (name, cell) in h.iter().zip(row) {
                if not_plain(cell) {
                    bad.push(format!("{} row {} {name}: {cell:?}", f.display(), i + 1));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} cell(s) not plain decimals:\n{}", bad.len(), bad.join("\n"));
}
