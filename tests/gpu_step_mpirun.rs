//! The GPU step's mechanisms, run on CPU with `mpirun -n 2`: rows read a step late
//! (`--phase-sync events`, host-timed events on CPU) carry the same losses, in the
//! same rows, as the exact mode; channels-last training ends where contiguous training
//! does; the manifest's comparison key records both settings.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(400);

/// A deterministic 2-rank mnist-cnn run on 2 epochs of 8 steps each into `dir/name`.
fn run(dir: &Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let o = path_str(&out);
    let mut args = vec![
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "512",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--warmup-steps",
        "2",
        "--deterministic",
        "--no-dropout",
        "--optimizer",
        "sgd",
        "--lr",
        "0.01",
        "--val-samples",
        "0",
        "--probe-iters",
        "0",
        "--save-model",
        "--out",
        &o,
    ];
    args.extend(extra);
    train(2, &args, LIMIT).assert_ok();
    out
}

fn column(out: &Path, rank: usize, name: &str) -> Vec<f64> {
    let (h, rows) = read_csv(&out.join(format!("rank-{rank:05}.csv")));
    col(&h, &rows, name)
}

#[test]
fn rows_read_a_step_late_hold_each_steps_own_loss_and_add_up() {
    let dir = tmp();
    let exact = run(dir.path(), "on", &[]);
    let late = run(dir.path(), "events", &["--phase-sync", "events"]);
    let key = |out: &Path| json(&out.join("manifest.json"))["comparison_key"].clone();
    assert_eq!(key(&late)["phase_sync"], "events");
    assert!(key(&exact).get("phase_sync").is_none(), "on CPU the default is on: {}", key(&exact));
    for r in 0..2 {
        let steps: Vec<f64> = (0..16).map(f64::from).collect();
        assert_eq!(column(&late, r, "global_step"), steps, "rank {r}: every step once, in order");
        assert_eq!(
            column(&late, r, "step"),
            [(0..8).collect::<Vec<_>>(), (0..8).collect()]
                .concat()
                .iter()
                .map(|&s| s as f64)
                .collect::<Vec<_>>()
        );
        // The loss of step k in row k: the same run, so the same losses.
        let (a, b) = (column(&exact, r, "loss"), column(&late, r, "loss"));
        assert_eq!(a, b, "rank {r}: losses by row");
        assert!(a.windows(2).any(|w| w[0] != w[1]), "the losses change from step to step");
        // Each row adds up to its step (the CSV rounds each column to 1e-9 s).
        let step_s = column(&late, r, "step_s");
        let cols: Vec<Vec<f64>> = ddpbench::record::Phase::ALL.iter().map(|p| column(&late, r, p.column())).collect();
        for (k, total) in step_s.iter().enumerate() {
            let sum: f64 = cols.iter().map(|c| c[k]).sum();
            assert!((sum - total).abs() <= 4e-9, "rank {r} row {k}: phases {sum} vs step {total}");
            assert!(cols.iter().all(|c| c[k] >= 0.0), "rank {r} row {k}: a negative phase");
            assert!(
                cols[2][k] > 0.0 && cols[3][k] > 0.0,
                "rank {r} row {k}: forward and backward are timed"
            );
        }
    }
    let epochs = |out: &Path| {
        let (h, rows) = read_csv(&out.join("epochs.csv"));
        col(&h, &rows, "train_loss")
    };
    assert_eq!(epochs(&exact), epochs(&late), "each epoch's mean holds its own steps");
}

fn final_params(dir: &Path) -> Vec<(String, tch::Tensor)> {
    let mut p = tch::Tensor::read_safetensors(dir.join("model.safetensors")).unwrap();
    p.sort_by(|a, b| a.0.cmp(&b.0));
    p
}

#[test]
fn channels_last_training_ends_where_contiguous_training_does() {
    let dir = tmp();
    let small = ["--max-steps", "6", "--overlap", "off"];
    let nchw = run(dir.path(), "contiguous", &small);
    let mut cl_args = small.to_vec();
    cl_args.extend(["--memory-format", "channels-last"]);
    let nhwc = run(dir.path(), "channels-last", &cl_args);
    let m = json(&nhwc.join("manifest.json"));
    assert_eq!(m["comparison_key"]["memory_format"], "channels-last");
    assert_eq!(m["config"]["memory_format"], "channels-last");
    let m0 = json(&nchw.join("manifest.json"));
    assert!(
        m0["comparison_key"].get("memory_format").is_none(),
        "contiguous is what older runs ran"
    );
    let (a, b) = (final_params(&nchw), final_params(&nhwc));
    assert_eq!(a.len(), b.len());
    let (mut diff, mut norm, mut moved) = (0.0, 0.0, 0.0);
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        diff += (ta - tb).square().sum(tch::Kind::Double).double_value(&[]);
        norm += ta.square().sum(tch::Kind::Double).double_value(&[]);
        moved += ta.abs().sum(tch::Kind::Double).double_value(&[]);
    }
    let rel = (diff / norm).sqrt();
    // Channels-last convolutions sum in another order, so fp32 rounding
    // (about 6e-8 per operation) differs and compounds over the six SGD
    // steps. A wrong layout changes what each filter sees, not only the
    // rounding; the end of this test shows a changed start ends far apart.
    assert!(
        moved > 0.0 && rel < 1e-3,
        "channels-last vs contiguous: relative L2 difference {rel:e}"
    );
    // And the comparison can fail: another seed ends far away.
    let mut other = cl_args.clone();
    other.extend(["--seed", "9"]);
    let far = final_params(&run(dir.path(), "other-seed", &other));
    let d: f64 = a
        .iter()
        .zip(&far)
        .map(|((_, x), (_, y))| (x - y).square().sum(tch::Kind::Double).double_value(&[]))
        .sum();
    let far_rel = (d / norm).sqrt();
    assert!(
        far_rel > 1e-2 && far_rel > 100.0 * rel,
        "another seed ends {far_rel:e} away, the layouts {rel:e} apart"
    );
}

#[test]
fn channels_last_is_refused_for_a_model_of_tokens() {
    let dir = tmp();
    let o = path_str(&dir.path().join("run"));
    let job = train(
        1,
        &["--model", "transformer-small", "--memory-format", "channels-last", "--out", &o],
        LIMIT,
    );
    assert_eq!(job.status, Some(1), "{}", job.all());
    assert!(job.all().contains("--memory-format channels-last"), "{}", job.all());
    assert!(!job.all().contains("panicked"), "{}", job.all());
}
