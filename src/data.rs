//! Data sets and how each rank gets its share of them.
//!
//! MNIST-format IDX files (gzipped or raw) are read whole into one tensor per
//! split; a batch is an `index_select` of the rank's shard. Sharding follows
//! PyTorch's `DistributedSampler` (shuffle, pad to a multiple of the world size,
//! rank r takes every size-th index from r), so a run is comparable step for step
//! with a PyTorch DDP run.

use crate::model::{Input, ModelSpec, PAD_TOKEN, UNK_TOKEN};
use crate::stats::Rng;
use crate::train::TrainConfig;
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// Fashion-MNIST from Debian's dataset-fashion-mnist (or any IDX folder via --data-dir).
    FashionMnist,
    /// MNIST-format IDX files in --data-dir (gzipped or raw).
    Mnist,
    /// CIFAR-10 binary batches in --data-dir (data_batch_1..5.bin, test_batch.bin); random crop + flip.
    Cifar10,
    /// bigMNIST written by `ddpbench gen-bigmnist` in --data-dir, streamed with read-ahead.
    Bigmnist,
    /// ImageNet-style folder in --data-dir (train/<class>/*.JPEG, val/<class>/*.JPEG), decoded per batch.
    Imagenet,
    /// AG News CSV in --data-dir (train.csv, test.csv: class,title,description); for transformers.
    Agnews,
    /// Random data of the model's input shape: no I/O, for benchmarks.
    Synthetic,
}

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

/// Random augmentation applied to training batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Augment {
    None,
    /// Zero-pad by `pad`, crop back to the original size at a random offset, flip
    /// horizontally with probability 1/2 (torchvision's RandomCrop + RandomHorizontalFlip).
    CropFlip {
        pad: i64,
    },
    /// Image files: RandomResizedCrop(224, scale 0.08–1, ratio 3/4–4/3) + horizontal flip.
    ImageNetTrain,
    /// Image files: resize the shorter side to 256, centre crop 224.
    ImageNetEval,
}

/// One split of a data set, on the CPU: inputs (f32 images or i64 tokens) held in
/// memory, or image files decoded per batch; labels as i64.
pub struct Split {
    pub inputs: Tensor,
    pub labels: Tensor,
    pub augment: Augment,
    /// For file-backed splits (ImageNet folders), the image of each sample.
    pub files: Option<std::sync::Arc<Vec<PathBuf>>>,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Rows `indices` of the split (augmented when the split asks for it), moved to `device`.
    pub fn batch(&self, indices: &Tensor, device: Device) -> Result<(Tensor, Tensor)> {
        let x = match &self.files {
            Some(files) => decode_images(files, indices, self.augment)?,
            None => augment(&self.inputs.index_select(0, indices), self.augment),
        };
        let y = self.labels.index_select(0, indices);
        Ok(if device == Device::Cpu {
            (x, y)
        } else {
            (x.to_device(device), y.to_device(device))
        })
    }
}

/// Applies `how` to a batch of images [N, C, H, W], drawing from libtorch's RNG.
pub fn augment(x: &Tensor, how: Augment) -> Tensor {
    match how {
        Augment::None | Augment::ImageNetTrain | Augment::ImageNetEval => x.shallow_clone(),
        Augment::CropFlip { pad } => {
            let (n, _, h, w) = x.size4().expect("images are N×C×H×W");
            let padded = x.constant_pad_nd([pad, pad, pad, pad]);
            let offsets: Vec<i64> =
                Vec::<i64>::try_from(Tensor::randint(2 * pad + 1, [n, 2], (Kind::Int64, Device::Cpu)).view([-1])).unwrap();
            let crops: Vec<Tensor> = (0..n as usize)
                .map(|i| padded.get(i as i64).narrow(1, offsets[2 * i], h).narrow(2, offsets[2 * i + 1], w))
                .collect();
            let cropped = Tensor::stack(&crops, 0);
            let flip = Tensor::rand([n, 1, 1, 1], (Kind::Float, Device::Cpu)).lt(0.5);
            cropped.flip([3]).where_self(&flip, &cropped)
        }
    }
}

