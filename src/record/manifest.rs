//! `manifest.json`: everything needed to interpret, compare and repeat a run.

use super::settings::{Backend, GradDtype};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Version of the files a run folder holds (`manifest.json`, `rank-NNNNN.csv`, and
/// `summary.csv` written from them). 1: before `batch_copy_s` (the batch copy was inside
/// `data_s`) and with `copy_d2h_s`/`copy_h2d_s`; 2: the phase glossary of results/README.md;
/// 3: instants end in `_at_s`, `allreduce.csv` in seconds and bytes per second with
/// `buffer` for `placement` (the old → new table in results/README.md); 4: one name per
/// all-reduce backend (`mpi` for `mpi-cpu-staged` and the sweep's `staged`, with where
/// the buffers live in `allreduce.csv`'s `memory`).
pub const SCHEMA_VERSION: u32 = 4;

/// Why a file of schema `version` cannot be read by this ddpbench, ending in what to do
/// (`command` with the newer ddpbench), or None when it can: every schema from 1 to
/// [`SCHEMA_VERSION`] reads; a newer one's keys and columns may mean what this one does
/// not know, and 0 is no schema.
pub(crate) fn schema_problem(version: u64, command: &str) -> Option<String> {
    if version == 0 {
        Some(format!(
            "of schema 0, which no ddpbench writes (schemas run from 1 to {SCHEMA_VERSION}): the file is damaged"
        ))
    } else if version > u64::from(SCHEMA_VERSION) {
        Some(format!(
            "of schema {version}, written by a newer ddpbench; this one reads up to schema {SCHEMA_VERSION}: \
             {command} with the newer ddpbench"
        ))
    } else {
        None
    }
}

fn fp32() -> GradDtype {
    GradDtype::Fp32
}

/// Manifests written before `schema_version` existed are version 1.
fn schema_v1() -> u32 {
    1
}

/// A raw MPI_Allreduce of the same buckets, timed in the same run as training.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllreduceProbe {
    pub bytes: u64,
    pub iters: usize,
    /// Median over iterations of the slowest rank's time for all buckets.
    pub median_s: f64,
    pub min_s: f64,
    pub busbw_bytes_per_s: f64,
    pub algbw_bytes_per_s: f64,
    /// True when caches were flushed before each iteration.
    #[serde(default)]
    pub cold_cache: bool,
    /// The elements' type: the run's wire dtype (absent: fp32, all probes ran in before).
    #[serde(default = "fp32")]
    pub dtype: GradDtype,
    /// 10th and 90th percentile of the iterations: the probe's spread.
    #[serde(default)]
    pub p10_s: Option<f64>,
    #[serde(default)]
    pub p90_s: Option<f64>,
}

/// The communication set-up a run actually used (which may differ from what was asked).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CommInfo {
    /// Buckets all-reduced while backward ran.
    pub overlap: bool,
    /// Stages backward ran in (1 without overlap).
    pub backward_stages: usize,
    /// Gradient dtype on the wire.
    pub grad_dtype: String,
    /// Autocast dtype, or "off".
    pub amp: String,
    /// NCCL's version, when NCCL was used.
    pub nccl_version: Option<String>,
    /// MPI's thread support level as granted (overlap on MPI needs serialized or multiple).
    pub mpi_threading: String,
    /// Why the backend or overlap differs from what was asked, if it does.
    pub note: Option<String>,
    /// True when overlap was forced onto a core backward also computes on: the
    /// all-reduce then time-slices with backward and nothing of it is really hidden.
    #[serde(default)]
    pub overlap_shares_core: bool,
    /// Bytes on the wire of each gradient bucket, in the order they are all-reduced
    /// (empty in runs from before it was recorded).
    #[serde(default)]
    pub bucket_bytes: Vec<u64>,
    /// Per bucket, the mean over the timed steps of the fraction of backward that had
    /// run when rank 0 handed it to the all-reduce (host clock; 1: after backward).
    #[serde(default)]
    pub bucket_ready_fraction: Vec<f64>,
}

