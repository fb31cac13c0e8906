//! Every model trains for a few steps on 2 ranks with synthetic data of its shape.

mod common;
use common::*;
use std::time::Duration;

fn short_run(model: &str, batch: &str) {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let job = train(
        2,
        &[
            "--model",
            model,
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "24",
            "--batch-size",
            batch,
            "--max-steps",
            "2",
            "--warmup-steps",
            "0",
            "--val-samples",
            "4",
            "--seq-len",
            "32",
            "--vocab-size",
            "500",
            "--probe-iters",
            "1",
            "--out",
            &out,
        ],
        Duration::from_secs(300),
    );
    job.assert_ok();
    let m = json(&d.path().join("run/manifest.json"));
    assert_eq!(m["status"], "completed", "{model}");
    for r in 0..2 {
        let (h, rows) = read_csv(&d.path().join(format!("run/rank-{r:05}.csv")));
        assert_eq!(rows.len(), 2, "{model}");
        assert!(col(&h, &rows, "loss").iter().all(|l| l.is_finite()));
        assert!(col(&h, &rows, "bytes").iter().all(|&b| b == m["gradient_bytes"].as_f64().unwrap()));
    }
}

#[test]
fn resnet18_cifar_trains() {
    short_run("resnet18-cifar", "4");
}

#[test]
fn resnet18_trains() {
    short_run("resnet18", "2");
}

/// The default synthetic set (60,000 images of 3×224×224, 36 GB if materialised) is
/// drawn from a bounded pool: two ranks train on one machine.
#[test]
fn resnet18_on_the_default_synthetic_set_fits_in_memory() {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let job = train(
        2,
        &[
            "--model",
            "resnet18",
            "--dataset",
            "synthetic",
            "--batch-size",
            "2",
            "--max-steps",
            "3",
            "--val-samples",
            "2",
            "--probe-iters",
            "1",
            "--out",
            &out,
        ],
        Duration::from_secs(300),
    );
    job.assert_ok();
    let m = json(&d.path().join("run/manifest.json"));
    assert_eq!(m["status"], "completed");
    assert_eq!(m["steps_per_epoch"], 15_000, "60,000 samples / 2 ranks / batch 2");
}

#[test]
fn resnet50_trains() {
    short_run("resnet50", "2");
}

#[test]
fn transformers_train() {
    short_run("transformer-small", "4");
    short_run("transformer-medium", "4");
}

#[test]
fn a_model_and_data_set_of_different_shapes_are_refused() {
    let job = train_reporting_exits(
        2,
        &["--model", "resnet18-cifar", "--dataset", "fashion-mnist"],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        job.all()
            .contains("--dataset fashion-mnist holds 1×28×28 images; --model resnet18-cifar wants"),
        "{}",
        job.all()
    );
    assert!(!job.all().contains("rank-exit 0 0") && !job.all().contains("rank-exit 1 0"));
}

#[test]
fn resnet18_trains_on_an_image_folder_with_default_worker_threads() {
    use tch::{Device, Kind, Tensor};
    let d = tmp();
    for (split, n) in [("train", 4), ("val", 2)] {
        for class in ["cat", "dog"] {
            let folder = d.path().join(split).join(class);
            std::fs::create_dir_all(&folder).unwrap();
            for i in 0..n {
                let img = Tensor::randint(256, [3, 240, 300], (Kind::Uint8, Device::Cpu));
                tch::vision::image::save(&img, folder.join(format!("{i}.jpg"))).unwrap();
            }
        }
    }
    let out = path_str(&d.path().join("run"));
    let job = train(
        2,
        &[
            "--model",
            "resnet18",
            "--dataset",
            "imagenet",
            "--data-dir",
            &path_str(d.path()),
            "--batch-size",
            "2",
            "--epochs",
            "1",
            "--warmup-steps",
            "0",
            "--probe-iters",
            "1",
            "--out",
            &out,
        ],
        Duration::from_secs(300),
    );
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("run/epochs.csv"));
    assert_eq!(col(&h, &rows, "steps")[0], 2.0, "8 images / (2 ranks × batch 2)");
    assert_eq!(col(&h, &rows, "val_samples")[0], 4.0);
    // Image folders get batch workers by default: each rank here is bound to one core
    // and computes on one thread, so one worker, and a note that they share the core.
    let m = json(&d.path().join("run/manifest.json"));
    assert_eq!(m["config"]["workers"], 1, "{}", m["config"]);
    for r in m["ranks"].as_array().unwrap() {
        let note = r["workers_note"].as_str().unwrap_or_default();
        assert!(
            note.starts_with("1 batch worker(s) and 1 compute thread(s) share 1 core(s)"),
            "{note}"
        );
    }
}
