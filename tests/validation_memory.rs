//! Validation runs in chunks no larger than the training batch: resnet18 on synthetic
//! 224×224 data validates at 2 ranks within the memory its training steps took.

mod common;
use common::*;
use std::time::Duration;

/// The largest resident set of any child of this process that has ended, in KiB
/// (the kernel carries each rank's peak up through mpirun when it waits for it).
fn children_peak_kib() -> u64 {
    // SAFETY: getrusage writes only the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) }, 0);
    usage.ru_maxrss as u64
}

fn resnet18(out: &std::path::Path, val_samples: &str) -> Job {
    train(
        2,
        &[
            "--model",
            "resnet18",
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "960",
            "--batch-size",
            "4",
            "--max-steps",
            "1",
            "--warmup-steps",
            "0",
            "--probe-iters",
            "0",
            "--val-samples",
            val_samples,
            "--out",
            &path_str(out),
        ],
        Duration::from_secs(400),
    )
}

/// 160 validation images, 80 per rank: in one chunk their resnet18 forward pass takes
/// about 1 GB more than the training step (13.4 GB for 1,000 images); in chunks of the
/// training batch (4) it takes no more than a training step.
#[test]
fn validation_chunks_stay_within_what_a_training_step_takes() {
    let d = tmp();
    // The peak is a maximum over this process's ended children: the run without
    // validation goes first, so the second run can only raise it.
    resnet18(&d.path().join("train-only"), "0").assert_ok();
    let train_kib = children_peak_kib();
    let out = d.path().join("validated");
    resnet18(&out, "160").assert_ok();
    let both_kib = children_peak_kib();
    let grown_mib = both_kib.saturating_sub(train_kib) / 1024;
    eprintln!("peak resident set of a rank: {train_kib} KiB training alone, {both_kib} KiB with validation");
    assert!(
        grown_mib < 300,
        "validation raised a rank's peak resident set by {grown_mib} MiB ({train_kib} KiB training alone, {both_kib} KiB with validation)"
    );
    let (h, rows) = read_csv(&out.join("epochs.csv"));
    assert_eq!(col(&h, &rows, "val_samples"), vec![160.0]);
    let (loss, acc) = (col(&h, &rows, "val_loss")[0], col(&h, &rows, "val_accuracy")[0]);
    assert!(loss.is_finite() && loss > 0.0, "val_loss {loss}");
    // Accuracy counts whole samples across every chunk and rank: k / 160.
    let correct = acc * 160.0;
    assert!(
        (correct - correct.round()).abs() < 1e-6 && (0.0..=1.0).contains(&acc),
        "val_accuracy {acc}"
    );
}
