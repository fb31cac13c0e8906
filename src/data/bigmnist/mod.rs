//! bigMNIST: an MNIST-format training set augmented `augment` times per
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

pub(crate) mod reader;
pub(crate) mod writer;

pub use reader::{records_to_batch, BlockStream};
pub use writer::{generate, GenBigMnistArgs};

use super::idx::DataError;
use super::mnist::{idx_file, load_idx_split};
use super::{Dataset, Split, StreamSource};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub(crate) const RECORD_BYTES: usize = 1 + 28 * 28;
pub(crate) const BLOCK_RECORDS: usize = 4096;

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

pub(crate) fn shard_name(k: usize) -> String {
    format!("shard-{k:05}.bin")
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
        // A shard's name comes from the index: a path in its place would read outside the set.
        if let Some(why) = crate::files::name_problem(&s.file) {
            return Err(DataError::Invalid {
                path: path.clone(),
                what: format!(
                    "shards[].file is {:?}: {why}; the index is damaged: run the same `ddpbench gen-bigmnist` command again to rewrite it",
                    s.file
                ),
            }
            .into());
        }
        let p = dir.join(&s.file);
        let len = std::fs::metadata(&p)
            .map_err(|_| DataError::Missing {
                path: p.clone(),
                hint: "the set is incomplete: run the same `ddpbench gen-bigmnist` command again to resume or repair it".into(),
            })?
            .len();
        if len != s.samples * RECORD_BYTES as u64 {
            return Err(DataError::Invalid {
                path: p,
                what: format!(
                    "holds {len} bytes where the index says {} (truncated or damaged): run the same `ddpbench gen-bigmnist` command again to rewrite it",
                    s.samples * RECORD_BYTES as u64
                ),
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

/// A generated set as a training stream, with its source's test split (normalised like
/// the stream) for validation when the source folder still holds it.
pub(crate) fn load(dir: &Path) -> Result<Dataset> {
    let index = open(dir)?;
    let source = PathBuf::from(&index.source);
    let test = if idx_file(&source, "t10k-images-idx3-ubyte", "").is_ok() {
        load_idx_split(&source, "t10k", index.mean, index.std, "")?
    } else {
        Split::empty([1, 28, 28])
    };
    Ok(Dataset {
        stream: Some(StreamSource {
            dir: dir.to_path_buf(),
            index,
        }),
        name: "bigmnist".into(),
        source: dir.display().to_string(),
        train: Split::empty([1, 28, 28]),
        test,
        classes: 10,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_named_by_a_path_is_refused_before_it_is_opened() {
        let d = tempfile::tempdir().unwrap();
        let set = d.path().join("set");
        std::fs::create_dir(&set).unwrap();
        // A file of the right size one level up, which the path would reach.
        std::fs::write(d.path().join("outside.bin"), vec![0u8; RECORD_BYTES]).unwrap();
        let index = |file: &str| Index {
            format: "bigmnist-v1".into(),
            samples: 1,
            unique: 1,
            augment: 1,
            copies: 1,
            seed: 0,
            source: String::new(),
            mean: 0.0,
            std: 1.0,
            shards: vec![ShardInfo {
                file: file.into(),
                first: 0,
                samples: 1,
                block_crc32: vec![0],
            }],
        };
        std::fs::write(set.join("index.json"), serde_json::to_string(&index("../outside.bin")).unwrap()).unwrap();
        let e = format!("{:#}", open(&set).unwrap_err());
        assert!(e.contains("shards[].file is \"../outside.bin\""), "{e}");
        std::fs::copy(d.path().join("outside.bin"), set.join("shard-00000.bin")).unwrap();
        std::fs::write(set.join("index.json"), serde_json::to_string(&index("shard-00000.bin")).unwrap()).unwrap();
        assert!(open(&set).is_ok());
    }
}
