//! The optimizer in real `mpirun -n 2` runs: SGD and Adam update bucket by bucket over
//! the flat buffers the gradient buckets lay out; LARS, which takes per-layer norms,
//! parameter by parameter.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// A 3-step mnist-cnn run with `optimizer` in buckets of at most 1 MB (several for its
/// 4.8 MB of gradients): its manifest's bucket count and its log.
fn run(optimizer: &str) -> (u64, String) {
    let dir = tmp();
    let out = path_str(&dir.path().join("run"));
    let args = [
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "600",
        "--max-steps",
        "3",
        "--val-samples",
        "8",
        "--probe-iters",
        "0",
        "--bucket-mb",
        "1",
        "--optimizer",
        optimizer,
        "--out",
        &out,
    ];
    let job = train(2, &args, LIMIT);
    job.assert_ok();
    let m = json(&dir.path().join("run/manifest.json"));
    (m["buckets"].as_u64().unwrap(), job.all())
}

#[test]
fn sgd_and_adam_update_over_every_flat_bucket_and_lars_per_parameter() {
    for optimizer in ["sgd", "adam"] {
        let (buckets, log) = run(optimizer);
        assert!(buckets >= 2, "{optimizer}: {buckets} buckets");
        let said = format!("updated bucket by bucket over {buckets} of {buckets} flat gradient bucket(s)");
        assert_eq!(log.matches(&said).count(), 1, "{optimizer}: rank 0 says {said:?}:\n{log}");
    }
    let (_, log) = run("lars");
    assert_eq!(log.matches("Lars, updated parameter by parameter").count(), 1, "{log}");
}