/// Where and on what one rank ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub node_type: String,
    pub device: String,
    /// Core binding policy and the hardware threads bound (e.g. "auto: 0-11").
    pub binding: String,
    pub threads: usize,
    pub cpu_model: String,
    pub gpus: Vec<String>,
    /// PCI bus id of this rank's GPU (from CUDA, so CUDA_VISIBLE_DEVICES is honoured).
    #[serde(default)]
    pub gpu_bus_id: Option<String>,
    /// Why the rank is not bound to the cores nearest its GPU, when it is not.
    #[serde(default)]
    pub binding_note: Option<String>,
    /// Where an overlapped MPI all-reduce's thread runs: its own core, unpinned with a
    /// core to spare, or sharing backward's cores.
    #[serde(default)]
    pub comm_thread: Option<String>,
    /// When batch workers and compute threads together exceed the rank's cores: how.
    #[serde(default)]
    pub workers_note: Option<String>,
    /// Launcher variables (OMPI_COMM_WORLD_*, SLURM_*, CUDA_VISIBLE_DEVICES).
    pub launcher_env: Vec<(String, String)>,
    /// Every `NCCL_*` variable this rank saw (they change NCCL's algorithms and transports).
    #[serde(default)]
    pub nccl_env: Vec<(String, String)>,
    /// The environment variables this rank saw that change what a run does (the test
    /// hooks, glibc's malloc settings), as `NAME=value`: the comparison key's `env`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run_env: Vec<String>,
    /// The CUDA version the driver supports (from the driver), on a GPU rank.
    #[serde(default)]
    pub cuda_driver_version: Option<String>,
    /// The NVIDIA driver's version (from NVML), on a GPU rank.
    #[serde(default)]
    pub gpu_driver_version: Option<String>,
    /// This rank's GPU clocks and throttle reasons before the first step.
    #[serde(default)]
    pub gpu_clocks_start: Option<GpuClocks>,
    /// The same after the last step (a GPU that heated up and throttled shows here).
    #[serde(default)]
    pub gpu_clocks_end: Option<GpuClocks>,
    /// The first global step this rank's trace left out because its file reached its
    /// byte bound (the trace file marks the same step); absent when the whole window was
    /// traced, or nothing was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_stopped_before_step: Option<usize>,
}

/// `manifest.json`: everything needed to interpret, compare and repeat a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// [`SCHEMA_VERSION`] of the writer.
    #[serde(default = "schema_v1")]
    pub schema_version: u32,
    pub run_id: String,
    /// "running", "completed", "failed" or "interrupted" ([`super::RunStatus`]).
    pub status: String,
    pub error: Option<String>,
    pub ddpbench_version: String,
    pub libtorch_version: String,
    pub mpi_library: String,
    pub command_line: Vec<String>,
    pub config: serde_json::Value,
    pub model: String,
    pub dataset: String,
    pub dataset_source: String,
    pub parameters: usize,
    pub gradient_bytes: u64,
    /// The all-reduce ([`Backend`]: `mpi`, `nccl` or `none`; `mpi-cpu-staged` before schema 4).
    pub comm_backend: Backend,
    /// How communication ran: overlap with backward, wire dtype, AMP, and why (e.g. the
    /// fallback from NCCL to MPI).
    #[serde(default)]
    pub comm: CommInfo,
    pub buckets: usize,
    pub world_size: usize,
    pub nodes: usize,
    pub batch_size_per_rank: usize,
    pub global_batch_size: usize,
    pub steps_per_epoch: usize,
    pub start_utc: String,
    pub end_utc: Option<String>,
    pub wall_s: Option<f64>,
    pub final_param_l2: Option<f64>,
    pub final_val_accuracy: Option<f64>,
    /// Raw MPI_Allreduce of the gradient buckets timed before training, caches flushed
    /// between iterations (gradients come from memory after backward): what the
    /// all-reduce inside training is compared with.
    pub allreduce_probe: Option<AllreduceProbe>,
    /// The same probe with warm caches: the best case, for comparison.
    #[serde(default)]
    pub allreduce_probe_warm: Option<AllreduceProbe>,
    pub ranks: Vec<RankInfo>,
    /// How the host allocator ran (`--malloc`, or the environment's MALLOC_* settings).
    #[serde(default)]
    pub host_malloc: Option<String>,
    /// How well the ranks' clocks agree (`clock.csv` holds every estimate).
    #[serde(default)]
    pub clock: Option<ClockSummary>,
    /// What the run is compared by, from what ran ([`super::ComparisonKey`]); absent in
    /// manifests written before it existed, whose key `reduce` derives from the fields above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison_key: Option<super::ComparisonKey>,
    /// The TorchScript file trained (`--model path.pt`): where it was, its bytes and its
    /// SHA-256; absent for a built-in network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_file: Option<ScriptFile>,
    /// Log lines rank 0 dropped because its stderr was full (nothing read it) until the
    /// run's outcome was written: training never waits for its log ([`crate::stderr`]).
    #[serde(default)]
    pub log_lines_dropped: u64,
    /// What the run accepted but warns of ([`super::RunWarning`]), each printed once by
    /// rank 0; empty in runs from before warnings were recorded.
    #[serde(default)]
    pub warnings: Vec<super::RunWarning>,
    /// What `--target-loss` or `--target-accuracy` asked and whether the run reached it;
    /// absent without either flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetOutcome>,
    /// The study point and repeat the run is (`ddpbench study` writes it): what the
    /// study's report joins the run by. Absent in a run of `train`, and in study runs
    /// written before it was recorded, whose folder name (`<point>-rep<N>`) says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study_run: Option<StudyRun>,
}

