//! `ddpbench loader`: the input pipeline alone, before any GPU job. Reads a sample of an
//! image folder with the page cache dropped (what a first epoch on a fresh node sees),
//! then decodes and augments it from memory with one worker and with N, each worker
//! pinned to its own core of the process's binding, and reports images/s per worker and
//! in total, so a user can size `--cpus-per-task` and `--workers` for a GPU's appetite.

use super::imagenet::{self, CROP};
use super::Augment;
use crate::stats::Rng;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
ddpbench loader --data-dir /data/imagenet                  # workers = the cores this process may use\n  \
srun -c 16 ddpbench loader --data-dir /data/imagenet      # what 16 cores per GPU would give\n  \
ddpbench loader --data-dir DIR --workers 4 --out loader.csv\n\n\
Read: the sample's files read by N threads after their pages were dropped from the page cache \
(posix_fadvise DONTNEED: pages another process has mapped stay), then again warm. Prepare: \
read (warm) + decode + RandomResizedCrop(224) + flip + normalise (train) or resize 256 + centre crop 224 \
(val), as `train --workers` does, one worker alone and then N together. \
scaling = N-worker rate / (N × the one-worker rate).")]
pub struct LoaderArgs {
    /// Data set to read (image folders only).
    #[arg(long, default_value = "imagenet")]
    pub dataset: String,
    /// ImageNet-layout folder: train/<class>/*.JPEG and val/<class>/*.JPEG.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Which split's files and transform.
    #[arg(long, value_parser = ["train", "val"], default_value = "train")]
    pub split: String,
    /// Workers decoding together (default: the CPUs this process may run on).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Images in the sample (spread evenly over the split; all when it has fewer).
    #[arg(long, default_value_t = 1024)]
    pub images: usize,
    /// Times each measurement is repeated (the median and the range are reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeats: u64,
    /// Write the measurements as CSV here too.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoaderRow {
    /// read-cold, read-warm, prepare.
    pub phase: String,
    pub workers: usize,
    pub repeat: usize,
    pub images: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub images_per_s: f64,
    pub images_per_s_per_worker: f64,
    pub mb_per_s: f64,
}

