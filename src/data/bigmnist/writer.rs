//! Writing a bigMNIST set: the source's images augmented `augment` times each and
//! replicated `copies` times, written in parallel into checksummed shards; a run that
//! finds shards complete (their `.done` files) resumes after them.

use super::{shard_name, Index, ShardInfo, BLOCK_RECORDS, RECORD_BYTES};
use crate::data::idx::{read_idx, DataError};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

/// Augments a batch of images [B, 1, 28, 28] (values 0..1): one random affine map per
/// image (rotation ±15°, shear ±10°, scale 0.9–1.1, translation ±10 %, horizontal flip
/// with probability 1/2) plus an elastic displacement field (Simard et al. 2003:
/// α = 34 px, σ = 4 px), sampled bilinearly. Draws from libtorch's generator.
pub(crate) fn augment_batch(x: &Tensor) -> Tensor {
    let b = x.size()[0];
    let opts = (Kind::Float, Device::Cpu);
    let u = |lo: f64, hi: f64| Tensor::rand([b], opts) * (hi - lo) + lo;
    let angle = u(-15.0, 15.0) * (std::f64::consts::PI / 180.0);
    let shear = u(-10.0, 10.0) * (std::f64::consts::PI / 180.0);
    let scale = u(0.9, 1.1);
    let (tx, ty) = (u(-0.2, 0.2), u(-0.2, 0.2));
    let flip = Tensor::rand([b], opts).lt(0.5).to_kind(Kind::Float) * -2.0 + 1.0;
    // Rotation × shear, divided by scale (the grid maps output to input coordinates).
    let (c, s, t) = (angle.cos(), angle.sin(), shear.tan());
    let a11 = &c / &scale * &flip;
    let a12 = (&c * &t - &s) / &scale;
    let a21 = &s / &scale * &flip;
    let a22 = (&s * &t + &c) / &scale;
    let theta = Tensor::stack(&[a11, a12, tx, a21, a22, ty], 1).view([b, 2, 3]);
    let grid = Tensor::affine_grid_generator(&theta, [b, 1, 28, 28], false);
    // Elastic: uniform noise smoothed by a Gaussian (σ = 4 px), scaled to α = 34 px.
    let sigma = 4.0f64;
    let radius = 8i64;
    let k = Tensor::arange_start(-radius, radius + 1, opts);
    let g = (-(&k * &k) / (2.0 * sigma * sigma)).exp();
    let g = &g / g.sum(Kind::Float);
    // Separable blur: a vertical then a horizontal 1-D Gaussian (17 + 17 taps, not 17²).
    let kv = g.view([1, 1, 2 * radius + 1, 1]).repeat([2, 1, 1, 1]);
    let kh = g.view([1, 1, 1, 2 * radius + 1]).repeat([2, 1, 1, 1]);
    let noise = Tensor::rand([b, 2, 28, 28], opts) * 2.0 - 1.0;
    let field =
        noise
            .conv2d(&kv, None::<Tensor>, [1, 1], [radius, 0], [1, 1], 2)
            .conv2d(&kh, None::<Tensor>, [1, 1], [0, radius], [1, 1], 2);
    let field = field * (34.0 * 2.0 / 28.0);
    let grid = grid + field.permute([0, 2, 3, 1]);
    Tensor::grid_sampler(x, &grid, 0, 0, false)
}

/// The augmented set: `augment` versions of every source image, as records.
fn augmented_records(images: &[u8], labels: &[u8], augment: usize, seed: u64) -> Vec<u8> {
    let n = labels.len();
    let mut out = Vec::with_capacity(n * augment * RECORD_BYTES);
    tch::manual_seed(seed as i64);
    let all = Tensor::from_slice(images).view([n as i64, 1, 28, 28]).to_kind(Kind::Float) / 255.0;
    for _ in 0..augment {
        for start in (0..n).step_by(8192) {
            let len = (n - start).min(8192);
            let aug = augment_batch(&all.narrow(0, start as i64, len as i64));
            let px = Vec::<u8>::try_from((aug * 255.0).round().clamp(0.0, 255.0).to_kind(Kind::Uint8).view([-1])).unwrap();
            for i in 0..len {
                out.push(labels[start + i]);
                out.extend_from_slice(&px[i * 784..(i + 1) * 784]);
            }
        }
    }
    out
}

