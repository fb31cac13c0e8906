//! The enums of the comparison key's settings (fields of [`super::key::ComparisonKey`]),
//! defined in `record` so that `record`, and `reduce` reading it, need neither `comm` nor
//! `train`; those modules re-export them.

use super::RankInfo;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Data type of gradients on the wire (`--grad-dtype`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradDtype {
    /// Gradients travel as float32.
    Fp32,
    /// Gradients are cast to float16 for the all-reduce: half the bytes on the wire.
    Fp16,
    /// Gradients are cast to bfloat16 for the all-reduce: half the bytes, fp32's range.
    Bf16,
}

impl GradDtype {
    /// Bytes per gradient element on the wire.
    pub(crate) fn bytes(self) -> usize {
        match self {
            GradDtype::Fp32 => 4,
            GradDtype::Fp16 | GradDtype::Bf16 => 2,
        }
    }
}

/// How the host allocator treats the memory a step frees (`--malloc`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MallocMode {
    /// Keep freed memory for reuse (glibc mmap threshold 32 MiB, no trimming), so a step
    /// does not page its buffers in again every time.
    Tuned,
    /// glibc's own settings.
    Default,
}

/// How the phases of a step are timed (`--phase-sync`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseSync {
    /// Every phase boundary waits for the device, then reads the host clock: exact, and
    /// costs the CPU/GPU pipelining at every boundary (the default on CPU, where a
    /// boundary waits for nothing).
    #[default]
    On,
    /// No boundary waits; one wait at the step's end; the whole step is other_s.
    Off,
    /// Device phases from events recorded on the compute stream, read when the next step
    /// ends (no wait the device has not already passed); host phases from the host clock
    /// (the default on GPUs).
    Events,
    /// As `events`, but each step is read at its own end after one wait for the device.
    EventsAtEnd,
}

impl PhaseSync {
    pub(super) fn is_on(&self) -> bool {
        *self == PhaseSync::On
    }
}

/// Which steps measure the two squared norms (`--noise-scale`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum NoiseScaleMode {
    /// No norms (also what a manifest written before the flag existed means): the rank
    /// file's and epochs.csv's noise cells are empty.
    #[default]
    Off,
    /// Every K-th global step (K = 1: every step).
    Every(u32),
}

impl NoiseScaleMode {
    pub(super) fn is_off(&self) -> bool {
        *self == NoiseScaleMode::Off
    }

    /// Whether global step `global_step` measures.
    pub fn measures(self, global_step: usize) -> bool {
        match self {
            NoiseScaleMode::Off => false,
            NoiseScaleMode::Every(k) => global_step % k.max(1) as usize == 0,
        }
    }
}

impl FromStr for NoiseScaleMode {
    type Err = String;

    fn from_str(s: &str) -> Result<NoiseScaleMode, String> {
        let bad = |why: &str| format!("--noise-scale {s:?}: {why}; give off, on (every step) or every:K (every K-th step, K ≥ 1)");
        match s.trim() {
            "off" => Ok(NoiseScaleMode::Off),
            "on" => Ok(NoiseScaleMode::Every(1)),
            t => {
                let k = t.strip_prefix("every:").ok_or_else(|| bad("not off, on or every:K"))?;
                match k.trim().parse::<u32>() {
                    Ok(k) if k >= 1 => Ok(NoiseScaleMode::Every(k)),
                    _ => Err(bad("K is not a whole number of at least 1")),
                }
            }
        }
    }
}

impl fmt::Display for NoiseScaleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoiseScaleMode::Off => f.write_str("off"),
            NoiseScaleMode::Every(1) => f.write_str("on"),
            NoiseScaleMode::Every(k) => write!(f, "every:{k}"),
        }
    }
}

impl TryFrom<String> for NoiseScaleMode {
    type Error = String;
    fn try_from(s: String) -> Result<NoiseScaleMode, String> {
        s.parse()
    }
}

impl From<NoiseScaleMode> for String {
    fn from(m: NoiseScaleMode) -> String {
        m.to_string()
    }
}

/// The memory layout of the batch and of the parameters of 4-d (convolution) weights
/// (`--memory-format`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryFormat {
    /// NCHW, dense in that order (what runs before this field existed ran).
    #[default]
    Contiguous,
    /// NHWC strides on NCHW-shaped tensors, as `torch.channels_last`: what tensor-core
    /// convolutions read without a transpose.
    ChannelsLast,
}

impl MemoryFormat {
    pub(super) fn is_contiguous(&self) -> bool {
        *self == MemoryFormat::Contiguous
    }
}

/// The optimizer (`--optimizer`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// SGD with --momentum and --weight-decay.
    Sgd,
    Adam,
    /// LARS (You et al. 2017): SGD with momentum and a per-layer trust ratio, for large batches.
    Lars,
}

/// Mixed precision (`--amp`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AmpMode {
    /// Full fp32.
    Off,
    /// Autocast to float16 with dynamic loss scaling (as torch.amp.GradScaler).
    Fp16,
    /// Autocast to bfloat16; no loss scaling needed.
    Bf16,
}

