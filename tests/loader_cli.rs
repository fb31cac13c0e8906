//! `ddpbench loader` on an image folder the test writes: the rows it records (phases,
//! worker counts, repeats, bytes read), a PNG named .JPEG decoded, a truncated file named.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use tch::{Device, Kind, Tensor};

fn folder() -> tempfile::TempDir {
    let d = tmp();
    for (split, n) in [("train", 3), ("val", 1)] {
        for class in ["a", "b"] {
            let dir = d.path().join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..n {
                let img = Tensor::randint(256, [3, 180 + 20 * i, 260], (Kind::Uint8, Device::Cpu));
                tch::vision::image::save(&img, dir.join(format!("{i}.jpg"))).unwrap();
            }
        }
    }
    // A PNG under a JPEG name: decoded by content, not by name.
    let png = Tensor::randint(256, [3, 100, 120], (Kind::Uint8, Device::Cpu));
    tch::vision::image::save(&png, d.path().join("x.png")).unwrap();
    std::fs::rename(d.path().join("x.png"), d.path().join("train/b/2.jpg")).unwrap();
    d
}

#[test]
fn the_loader_reads_and_prepares_every_image_and_records_each_measurement() {
    let d = folder();
    let csv = d.path().join("loader.csv");
    let job = ddpbench(&[
        "loader",
        "--data-dir",
        &path_str(d.path()),
        "--workers",
        "2",
        "--repeats",
        "2",
        "--out",
        &path_str(&csv),
    ]);
    job.assert_ok();
    assert!(job.stdout.contains("scaling: 2 workers prepare"), "{}", job.stdout);
    let (h, rows) = read_csv(&csv);
    let at = |name: &str| h.iter().position(|x| x == name).unwrap();
    let phases: Vec<(String, String)> = rows.iter().map(|r| (r[at("phase")].clone(), r[at("workers")].clone())).collect();
    let count = |p: &str, w: &str| phases.iter().filter(|(a, b)| a == p && b == w).count();
    assert_eq!((count("read-cold", "2"), count("read-warm", "2")), (2, 2), "{phases:?}");
    assert_eq!((count("prepare", "1"), count("prepare", "2")), (2, 2), "{phases:?}");
    assert_eq!(rows.len(), 8);
    // Every train image, and exactly their bytes on disk.
    let on_disk: u64 = ["a", "b"]
        .iter()
        .flat_map(|c| std::fs::read_dir(d.path().join("train").join(c)).unwrap())
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    for (images, bytes) in col(&h, &rows, "images").iter().zip(col(&h, &rows, "bytes")) {
        assert_eq!((*images, bytes), (6.0, on_disk as f64));
    }
    for ((n, s), rate) in col(&h, &rows, "images")
        .iter()
        .zip(col(&h, &rows, "seconds"))
        .zip(col(&h, &rows, "images_per_s"))
    {
        assert!(s > 0.0 && (n / s - rate).abs() <= 1e-6 * rate, "{n} / {s} vs {rate}");
    }
}

#[test]
fn a_truncated_image_is_named() {
    let d = folder();
    let bad = d.path().join("train/a/1.jpg");
    let bytes = std::fs::read(&bad).unwrap();
    // A tenth of the data: fewer rows than the smallest crop (8 % of the area) spans.
    std::fs::write(&bad, &bytes[..bytes.len() / 10]).unwrap();
    let job = ddpbench(&["loader", "--data-dir", &path_str(d.path()), "--workers", "1", "--repeats", "1"]);
    assert!(!job.ok());
    assert!(
        job.stderr.contains("train/a/1.jpg") && job.stderr.contains("truncated"),
        "{}",
        job.stderr
    );
    for (flag, what) in [("--workers", "--workers 0: "), ("--images", "--images 0: ")] {
        let job = ddpbench(&["loader", "--data-dir", &path_str(d.path()), flag, "0"]);
        assert!(!job.ok() && job.stderr.contains(what), "{}", job.stderr);
    }
    let job = ddpbench(&["loader", "--data-dir", &path_str(d.path()), "--dataset", "cifar10"]);
    assert!(
        !job.ok() && job.stderr.contains("--dataset cifar10: the loader measures image folders"),
        "{}",
        job.stderr
    );
}

/// A worker count no node could run is refused before any thread starts, and a thread
/// the system will not start is an error naming it, not a panic.
#[test]
fn worker_counts_are_bounded_and_a_thread_that_cannot_start_is_an_error() {
    let d = folder();
    let job = ddpbench(&["loader", "--data-dir", &path_str(d.path()), "--workers", "100000"]);
    assert!(!job.ok(), "{}", job.all());
    assert!(job.stderr.contains("--workers 100000: must be 1 to "), "{}", job.stderr);
    assert!(
        !job.stderr.contains("panicked") && !job.stderr.contains("ddpbench bug"),
        "{}",
        job.stderr
    );
    // Threads ask for a 1 TiB stack (RUST_MIN_STACK): the system refuses to start them.
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["loader", "--data-dir", &path_str(d.path()), "--workers", "2", "--repeats", "1"])
        .env("RUST_MIN_STACK", (1u64 << 40).to_string());
    let job = run_with_limit(cmd, std::time::Duration::from_secs(120));
    assert!(!job.ok(), "{}", job.all());
    assert!(job.stderr.contains("cannot start worker thread"), "{}", job.stderr);
    assert!(
        !job.stderr.contains("panicked") && !job.stderr.contains("ddpbench bug"),
        "{}",
        job.stderr
    );
}
