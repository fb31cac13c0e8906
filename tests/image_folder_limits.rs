//! Image folders within bounds: an image whose header declares more pixels than
//! `--max-image-pixels`, or a file larger than `--max-image-bytes`, is named and refused
//! as a corrupt one is, by `loader` and by `train`, from its header or its size on disk;
//! a batch worker the system will not start is an error, not a panic.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// An ImageNet-layout folder of 64×64 JPEGs: 2 classes, 2 train and 1 val image each.
fn folder() -> tempfile::TempDir {
    let d = tmp();
    for (split, n) in [("train", 2), ("val", 1)] {
        for class in ["a", "b"] {
            let dir = d.path().join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..n {
                let img = Tensor::randint(256, [3, 64, 64], (Kind::Uint8, Device::Cpu));
                tch::vision::image::save(&img, dir.join(format!("{i}.jpg"))).unwrap();
            }
        }
    }
    d
}

/// A JPEG with the frame header's (SOF's) size set to `w`×`h`, the rest unchanged.
fn forge_size(bytes: &[u8], w: u16, h: u16) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let mut at = 2;
    // Segments from the start-of-image marker on: FF, marker, 2-byte length.
    while !matches!(b[at + 1], 0xC0 | 0xC2) {
        at += 2 + u16::from_be_bytes([b[at + 2], b[at + 3]]) as usize;
    }
    b[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
    b[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
    b
}

fn train_args<'a>(dir: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--model",
        "resnet18",
        "--dataset",
        "imagenet",
        "--data-dir",
        dir,
        "--batch-size",
        "1",
        "--max-steps",
        "1",
        "--probe-iters",
        "0",
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    args
}

fn loader(dir: &Path, split: &str, extra: &[&str]) -> Job {
    let mut args = vec![
        "loader",
        "--data-dir",
        dir.to_str().unwrap(),
        "--split",
        split,
        "--workers",
        "1",
        "--repeats",
        "1",
    ];
    args.extend_from_slice(extra);
    ddpbench(&args)
}

fn assert_refused(job: &Job, parts: &[&str]) {
    assert!(!job.ok(), "accepted:\n{}", job.all());
    for p in parts {
        assert!(job.stderr.contains(p), "expected {p:?} in:\n{}", job.stderr);
    }
    assert!(
        !job.stderr.contains("panicked") && !job.stderr.contains("ddpbench bug"),
        "{}",
        job.stderr
    );
}

#[test]
fn an_image_over_the_pixel_cap_is_named_and_refused() {
    let d = folder();
    // 64×64 = 4096 pixels: refused at 4095, accepted at 4096.
    let job = loader(d.path(), "val", &["--max-image-pixels", "4095"]);
    assert_refused(
        &job,
        &[
            "val/a/0.jpg: cannot decode image",
            "64×64",
            "--max-image-pixels 4095",
            "remove or replace the file",
        ],
    );
    loader(d.path(), "val", &["--max-image-pixels", "4096"]).assert_ok();
    // A PNG under a JPEG name: its size is read from its header before libtorch decodes it.
    let png = Tensor::randint(256, [3, 100, 120], (Kind::Uint8, Device::Cpu));
    tch::vision::image::save(&png, d.path().join("x.png")).unwrap();
    std::fs::rename(d.path().join("x.png"), d.path().join("val/b/0.jpg")).unwrap();
    let job = loader(d.path(), "val", &["--max-image-pixels", "4096"]);
    assert_refused(&job, &["val/b/0.jpg: cannot decode image", "120×100", "--max-image-pixels 4096"]);
    // A baseline JPEG whose header claims 65000×65000, under the default cap.
    let bytes = std::fs::read(d.path().join("val/a/0.jpg")).unwrap();
    std::fs::write(d.path().join("val/a/0.jpg"), forge_size(&bytes, 65000, 65000)).unwrap();
    let job = loader(d.path(), "val", &[]);
    assert_refused(
        &job,
        &["val/a/0.jpg: cannot decode image", "65000×65000", "--max-image-pixels 178956970"],
    );
}

#[test]
fn a_file_over_the_byte_cap_is_named_and_refused() {
    let d = folder();
    let big = d.path().join("train/b/1.jpg");
    let size = std::fs::metadata(&big).unwrap().len();
    let others = ["a/0", "a/1", "b/0", "b/1"]
        .iter()
        .map(|f| std::fs::metadata(d.path().join(format!("train/{f}.jpg"))).unwrap().len())
        .max()
        .unwrap();
    // Make one file the largest by far; a cap between it and the others refuses it alone.
    let img = Tensor::randint(256, [3, 200, 200], (Kind::Uint8, Device::Cpu));
    tch::vision::image::save(&img, &big).unwrap();
    let grown = std::fs::metadata(&big).unwrap().len();
    assert!(grown > 2 * size.max(others), "{grown} vs {size}");
    let cap = (others + grown) / 2;
    let job = loader(d.path(), "train", &["--max-image-bytes", &cap.to_string()]);
    assert_refused(
        &job,
        &[
            "train/b/1.jpg: cannot decode image",
            &format!("{grown} bytes"),
            &format!("--max-image-bytes {cap}"),
        ],
    );
    loader(d.path(), "train", &["--max-image-bytes", &grown.to_string()]).assert_ok();
    // Just over the default 64 MiB, without the disk space (a sparse file).
    std::fs::File::create(&big).unwrap().set_len((64 << 20) + 1).unwrap();
    let job = loader(d.path(), "train", &[]);
    assert_refused(&job, &["train/b/1.jpg: cannot decode image", "--max-image-bytes 67108864"]);
}

/// `train` refuses such a file by name on every rank, and the manifest records both caps.
#[test]
fn train_names_an_image_over_a_cap_and_records_the_caps() {
    let d = folder();
    let out = d.path().join("run");
    let (dir, out_s) = (path_str(d.path()), path_str(&out));
    let args = train_args(&dir, &out_s, &["--workers", "0", "--max-image-bytes", "100"]);
    let job = train_reporting_exits(2, &args, &[], Duration::from_secs(240));
    let all = job.all();
    assert!(!job.timed_out, "hung:\n{all}");
    assert!(
        all.contains(".jpg: cannot decode image") && all.contains("--max-image-bytes 100"),
        "{all}"
    );
    assert!(!all.contains("rank-exit 0 0") && !all.contains("rank-exit 1 0"), "{all}");
    assert!(!all.contains("ddpbench bug"), "{all}");
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "failed");
    assert_eq!(
        (m["config"]["max_image_bytes"].as_u64(), m["config"]["max_image_pixels"].as_u64()),
        (Some(100), Some(178_956_970)),
        "{}",
        m["config"]
    );
}

/// Batch workers whose threads the system refuses (each asks for a 1 TiB stack through
/// RUST_MIN_STACK) stop the run with an error saying so on every rank.
#[test]
fn train_reports_a_batch_worker_that_cannot_start() {
    let d = folder();
    let out = d.path().join("run");
    let (dir, out_s) = (path_str(d.path()), path_str(&out));
    let args = train_args(&dir, &out_s, &["--workers", "1"]);
    let stack = (1u64 << 40).to_string();
    let job = train_reporting_exits(2, &args, &[("RUST_MIN_STACK", &stack)], Duration::from_secs(240));
    let all = job.all();
    assert!(!job.timed_out, "hung:\n{all}");
    assert!(all.contains("cannot start batch worker thread"), "{all}");
    assert!(!all.contains("rank-exit 0 0") && !all.contains("rank-exit 1 0"), "{all}");
    assert!(!all.contains("panicked") && !all.contains("ddpbench bug"), "{all}");
}