/// A point of a study, as its plan names it: safe as a folder name, unique in the study,
/// the same in every launch of the same study.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PointId(pub String);

impl PointId {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`: a width and alignment given in the format apply.
        f.pad(&self.0)
    }
}

impl From<&str> for PointId {
    fn from(s: &str) -> PointId {
        PointId(s.to_string())
    }
}

/// Which run of a study a run is: its point, and which repeat of it (from 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StudyRun {
    pub point: PointId,
    pub repeat: usize,
}

/// A run to a target (`train --target-loss` or `--target-accuracy`): the target, how
/// it was watched, and when it was reached. Not reached: `reached` false and no figures
/// of the reach, never a figure made up. Exactly one of `target_loss` and
/// `target_accuracy` is set ([`TargetOutcome::goal`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TargetOutcome {
    /// The smoothed training loss asked for (`--target-loss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_loss: Option<f64>,
    /// The validation accuracy asked for, as a fraction (`--target-accuracy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_accuracy: Option<f64>,
    /// The training loss's smoothing: the mean over the ranks of each step's training
    /// loss, averaged over this many of the last measured steps (a full window is
    /// needed). 0 for a target accuracy, which is not smoothed.
    pub window_steps: usize,
    /// Optimizer steps between validations (`--val-every`) for a target accuracy: the
    /// steps to the target are known to within this many. Absent for a target loss,
    /// which is checked after every measured step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validate_every_steps: Option<usize>,
    pub reached: bool,
    /// Optimizer steps done when the target was first met: the smoothed loss at or
    /// below it, or a validation's accuracy at or above it.
    #[serde(default)]
    pub steps_to_target: Option<usize>,
    /// Samples trained over all ranks by then (steps × the global batch).
    #[serde(default)]
    pub samples_to_target: Option<u64>,
    /// Seconds from the start of training (the ranks leave a barrier together) to then,
    /// epoch-end validation included.
    #[serde(default)]
    pub seconds_to_target: Option<f64>,
    /// The smoothed loss at the stop, or at the run's end when the target was not
    /// reached (None when fewer steps than the window were measured, and for a target
    /// accuracy).
    #[serde(default)]
    pub smoothed_loss: Option<f64>,
    /// For a target accuracy: the accuracy of the validation that reached it, else the
    /// best of the run's validations (None when none ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_accuracy: Option<f64>,
    /// The learning rate the run followed, in words (`--lr`, `--lr-scaling`,
    /// `--warmup-epochs` as run).
    pub lr_rule: String,
    /// Optimizer steps of the learning rate's linear warm-up (0: none). A target reached
    /// within them measures the warm-up, not samples to the target.
    #[serde(default)]
    pub warmup_lr_steps: usize,
    /// The learning rate after the warm-up (`--lr`, times the ranks and `--grad-accum`
    /// under `--lr-scaling linear`): what a grid of rates varies. Absent in runs recorded
    /// before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_lr: Option<f64>,
}

/// What a run was trained to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TargetGoal {
    /// The training loss, averaged over the ranks and the last measured steps, at or
    /// below this.
    TrainingLoss(f64),
    /// A validation's accuracy (a fraction) at or above this.
    ValidationAccuracy(f64),
}