/// Writes one shard: samples [first, first + samples) of the replicated set.
fn write_shard(dir: &Path, k: usize, first: u64, samples: u64, unique: &[u8], written: &AtomicU64) -> Result<ShardInfo> {
    let n_unique = (unique.len() / RECORD_BYTES) as u64;
    let tmp = dir.join(format!("{}.tmp", shard_name(k)));
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?,
    );
    let mut crcs = Vec::new();
    let mut g = first;
    while g < first + samples {
        let block_end = (g + BLOCK_RECORDS as u64).min(first + samples);
        let mut crc = flate2::Crc::new();
        for i in g..block_end {
            let u = (i % n_unique) as usize;
            let rec = &unique[u * RECORD_BYTES..(u + 1) * RECORD_BYTES];
            crc.update(rec);
            f.write_all(rec)?;
        }
        crcs.push(crc.sum());
        written.fetch_add(block_end - g, Ordering::Relaxed);
        g = block_end;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, dir.join(shard_name(k)))?;
    let info = ShardInfo {
        file: shard_name(k),
        first,
        samples,
        block_crc32: crcs,
    };
    std::fs::write(dir.join(format!("{}.done", shard_name(k))), serde_json::to_string(&info)?)?;
    Ok(info)
}

/// A shard's file holds what its record says: the right size and every block's CRC32.
fn shard_intact(dir: &Path, info: &ShardInfo) -> bool {
    let Ok(mut f) = std::fs::File::open(dir.join(&info.file)) else {
        return false;
    };
    if f.metadata().map(|m| m.len()).ok() != Some(info.samples * RECORD_BYTES as u64) {
        return false;
    }
    let mut buf = vec![0u8; BLOCK_RECORDS * RECORD_BYTES];
    let mut left = info.samples as usize;
    for &want in &info.block_crc32 {
        let n = left.min(BLOCK_RECORDS);
        if f.read_exact(&mut buf[..n * RECORD_BYTES]).is_err() {
            return false;
        }
        let mut crc = flate2::Crc::new();
        crc.update(&buf[..n * RECORD_BYTES]);
        if crc.sum() != want {
            return false;
        }
        left -= n;
    }
    left == 0
}

/// The source's training images and labels (N×28×28 and N).
fn read_source(from: &Path) -> Result<(Vec<u8>, Vec<u8>)> {
    let find = |stem: &str| -> Result<PathBuf> {
        [from.join(stem), from.join(format!("{stem}.gz"))]
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                DataError::Missing {
                    path: from.join(format!("{stem}[.gz]")),
                    hint: "--from must be an MNIST-format folder".into(),
                }
                .into()
            })
    };
    let (dims, images) = read_idx(&find("train-images-idx3-ubyte")?, 0x803)?;
    let (_, labels) = read_idx(&find("train-labels-idx1-ubyte")?, 0x801)?;
    if dims.len() != 3 || dims[1..] != [28, 28] || dims[0] != labels.len() || labels.is_empty() {
        bail!(
            "{}: expected N×28×28 images with N labels (N ≥ 1), found {dims:?} and {} labels",
            from.display(),
            labels.len()
        );
    }
    Ok((images, labels))
}

/// Pixel mean and standard deviation (0..1 scale) of `records`.
fn pixel_stats(records: &[u8]) -> (f64, f64) {
    let (mut sum, mut sq, mut n) = (0.0f64, 0.0f64, 0u64);
    for r in records.chunks(RECORD_BYTES) {
        for &p in &r[1..] {
            let v = p as f64 / 255.0;
            sum += v;
            sq += v * v;
            n += 1;
        }
    }
    let mean = sum / n.max(1) as f64;
    (mean, (sq / n.max(1) as f64 - mean * mean).max(0.0).sqrt())
}

/// The shards an earlier run completed that are intact (size and every CRC); a damaged
/// or unfinished one is left to be written again, and says so.
fn intact_shards(out: &Path, n_shards: usize) -> Vec<Option<ShardInfo>> {
    (0..n_shards)
        .map(|k| {
            let done = out.join(format!("{}.done", shard_name(k)));
            let info: ShardInfo = serde_json::from_str(&std::fs::read_to_string(&done).ok()?).ok()?;
            if shard_intact(out, &info) {
                Some(info)
            } else {
                eprintln!("{} is damaged: rewriting it", out.join(&info.file).display());
                let _ = std::fs::remove_file(&done);
                None
            }
        })
        .collect()
}