/// The kind of device the ranks trained on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    /// CUDA when any rank trained on a GPU (a rank's `device` is libtorch's, e.g. `Cuda(0)`).
    pub(crate) fn of_ranks(ranks: &[RankInfo]) -> DeviceKind {
        if ranks.iter().any(|r| r.device.starts_with("Cuda")) {
            DeviceKind::Cuda
        } else {
            DeviceKind::Cpu
        }
    }
}

/// The all-reduce: one name each for `train --allreduce`, the manifest's `comm_backend`
/// and `comparison_key.backend`, `allreduce --backends`, the sweep's `backend` column
/// and the link model's `backend`. Where the buffers live is [`Memory`], not a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// MPI_Allreduce over host memory; a GPU's gradients are staged through pinned host
    /// buffers (device → host → MPI → device). Schema 3 and older wrote `mpi-cpu-staged`
    /// in manifests and `staged` for device buffers in the sweep.
    #[serde(alias = "mpi-cpu-staged", alias = "staged")]
    #[value(alias = "staged")]
    Mpi,
    /// NCCL on device memory.
    Nccl,
    /// No all-reduce (`--allreduce none`): never a point of a scaling study.
    #[value(skip)]
    None,
    /// PyTorch's gloo all-reduce: what a twin run ([`Twin`]) records on CPU, never an
    /// all-reduce ddpbench runs.
    #[value(skip)]
    Gloo,
}

impl Backend {
    /// The one name the files and the command line use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
            Backend::None => "none",
            Backend::Gloo => "gloo",
        }
    }

    /// The backend named `name` by any schema (`mpi-cpu-staged` and `staged` are `mpi`);
    /// Err names what it can be.
    pub(crate) fn from_name(name: &str) -> Result<Backend, String> {
        match serde_json::from_value(serde_json::Value::String(name.into())) {
            Ok(Backend::Gloo) | Err(_) => Err(format!("{name:?}: not an all-reduce ddpbench runs (mpi, nccl or none)")),
            Ok(b) => Ok(b),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an all-reduce's buffers live: a property of the path, not another backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Memory {
    /// Host memory: MPI reads and writes the buffers themselves.
    Host,
    /// Device memory: NCCL reads it; MPI stages it through pinned host buffers.
    Device,
}

impl Memory {
    /// Where a run's gradients lived: on its device.
    pub(crate) fn of_device(device: DeviceKind) -> Memory {
        match device {
            DeviceKind::Cpu => Memory::Host,
            DeviceKind::Cuda => Memory::Device,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Memory::Host => "host",
            Memory::Device => "device",
        }
    }
}

/// The overlap of the all-reduce with backward that was in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// Buckets all-reduced while backward ran, on resources of their own.
    On,
    /// After backward (asked for, or `on` that turned itself off for want of a core).
    Off,
    /// Overlapped on a thread sharing backward's cores (`--overlap force` without a
    /// spare core): the all-reduce time-slices with backward, another step's work.
    Force,
}

impl Overlap {
    /// From the manifest's `comm.overlap` and `comm.overlap_shares_core`.
    pub(crate) fn in_effect(overlapped: bool, shares_core: bool) -> Overlap {
        match (overlapped, shares_core) {
            (false, _) => Overlap::Off,
            (true, false) => Overlap::On,
            (true, true) => Overlap::Force,
        }
    }
}

/// Another trainer run on the same workload beside ddpbench's points (`study` with
/// `peer`): its runs carry it in the key, so they are never repeats of ddpbench's runs
/// nor their reference, and ddpbench's never theirs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Twin {
    /// PyTorch's DistributedDataParallel (gloo on CPU, NCCL on GPUs), one process per
    /// rank: `benchmarks/pytorch_ddp_mnist.py`, timed by `python/ddpbench_record`.
    PytorchDdp,
    /// A user's own `torchrun` DDP script, recorded by `python/ddpbench_record`: its
    /// model and data set are the names the script gave. Never a study's peer.
    #[value(skip)]
    PytorchDdpScript,
}

impl Twin {
    /// The name the study key, the key and the files use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Twin::PytorchDdp => "pytorch-ddp",
            Twin::PytorchDdpScript => "pytorch-ddp-script",
        }
    }

    /// The name reports show.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Twin::PytorchDdp => "PyTorch DDP",
            Twin::PytorchDdpScript => "a PyTorch DDP script",
        }
    }
}

/// The element type of a TorchScript model's input (`--input-dtype`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputDtype {
    /// Real-valued samples (images): synthetic ones are drawn from a standard normal.
    #[default]
    Float32,
    /// Token ids below --vocab-size (0 is padding, 1 unknown): `--input-shape` is the
    /// sequence length.
    Int64,
}

/// The loss a TorchScript model is trained with (`--loss`).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// The module returns class logits [batch, classes]; ddpbench applies log-softmax and
    /// the negative log-likelihood, as the built-in classifiers end.
    #[default]
    Nll,
    /// The module computes its own loss: forward(input, target) returns one scalar.
    None,
}

impl LossKind {
    pub(crate) fn is_nll(&self) -> bool {
        *self == LossKind::Nll
    }
}