/// ImageNet's per-channel mean and standard deviation.
const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Decodes, crops and normalises the images `indices` of `files` into [N, 3, 224, 224].
fn decode_images(files: &[PathBuf], indices: &Tensor, how: Augment) -> Result<Tensor> {
    let idx = Vec::<i64>::try_from(indices)?;
    // One seed per batch from libtorch's (seeded) generator, then a cheap generator per image.
    let seed = Tensor::randint(i64::MAX, [1], (Kind::Int64, Device::Cpu)).int64_value(&[0]) as u64;
    let mut rng = Rng(seed);
    let images: Vec<Tensor> = idx
        .iter()
        .map(|&i| {
            let path = &files[i as usize];
            let img = tch::vision::image::load(path).map_err(|e| DataError::Invalid {
                path: path.clone(),
                what: format!("cannot decode image ({e}); remove or replace the file"),
            })?;
            let img = match img.size()[0] {
                1 => img.expand([3, -1, -1], false).contiguous(),
                3 => img,
                _ => img.narrow(0, 0, 3).contiguous(),
            };
            let (h, w) = (img.size()[1], img.size()[2]);
            let out = if how == Augment::ImageNetTrain {
                let (top, left, ch, cw) = random_resized_crop(h, w, &mut rng);
                let crop = img.narrow(1, top, ch).narrow(2, left, cw).contiguous();
                let r = tch::vision::image::resize(&crop, 224, 224)?;
                if rng.next_u64() & 1 == 1 {
                    r.flip([2])
                } else {
                    r
                }
            } else {
                let (nh, nw) = if h < w {
                    (256, (256 * w + h / 2) / h)
                } else {
                    ((256 * h + w / 2) / w, 256)
                };
                let r = tch::vision::image::resize(&img, nw, nh)?;
                r.narrow(1, (nh - 224) / 2, 224).narrow(2, (nw - 224) / 2, 224)
            };
            Ok(out)
        })
        .collect::<Result<_>>()?;
    let mean = Tensor::from_slice(&IMAGENET_MEAN).view([1, 3, 1, 1]);
    let std = Tensor::from_slice(&IMAGENET_STD).view([1, 3, 1, 1]);
    Ok((Tensor::stack(&images, 0).to_kind(Kind::Float) / 255.0 - mean) / std)
}

/// torchvision's RandomResizedCrop box (top, left, height, width) for an h×w image.
pub fn random_resized_crop(h: i64, w: i64, rng: &mut Rng) -> (i64, i64, i64, i64) {
    let area = (h * w) as f64;
    let uniform = |rng: &mut Rng| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    for _ in 0..10 {
        let target = area * (0.08 + 0.92 * uniform(rng));
        let log_ratio = (3f64 / 4.0).ln() + ((4f64 / 3.0).ln() - (3f64 / 4.0).ln()) * uniform(rng);
        let ratio = log_ratio.exp();
        let cw = (target * ratio).sqrt().round() as i64;
        let ch = (target / ratio).sqrt().round() as i64;
        if cw > 0 && ch > 0 && cw <= w && ch <= h {
            let top = rng.below((h - ch + 1) as u64) as i64;
            let left = rng.below((w - cw + 1) as u64) as i64;
            return (top, left, ch, cw);
        }
    }
    (0, 0, h, w)
}