impl TargetGoal {
    /// What is watched, in words: "training loss", "validation accuracy".
    pub fn metric(self) -> &'static str {
        match self {
            TargetGoal::TrainingLoss(_) => "training loss",
            TargetGoal::ValidationAccuracy(_) => "validation accuracy",
        }
    }

    /// The value asked for.
    pub fn value(self) -> f64 {
        match self {
            TargetGoal::TrainingLoss(v) | TargetGoal::ValidationAccuracy(v) => v,
        }
    }

    /// The same metric and the same value, bit for bit: runs that may be compared.
    pub fn same(self, other: TargetGoal) -> bool {
        self.metric() == other.metric() && self.value().to_bits() == other.value().to_bits()
    }
}

/// As the manifest's fields: `{"target_loss": v}` or `{"target_accuracy": v}`, so a
/// struct that flattens a goal keeps the manifest's names.
impl Serialize for TargetGoal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        match self {
            TargetGoal::TrainingLoss(v) => m.serialize_entry("target_loss", v)?,
            TargetGoal::ValidationAccuracy(v) => m.serialize_entry("target_accuracy", v)?,
        }
        m.end()
    }
}

/// "training loss 0.6", "validation accuracy 0.85": the metric and the value as given.
impl std::fmt::Display for TargetGoal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.metric(), self.value())
    }
}

impl TargetOutcome {
    /// What the run was trained to; None when the manifest sets neither target or both.
    pub fn goal(&self) -> Option<TargetGoal> {
        match (self.target_loss, self.target_accuracy) {
            (Some(l), None) => Some(TargetGoal::TrainingLoss(l)),
            (None, Some(a)) => Some(TargetGoal::ValidationAccuracy(a)),
            _ => None,
        }
    }

    /// Reached within the learning rate's warm-up.
    pub fn reached_in_warmup(&self) -> bool {
        self.reached && self.steps_to_target.is_some_and(|n| n <= self.warmup_lr_steps)
    }

    /// Reached after the warm-up: a run whose samples to the target count.
    pub fn measures_samples(&self) -> bool {
        self.reached && !self.reached_in_warmup()
    }
}

/// The clock offsets to rank 0 estimated during a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClockSummary {
    /// Estimates made (at the start and after every epoch).
    pub syncs: usize,
    /// The largest error of any offset `reduce` uses: the exact one's (the origins'
    /// reading error) where the rank shares rank 0's kernel, else the estimate's.
    pub max_error_s: f64,
    /// The largest offset of any rank to rank 0.
    pub max_abs_offset_s: f64,
    /// The largest change of one rank's offset between its first and last estimate.
    pub max_drift_s: f64,
    /// The largest error bound of any round-trip estimate (half its shortest round trip).
    #[serde(default)]
    pub max_estimate_error_s: f64,
    /// Round trips repeat until the bound is below this, or `budget_s` is spent.
    #[serde(default)]
    pub target_error_s: f64,
    #[serde(default)]
    pub budget_s: f64,
    /// Ranks (rank 0 included) under rank 0's kernel: their offsets are exact.
    #[serde(default)]
    pub exact_ranks: usize,
}

impl Manifest {
    /// Writes atomically (temp file, fsync, rename) so a reader never sees half a manifest.
    pub fn write(&self, dir: &Path) -> Result<()> {
        super::write_atomic(&dir.join("manifest.json"), &(serde_json::to_string_pretty(self)? + "\n"))
    }
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        // Only a regular file within its bound: a FIFO or a device in its place is named,
        // not waited on, and a file larger than a manifest is refused unread.
        let text = crate::files::read_regular_to_string(&path, crate::bounds::MANIFEST)
            .map_err(|e| anyhow::anyhow!(crate::files::read_error(&path, &e)))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a ddpbench manifest", path.display()))
    }
}

/// A GPU's clocks and why they are held down, as the manifest records them at the start
/// and the end of a run (a throttled GPU explains a slow rank).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuClocks {
    pub bus_id: String,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub max_sm_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    /// NVML's throttle reasons by name (e.g. `SW_POWER_CAP`, `HW_SLOWDOWN`); empty when
    /// none is active; `None` when the reading failed.
    pub throttle_reasons: Option<Vec<String>>,
}

/// The TorchScript file a run trained: where it was, its size and its SHA-256 (the
/// comparison key holds the hash, never the path). Read by `model::script`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptFile {
    pub path: std::path::PathBuf,
    pub bytes: u64,
    pub sha256: String,
}