/// `ddpbench gen-bigmnist` options.
#[derive(Args, Debug, Clone)]
pub struct GenBigMnistArgs {
    /// MNIST-format folder to start from (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]).
    #[arg(long)]
    pub from: PathBuf,
    /// Augmented versions of each training image.
    #[arg(long, default_value_t = 6)]
    pub augment: usize,
    /// Copies of the augmented set (with --augment 6, 200 copies give 72,000,000 samples, ~52 GiB).
    #[arg(long, default_value_t = 200)]
    pub copies: usize,
    /// Output folder (shards, index.json). Run the same command again to resume.
    #[arg(long)]
    pub out: PathBuf,
    /// Samples per shard file (785 bytes each).
    #[arg(long, default_value_t = 1 << 20)]
    pub shard_samples: u64,
    /// Seed of the augmentation: the same seed gives the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Shards written at once (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The plan of one generation: what to write where.
struct ShardPlan<'a> {
    args: &'a GenBigMnistArgs,
    total: u64,
    n_shards: usize,
    todo: Vec<usize>,
}

impl ShardPlan<'_> {
    fn samples_of(&self, k: usize) -> u64 {
        (self.total - k as u64 * self.args.shard_samples).min(self.args.shard_samples)
    }
}

/// `ddpbench gen-bigmnist`. Run again, it resumes an interrupted generation and, on a
/// finished set, re-checks every shard and rewrites any that is damaged.
pub fn generate(args: GenBigMnistArgs) -> Result<()> {
    anyhow::ensure!(
        args.augment > 0 && args.copies > 0 && args.shard_samples > 0,
        "--augment, --copies and --shard-samples must be at least 1"
    );
    let (images, labels) = read_source(&args.from)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let unique_n = (labels.len() * args.augment) as u64;
    let total = unique_n * args.copies as u64;
    let n_shards = total.div_ceil(args.shard_samples) as usize;
    if let Ok(text) = std::fs::read_to_string(args.out.join("index.json")) {
        let idx: Index = serde_json::from_str(&text)
            .with_context(|| format!("{} holds a damaged index.json: delete it and run again", args.out.display()))?;
        if !(idx.samples == total && idx.seed == args.seed && idx.augment == args.augment) {
            bail!(
                "{} holds a different bigMNIST ({} samples, seed {}): choose another --out",
                args.out.display(),
                idx.samples,
                idx.seed
            );
        }
        eprintln!("{} exists: checking every shard", args.out.display());
    }
    let mut done = intact_shards(&args.out, n_shards);
    let resumed = done.iter().filter(|d| d.is_some()).count();
    if resumed == n_shards && args.out.join("index.json").is_file() {
        eprintln!("{} is complete and intact ({total} samples)", args.out.display());
        return Ok(());
    }
    if resumed > 0 {
        eprintln!("resuming: {resumed} of {n_shards} shards already complete and intact");
    }
    let t0 = std::time::Instant::now();
    let unique = Arc::new(augmented_records(&images, &labels, args.augment, args.seed));
    let aug_s = t0.elapsed().as_secs_f64();
    let (mean, std) = pixel_stats(&unique);
    let plan = ShardPlan {
        args: &args,
        total,
        n_shards,
        todo: (0..n_shards).filter(|&k| done[k].is_none()).collect(),
    };
    let t1 = std::time::Instant::now();
    let (threads, written) = write_shards(&plan, &unique, resumed, &mut done)?;
    let write_s = t1.elapsed().as_secs_f64();
    let index = Index {
        format: "ddpbench-bigmnist-1".into(),
        samples: total,
        unique: unique_n,
        augment: args.augment,
        copies: args.copies,
        seed: args.seed,
        source: args.from.canonicalize().unwrap_or(args.from.clone()).display().to_string(),
        mean,
        std,
        shards: done.into_iter().map(Option::unwrap).collect(),
    };
    crate::record::write_atomic(&args.out.join("index.json"), &serde_json::to_string_pretty(&index)?)?;
    eprintln!(
        "wrote {} samples ({:.2} GiB) in {} shards to {}: augmentation {:.1} s ({:.0} images/s), writing {:.1} s ({:.2} M samples/s with {threads} threads)",
        total,
        (total * RECORD_BYTES as u64) as f64 / (1u64 << 30) as f64,
        n_shards,
        args.out.display(),
        aug_s,
        unique_n as f64 / aug_s.max(1e-9),
        write_s,
        written as f64 / write_s.max(1e-9) / 1e6
    );
    Ok(())
}