/// An ImageNet-style folder: `train/<class>/*.JPEG` and `val/<class>/*.JPEG`; classes
/// are the sorted names of train's sub-folders. Images stay on disk and are decoded
/// per batch (on `--workers` threads).
pub fn load_image_folder(dir: &Path) -> Result<Dataset> {
    let hint = "--data-dir must hold train/<class>/*.JPEG and val/<class>/*.JPEG (ImageNet layout)";
    let train_dir = dir.join("train");
    if !train_dir.is_dir() {
        return Err(DataError::Missing {
            path: train_dir,
            hint: hint.into(),
        }
        .into());
    }
    let mut classes: Vec<String> = std::fs::read_dir(&train_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    classes.sort();
    if classes.is_empty() {
        return Err(DataError::Invalid {
            path: train_dir,
            what: format!("has no class folders. {hint}"),
        }
        .into());
    }
    let list = |split: &str, augment: Augment| -> Result<Split> {
        let mut files = Vec::new();
        let mut labels = Vec::new();
        for (c, class) in classes.iter().enumerate() {
            let folder = dir.join(split).join(class);
            if !folder.is_dir() {
                continue;
            }
            let mut imgs: Vec<PathBuf> = std::fs::read_dir(&folder)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| ["jpeg", "jpg", "png"].contains(&x.to_string_lossy().to_lowercase().as_str()))
                })
                .collect();
            imgs.sort();
            labels.extend(std::iter::repeat(c as i64).take(imgs.len()));
            files.extend(imgs);
        }
        if files.is_empty() {
            return Err(DataError::Invalid {
                path: dir.join(split),
                what: format!("holds no .JPEG/.jpg/.png images. {hint}"),
            }
            .into());
        }
        Ok(Split {
            inputs: Tensor::zeros([0], (Kind::Float, Device::Cpu)),
            labels: Tensor::from_slice(&labels),
            augment,
            files: Some(std::sync::Arc::new(files)),
        })
    };
    let train = list("train", Augment::ImageNetTrain)?;
    let test = list("val", Augment::ImageNetEval)?;
    Ok(Dataset {
        stream: None,
        name: "imagenet".into(),
        source: dir.display().to_string(),
        train,
        test,
        classes: classes.len() as i64,
    })
}

/// A streamed training set (bigMNIST): never held in memory.
#[derive(Clone)]
pub struct StreamSource {
    pub dir: PathBuf,
    pub index: crate::bigmnist::Index,
}

pub struct Dataset {
    /// Set for streamed data sets; `train` is then empty.
    pub stream: Option<StreamSource>,
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
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| DataError::Invalid {
                path: path.into(),
                what: format!("gzip data is corrupt or truncated ({e}). Re-download or re-install the data set"),
            })?;
        out
    } else {
        raw
    };
    if bytes.len() < 4 {
        return Err(DataError::Truncated {
            path: path.into(),
            expected: 4,
            found: bytes.len(),
        });
    }
    let magic = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
    if magic != expected_magic {
        return Err(DataError::BadMagic {
            path: path.into(),
            found: magic,
            expected: expected_magic,
        });
    }
    let ndims = (magic & 0xff) as usize;
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(DataError::Truncated {
            path: path.into(),
            expected: header,
            found: bytes.len(),
        });
    }
    let dims: Vec<usize> = (0..ndims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let expected = dims.iter().product::<usize>();
    let found = bytes.len() - header;
    if found < expected {
        return Err(DataError::Truncated {
            path: path.into(),
            expected,
            found,
        });
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
    Err(DataError::Missing {
        path: dir.join(format!("{stem}[.gz]")),
        hint: hint.into(),
    })
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
        return Err(DataError::Invalid {
            path: lbl_path,
            what: format!("label {max_label} is out of range 0..9"),
        }
        .into());
    }
    Ok(Split {
        inputs,
        labels,
        augment: Augment::None,
        files: None,
    })
}

