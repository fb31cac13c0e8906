//! Data sets and how each rank gets its share of them.
//!
//! MNIST-format IDX files (gzipped or raw) are read whole into one tensor per
//! split; a batch is an `index_select` of the rank's shard. Sharding follows
//! PyTorch's `DistributedSampler` (shuffle, pad to a multiple of the world size,
//! rank r takes every size-th index from r), so a run is comparable step for step
//! with a PyTorch DDP run.

use crate::cli::{DatasetKind, TrainArgs};
use anyhow::{bail, Result};
use std::io::Read;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// Where Debian's `dataset-fashion-mnist` installs its files.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Errors in data files: each says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: not found. {hint}")]
    Missing { path: PathBuf, hint: String },
    #[error("{path}: not an IDX file (magic {found:#010x}, expected {expected:#010x}). Point --data-dir at MNIST-format files (train-images-idx3-ubyte[.gz], ...)")]
    BadMagic { path: PathBuf, found: u32, expected: u32 },
    #[error("{path}: truncated: header says {expected} bytes of data, the file holds {found}. Re-download or re-install the data set")]
    Truncated { path: PathBuf, expected: usize, found: usize },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// One split of a data set, on the CPU: inputs as f32, labels as i64.
pub struct Split {
    pub inputs: Tensor,
    pub labels: Tensor,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rows `indices` of the split, moved to `device`.
    pub fn batch(&self, indices: &Tensor, device: Device) -> (Tensor, Tensor) {
        let x = self.inputs.index_select(0, indices);
        let y = self.labels.index_select(0, indices);
        if device == Device::Cpu {
            (x, y)
        } else {
            (x.to_device(device), y.to_device(device))
        }
    }
}

pub struct Dataset {
    /// Name as recorded in the manifest.
    pub name: String,
    /// Where it was read from (empty for synthetic data).
    pub source: String,
    pub train: Split,
    pub test: Split,
    pub classes: i64,
}

/// Reads an IDX file (gzipped when it starts with the gzip magic) and checks its
/// header against `expected_magic` (0x801 labels, 0x803 images) and its length.
/// Returns the dimensions and the raw bytes.
pub fn read_idx(path: &Path, expected_magic: u32) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::Invalid {
        path: path.into(),
        what: format!("cannot read: {e}"),
    })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out).map_err(|e| {
            DataError::Invalid {
                path: path.into(),
                what: format!("gzip data is corrupt or truncated ({e}). Re-download or re-install the data set"),
            }
        })?;
        out
    } else {
        raw
    };
    if bytes.len() < 4 {
        return Err(DataError::Truncated { path: path.into(), expected: 4, found: bytes.len() });
    }
    let magic = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    if magic != expected_magic {
        return Err(DataError::BadMagic { path: path.into(), found: magic, expected: expected_magic });
    }
    let ndims = (magic & 0xff) as usize;
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(DataError::Truncated { path: path.into(), expected: header, found: bytes.len() });
    }
    let dims: Vec<usize> = (0..ndims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let expected = dims.iter().product::<usize>();
    let found = bytes.len() - header;
    if found < expected {
        return Err(DataError::Truncated { path: path.into(), expected, found });
    }
    Ok((dims, bytes[header..header + expected].to_vec()))
}

/// `dir/stem` or `dir/stem.gz`, whichever exists.
fn idx_file(dir: &Path, stem: &str, hint: &str) -> Result<PathBuf, DataError> {
    for candidate in [dir.join(stem), dir.join(format!("{stem}.gz"))] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(DataError::Missing { path: dir.join(format!("{stem}[.gz]")), hint: hint.into() })
}

