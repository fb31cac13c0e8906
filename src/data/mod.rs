//! Data sets, by format, and how each rank gets its share of them.
//!
//! A split is held in memory as one tensor (MNIST IDX, CIFAR-10, AG News), read as
//! image files decoded per batch (ImageNet folders), or drawn from a seeded pool
//! (synthetic data); bigMNIST is streamed from its shards. A batch is an
//! `index_select` of the rank's shard. Sharding follows PyTorch's `DistributedSampler`
//! (shuffle, pad to a multiple of the world size, rank r takes every size-th index
//! from r), so a run is comparable step for step with a PyTorch DDP run; the shuffle is
//! computed, never stored ([`sampler`]).
//!
//! Formats: [`idx`] (the IDX reader at the bottom, and the errors data files can have),
//! [`mnist`], [`cifar`], [`imagenet`], [`agnews`], [`synthetic`], [`bigmnist`] (its
//! reader, and apart from it the generator); [`sampler`] orders an epoch's samples and
//! shards them; [`loader`] prepares an epoch's batches.

pub(crate) mod agnews;
pub mod bigmnist;
pub(crate) mod cifar;
pub(crate) mod idx;
pub(crate) mod image_caps;
pub(crate) mod imagenet;
pub(crate) mod jpeg;
pub(crate) mod loader;
pub(crate) mod mnist;
pub mod pipeline;
pub(crate) mod resample;
pub(crate) mod sampler;
pub(crate) mod synthetic;

pub(crate) use image_caps::ImageCaps;
pub(crate) use loader::Loader;
pub(crate) use sampler::{Batches, Shard, SAMPLE_ORDER};