/// Loads the data set the arguments ask for, shaped for a model of `spec`.
pub fn load(cfg: &TrainConfig, spec: &ModelSpec) -> Result<Dataset> {
    let args = &cfg.workload;
    let needs = |what: &str| -> Result<()> {
        bail!(
            "--dataset {} holds {what}; --model {} wants {:?}. See `ddpbench models`",
            dataset_name(args.dataset),
            serde_json::to_value(args.model)?.as_str().unwrap_or(""),
            spec.input
        )
    };
    match args.dataset {
        DatasetKind::Synthetic => Ok(synthetic(args.synthetic_samples, spec, cfg.schedule.seed)),
        DatasetKind::Cifar10 => {
            if spec.input != Input::Image([3, 32, 32]) {
                needs("3×32×32 images")?;
            }
            let Some(dir) = &args.data_dir else {
                bail!("--dataset cifar10 needs --data-dir DIR holding data_batch_1.bin … data_batch_5.bin and test_batch.bin (the CIFAR-10 binary version)");
            };
            load_cifar10(dir)
        }
        DatasetKind::Bigmnist => {
            if spec.input != Input::Image([1, 28, 28]) {
                needs("1×28×28 images")?;
            }
            let Some(dir) = &args.data_dir else {
                bail!("--dataset bigmnist needs --data-dir DIR written by `ddpbench gen-bigmnist`");
            };
            let index = crate::bigmnist::open(dir)?;
            // Validation: the source's test split, normalised like the training stream.
            let source = PathBuf::from(&index.source);
            let test = if idx_file(&source, "t10k-images-idx3-ubyte", "").is_ok() {
                load_idx_split(&source, "t10k", index.mean, index.std, "")?
            } else {
                Split {
                    inputs: Tensor::zeros([0, 1, 28, 28], (Kind::Float, Device::Cpu)),
                    labels: Tensor::zeros([0], (Kind::Int64, Device::Cpu)),
                    augment: Augment::None,
                    files: None,
                }
            };
            let train = Split {
                inputs: Tensor::zeros([0, 1, 28, 28], (Kind::Float, Device::Cpu)),
                labels: Tensor::zeros([0], (Kind::Int64, Device::Cpu)),
                augment: Augment::None,
                files: None,
            };
            Ok(Dataset {
                stream: Some(StreamSource { dir: dir.clone(), index }),
                name: "bigmnist".into(),
                source: dir.display().to_string(),
                train,
                test,
                classes: 10,
            })
        }
        DatasetKind::Imagenet => {
            let Input::Image([3, h, w]) = spec.input else {
                return needs("RGB images").map(|_| unreachable!());
            };
            if (h, w) != (224, 224) {
                needs("224×224 crops")?;
            }
            let Some(dir) = &args.data_dir else {
                bail!("--dataset imagenet needs --data-dir DIR holding train/<class>/*.JPEG and val/<class>/*.JPEG");
            };
            load_image_folder(dir)
        }
        DatasetKind::Agnews => {
            let Input::Tokens { seq_len, vocab } = spec.input else {
                return needs("text").map(|_| unreachable!());
            };
            let Some(dir) = &args.data_dir else {
                bail!("--dataset agnews needs --data-dir DIR holding train.csv and test.csv (class,title,description)");
            };
            load_agnews(dir, seq_len as usize, vocab as usize)
        }
        DatasetKind::FashionMnist | DatasetKind::Mnist => {
            if spec.input != Input::Image([1, 28, 28]) {
                needs("1×28×28 images")?;
            }
            let (dir, hint, mean, std) = match (args.dataset, &args.data_dir) {
                (DatasetKind::FashionMnist, None) => (
                    PathBuf::from(FASHION_MNIST_DIR),
                    "Install Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) or pass --data-dir".to_string(),
                    0.2860,
                    0.3530,
                ),
                (DatasetKind::Mnist, None) => bail!("--dataset mnist needs --data-dir DIR with the MNIST IDX files"),
                (kind, Some(d)) => (
                    d.clone(),
                    "Check --data-dir: it must hold train-/t10k-images-idx3-ubyte and -labels-idx1-ubyte, gzipped or not".to_string(),
                    if kind == DatasetKind::Mnist { 0.1307 } else { 0.2860 },
                    if kind == DatasetKind::Mnist { 0.3081 } else { 0.3530 },
                ),
                _ => unreachable!("handled above"),
            };
            if !dir.is_dir() {
                return Err(DataError::Missing { path: dir, hint }.into());
            }
            let train = load_idx_split(&dir, "train", mean, std, &hint)?;
            let test = load_idx_split(&dir, "t10k", mean, std, &hint)?;
            Ok(Dataset {
                stream: None,
                name: dataset_name(args.dataset),
                source: dir.display().to_string(),
                train,
                test,
                classes: 10,
            })
        }
    }
}