/// Drops a file's pages from the page cache (clean pages no one has mapped).
fn drop_cached(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(path) {
        // SAFETY: a valid open descriptor; the advice has no effect on the file's data.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

/// Reads `files` with `workers` threads (worker w reads files w, w + N, ...); returns
/// the contents and the seconds taken.
fn read_all(files: &[PathBuf], workers: usize) -> Result<(Vec<Vec<u8>>, f64)> {
    let start = Instant::now();
    let parts: Vec<Result<Vec<Vec<u8>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    files
                        .iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|f| std::fs::read(f).with_context(|| format!("reading {}", f.display())))
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reader thread panicked")).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut out = vec![Vec::new(); files.len()];
    for (w, part) in parts.into_iter().enumerate() {
        for (k, bytes) in part?.into_iter().enumerate() {
            out[w + k * workers] = bytes;
        }
    }
    Ok((out, seconds))
}

/// Reads (from the page cache, warm) and prepares every image of `files` with `workers`
/// threads, as `train --workers` does, worker w pinned to `cpus[w % cpus.len()]`;
/// returns the seconds taken (the slowest worker).
fn prepare_all(files: &[PathBuf], how: Augment, workers: usize, cpus: &[u32], seed: u64) -> Result<f64> {
    let start = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let cpu = cpus.get(w % cpus.len().max(1)).copied();
                s.spawn(move || {
                    if let Some(c) = cpu {
                        crate::topology::pin_this_thread(&[c]);
                    }
                    let mut rng = Rng(seed ^ (w as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let mut out = vec![0f32; 3 * CROP * CROP];
                    for f in files.iter().skip(w).step_by(workers) {
                        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
                        imagenet::prepare_image(&bytes, how, &mut rng, &mut out)
                            .map_err(|e| anyhow::anyhow!("{}: cannot decode image ({e})", f.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker panicked")).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(seconds)
}

/// Entry point of `ddpbench loader`.
pub fn main(args: LoaderArgs) -> Result<()> {
    crate::train::init_logging(0);
    if args.dataset != "imagenet" {
        bail!(
            "--dataset {}: the loader measures image folders (--dataset imagenet); other data sets are decoded tensors held in memory",
            args.dataset
        );
    }
    if args.workers == Some(0) {
        bail!("--workers 0: the loader measures workers preparing images; give 1 or more (or leave it out for one per CPU)");
    }
    if args.images == 0 {
        bail!("--images 0: give the number of images to measure (1 or more)");
    }
    let ds = super::imagenet::load_image_folder(&args.data_dir)?;
    let (split, how) = if args.split == "val" {
        (&ds.test, Augment::ImageNetEval)
    } else {
        (&ds.train, Augment::ImageNetTrain)
    };
    let all = split.files.as_ref().expect("an image folder's split lists its files");
    let n = args.images.min(all.len());
    let files: Vec<PathBuf> = (0..n).map(|i| all[i * all.len() / n].clone()).collect();
    let cpus = crate::topology::allowed_pus();
    let workers = args.workers.unwrap_or(cpus.len().max(1));
    if workers > cpus.len() {
        eprintln!(
            "note: {workers} workers on {} CPUs: workers time-slice, so the per-worker rate falls",
            cpus.len()
        );
    }
    println!(
        "ddpbench loader: {} {} images of {} ({}), {workers} worker(s) on CPUs {}",
        n,
        args.split,
        args.data_dir.display(),
        if how == Augment::ImageNetTrain {
            "RandomResizedCrop(224) + flip + normalise"
        } else {
            "resize 256 + centre crop 224 + normalise"
        },
        crate::topology::compact_list(&cpus)
    );
    let mut rows = Vec::new();
    let mut bytes = 0;
    let row = |phase: &str, workers: usize, repeat: usize, bytes: u64, seconds: f64| LoaderRow {
        phase: phase.into(),
        workers,
        repeat,
        images: n,
        bytes,
        seconds,
        images_per_s: n as f64 / seconds,
        images_per_s_per_worker: n as f64 / seconds / workers as f64,
        mb_per_s: bytes as f64 / seconds / 1e6,
    };
    for r in 0..args.repeats as usize {
        files.iter().for_each(|f| drop_cached(f));
        let (d, cold_s) = read_all(&files, workers)?;
        bytes = d.iter().map(|b| b.len() as u64).sum();
        let (_, warm_s) = read_all(&files, workers)?;
        rows.push(row("read-cold", workers, r, bytes, cold_s));
        rows.push(row("read-warm", workers, r, bytes, warm_s));
    }
    let counts: Vec<usize> = if workers > 1 { vec![1, workers] } else { vec![1] };
    for r in 0..args.repeats as usize {
        for &w in &counts {
            let seconds = prepare_all(&files, how, w, &cpus, r as u64)?;
            rows.push(row("prepare", w, r, bytes, seconds));
        }
    }
    print_table(&rows, workers);
    if let Some(path) = &args.out {
        let mut log = crate::record::CsvLog::create(path)?;
        for r in &rows {
            log.write(r)?;
        }
        log.flush()?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_table(rows: &[LoaderRow], workers: usize) {
    let pick = |phase: &str, w: usize| -> Vec<&LoaderRow> { rows.iter().filter(|r| r.phase == phase && r.workers == w).collect() };
    let stats = |v: Vec<f64>| {
        let med = crate::stats::median(&v);
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (med, lo, hi)
    };
    println!(
        "{:<10} {:>7} {:>12} {:>19} {:>16} {:>9}",
        "phase", "workers", "images/s", "(min-max)", "per worker", "MB/s"
    );
    let one = stats(pick("prepare", 1).iter().map(|r| r.images_per_s).collect()).0;
    let mut lines = vec![("read-cold", workers), ("read-warm", workers), ("prepare", 1)];
    if workers > 1 {
        lines.push(("prepare", workers));
    }
    for (phase, w) in lines {
        let sel = pick(phase, w);
        let (med, lo, hi) = stats(sel.iter().map(|r| r.images_per_s).collect());
        let mb = stats(sel.iter().map(|r| r.mb_per_s).collect()).0;
        println!(
            "{phase:<10} {w:>7} {med:>12.1} {:>19} {:>16.1} {mb:>9.1}",
            format!("({lo:.1}-{hi:.1})"),
            med / w as f64
        );
    }
    if workers > 1 {
        let many = stats(pick("prepare", workers).iter().map(|r| r.images_per_s).collect()).0;
        println!(
            "scaling: {workers} workers prepare {:.2} × one worker's rate ({:.0} % of linear)",
            many / one,
            100.0 * many / (one * workers as f64)
        );
    }
}