use crate::model::{Input, ModelSpec};
use anyhow::Result;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<class>` is a placeholder
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

/// Random augmentation applied to training batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Augment {
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
pub(crate) struct Split {
    pub inputs: Tensor,
    pub labels: Tensor,
    pub augment: Augment,
    /// For file-backed splits (ImageNet folders), the image of each sample.
    pub files: Option<Arc<Vec<PathBuf>>>,
    /// What each of `files` may cost.
    pub image_caps: ImageCaps,
    /// Samples in the split: the rows of `labels`, or more when those rows are a pool
    /// that sample i takes as row i mod rows (synthetic data).
    len: usize,
}

impl Split {
    /// Samples held in memory: `inputs` \[N, ...\] and `labels` \[N\].
    pub(crate) fn memory(inputs: Tensor, labels: Tensor, augment: Augment) -> Split {
        let len = labels.size()[0] as usize;
        Split {
            inputs,
            labels,
            augment,
            files: None,
            image_caps: ImageCaps::default(),
            len,
        }
    }

    /// Image files decoded per batch, with their labels, each file within `caps`.
    pub(crate) fn files(files: Vec<PathBuf>, labels: Tensor, augment: Augment, caps: ImageCaps) -> Split {
        Split {
            inputs: Tensor::zeros([0], (Kind::Float, Device::Cpu)),
            len: files.len(),
            labels,
            augment,
            files: Some(Arc::new(files)),
            image_caps: caps,
        }
    }

    /// `len` samples drawn from a pool of rows: sample i is row i mod rows.
    pub(crate) fn pooled(inputs: Tensor, labels: Tensor, len: usize) -> Split {
        Split {
            inputs,
            labels,
            augment: Augment::None,
            files: None,
            image_caps: ImageCaps::default(),
            len,
        }
    }

    /// No samples of images shaped `[c, h, w]`.
    pub(crate) fn empty(shape: [i64; 3]) -> Split {
        Split::memory(
            Tensor::zeros([0, shape[0], shape[1], shape[2]], (Kind::Float, Device::Cpu)),
            Tensor::zeros([0], (Kind::Int64, Device::Cpu)),
            Augment::None,
        )
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of one prepared input sample (a decoded 3 × 224 × 224 crop for image files).
    pub(crate) fn sample_bytes(&self) -> usize {
        if self.files.is_some() {
            return 3 * imagenet::CROP * imagenet::CROP * std::mem::size_of::<f32>();
        }
        let per_row: i64 = self.inputs.size().iter().skip(1).product();
        per_row.max(0) as usize * self.inputs.kind().elt_size_in_bytes()
    }

    /// Rows `indices` of the split (augmented when the split asks for it), moved to `device`.
    pub(crate) fn batch(&self, indices: &Tensor, device: Device) -> Result<(Tensor, Tensor)> {
        let (x, y) = self.host_batch(indices, None)?;
        Ok(if device == Device::Cpu {
            (x, y)
        } else {
            (x.to_device(device), y.to_device(device))
        })
    }

    /// Rows `indices` of the split in host memory; with `pin` (a CUDA device), in page-locked
    /// memory that device can copy from while the host goes on. Images are decoded straight
    /// into that memory; in-memory rows are copied into it.
    pub(crate) fn host_batch(&self, indices: &Tensor, pin: Option<Device>) -> Result<(Tensor, Tensor)> {
        let rows = self.labels.size()[0];
        let indices = if (rows as usize) < self.len {
            indices.remainder(rows)
        } else {
            indices.shallow_clone()
        };
        let pinned = |t: Tensor| match pin {
            Some(d) => t.pin_memory(d),
            None => t,
        };
        let x = match &self.files {
            Some(files) => imagenet::decode_images(files, &indices, self.augment, pin, &self.image_caps)?,
            None => pinned(augment(&self.inputs.index_select(0, &indices), self.augment)),
        };
        let y = pinned(self.labels.index_select(0, &indices));
        Ok((x, y))
    }

    /// A handle on the same data, for another thread.
    pub(crate) fn share(&self) -> Split {
        Split {
            inputs: self.inputs.shallow_clone(),
            labels: self.labels.shallow_clone(),
            augment: self.augment,
            files: self.files.clone(),
            image_caps: self.image_caps,
            len: self.len,
        }
    }
}

/// Applies `how` to a batch of images [N, C, H, W], drawing from libtorch's RNG.
pub(crate) fn augment(x: &Tensor, how: Augment) -> Tensor {
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

/// A streamed training set (bigMNIST): never held in memory.
#[derive(Clone)]
pub(crate) struct StreamSource {
    pub dir: PathBuf,
    pub index: bigmnist::Index,
}

pub(crate) struct Dataset {
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

/// What [`load`] reads: the data set asked for and what loading it depends on.
#[derive(Debug, Clone)]
pub(crate) struct DataSpec {
    pub dataset: DatasetKind,
    /// The folder holding a data set in one of the formats read from disk.
    pub data_dir: Option<PathBuf>,
    /// Samples of `synthetic` data (drawn from a seeded pool).
    pub synthetic_samples: usize,
    /// The seed of the synthetic pool.
    pub seed: u64,
    /// What one image file may cost (image folders).
    pub image_caps: ImageCaps,
    /// The model the data is for, named in an error when their shapes differ.
    pub model_name: String,
}

/// Loads the data set `data` names, shaped for a model of `spec` (a transformer's
/// sequence length and vocabulary come from its input).
pub(crate) fn load(data: &DataSpec, spec: &ModelSpec) -> Result<Dataset> {
    let dir = data.data_dir.as_deref();
    let wants = |shape: &str| -> anyhow::Error {
        anyhow::anyhow!(
            "--dataset {} holds {shape}; --model {} wants {:?}. See `ddpbench models`",
            dataset_name(data.dataset),
            data.model_name,
            spec.input
        )
    };
    let need_dir = |what: &str| -> Result<&std::path::Path> {
        dir.ok_or_else(|| anyhow::anyhow!("--dataset {} needs --data-dir DIR holding {what}", dataset_name(data.dataset)))
    };
    match data.dataset {
        DatasetKind::Synthetic => Ok(synthetic::load(data.synthetic_samples, spec, data.seed)),
        DatasetKind::Cifar10 if spec.input != Input::Image([3, 32, 32]) => Err(wants("3×32×32 images")),
        DatasetKind::Cifar10 => cifar::load_cifar10(need_dir(
            "data_batch_1.bin … data_batch_5.bin and test_batch.bin (the CIFAR-10 binary version)",
        )?),
        DatasetKind::Bigmnist if spec.input != Input::Image([1, 28, 28]) => Err(wants("1×28×28 images")),
        DatasetKind::Bigmnist => bigmnist::load(need_dir("a set written by `ddpbench gen-bigmnist`")?),
        DatasetKind::Imagenet if spec.input != Input::Image([3, 224, 224]) => Err(wants("224×224 RGB crops")),
        DatasetKind::Imagenet => imagenet::load_image_folder(need_dir("train/<class>/*.JPEG and val/<class>/*.JPEG")?, data.image_caps),
        DatasetKind::Agnews => {
            let Input::Tokens { seq_len, vocab } = spec.input else {
                return Err(wants("text"));
            };
            agnews::load_agnews(
                need_dir("train.csv and test.csv (class,title,description)")?,
                seq_len as usize,
                vocab as usize,
            )
        }
        DatasetKind::FashionMnist | DatasetKind::Mnist if spec.input != Input::Image([1, 28, 28]) => Err(wants("1×28×28 images")),
        DatasetKind::FashionMnist | DatasetKind::Mnist => mnist::load(data.dataset, dir),
    }
}

/// The data set's name as recorded in the manifest (`fashion-mnist`, ...).
pub(crate) fn dataset_name(kind: DatasetKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// Steps per epoch for `per_rank` samples at `batch` per step (the last batch may be short).
pub(crate) fn steps_per_epoch(per_rank: usize, batch: usize) -> usize {
    per_rank.div_ceil(batch)
}