fn dataset_name(kind: DatasetKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// CIFAR-10 binary version: records of 1 label byte + 3072 pixel bytes (R, G, B planes of 32×32).
pub fn load_cifar10(dir: &Path) -> Result<Dataset> {
    const RECORD: usize = 1 + 3 * 32 * 32;
    let hint = "Point --data-dir at the extracted cifar-10-batches-bin folder";
    let read = |names: &[String]| -> Result<Split> {
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for name in names {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(DataError::Missing { path, hint: hint.into() }.into());
            }
            let bytes = std::fs::read(&path).map_err(|e| DataError::Invalid {
                path: path.clone(),
                what: format!("cannot read: {e}"),
            })?;
            if bytes.is_empty() || bytes.len() % RECORD != 0 {
                return Err(DataError::Invalid {
                    path,
                    what: format!(
                        "{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records (truncated?)",
                        bytes.len()
                    ),
                }
                .into());
            }
            for (i, rec) in bytes.chunks(RECORD).enumerate() {
                if rec[0] > 9 {
                    return Err(DataError::Invalid {
                        path,
                        what: format!("record {i} has label {} (expected 0..9): not CIFAR-10 binary data", rec[0]),
                    }
                    .into());
                }
                labels.push(rec[0] as i64);
                pixels.extend_from_slice(&rec[1..]);
            }
        }
        let n = labels.len() as i64;
        let mean = Tensor::from_slice(&[0.4914f32, 0.4822, 0.4465]).view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&[0.2470f32, 0.2435, 0.2616]).view([1, 3, 1, 1]);
        let inputs = (Tensor::from_slice(&pixels).view([n, 3, 32, 32]).to_kind(Kind::Float) / 255.0 - mean) / std;
        Ok(Split {
            inputs,
            labels: Tensor::from_slice(&labels),
            augment: Augment::None,
            files: None,
        })
    };
    let mut train = read(&(1..=5).map(|i| format!("data_batch_{i}.bin")).collect::<Vec<_>>())?;
    train.augment = Augment::CropFlip { pad: 4 };
    let test = read(&["test_batch.bin".to_string()])?;
    Ok(Dataset {
        stream: None,
        name: "cifar10".into(),
        source: dir.display().to_string(),
        train,
        test,
        classes: 10,
    })
}

/// Lower-cased alphanumeric words.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
}

/// Reads an AG News CSV (class 1..4, title, description; no header).
fn read_agnews(path: &Path) -> Result<Vec<(i64, String)>> {
    let hint = "AG News comes as train.csv and test.csv with rows \"class\",\"title\",\"description\"";
    if !path.is_file() {
        return Err(DataError::Missing {
            path: path.into(),
            hint: hint.into(),
        }
        .into());
    }
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(false).from_path(path)?;
    let mut rows = Vec::new();
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| DataError::Invalid {
            path: path.into(),
            what: format!("row {}: {e}", i + 1),
        })?;
        let class: i64 = rec
            .get(0)
            .and_then(|c| c.trim().parse().ok())
            .filter(|c| (1..=4).contains(c))
            .ok_or_else(|| DataError::Invalid {
                path: path.into(),
                what: format!("row {}: class {:?} is not 1..4. {hint}", i + 1, rec.get(0).unwrap_or("")),
            })?;
        if rec.len() < 3 {
            return Err(DataError::Invalid {
                path: path.into(),
                what: format!("row {}: expected class,title,description", i + 1),
            }
            .into());
        }
        rows.push((class - 1, format!("{} {}", &rec[1], &rec[2])));
    }
    if rows.is_empty() {
        return Err(DataError::Invalid {
            path: path.into(),
            what: "holds no rows".into(),
        }
        .into());
    }
    Ok(rows)
}

/// Word-level vocabulary of the `size - 2` most frequent training words (ties by
/// word), after padding (0) and unknown (1).
pub fn build_vocab<'a>(texts: impl Iterator<Item = &'a str>, size: usize) -> HashMap<String, i64> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    for t in texts {
        for w in words(t) {
            *counts.entry(w).or_default() += 1;
        }
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked
        .into_iter()
        .take(size.saturating_sub(2))
        .enumerate()
        .map(|(i, (w, _))| (w, i as i64 + 2))
        .collect()
}

/// Token ids of `text`, truncated or padded to `seq_len`.
pub fn encode(text: &str, vocab: &HashMap<String, i64>, seq_len: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = words(text).take(seq_len).map(|w| *vocab.get(&w).unwrap_or(&UNK_TOKEN)).collect();
    ids.resize(seq_len, PAD_TOKEN);
    ids
}