/// Reads one MNIST-format split and normalises pixels with `mean`/`std`.
fn load_idx_split(dir: &Path, prefix: &str, mean: f64, std: f64, hint: &str) -> Result<Split> {
    let img_path = idx_file(dir, &format!("{prefix}-images-idx3-ubyte"), hint)?;
    let lbl_path = idx_file(dir, &format!("{prefix}-labels-idx1-ubyte"), hint)?;
    let (dims, pixels) = read_idx(&img_path, 0x803)?;
    let (ldims, labels) = read_idx(&lbl_path, 0x801)?;
    if dims.len() != 3 || ldims[0] != dims[0] {
        return Err(DataError::Invalid {
            path: img_path,
            what: format!("has shape {dims:?} but {} holds {} labels", lbl_path.display(), ldims[0]),
        }
        .into());
    }
    let n = dims[0] as i64;
    let inputs = Tensor::from_slice(&pixels)
        .view([n, 1, dims[1] as i64, dims[2] as i64])
        .to_kind(Kind::Float)
        .divide_scalar(255.0)
        .g_sub_scalar(mean)
        .divide_scalar(std);
    let labels = Tensor::from_slice(&labels).to_kind(Kind::Int64);
    let max_label = labels.max().int64_value(&[]);
    if max_label > 9 {
        return Err(DataError::Invalid { path: lbl_path, what: format!("label {max_label} is out of range 0..9") }.into());
    }
    Ok(Split { inputs, labels })
}

/// Loads the data set the arguments ask for, for a model with `input_shape` (C, H, W).
pub fn load(args: &TrainArgs, input_shape: [i64; 3], classes: i64) -> Result<Dataset> {
    match args.dataset {
        DatasetKind::Synthetic => Ok(synthetic(args.synthetic_samples, input_shape, classes, args.seed)),
        DatasetKind::FashionMnist | DatasetKind::Mnist => {
            if input_shape != [1, 28, 28] {
                bail!("--dataset {:?} holds 1×28×28 images; the model wants {:?}", args.dataset, input_shape);
            }
            let (dir, hint, mean, std) = match (args.dataset, &args.data_dir) {
                (DatasetKind::FashionMnist, None) => (
                    PathBuf::from(FASHION_MNIST_DIR),
                    "Install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass --data-dir".to_string(),
                    0.2860,
                    0.3530,
                ),
                (DatasetKind::Mnist, None) => bail!("--dataset mnist needs --data-dir DIR with the MNIST IDX files"),
                (DatasetKind::Synthetic, _) => unreachable!("handled above"),
                (kind, Some(d)) => (
                    d.clone(),
                    "Check --data-dir: it must hold train-/t10k-images-idx3-ubyte and -labels-idx1-ubyte, gzipped or not".to_string(),
                    if kind == DatasetKind::Mnist { 0.1307 } else { 0.2860 },
                    if kind == DatasetKind::Mnist { 0.3081 } else { 0.3530 },
                ),
            };
            if !dir.is_dir() {
                return Err(DataError::Missing { path: dir, hint }.into());
            }
            let train = load_idx_split(&dir, "train", mean, std, &hint)?;
            let test = load_idx_split(&dir, "t10k", mean, std, &hint)?;
            Ok(Dataset {
                name: format!("{:?}", args.dataset).to_lowercase(),
                source: dir.display().to_string(),
                train,
                test,
                classes: 10,
            })
        }
    }
}

/// Random inputs of the model's shape and random labels, seeded.
pub fn synthetic(samples: usize, shape: [i64; 3], classes: i64, seed: u64) -> Dataset {
    tch::manual_seed(seed as i64 ^ 0x5eed);
    let make = |n: i64| Split {
        inputs: Tensor::randn([n, shape[0], shape[1], shape[2]], (Kind::Float, Device::Cpu)),
        labels: Tensor::randint(classes, [n], (Kind::Int64, Device::Cpu)),
    };
    let n = samples.max(1) as i64;
    Dataset {
        name: "synthetic".into(),
        source: String::new(),
        train: make(n),
        test: make((n / 6).max(1)),
        classes,
    }
}

