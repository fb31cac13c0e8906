//! bigMNIST: generation (count, augmentation, replication, determinism, resume)
//! and streaming into a 2-rank run, with corrupt-shard detection.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const N: usize = 200;

/// A small MNIST-format source: N training images (a bright square at a varying
/// place), 50 test images.
fn source() -> tempfile::TempDir {
    let d = tmp();
    for (prefix, n) in [("train", N), ("t10k", 50)] {
        let mut img = vec![0u8, 0, 8, 3];
        for v in [n as u32, 28, 28] {
            img.extend_from_slice(&v.to_be_bytes());
        }
        let mut lbl = vec![0u8, 0, 8, 1];
        lbl.extend_from_slice(&(n as u32).to_be_bytes());
        for i in 0..n {
            let (r0, c0) = (4 + i % 12, 4 + (i / 12) % 12);
            for r in 0..28 {
                for c in 0..28 {
                    img.push(if (r0..r0 + 10).contains(&r) && (c0..c0 + 10).contains(&c) {
                        255
                    } else {
                        0
                    });
                }
            }
            lbl.push((i % 10) as u8);
        }
        std::fs::write(d.path().join(format!("{prefix}-images-idx3-ubyte")), img).unwrap();
        std::fs::write(d.path().join(format!("{prefix}-labels-idx1-ubyte")), lbl).unwrap();
    }
    d
}