pub fn load_agnews(dir: &Path, seq_len: usize, vocab_size: usize) -> Result<Dataset> {
    let train_rows = read_agnews(&dir.join("train.csv"))?;
    let test_rows = read_agnews(&dir.join("test.csv"))?;
    let vocab = build_vocab(train_rows.iter().map(|(_, t)| t.as_str()), vocab_size);
    let split = |rows: &[(i64, String)]| -> Split {
        let ids: Vec<i64> = rows.iter().flat_map(|(_, t)| encode(t, &vocab, seq_len)).collect();
        let labels: Vec<i64> = rows.iter().map(|(c, _)| *c).collect();
        Split {
            inputs: Tensor::from_slice(&ids).view([rows.len() as i64, seq_len as i64]),
            labels: Tensor::from_slice(&labels),
            augment: Augment::None,
            files: None,
        }
    };
    Ok(Dataset {
        stream: None,
        name: "agnews".into(),
        source: dir.display().to_string(),
        train: split(&train_rows),
        test: split(&test_rows),
        classes: 4,
    })
}

/// Random inputs of the model's shape (images, or token ids) and random labels, seeded.
pub fn synthetic(samples: usize, spec: &ModelSpec, seed: u64) -> Dataset {
    tch::manual_seed(seed as i64 ^ 0x5eed);
    let classes = spec.classes;
    let make = |n: i64| Split {
        inputs: match spec.input {
            Input::Image([c, h, w]) => Tensor::randn([n, c, h, w], (Kind::Float, Device::Cpu)),
            Input::Tokens { seq_len, vocab } => Tensor::randint_low(2, vocab.max(3), [n, seq_len], (Kind::Int64, Device::Cpu)),
        },
        labels: Tensor::randint(classes, [n], (Kind::Int64, Device::Cpu)),
        augment: Augment::None,
        files: None,
    };
    let n = samples.max(1) as i64;
    Dataset {
        stream: None,
        name: "synthetic".into(),
        source: String::new(),
        train: make(n),
        test: make((n / 6).max(1)),
        classes,
    }
}

/// Batches of one epoch, in order: prepared inline, or ahead of time by worker
/// threads (worker w prepares batches w, w+N, …) each behind a queue of two, so at
/// most 2N batches wait in memory.
pub struct Loader {
    stream: Option<(crate::bigmnist::BlockStream, usize, f64, f64)>,
    source: Option<(Split, std::vec::IntoIter<Vec<i64>>)>,
    queues: Vec<std::sync::mpsc::Receiver<Result<(Tensor, Tensor)>>>,
    next: usize,
    remaining: usize,
}

impl Split {
    /// A handle on the same data, for another thread.
    pub fn share(&self) -> Split {
        Split {
            inputs: self.inputs.shallow_clone(),
            labels: self.labels.shallow_clone(),
            augment: self.augment,
            files: self.files.clone(),
        }
    }
}

impl Loader {
    pub fn new(split: &Split, batches: Vec<Vec<i64>>, workers: usize) -> Loader {
        let remaining = batches.len();
        if workers == 0 {
            return Loader {
                stream: None,
                source: Some((split.share(), batches.into_iter())),
                queues: Vec::new(),
                next: 0,
                remaining,
            };
        }
        let queues = (0..workers)
            .map(|w| {
                let (tx, rx) = std::sync::mpsc::sync_channel(2);
                let mine: Vec<Vec<i64>> = batches.iter().skip(w).step_by(workers).cloned().collect();
                let data = split.share();
                std::thread::spawn(move || {
                    for idx in mine {
                        // A closed queue means the epoch ended early: stop quietly.
                        if tx.send(data.batch(&Tensor::from_slice(&idx), Device::Cpu)).is_err() {
                            return;
                        }
                    }
                });
                rx
            })
            .collect();
        Loader {
            stream: None,
            source: None,
            queues,
            next: 0,
            remaining,
        }
    }

    /// `batches` batches of `batch` records streamed from rank `rank`'s range of `src`,
    /// read ahead by a reader thread (`readahead` blocks of 4096 records).
    pub fn stream(src: &StreamSource, rank: usize, size: usize, batch: usize, batches: usize, readahead: usize) -> Loader {
        let (start, end) = crate::bigmnist::rank_range(&src.index, rank, size);
        let reader = crate::bigmnist::BlockStream::new(&src.dir, &src.index, start, end, readahead);
        Loader {
            stream: Some((reader, batch, src.index.mean, src.index.std)),
            source: None,
            queues: Vec::new(),
            next: 0,
            remaining: batches,
        }
    }