/// A rank's indices for one epoch, as `DistributedSampler(shuffle, drop_last=False)`:
/// a permutation seeded by `seed + epoch` (the same on every rank), padded by
/// wrapping to a multiple of `world`, then every `world`-th index from `rank`.
/// Every rank gets `ceil(n / world)` indices.
pub fn shard_indices(n: usize, world: usize, rank: usize, seed: u64, epoch: usize, shuffle: bool) -> Vec<i64> {
    assert!(world > 0 && rank < world && n > 0);
    let perm: Vec<i64> = if shuffle {
        let mut order: Vec<i64> = (0..n as i64).collect();
        let mut rng = SplitMix64(seed.wrapping_add(epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xddb);
        for i in (1..n).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        order
    } else {
        (0..n as i64).collect()
    };
    let per_rank = n.div_ceil(world);
    let total = per_rank * world;
    (0..per_rank).map(|k| perm[(rank + k * world) % total % n]).collect()
}

/// Steps per epoch for `per_rank` samples at `batch` per step (the last batch may be short).
pub fn steps_per_epoch(per_rank: usize, batch: usize) -> usize {
    per_rank.div_ceil(batch)
}

/// Small, fast, seedable generator: identical permutations on every rank and platform.
struct SplitMix64(u64);
impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn shards_are_disjoint_covering_and_equal_length() {
        for (n, world) in [(10, 3), (60_000, 2), (7, 7), (5, 8), (1000, 4)] {
            let shards: Vec<Vec<i64>> = (0..world).map(|r| shard_indices(n, world, r, 42, 3, true)).collect();
            let len = n.div_ceil(world);
            assert!(shards.iter().all(|s| s.len() == len), "n={n} world={world}");
            let all: BTreeSet<i64> = shards.iter().flatten().copied().collect();
            assert_eq!(all.len(), n, "every sample covered");
            // Only padding repeats samples: total - n duplicates at most.
            let total: usize = shards.iter().map(|s| s.len()).sum();
            assert_eq!(total - n, len * world - n);
            if len * world == n {
                let mut flat: Vec<i64> = shards.concat();
                flat.sort();
                flat.dedup();
                assert_eq!(flat.len(), n, "no duplicates without padding");
            }
        }
    }

    #[test]
    fn shards_follow_seed_and_epoch_and_match_single_rank_batches() {
        assert_eq!(shard_indices(100, 2, 0, 1, 0, true), shard_indices(100, 2, 0, 1, 0, true));
        assert_ne!(shard_indices(100, 2, 0, 1, 0, true), shard_indices(100, 2, 0, 1, 1, true));
        assert_ne!(shard_indices(100, 2, 0, 1, 0, true), shard_indices(100, 2, 0, 2, 0, true));
        // Step k of 2 ranks × batch b covers the same samples as step k of 1 rank × batch 2b.
        let one = shard_indices(64 * 10, 1, 0, 7, 0, true);
        let r0 = shard_indices(64 * 10, 2, 0, 7, 0, true);
        let r1 = shard_indices(64 * 10, 2, 1, 7, 0, true);
        for k in 0..10 {
            let mut a: Vec<i64> = one[64 * k..64 * (k + 1)].to_vec();
            let mut b: Vec<i64> = [&r0[32 * k..32 * (k + 1)], &r1[32 * k..32 * (k + 1)]].concat();
            a.sort();
            b.sort();
            assert_eq!(a, b, "step {k}");
        }
        assert_eq!(shard_indices(5, 2, 1, 0, 0, false), vec![1, 3, 0]);
        assert_eq!(steps_per_epoch(30_000, 64), 469);
    }

    fn write_idx(path: &Path, magic: u32, dims: &[u32], data: &[u8], gzip: bool) {
        let mut bytes = magic.to_be_bytes().to_vec();
        for d in dims {
            bytes.extend_from_slice(&d.to_be_bytes());
        }
        bytes.extend_from_slice(data);
        if gzip {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            bytes = enc.finish().unwrap();
        }
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn idx_reader_accepts_raw_and_gzip_and_names_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8], false);
        assert_eq!(read_idx(&p, 0x803).unwrap(), (vec![2, 2, 2], vec![1, 2, 3, 4, 5, 6, 7, 8]));
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8], true);
        assert_eq!(read_idx(&p, 0x803).unwrap().1.len(), 8);
        let e = read_idx(&p, 0x801).unwrap_err().to_string();
        assert!(e.contains("not an IDX file") && e.contains("0x00000803"), "{e}");
        write_idx(&p, 0x803, &[2, 2, 2], &[1, 2, 3], false);
        let e = read_idx(&p, 0x803).unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("8 bytes") && e.contains("holds 3"), "{e}");
    }
}
