//! `ddpbench loader`: the input pipeline alone, before any GPU job. Reads a sample of an
//! image folder with the page cache dropped (what a first epoch on a fresh node sees),
//! then decodes and augments it from memory with one worker and with N, each worker
//! pinned to its own core of the process's binding, and reports images/s per worker and
//! in total, so a user can size `--cpus-per-task` and `--workers` for a GPU's appetite.

use super::image_caps::ImageCaps;
use super::imagenet::{self, CROP};
use super::Augment;
use crate::stats::Rng;
use anyhow::{anyhow, bail, Result};
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
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<name>` is a placeholder
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
    #[command(flatten)]
    pub image_caps: ImageCaps,
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LoaderRow {
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

/// Starts `workers` scoped threads running `work(w)` and collects their results; a
/// thread the system will not start is an error (those started are joined first).
fn run_workers<'s, 'e, T: Send + 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    workers: usize,
    work: impl Fn(usize) -> Result<T> + Send + Sync + Copy + 's,
) -> Result<Vec<T>> {
    let mut handles = Vec::with_capacity(workers);
    for w in 0..workers {
        let handle = std::thread::Builder::new()
            .name(format!("ddpbench-loader-{w}"))
            .spawn_scoped(s, move || work(w))
            .map_err(|e| anyhow!("cannot start worker thread {} of {workers} ({e}); lower --workers", w + 1))?;
        handles.push(handle);
    }
    handles
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow!("a worker thread panicked"))?)
        .collect()
}

/// Reads `files` within `caps` with `workers` threads (worker w reads files w, w + N,
/// ...); returns the bytes read and the seconds taken. Each file is dropped once read,
/// so at most `workers` files are held at a time.
fn read_all(files: &[PathBuf], workers: usize, caps: &ImageCaps) -> Result<(u64, f64)> {
    let start = Instant::now();
    let parts = std::thread::scope(|s| {
        run_workers(s, workers, |w| -> Result<u64> {
            let mut bytes = 0;
            for f in files.iter().skip(w).step_by(workers) {
                bytes += caps.read(f)?.len() as u64;
            }
            Ok(bytes)
        })
    })?;
    Ok((parts.iter().sum(), start.elapsed().as_secs_f64()))
}

/// Reads (from the page cache, warm) and prepares every image of `files` with `workers`
/// threads, as `train --workers` does, worker w pinned to `cpus[w % cpus.len()]`;
/// returns the seconds taken (the slowest worker).
fn prepare_all(files: &[PathBuf], how: Augment, workers: usize, cpus: &[u32], seed: u64, caps: &ImageCaps) -> Result<f64> {
    let start = Instant::now();
    std::thread::scope(|s| {
        run_workers(s, workers, |w| -> Result<()> {
            if let Some(&c) = cpus.get(w % cpus.len().max(1)) {
                crate::topology::pin_this_thread(&[c]);
            }
            let mut rng = Rng(seed ^ (w as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut out = vec![0f32; 3 * CROP * CROP];
            for f in files.iter().skip(w).step_by(workers) {
                imagenet::load_image(f, how, &mut rng, &mut out, caps)?;
            }
            Ok(())
        })
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// Entry point of `ddpbench loader`.
pub fn main(args: LoaderArgs) -> Result<()> {
    crate::job::logging::init(0);
    if args.dataset != "imagenet" {
        bail!(
            "--dataset {}: the loader measures image folders (--dataset imagenet); other data sets are decoded tensors held in memory",
            args.dataset
        );
    }
    if args.workers == Some(0) {
        bail!("--workers 0: the loader measures workers preparing images; give 1 or more (or leave it out for one per CPU)");
    }
    let most = super::loader::max_workers(crate::topology::online_cpus());
    if let Some(w) = args.workers.filter(|&w| w > most) {
        bail!("--workers {w}: must be 1 to {most} worker threads (4 per hardware thread of this node, at most 256)");
    }
    if args.images == 0 {
        bail!("--images 0: give the number of images to measure (1 or more)");
    }
    let ds = super::imagenet::load_image_folder(&args.data_dir, args.image_caps)?;
    let (split, how) = if args.split == "val" {
        (&ds.test, Augment::ImageNetEval)
    } else {
        (&ds.train, Augment::ImageNetTrain)
    };
    let all = split.files.as_ref().expect("an image folder's split lists its files");
    let n = args.images.min(all.len());
    let files: Vec<PathBuf> = (0..n).map(|i| all[i * all.len() / n].clone()).collect();
    let cpus = crate::topology::allowed_pus();
    let workers = args.workers.unwrap_or(cpus.len().clamp(1, most));
    if workers > cpus.len() {
        eprintln!(
            "note: {workers} workers on {} CPUs: workers time-slice, so the per-worker rate falls",
            cpus.len()
        );
    }
    let caps = args.image_caps;
    println!(
        "ddpbench loader: {} {} images of {} ({}), {workers} worker(s) on CPUs {}; files up to {} bytes and {} pixels",
        n,
        args.split,
        args.data_dir.display(),
        if how == Augment::ImageNetTrain {
            "RandomResizedCrop(224) + flip + normalise"
        } else {
            "resize 256 + centre crop 224 + normalise"
        },
        crate::topology::compact_list(&cpus),
        caps.max_image_bytes,
        caps.max_image_pixels
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
        let (read, cold_s) = read_all(&files, workers, &caps)?;
        bytes = read;
        let (_, warm_s) = read_all(&files, workers, &caps)?;
        rows.push(row("read-cold", workers, r, bytes, cold_s));
        rows.push(row("read-warm", workers, r, bytes, warm_s));
    }
    let counts: Vec<usize> = if workers > 1 { vec![1, workers] } else { vec![1] };
    for r in 0..args.repeats as usize {
        for &w in &counts {
            let seconds = prepare_all(&files, how, w, &cpus, r as u64, &caps)?;
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