    /// The next batch on the CPU, or None at the end of the epoch.
    pub fn next_batch(&mut self) -> Option<Result<(Tensor, Tensor)>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let batch = if let Some((reader, n, mean, std)) = &mut self.stream {
            Some(
                reader
                    .take(*n)
                    .map(|records| crate::bigmnist::records_to_batch(&records, *mean, *std)),
            )
        } else {
            match &mut self.source {
                Some((split, it)) => it.next().map(|idx| split.batch(&Tensor::from_slice(&idx), Device::Cpu)),
                None => self.queues[self.next % self.queues.len()].recv().ok(),
            }
        };
        self.next += 1;
        batch
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
        let mut rng = Rng(seed.wrapping_add(epoch as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xddb);
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
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

    fn cifar_dir(records_per_file: usize) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let names: Vec<String> = (1..=5)
            .map(|i| format!("data_batch_{i}.bin"))
            .chain(["test_batch.bin".to_string()])
            .collect();
        for (f, name) in names.iter().enumerate() {
            let mut bytes = Vec::new();
            for r in 0..records_per_file {
                bytes.push(((f + r) % 10) as u8);
                // Red plane 255, green 0, blue 128: checks the plane order.
                bytes.extend(std::iter::repeat(255u8).take(1024));
                bytes.extend(std::iter::repeat(0u8).take(1024));
                bytes.extend(std::iter::repeat(128u8).take(1024));
            }
            std::fs::write(d.path().join(name), bytes).unwrap();
        }
        d
    }