fn generate(src: &Path, out: &Path, seed: &str, env: &[(&str, &str)]) -> Job {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args([
        "gen-bigmnist",
        "--from",
        &path_str(src),
        "--augment",
        "3",
        "--copies",
        "4",
        "--shard-samples",
        "1000",
        "--threads",
        "1",
        "--seed",
        seed,
        "--out",
        &path_str(out),
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_limit(cmd, Duration::from_secs(120))
}

fn crcs(dir: &Path) -> Vec<serde_json::Value> {
    json(&dir.join("index.json"))["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["block_crc32"].clone())
        .collect()
}

fn record(dir: &Path, g: usize) -> Vec<u8> {
    let bytes = std::fs::read(dir.join(format!("shard-{:05}.bin", g / 1000))).unwrap();
    bytes[(g % 1000) * 785..(g % 1000 + 1) * 785].to_vec()
}

#[test]
fn generation_counts_augments_replicates_and_is_deterministic() {
    let src = source();
    let d = tmp();
    let a = d.path().join("a");
    generate(src.path(), &a, "7", &[]).assert_ok();
    let index = json(&a.join("index.json"));
    assert_eq!(index["samples"], (N * 3 * 4) as u64);
    assert_eq!(index["unique"], (N * 3) as u64);
    let shards = index["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 3, "2400 samples in shards of 1000");
    assert_eq!(shards[2]["samples"], 400);
    assert_eq!(std::fs::metadata(a.join("shard-00002.bin")).unwrap().len(), 400 * 785);
    // Labels follow the source; augmentation changes pixels; copies repeat the augmented set.
    let source_pixels = std::fs::read(src.path().join("train-images-idx3-ubyte")).unwrap();
    let mut changed = 0;
    for i in 0..N {
        let r = record(&a, i);
        assert_eq!(r[0] as usize, i % 10);
        if r[1..] != source_pixels[16 + i * 784..16 + (i + 1) * 784] {
            changed += 1;
        }
        assert_eq!(record(&a, i), record(&a, i + 3 * N), "copy 2 repeats copy 1");
    }
    assert!(changed >= N * 9 / 10, "augmentation changed only {changed} of {N} images");
    assert_ne!(record(&a, 0)[1..], record(&a, N)[1..], "two augmentations of one image differ");
    // Same seed, same bytes; another seed, other bytes.
    let b = d.path().join("b");
    generate(src.path(), &b, "7", &[]).assert_ok();
    assert_eq!(crcs(&a), crcs(&b));
    let c = d.path().join("c");
    generate(src.path(), &c, "8", &[]).assert_ok();
    assert_ne!(crcs(&a), crcs(&c));
    // Asking again for a complete set does nothing.
    let again = generate(src.path(), &a, "7", &[]);
    again.assert_ok();
    assert!(again.stderr.contains("is complete and intact"));
}

#[test]
fn interrupted_generation_resumes_to_the_same_bytes() {
    let src = source();
    let d = tmp();
    let whole = d.path().join("whole");
    generate(src.path(), &whole, "3", &[]).assert_ok();
    let part = d.path().join("part");
    let stopped = generate(src.path(), &part, "3", &[("DDPBENCH_GEN_FAULT_AFTER_SHARDS", "1")]);
    assert_ne!(stopped.status, Some(0));
    assert!(
        stopped
            .stderr
            .contains("interrupted with 2 of 3 shards unwritten: run the same command again to resume"),
        "{}",
        stopped.stderr
    );
    assert!(!part.join("index.json").exists());
    let resumed = generate(src.path(), &part, "3", &[]);
    resumed.assert_ok();
    assert!(
        resumed.stderr.contains("resuming: 1 of 3 shards already complete and intact"),
        "{}",
        resumed.stderr
    );
    assert_eq!(crcs(&whole), crcs(&part));
}

#[test]
fn two_ranks_stream_it_and_a_corrupt_shard_is_named() {
    let src = source();
    let d = tmp();
    let set = d.path().join("set");
    generate(src.path(), &set, "1", &[]).assert_ok();
    let out = d.path().join("run");
    let job = train(
        2,
        &[
            "--dataset",
            "bigmnist",
            "--data-dir",
            &path_str(&set),
            "--batch-size",
            "32",
            "--epochs",
            "1",
            "--out",
            &path_str(&out),
        ],
        Duration::from_secs(300),
    );
    job.assert_ok();
    // 2400 samples, 1200 per rank, 37 full batches of 32.
    for r in 0..2 {
        let (h, rows) = read_csv(&out.join(format!("rank-{r:05}.csv")));
        assert_eq!(rows.len(), 37);
        assert!(col(&h, &rows, "samples").iter().all(|&s| s == 32.0));
    }
    let (h, rows) = read_csv(&out.join("epochs.csv"));
    assert_eq!(col(&h, &rows, "val_samples")[0], 50.0, "validated on the source's test split");
    // Flip one byte in shard 1: the rank reading it stops the job with the shard and block named.
    let f = set.join("shard-00001.bin");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[785 * 5 + 100] ^= 0xff;
    std::fs::write(&f, bytes).unwrap();
    let job = train_reporting_exits(
        2,
        &[
            "--dataset",
            "bigmnist",
            "--data-dir",
            &path_str(&set),
            "--batch-size",
            "32",
            "--epochs",
            "1",
            "--out",
            &path_str(&d.path().join("run2")),
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(!job.timed_out);
    assert!(job.all().contains("shard-00001.bin: block 0 is corrupt"), "{}", job.all());
    assert!(
        job.all().contains("Run the same `ddpbench gen-bigmnist` command again"),
        "{}",
        job.all()
    );
    assert!(!job.all().contains("rank-exit 0 0") && !job.all().contains("rank-exit 1 0"));
    // The way the message names repairs it: the same command finds the damaged shard,
    // rewrites it, and training reads the set again.
    let repaired = generate(src.path(), &set, "1", &[]);
    repaired.assert_ok();
    assert!(
        repaired.stderr.contains("shard-00001.bin is damaged: rewriting it"),
        "{}",
        repaired.stderr
    );
    let job = train(
        2,
        &[
            "--dataset",
            "bigmnist",
            "--data-dir",
            &path_str(&set),
            "--batch-size",
            "32",
            "--max-steps",
            "3",
            "--out",
            &path_str(&d.path().join("run3")),
        ],
        Duration::from_secs(120),
    );
    job.assert_ok();
    // Run once more on an intact set: it checks and says so.
    let again = generate(src.path(), &set, "1", &[]);
    again.assert_ok();
    assert!(again.stderr.contains("is complete and intact"), "{}", again.stderr);
}
