//! `--synthetic-samples` at the flag's upper bound (10^12 samples): the job trains in
//! memory that does not grow with the count (the sample order is computed, not held),
//! and its manifest says which order it used. Alone in its test binary, so the peak
//! resident memory of the children waited for is that of this job's ranks.

mod common;
use common::*;
use std::time::Duration;

/// Peak resident memory of any descendant waited for so far, KiB.
fn children_peak_rss_kib() -> i64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) }, 0);
    usage.ru_maxrss
}

#[test]
fn a_trillion_synthetic_samples_train_in_bounded_memory() {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let args = [
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "1000000000000",
        "--max-steps",
        "2",
        "--val-samples",
        "64",
        "--batch-size",
        "32",
        "--threads",
        "1",
        "--out",
        &out,
    ];
    let job = train(2, &args, Duration::from_secs(300));
    job.assert_ok();
    // Two pools of at most 256 MiB (training and test split) and libtorch: the order of
    // 10^12 samples held as 8-byte indices would take 8 TB.
    let peak_kib = children_peak_rss_kib();
    eprintln!("peak resident memory of a rank: {peak_kib} KiB");
    assert!(peak_kib < 2 << 20, "a rank peaked at {peak_kib} KiB");
    let m = json(&d.path().join("run/manifest.json"));
    assert_eq!(m["config"]["sample_order"], "feistel-v1", "{}", m["config"]);
    assert_eq!(m["steps_per_epoch"], 1_000_000_000_000u64 / 2 / 32);
    let (_, rows) = read_csv(&d.path().join("run/rank-00001.csv"));
    assert_eq!(rows.len(), 2);
}