    #[test]
    fn cifar10_reads_the_binary_format_and_augments() {
        let d = cifar_dir(3);
        let ds = load_cifar10(d.path()).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (15, 3, 10));
        assert_eq!(ds.train.inputs.size(), [15, 3, 32, 32]);
        assert_eq!(Vec::<i64>::try_from(&ds.test.labels).unwrap(), vec![5, 6, 7]);
        // Normalised per channel: red (1 - 0.4914)/0.2470, green -0.4822/0.2435.
        let px = |c: i64| ds.test.inputs.get(0).get(c).get(5).get(5).double_value(&[]);
        assert!((px(0) - (1.0 - 0.4914) / 0.2470).abs() < 1e-4);
        assert!((px(1) - (-0.4822 / 0.2435)).abs() < 1e-4);
        assert_eq!(ds.train.augment, Augment::CropFlip { pad: 4 });
        tch::manual_seed(3);
        let (x, _) = ds
            .train
            .batch(&Tensor::from_slice(&[0i64, 1, 2, 3, 4, 5, 6, 7]), Device::Cpu)
            .unwrap();
        assert_eq!(x.size(), [8, 3, 32, 32]);
        // Crops shifted by up to 4 pixels bring zero padding into some images' borders.
        let original = ds.train.inputs.narrow(0, 0, 8);
        assert!(
            (x - original).abs().sum(Kind::Float).double_value(&[]) > 0.0,
            "augmentation changes pixels"
        );
        // A truncated file is named.
        let f = d.path().join("data_batch_3.bin");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() - 10]).unwrap();
        let e = load_cifar10(d.path()).err().unwrap().to_string();
        assert!(
            e.contains("data_batch_3.bin") && e.contains("not a whole number of 3073-byte"),
            "{e}"
        );
    }

    #[test]
    fn agnews_builds_a_vocabulary_and_encodes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("train.csv"),
            "\"3\",\"Wall St. Bears\",\"Short-sellers, Wall Street's dwindling band\"\n\"1\",\"Bears win\",\"The bears, the bears!\"\n",
        )
        .unwrap();
        std::fs::write(d.path().join("test.csv"), "\"4\",\"Unseen words\",\"bears\"\n").unwrap();
        let ds = load_agnews(d.path(), 6, 5).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (2, 1, 4));
        assert_eq!(Vec::<i64>::try_from(&ds.train.labels).unwrap(), vec![2, 0]);
        // Counts: bears 4, the 2, wall 2, ... vocab of 5 keeps pad, unk and the top 3:
        // bears=2, the=3, wall=4 (ties broken alphabetically: "the" before "wall").
        let row = |i: i64| Vec::<i64>::try_from(ds.train.inputs.get(i)).unwrap();
        assert_eq!(row(1), vec![2, 1, 3, 2, 3, 2]);
        assert_eq!(row(0), vec![4, 1, 2, 1, 1, 4], "truncated to 6 tokens");
        assert_eq!(
            Vec::<i64>::try_from(ds.test.inputs.get(0)).unwrap(),
            vec![1, 1, 2, 0, 0, 0],
            "padded"
        );
        std::fs::write(d.path().join("test.csv"), "\"9\",\"x\",\"y\"\n").unwrap();
        let e = load_agnews(d.path(), 6, 5).err().unwrap().to_string();
        assert!(e.contains("test.csv") && e.contains("class \"9\" is not 1..4"), "{e}");
    }

    /// An ImageNet-style folder of real JPEGs: 2 classes, images of several sizes.
    fn image_folder() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (split, per_class) in [("train", 3), ("val", 2)] {
            for class in ["n01440764", "n02102040"] {
                let folder = d.path().join(split).join(class);
                std::fs::create_dir_all(&folder).unwrap();
                for i in 0..per_class {
                    let (h, w) = [(300, 400), (256, 256), (500, 260)][i];
                    let img = Tensor::randint(256, [3, h, w], (Kind::Uint8, Device::Cpu));
                    tch::vision::image::save(&img, folder.join(format!("img{i}.jpg"))).unwrap();
                    std::fs::rename(folder.join(format!("img{i}.jpg")), folder.join(format!("img{i}.JPEG"))).unwrap();
                }
            }
        }
        // A grayscale image is widened to 3 channels.
        let gray = Tensor::randint(256, [1, 240, 320], (Kind::Uint8, Device::Cpu));
        tch::vision::image::save(&gray, d.path().join("val/n02102040/gray.png")).unwrap();
        d
    }

    #[test]
    fn image_folder_decodes_crops_and_labels() {
        let d = image_folder();
        let ds = load_image_folder(d.path()).unwrap();
        assert_eq!((ds.train.len(), ds.test.len(), ds.classes), (6, 5, 2));
        assert_eq!(Vec::<i64>::try_from(&ds.train.labels).unwrap(), vec![0, 0, 0, 1, 1, 1]);
        let all = Tensor::from_slice(&[0i64, 1, 2, 3, 4]);
        let (x, y) = ds.test.batch(&all, Device::Cpu).unwrap();
        assert_eq!(x.size(), [5, 3, 224, 224]);
        assert_eq!(Vec::<i64>::try_from(&y).unwrap(), vec![0, 0, 1, 1, 1]);
        // Validation is deterministic; training crops are random.
        let (x2, _) = ds.test.batch(&all, Device::Cpu).unwrap();
        assert!(x.equal(&x2));
        let (t1, _) = ds.train.batch(&all, Device::Cpu).unwrap();
        let (t2, _) = ds.train.batch(&all, Device::Cpu).unwrap();
        assert_eq!(t1.size(), [5, 3, 224, 224]);
        assert!(!t1.equal(&t2));
        // Normalised with ImageNet statistics: values of uniform noise stay within about ±2.7.
        assert!(x.abs().max().double_value(&[]) < 2.7);
        // A corrupt file is named.
        std::fs::write(d.path().join("val/n01440764/img0.JPEG"), b"not a jpeg").unwrap();
        let e = ds.test.batch(&all, Device::Cpu).err().unwrap().to_string();
        assert!(e.contains("img0.JPEG") && e.contains("cannot decode image"), "{e}");
    }

    #[test]
    fn random_resized_crop_stays_inside_the_image() {
        let mut rng = Rng(9);
        for _ in 0..1000 {
            let (t, l, h, w) = random_resized_crop(300, 500, &mut rng);
            assert!(t >= 0 && l >= 0 && h > 0 && w > 0 && t + h <= 300 && l + w <= 500);
            let frac = (h * w) as f64 / 150_000.0;
            assert!(frac > 0.07 && frac <= 1.0 + 1e-9);
        }
    }
}