/// Writes the plan's shards on `--threads` threads (with progress on stderr) into
/// `done`; returns the threads used and the samples written. Fails when a shard could
/// not be written or the run was cut short (the test hook
/// `DDPBENCH_GEN_FAULT_AFTER_SHARDS=N` stops after N shards).
fn write_shards(plan: &ShardPlan, unique: &Arc<Vec<u8>>, resumed: usize, done: &mut [Option<ShardInfo>]) -> Result<(usize, u64)> {
    let args = plan.args;
    let todo_samples: u64 = plan.todo.iter().map(|&k| plan.samples_of(k)).sum();
    let fault_after: Option<usize> = std::env::var("DDPBENCH_GEN_FAULT_AFTER_SHARDS").ok().and_then(|v| v.parse().ok());
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let written = AtomicU64::new(0);
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .max(1);
    let t1 = std::time::Instant::now();
    let results: Vec<Result<Vec<ShardInfo>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(plan.todo.len().max(1)))
            .map(|_| {
                scope.spawn(|| -> Result<Vec<ShardInfo>> {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= plan.todo.len() || fault_after.is_some_and(|f| finished.load(Ordering::SeqCst) >= f) {
                            return Ok(mine);
                        }
                        let k = plan.todo[i];
                        let first = k as u64 * args.shard_samples;
                        mine.push(write_shard(&args.out, k, first, plan.samples_of(k), unique, &written)?);
                        finished.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let progress = Progress {
            todo_samples,
            n_shards: plan.n_shards,
            resumed,
            start: t1,
            last_decile: std::cell::Cell::new(0),
            bar: crate::progress::Bar::percent("gen-bigmnist", todo_samples),
        };
        while !workers.iter().all(|w| w.is_finished()) {
            progress.show(&written, &finished);
        }
        drop(progress);
        workers.into_iter().map(|w| w.join().expect("shard writer panicked")).collect()
    });
    for r in results {
        for info in r? {
            let k = info.first / args.shard_samples;
            done[k as usize] = Some(info);
        }
    }
    let missing = done.iter().filter(|d| d.is_none()).count();
    if missing > 0 {
        bail!(
            "interrupted with {missing} of {} shards unwritten: run the same command again to resume",
            plan.n_shards
        );
    }
    Ok((threads, written.load(Ordering::Relaxed)))
}

/// Progress of the writers: a bar on a terminal ([`crate::progress`]), a line per 10 %
/// otherwise.
struct Progress {
    todo_samples: u64,
    n_shards: usize,
    resumed: usize,
    start: std::time::Instant,
    last_decile: std::cell::Cell<usize>,
    bar: crate::progress::Bar,
}

impl Progress {
    /// Waits a moment, then shows the samples written and shards finished so far.
    fn show(&self, written: &AtomicU64, finished: &AtomicUsize) {
        let shown = self.bar.shown();
        std::thread::sleep(std::time::Duration::from_millis(if shown { 200 } else { 500 }));
        let (written, finished) = (written.load(Ordering::Relaxed), finished.load(Ordering::Relaxed));
        let frac = written as f64 / self.todo_samples.max(1) as f64;
        let rate = written as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        let eta = (self.todo_samples - written.min(self.todo_samples)) as f64 / rate.max(1.0);
        if shown {
            self.bar.set(
                written,
                format!(
                    "{}/{} shards · {:.2} M samples/s",
                    finished + self.resumed,
                    self.n_shards,
                    rate / 1e6
                ),
            );
        } else if (frac * 10.0) as usize > self.last_decile.get() {
            self.last_decile.set((frac * 10.0) as usize);
            eprintln!("{:.0} % written ({:.2} M samples/s, ETA {:.0} s)", frac * 100.0, rate / 1e6, eta);
        }
    }
}
