//! bigMNIST (seed 000): an MNIST-format training set augmented `augment` times per
//! image (rotation, shear, translation, scaling, horizontal flip, elastic
//! deformation) and replicated `copies` times: 60,000 × 6 × 200 = 72,000,000
//! samples, about 52 GiB. Too big for memory, so it is written in shards and
//! streamed.
//!
//! On disk: `shard-00000.bin`, … of fixed 785-byte records (1 label byte, 28×28
//! pixel bytes), and `index.json` with every shard's size and a CRC32 per block of
//! [`BLOCK_RECORDS`] records. Generation writes shards in parallel; a shard is
//! complete once its `.done` file exists, so an interrupted run resumes where it
//! stopped. Readers verify each block's CRC as they stream it.

use crate::cli::GenBigMnistArgs;
use crate::data::{read_idx, DataError};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

pub const RECORD_BYTES: usize = 1 + 28 * 28;
pub const BLOCK_RECORDS: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardInfo {
    pub file: String,
    /// Global index of the shard's first sample.
    pub first: u64,
    pub samples: u64,
    /// CRC32 of each block of BLOCK_RECORDS records (the last may be shorter).
    pub block_crc32: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Index {
    pub format: String,
    pub samples: u64,
    /// Distinct augmented images (source images × augment); the rest are copies.
    pub unique: u64,
    pub augment: usize,
    pub copies: usize,
    pub seed: u64,
    pub source: String,
    /// Pixel mean and standard deviation (0..1 scale) of the augmented set, for normalisation.
    pub mean: f64,
    pub std: f64,
    pub shards: Vec<ShardInfo>,
}

/// Augments a batch of images [B, 1, 28, 28] (values 0..1): one random affine map per
/// image (rotation ±15°, shear ±10°, scale 0.9–1.1, translation ±10 %, horizontal flip
/// with probability 1/2) plus an elastic displacement field (Simard et al. 2003:
/// α = 34 px, σ = 4 px), sampled bilinearly. Draws from libtorch's generator.
pub fn augment_batch(x: &Tensor) -> Tensor {
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

fn shard_name(k: usize) -> String {
    format!("shard-{k:05}.bin")
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

/// `ddpbench gen-bigmnist`.
pub fn generate(args: GenBigMnistArgs) -> Result<()> {
    anyhow::ensure!(
        args.augment > 0 && args.copies > 0 && args.shard_samples > 0,
        "--augment, --copies and --shard-samples must be at least 1"
    );
    let find = |stem: &str| -> Result<PathBuf> {
        [args.from.join(stem), args.from.join(format!("{stem}.gz"))]
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                DataError::Missing {
                    path: args.from.join(format!("{stem}[.gz]")),
                    hint: "--from must be an MNIST-format folder".into(),
                }
                .into()
            })
    };
    let (dims, images) = read_idx(&find("train-images-idx3-ubyte")?, 0x803)?;
    let (_, labels) = read_idx(&find("train-labels-idx1-ubyte")?, 0x801)?;
    if dims[1..] != [28, 28] || dims[0] != labels.len() {
        bail!(
            "{}: expected N×28×28 images with N labels, found {dims:?} and {} labels",
            args.from.display(),
            labels.len()
        );
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let index_path = args.out.join("index.json");
    let unique_n = (labels.len() * args.augment) as u64;
    let total = unique_n * args.copies as u64;
    let n_shards = total.div_ceil(args.shard_samples) as usize;
    if let Ok(text) = std::fs::read_to_string(&index_path) {
        let idx: Index = serde_json::from_str(&text)?;
        if idx.samples == total && idx.seed == args.seed && idx.augment == args.augment {
            eprintln!("{} is already complete ({} samples)", args.out.display(), idx.samples);
            return Ok(());
        }
        bail!(
            "{} holds a different bigMNIST ({} samples, seed {}): choose another --out",
            args.out.display(),
            idx.samples,
            idx.seed
        );
    }
    let t0 = std::time::Instant::now();
    let unique = Arc::new(augmented_records(&images, &labels, args.augment, args.seed));
    let aug_s = t0.elapsed().as_secs_f64();
    let px: Vec<f64> = unique
        .chunks(RECORD_BYTES)
        .flat_map(|r| r[1..].iter().map(|&p| p as f64 / 255.0))
        .collect();
    let mean = px.iter().sum::<f64>() / px.len() as f64;
    let std = (px.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / px.len() as f64).sqrt();
    drop(px);

    // Shards already complete (an earlier, interrupted run) are kept.
    let mut done: Vec<Option<ShardInfo>> = (0..n_shards)
        .map(|k| {
            let info: ShardInfo =
                serde_json::from_str(&std::fs::read_to_string(args.out.join(format!("{}.done", shard_name(k)))).ok()?).ok()?;
            let len = std::fs::metadata(args.out.join(&info.file)).ok()?.len();
            (len == info.samples * RECORD_BYTES as u64).then_some(info)
        })
        .collect();
    let resumed = done.iter().filter(|d| d.is_some()).count();
    if resumed > 0 {
        eprintln!("resuming: {resumed} of {n_shards} shards already complete");
    }
    let todo: Vec<usize> = (0..n_shards).filter(|&k| done[k].is_none()).collect();
    let todo_samples: u64 = todo
        .iter()
        .map(|&k| (total - k as u64 * args.shard_samples).min(args.shard_samples))
        .sum();
    let fault_after: Option<usize> = std::env::var("DDPBENCH_GEN_FAULT_AFTER_SHARDS").ok().and_then(|v| v.parse().ok());
    let next = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
        .max(1);
    let t1 = std::time::Instant::now();
    let results: Vec<Result<Vec<ShardInfo>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(todo.len().max(1)))
            .map(|_| {
                let (todo, unique, next, finished, written, out) = (
                    &todo,
                    unique.clone(),
                    next.clone(),
                    finished.clone(),
                    written.clone(),
                    args.out.clone(),
                );
                scope.spawn(move || -> Result<Vec<ShardInfo>> {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= todo.len() || fault_after.is_some_and(|f| finished.load(Ordering::SeqCst) >= f) {
                            return Ok(mine);
                        }
                        let k = todo[i];
                        let first = k as u64 * args.shard_samples;
                        let samples = (total - first).min(args.shard_samples);
                        mine.push(write_shard(&out, k, first, samples, &unique, &written)?);
                        finished.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // Progress: a bar on a terminal, a line per 10 % otherwise.
        let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let mut last_decile = 0;
        while !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(if tty { 200 } else { 500 }));
            let w = written.load(Ordering::Relaxed);
            let frac = w as f64 / todo_samples.max(1) as f64;
            let rate = w as f64 / t1.elapsed().as_secs_f64().max(1e-9);
            let eta = (todo_samples - w.min(todo_samples)) as f64 / rate.max(1.0);
            if tty {
                let filled = (frac * 30.0) as usize;
                eprint!(
                    "\r[{}{}] {:5.1} %  {}/{} shards  {:.2} M samples/s  ETA {:.0} s ",
                    "#".repeat(filled),
                    " ".repeat(30 - filled.min(30)),
                    frac * 100.0,
                    finished.load(Ordering::Relaxed) + resumed,
                    n_shards,
                    rate / 1e6,
                    eta
                );
            } else if (frac * 10.0) as usize > last_decile {
                last_decile = (frac * 10.0) as usize;
                eprintln!("{:.0} % written ({:.2} M samples/s, ETA {:.0} s)", frac * 100.0, rate / 1e6, eta);
            }
        }
        if tty {
            eprintln!();
        }
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
        bail!("interrupted with {missing} of {n_shards} shards unwritten: run the same command again to resume");
    }
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
    let tmp = args.out.join(".index.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&index)?)?;
    std::fs::rename(&tmp, &index_path)?;
    eprintln!(
        "wrote {} samples ({:.2} GiB) in {} shards to {}: augmentation {:.1} s ({:.0} images/s), writing {:.1} s ({:.2} M samples/s with {threads} threads)",
        total,
        (total * RECORD_BYTES as u64) as f64 / (1u64 << 30) as f64,
        n_shards,
        args.out.display(),
        aug_s,
        unique_n as f64 / aug_s.max(1e-9),
        write_s,
        todo_samples as f64 / write_s.max(1e-9) / 1e6
    );
    Ok(())
}

/// Opens a generated set: reads the index and checks every shard's size.
pub fn open(dir: &Path) -> Result<Index> {
    let path = dir.join("index.json");
    let text = std::fs::read_to_string(&path).map_err(|_| DataError::Missing {
        path: path.clone(),
        hint: "generate it with `ddpbench gen-bigmnist --from MNIST_DIR --out DIR` (an interrupted generation resumes when run again)"
            .into(),
    })?;
    let index: Index = serde_json::from_str(&text).with_context(|| format!("{} is not a bigMNIST index", path.display()))?;
    for s in &index.shards {
        let p = dir.join(&s.file);
        let len = std::fs::metadata(&p)
            .map_err(|_| DataError::Missing {
                path: p.clone(),
                hint: "the set is incomplete: re-run gen-bigmnist to resume".into(),
            })?
            .len();
        if len != s.samples * RECORD_BYTES as u64 {
            return Err(DataError::Truncated {
                path: p,
                expected: (s.samples * RECORD_BYTES as u64) as usize,
                found: len as usize,
            }
            .into());
        }
    }
    Ok(index)
}

/// Samples [start, end) that rank `rank` of `size` streams: equal contiguous ranges
/// (the remainder of samples / size is left out, as drop_last).
pub fn rank_range(index: &Index, rank: usize, size: usize) -> (u64, u64) {
    let per = index.samples / size as u64;
    (rank as u64 * per, (rank as u64 + 1) * per)
}

/// Streams records [start, end) block by block on a reader thread, verifying each
/// block's CRC, with at most `readahead` blocks in flight: memory stays at
/// readahead × 3.2 MB whatever the set's size.
pub struct BlockStream {
    rx: std::sync::mpsc::Receiver<Result<Vec<u8>>>,
    buffer: Vec<u8>,
    pos: usize,
}

impl BlockStream {
    pub fn new(dir: &Path, index: &Index, start: u64, end: u64, readahead: usize) -> BlockStream {
        let (tx, rx) = std::sync::mpsc::sync_channel(readahead.max(1));
        let (dir, index) = (dir.to_path_buf(), index.clone());
        std::thread::spawn(move || {
            let send = |r: Result<Vec<u8>>| tx.send(r).is_ok();
            for shard in index.shards.iter().filter(|s| s.first < end && s.first + s.samples > start) {
                let path = dir.join(&shard.file);
                let mut f = match std::fs::File::open(&path) {
                    Ok(f) => f,
                    Err(e) => {
                        send(Err(anyhow::anyhow!("{}: cannot open ({e})", path.display())));
                        return;
                    }
                };
                let first_block = (start.saturating_sub(shard.first) / BLOCK_RECORDS as u64) as usize;
                if f.seek(SeekFrom::Start(first_block as u64 * (BLOCK_RECORDS * RECORD_BYTES) as u64))
                    .is_err()
                {
                    send(Err(anyhow::anyhow!("{}: cannot seek", path.display())));
                    return;
                }
                for b in first_block..shard.block_crc32.len() {
                    let block_first = shard.first + (b * BLOCK_RECORDS) as u64;
                    if block_first >= end {
                        break;
                    }
                    let n = (shard.first + shard.samples - block_first).min(BLOCK_RECORDS as u64) as usize;
                    let mut buf = vec![0u8; n * RECORD_BYTES];
                    if let Err(e) = f.read_exact(&mut buf) {
                        send(Err(anyhow::anyhow!(
                            "{}: block {b} unreadable ({e}); re-run gen-bigmnist",
                            path.display()
                        )));
                        return;
                    }
                    let mut crc = flate2::Crc::new();
                    crc.update(&buf);
                    if crc.sum() != shard.block_crc32[b] {
                        send(Err(anyhow::anyhow!(
                            "{}: block {b} is corrupt (CRC32 {:08x}, index says {:08x}). Delete the shard and its .done file and re-run gen-bigmnist to rewrite it",
                            path.display(),
                            crc.sum(),
                            shard.block_crc32[b]
                        )));
                        return;
                    }
                    let lo = start.saturating_sub(block_first).min(n as u64) as usize;
                    let hi = (end - block_first).min(n as u64) as usize;
                    if !send(Ok(buf[lo * RECORD_BYTES..hi * RECORD_BYTES].to_vec())) {
                        return;
                    }
                }
            }
        });
        BlockStream {
            rx,
            buffer: Vec::new(),
            pos: 0,
        }
    }

    /// Up to `n` records (fewer only at the end of the range).
    pub fn take(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n * RECORD_BYTES);
        while out.len() < n * RECORD_BYTES {
            if self.pos >= self.buffer.len() {
                match self.rx.recv() {
                    Ok(block) => {
                        self.buffer = block?;
                        self.pos = 0;
                    }
                    Err(_) => break,
                }
            }
            let want = n * RECORD_BYTES - out.len();
            let have = (self.buffer.len() - self.pos).min(want);
            out.extend_from_slice(&self.buffer[self.pos..self.pos + have]);
            self.pos += have;
        }
        Ok(out)
    }
}

/// Records to a normalised batch: images [B, 1, 28, 28] and labels [B].
pub fn records_to_batch(records: &[u8], mean: f64, std: f64) -> (Tensor, Tensor) {
    let b = records.len() / RECORD_BYTES;
    let labels: Vec<i64> = records.chunks(RECORD_BYTES).map(|r| r[0] as i64).collect();
    let pixels: Vec<u8> = records.chunks(RECORD_BYTES).flat_map(|r| r[1..].iter().copied()).collect();
    let x = (Tensor::from_slice(&pixels).view([b as i64, 1, 28, 28]).to_kind(Kind::Float) / 255.0 - mean) / std;
    (x, Tensor::from_slice(&labels))
}
