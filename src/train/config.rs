//! The training configuration: what `ddpbench train` was asked to do. The command
//! line is parsed straight into it (each section is a group of `--help`), it is
//! validated once before MPI starts ([`TrainConfig::validate`]), and it is written
//! verbatim (flat, one key per flag) into `manifest.json`, so every run can be
//! repeated from its own folder. The trainer reads only this struct, never clap.

use crate::comm::{AllreduceChoice, GradDtype, OverlapMode};
use crate::data::{DataSpec, DatasetKind, ImageCaps};
use crate::device::DeviceChoice;
use crate::job::same_flags::LaunchFlags;
use crate::model::{self, InputDtype, InputShape, LossKind, ModelChoice, ModelOptions, ShapeFlags};
use crate::optim::LrScaling;
use crate::record::AmpMode;
use crate::record::NoiseScaleMode;
use crate::record::OptimizerKind;
use crate::topology::BindPolicy;
use crate::train::host_memory::MallocMode;
use anyhow::{anyhow, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Everything a training run is configured by.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
pub struct TrainConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub workload: WorkloadConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub schedule: ScheduleConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub optim: OptimConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub placement: PlacementConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub comm: CommConfig,
    #[command(flatten)]
    #[serde(flatten)]
    pub output: OutputConfig,
    /// The study point and repeat this run is, set by `ddpbench study` (no flag): its
    /// manifest's `study_run`.
    #[arg(skip)]
    #[serde(skip)]
    pub study_run: Option<crate::record::StudyRun>,
}

/// The `train` flags that change the work of a step, each with the field of the
/// comparison key ([`crate::record::ComparisonKey`]) that records what it made run: runs
/// that differ in one are never repeats of one point, nor each other's reference.
#[cfg(test)]
pub(crate) const IN_KEY: &[(&str, &str)] = &[
    ("--model", "model"),
    ("--dataset", "dataset"),
    ("--device", "device"),
    ("--threads", "threads"),
    ("--optimizer", "optimizer"),
    ("--grad-accum", "grad_accum"),
    ("--bucket-mb", "bucket_mb"),
    ("--overlap", "overlap"),
    ("--grad-dtype", "grad_dtype"),
    ("--amp", "amp"),
    ("--allreduce", "backend"),
    ("--workers", "workers"),
    ("--seq-len", "seq_len"),
    ("--vocab-size", "vocab_size"),
    ("--malloc", "malloc"),
    ("--deterministic", "deterministic"),
    ("--phase-sync", "phase_sync"),
    // Two gradient norms beside the step: a cost under 1 % at every:K, but a cost, so
    // runs that asked for different norms are never pooled. The key holds the flag as
    // asked, so a 1-rank run that takes none stays the reference of N-rank runs.
    ("--noise-scale", "noise_scale"),
    ("--memory-format", "memory_format"),
    ("--no-dropout", "dropout"),
    // 0 skips SGD's momentum buffer; the value is kept whole, so runs never pool updates
    // that differ.
    ("--momentum", "momentum"),
    // Above 0 adds the decay term to every parameter's update.
    ("--weight-decay", "weight_decay"),
    // A TorchScript model's sample shape; the key also holds the file's SHA-256.
    ("--input-shape", "input_shape"),
    ("--input-dtype", "input_shape"),
    ("--loss", "loss"),
];

/// The `train` flags that do not change the work of a step, and why: runs that differ
/// only in these are repeats of one point.
#[cfg(test)]
pub(crate) const NOT_IN_KEY: &[(&str, &str)] = &[
    (
        "--data-dir",
        "where the files are: the data set's kind is the key's dataset, and a path names no content",
    ),
    (
        "--synthetic-samples",
        "the size of the synthetic training split: steps per epoch, not a step's work",
    ),
    (
        "--max-image-pixels",
        "a cap that refuses a file before it is decoded: a completed step decoded the same",
    ),
    (
        "--max-image-bytes",
        "a cap that refuses a file before it is read: a completed step read the same",
    ),
    ("--epochs", "how long the run is, not what a step does"),
    ("--max-steps", "how long the run is, not what a step does"),
    (
        "--target-loss",
        "how long the run is, not what a step does (one all-reduce of one number between steps)",
    ),
    (
        "--target-accuracy",
        "how long the run is, not what a step does (validation runs between steps, outside the timed phases)",
    ),
    ("--val-every", "how often validation runs between steps, outside the timed phases"),
    ("--batch-size", "a dimension of the point of its own (batch per rank, global batch)"),
    ("--warmup-steps", "which steps are left out of the figures"),
    (
        "--min-measured-steps",
        "a threshold for a warning the manifest records, not what a step does",
    ),
    ("--val-samples", "validation runs after an epoch's timed steps"),
    ("--seed", "the initial values and the order of samples, not the work on them"),
    ("--lr", "the learning rate's value scales the same update"),
    ("--lr-scaling", "it sets the learning rate's value"),
    ("--warmup-epochs", "it sets the learning rate's value over time"),
    ("--bind", "where threads run; the threads it bound are the key's threads"),
    ("--node-type", "node types are a dimension of the point of their own"),
    ("--node-slots", "it sets the binding; the threads it bound are the key's threads"),
    ("--probe-iters", "the probe runs before the first step"),
    ("--out", "where the files go"),
    (
        "--break-lock",
        "whether a stale lock of the output folder is cleared, before anything runs",
    ),
    ("--log-every", "a log line on rank 0 between steps, outside the timed phases"),
    ("--telemetry-ms", "NVML is sampled by a thread of its own, beside the step"),
    ("--save-model", "the parameters are written after the last step"),
    ("--watchdog-s", "a time limit on collectives, which a completed run never reached"),
    (
        "--num-classes",
        "the width of a model's output, which the model (a file's SHA-256) fixes; a value that does not fit is refused",
    ),
    (
        "--trace",
        "the trace draws the marks the step records anyway, written after the step's end mark",
    ),
    ("--trace-steps", "which steps the trace draws"),
];

/// The `train` flags that may differ between the ranks of one job, and why: every other
/// flag is compared across ranks at start-up ([`TrainConfig::launch_flags`]), since ranks
/// that disagree make different collectives and hang.
pub(crate) const RANK_LOCAL: &[(&str, &str)] = &[(
    "--node-type",
    "it labels the node this rank runs on (ranks on different hardware carry different labels; \
     the manifest records each rank's)",
)];

/// The `train` flags every rank of a job must be given alike.
#[cfg(test)]
pub(crate) const SAME_ON_EVERY_RANK: &[&str] = &[
    "--model",
    "--input-shape",
    "--input-dtype",
    "--num-classes",
    "--loss",
    "--dataset",
    "--data-dir",
    "--synthetic-samples",
    "--seq-len",
    "--vocab-size",
    "--no-dropout",
    "--memory-format",
    "--max-image-pixels",
    "--max-image-bytes",
    "--epochs",
    "--max-steps",
    "--target-loss",
    "--target-accuracy",
    "--val-every",
    "--batch-size",
    "--grad-accum",
    "--warmup-steps",
    "--min-measured-steps",
    "--val-samples",
    "--seed",
    "--deterministic",
    "--optimizer",
    "--lr",
    "--momentum",
    "--weight-decay",
    "--lr-scaling",
    "--warmup-epochs",
    "--amp",
    "--device",
    "--bind",
    "--threads",
    "--workers",
    "--malloc",
    "--node-slots",
    "--phase-sync",
    "--allreduce",
    "--overlap",
    "--bucket-mb",
    "--grad-dtype",
    "--probe-iters",
    "--out",
    "--break-lock",
    "--log-every",
    "--telemetry-ms",
    "--save-model",
    "--watchdog-s",
    "--trace",
    "--trace-steps",
    "--noise-scale",
];

/// The environment variables that change what a `train` run does, and why: each is
/// recorded per rank (`RankInfo::run_env`) and held by the comparison key's `env`, so a
/// run with one set is never a repeat of, nor a reference for, a run without it.
pub(crate) const ENV_IN_KEY: &[(&str, &str)] = &[
    (
        "DDPBENCH_SLOW_FORWARD",
        "a rank sleeps in every forward pass: a straggler made on purpose",
    ),
    ("DDPBENCH_FAULT", "a rank fails at a step"),
    (
        "DDPBENCH_AMP_OVERFLOW",
        "rank 0 fills a gradient with inf at a step, which is then skipped",
    ),
    (
        "MALLOC_MMAP_THRESHOLD_",
        "glibc's malloc as the environment sets it wins over --malloc",
    ),
    (
        "MALLOC_TRIM_THRESHOLD_",
        "glibc's malloc as the environment sets it wins over --malloc",
    ),
    ("MALLOC_TOP_PAD_", "glibc's malloc as the environment sets it wins over --malloc"),
];

/// The `DDPBENCH_*` variables the code reads that do not change a training step, and why.
#[cfg(test)]
pub(crate) const ENV_NOT_IN_KEY: &[(&str, &str)] = &[
    (
        "DDPBENCH_PYTHON",
        "the Python a study's PyTorch DDP twin runs: no ddpbench step reads it; the twin's key names the peer and its \
         manifest the torch version",
    ),
    ("DDPBENCH_LOG", "which log lines are printed, between steps"),
    (
        "DDPBENCH_LOG_BUFFER_BYTES",
        "how many bytes of log lines wait for stderr: what is printed, never when a step runs",
    ),
    (
        "DDPBENCH_STOP_AT_EXIT",
        "a rank stops itself after its records are final: the job's teardown, after every step",
    ),
    (
        "DDPBENCH_NCCL_LIB",
        "where libnccl is found: a path names no content (the version loaded is the manifest's comm.nccl_version)",
    ),
    (
        "DDPBENCH_TRACE_MAX_BYTES",
        "how many bytes of trace a rank writes: the trace is written after each step's end mark, as --trace",
    ),
    ("DDPBENCH_LIBTORCH_LIB", "read when ddpbench is built, not when it runs"),
    ("DDPBENCH_GEN_FAULT_AFTER_SHARDS", "read by gen-bigmnist, not by train"),
    ("DDPBENCH_TEST_CORRUPT_RANK", "read by the allreduce sweep, not by train"),
    (
        "DDPBENCH_TEST_BUSY_FORWARD",
        "a test's busy machine: every rank sleeps in every forward pass, and a run beside a CPU load is a repeat \
         of one without, so the key leaves it out",
    ),
];

/// What is trained, on what.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Workload")]
pub struct WorkloadConfig {
    /// Network to train: a built-in one (mnist-cnn, resnet18, resnet50, resnet18-cifar,
    /// transformer-small, transformer-medium; see `ddpbench models`), or a TorchScript file
    /// saved from PyTorch (a path ending in .pt, e.g. `torch.jit.script(net).save("net.pt")`),
    /// which then needs --input-shape and --num-classes.
    #[arg(long, default_value_t = ModelChoice::default())]
    pub model: ModelChoice,

    /// A TorchScript model's sample shape, without the batch: channels × height × width for
    /// images (3x224x224), the sequence length for token ids (128, with --input-dtype int64).
    /// Synthetic data takes this shape; another data set's samples must have it.
    #[arg(long)]
    #[serde(default)]
    pub input_shape: Option<InputShape>,

    /// A TorchScript model's input type: float32 images, or int64 token ids below --vocab-size.
    #[arg(long, value_enum, default_value_t = InputDtype::Float32)]
    #[serde(default)]
    pub input_dtype: InputDtype,

    /// The classes a TorchScript model's logits cover ([batch, N]); synthetic labels are drawn below N.
    #[arg(long)]
    #[serde(default)]
    pub num_classes: Option<usize>,

    /// A TorchScript model's loss: `nll` applies log-softmax and the negative log-likelihood
    /// to the logits it returns (as the built-in classifiers end); `none` when its forward
    /// takes (input, target) and returns its own scalar loss.
    #[arg(long, value_enum, default_value_t = LossKind::Nll)]
    #[serde(default)]
    pub loss: LossKind,

    /// Data set; fashion-mnist reads /usr/share/datasets/fashion-mnist unless --data-dir is given.
    #[arg(long, value_enum, default_value_t = DatasetKind::FashionMnist)]
    pub dataset: DatasetKind,

    /// Folder holding the data set's files (for MNIST formats: train-images-idx3-ubyte[.gz] etc.).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,

    /// Training samples of --dataset synthetic (the test split gets a sixth of it).
    #[arg(long, default_value_t = 60_000)]
    pub synthetic_samples: usize,

    /// Tokens per sample for transformer models (padded or truncated).
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,

    /// Vocabulary size for transformer models (the most frequent training words, plus padding and unknown).
    #[arg(long, default_value_t = 20_000)]
    pub vocab_size: usize,

    /// Disable dropout layers, so that 1-rank and N-rank runs see bit-comparable updates.
    #[arg(long)]
    pub no_dropout: bool,

    /// Layout of the batch and the convolution weights: channels-last (NHWC strides, what
    /// tensor cores read without a transpose; the default for convolution networks on a
    /// GPU) or contiguous (NCHW; the default elsewhere). Gradient buckets follow each
    /// weight's layout, so the all-reduce still reads one flat buffer. Image models only.
    #[arg(long, value_enum)]
    #[serde(default)]
    pub memory_format: Option<MemoryFormat>,

    #[command(flatten)]
    #[serde(flatten)]
    pub image_caps: ImageCaps,
}

/// The fewest measured steps a run's throughput is trusted from, unless
/// `--min-measured-steps` says otherwise.
pub(crate) const MIN_MEASURED_STEPS: usize = 20;

/// [`MIN_MEASURED_STEPS`], for manifests written before the flag existed.
pub(crate) fn min_measured_steps_default() -> usize {
    MIN_MEASURED_STEPS
}

/// How long, in what batches.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Schedule")]
pub struct ScheduleConfig {
    /// Passes over the training split.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,

    /// Stop after this many steps in total (per rank), whatever --epochs says.
    #[arg(long)]
    pub max_steps: Option<usize>,

    /// Stop once the smoothed training loss is at or below this: each step's loss,
    /// averaged over the ranks and then over the last 20 measured steps (every rank
    /// holds the same mean, so every rank stops after the same step). The manifest's
    /// `target` records whether and when: steps, samples over all ranks and seconds
    /// since the start of training. Not reached within --epochs/--max-steps: the run
    /// ends as usual and says so, with no figure of the reach. The learning rate is the
    /// run's own (--lr, --lr-scaling, --warmup-epochs, written into `target.lr_rule`);
    /// --lr-scaling linear scales by ranks × --grad-accum only, so to compare global
    /// batches that differ in --batch-size, scale --lr with the batch by hand.
    #[arg(long, value_name = "LOSS", value_parser = super::target::positive_loss, conflicts_with = "target_accuracy")]
    #[serde(default)]
    pub target_loss: Option<f64>,

    /// Stop once a validation's accuracy is at or above this fraction (0.85 for 85 %):
    /// validation on --val-samples test samples (default: the whole test split) runs
    /// every --val-every optimizer steps, outside the timed steps, and every rank holds
    /// the same accuracy. The manifest's `target` records whether and when, as for
    /// --target-loss; the steps to the target are known to within --val-every, and its
    /// seconds include the validations. Needs a model that gives predictions (a
    /// TorchScript file with its own loss gives none: use --target-loss).
    #[arg(long, value_name = "FRACTION", value_parser = super::target::accuracy_fraction)]
    #[serde(default)]
    pub target_accuracy: Option<f64>,

    /// Optimizer steps between the validations of --target-accuracy (only with it).
    /// Default: a tenth of an epoch's steps, so that every global batch is checked
    /// every tenth of an epoch's samples. Longer than the run's steps is refused: the
    /// target would never be checked.
    #[arg(long, value_name = "STEPS", requires = "target_accuracy")]
    #[serde(default)]
    pub val_every: Option<usize>,

    /// Samples per step on each rank (the global batch is this times the number of ranks).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,

    /// Micro-batches accumulated per optimizer step; gradients are all-reduced once per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,

    /// Steps at the start flagged as warm-up in the CSV (kept, but excluded by `reduce`).
    #[arg(long, default_value_t = 5)]
    pub warmup_steps: usize,

    /// Fewest measured steps (after warm-up) a run's throughput is trusted from: a run
    /// with fewer is warned of, recorded (`too_few_measured_steps` in the manifest's
    /// `warnings`), and `reduce` claims no direction for its point. Raise --epochs or
    /// --max-steps, or lower --warmup-steps, rather than this.
    #[arg(long, default_value_t = MIN_MEASURED_STEPS)]
    #[serde(default = "min_measured_steps_default")]
    pub min_measured_steps: usize,

    /// Validate on the first N test samples after each epoch (0 skips validation). Default:
    /// as many as the epoch trained over all ranks (at most the test split), so that
    /// validation takes less time than the epoch's steps.
    #[arg(long)]
    pub val_samples: Option<usize>,

    /// Seed of parameter initialisation, shuffling and dropout.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Ask libtorch for deterministic algorithms (slower on GPU; repeatable results).
    #[arg(long)]
    pub deterministic: bool,
}

/// How the parameters are updated.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Optimizer")]
pub struct OptimConfig {
    /// Optimizer, stepped by every rank on the averaged gradients.
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adam)]
    pub optimizer: OptimizerKind,

    /// Learning rate (default: 0.001 for adam, 0.01 for sgd, 0.1 for lars).
    #[arg(long)]
    pub lr: Option<f64>,

    /// SGD/LARS momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,

    /// L2 weight decay (SGD, LARS).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,

    /// How the learning rate follows the global batch.
    #[arg(long, value_enum, default_value_t = LrScaling::None)]
    pub lr_scaling: LrScaling,

    /// Raise the learning rate linearly from 0 over this many epochs (fractions allowed).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_epochs: f64,

    /// Automatic mixed precision for forward and backward (parameters and optimizer keep
    /// their dtypes: fp32 for the built-in networks). fp16 refuses a float16 parameter,
    /// whose gradient its loss scaler cannot unscale (as torch.amp.GradScaler).
    #[arg(long, value_enum, default_value_t = AmpMode::Off)]
    pub amp: AmpMode,
}

/// Where each rank runs.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Placement (device, cores, threads) and host resources")]
pub struct PlacementConfig {
    /// Where to train.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,

    /// How each rank is pinned to cores with hwloc.
    #[arg(long, value_enum, default_value_t = BindPolicy::Auto)]
    pub bind: BindPolicy,

    /// Intra-op threads per rank (default: the number of cores the rank is bound to).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Threads preparing batches ahead of the step (0: prepare each batch inline). The queue
    /// holds two batches per worker; data_s is the time a step waited for its batch.
    /// Default: for data sets held in memory, 0 on a CPU and on a GPU 2 (fewer where the
    /// binding has fewer spare cores), which gather batches into page-locked memory so the
    /// copy to the GPU does not hold the host; for image folders (JPEG decoding), the
    /// cores of the rank's binding its compute does not use (on a GPU all but one), at
    /// least 1. Workers run inside the rank's binding; the manifest records the number.
    #[arg(long)]
    pub workers: Option<usize>,

    /// Node type label for this rank, overriding the one detected from the hardware.
    #[arg(long)]
    pub node_type: Option<String>,

    /// Host memory a step frees: kept for reuse (tuned), or given back to the kernel and
    /// paged in again next step (glibc's default). MALLOC_* environment variables win.
    #[arg(long, value_enum, default_value_t = MallocMode::Tuned)]
    pub malloc: MallocMode,

    /// Bind as if this many ranks shared each node (at least the ranks really there). A
    /// study sets it to the most ranks any of its points puts on one node, so a 1-rank
    /// point gets one rank's share of the cores, the same as every rank of a bigger point.
    #[arg(long)]
    #[serde(default)]
    pub node_slots: Option<usize>,

    /// How the phases of a step are timed on a GPU. `events` (the default there): a CUDA
    /// event at each device-side boundary, read when the next step ends, so no boundary
    /// waits; data and host work keep the host clock. `events-at-end`: the same, read at
    /// the step's own end after one wait. `on`: wait for the device at every boundary
    /// (exact, costs the CPU/GPU pipelining; the default on CPU, where nothing is waited
    /// for). `off`: one wait at the step's end and the whole step as other_s (what the
    /// breakdown costs). On CPU, `events` reads host times a step late, as on a GPU.
    #[arg(long, value_enum)]
    #[serde(default)]
    pub phase_sync: Option<PhaseSync>,
}

/// How phases are timed ([`PlacementConfig::phase_sync`]) and the batch's and weights'
/// layout ([`WorkloadConfig::memory_format`]); defined with the comparison key, which
/// records them.
pub(crate) use crate::record::{MemoryFormat, PhaseSync};

/// How gradients are averaged across ranks.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Communication")]
pub struct CommConfig {
    /// Gradient all-reduce backend.
    #[arg(long, value_enum, default_value_t = AllreduceChoice::Auto)]
    pub allreduce: AllreduceChoice,

    /// All-reduce each bucket while backward is still running (as PyTorch DDP). Backward runs
    /// in segments cut where a bucket's last gradient is made, and the bucket leaves at once;
    /// the CSV's comm_exposed_s is the part of comm_s not hidden behind backward. Needs more
    /// than one bucket: when all gradients fit one, the run says so (lower --bucket-mb).
    #[arg(long, value_enum, default_value_t = OverlapMode::On)]
    pub overlap: OverlapMode,

    /// Gradient bucket size in MiB for the all-reduce (PyTorch DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,

    /// Data type of gradients on the wire (compression; `bytes` in the CSV counts what was
    /// sent). It casts fp32 gradients only: a TorchScript model's fp64, fp16 or bf16
    /// parameters have buckets of their own, all-reduced in their own dtype.
    #[arg(long, value_enum, default_value_t = GradDtype::Fp32)]
    pub grad_dtype: GradDtype,

    /// Measure the gradient noise scale in the all-reduce: on the steps it picks, the
    /// squared norm of this rank's gradient before the all-reduce (batch b) and of the
    /// averaged one after it (batch N·b), or with one rank of the first micro-batch and
    /// the whole step (--grad-accum ≥ 2). From the two, epochs.csv estimates |G|², tr(Σ)
    /// and B_simple = tr(Σ)/|G|², the global batch past which more ranks buy little
    /// time to a given loss. `off`, `on` (every step) or `every:K` (every K-th step; the
    /// default keeps the cost under 1 % of a step). `off` leaves the cells empty.
    #[arg(long, value_name = "off|on|every:K", default_value = "every:10")]
    #[serde(default)]
    pub noise_scale: NoiseScaleMode,

    /// Iterations of the raw MPI_Allreduce probe run before training, cold and warm cache
    /// (each stops after 5 s once it has 10; 0 skips it). Its median and spread go to the manifest.
    #[arg(long, default_value_t = 50)]
    pub probe_iters: usize,
}

/// What is written where.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
#[command(next_help_heading = "Output and monitoring")]
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<name>` is a placeholder
pub struct OutputConfig {
    /// Output folder (default: results/<model>-<data>-n<ranks>-<time>[-j<job id>]-<4 random
    /// hex digits>/). Its name is the run id: letters, digits, `.`, `_` and `-` only. One
    /// job per folder: a folder that holds any file a run writes, or whose lock
    /// (.ddpbench.lock) another job holds, is refused; a folder you made empty is fine.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Remove the output folder's lock left by a job that was killed on another host
    /// (a lock of this host is cleared by itself once its process is gone). Check first
    /// that the job named in the refusal has ended.
    #[arg(long)]
    #[serde(default)]
    pub break_lock: bool,

    /// Log progress on rank 0 every N steps (0: only per epoch).
    #[arg(long, default_value_t = 100)]
    pub log_every: usize,

    /// GPU telemetry (NVML) sampling period in ms, written to rank-NNNNN.gpu.csv (0: off).
    #[arg(long, default_value_t = 200)]
    pub telemetry_ms: u64,

    /// Write the final parameters to model.safetensors in the run folder (rank 0); for a
    /// TorchScript --model, model.pt: the module with its trained weights.
    #[arg(long)]
    pub save_model: bool,

    /// Seconds a collective, or one phase of a step where no collective is pending
    /// (forward, backward, data loading...), may take before the job is declared hung: the
    /// ranks write rank-NNNNN.flight.json, one message names the ranks that never entered
    /// it (or the phase a rank is stuck in), and the job is aborted. Default: 1800 s
    /// during set-up, 600 s in the warm-up steps, then 50 × the median step (at least
    /// 60 s); 300 s in the teardown (closing files, MPI_Finalize), where a rank that does
    /// not arrive is named and the job ends with its records kept.
    #[arg(long)]
    pub watchdog_s: Option<f64>,

    /// Write a timeline of every rank: RUN_DIR/trace/rank-NNNNN.trace.json (Chrome trace
    /// format: Perfetto, chrome://tracing, Holistic Trace Analysis) for the first 50 steps
    /// after warm-up, and merge them into RUN_DIR/timeline.json with `ddpbench trace RUN_DIR`.
    #[arg(long)]
    #[serde(default)]
    pub trace: bool,

    /// Trace global steps A to B (B excluded, at most 10000 steps) instead of the first
    /// 50 after warm-up; implies --trace. A rank's trace stops sooner if its file reaches
    /// 512 MiB (about 1,300 steps of a 1,000-bucket model), and the log says at which step.
    #[arg(long, value_name = "A:B")]
    #[serde(default)]
    pub trace_steps: Option<crate::trace::StepWindow>,
}

impl WorkloadConfig {
    /// Sizes the built-in networks depend on.
    pub(crate) fn model_options(&self) -> ModelOptions {
        ModelOptions {
            seq_len: self.seq_len as i64,
            vocab: self.vocab_size as i64,
            dropout: !self.no_dropout,
        }
    }

    /// What the model takes and predicts ([`model::resolve_spec`]); Err says which flag is wrong.
    pub(crate) fn model_spec(&self) -> Result<model::ModelSpec> {
        let flags = ShapeFlags {
            input_shape: self.input_shape.as_ref(),
            input_dtype: self.input_dtype,
            num_classes: self.num_classes,
            loss: self.loss,
        };
        model::resolve_spec(&self.model, &flags, &self.model_options()).map_err(|e| anyhow!("{e}"))
    }
}

impl TrainConfig {
    /// The command and flags compared across ranks at start-up: every flag but
    /// [`RANK_LOCAL`]'s.
    pub(crate) fn launch_flags(&self) -> LaunchFlags {
        LaunchFlags::from_fields("train", self, RANK_LOCAL)
    }

    /// The steps traced, when `--trace` or `--trace-steps` asked for a trace.
    pub(crate) fn trace_window(&self) -> Option<crate::trace::StepWindow> {
        let o = &self.output;
        o.trace_steps
            .or_else(|| o.trace.then(|| crate::trace::StepWindow::after_warmup(self.schedule.warmup_steps)))
    }

    /// The data set this run loads ([`crate::data::load`]).
    pub(crate) fn data_spec(&self) -> DataSpec {
        let w = &self.workload;
        DataSpec {
            dataset: w.dataset,
            data_dir: w.data_dir.clone(),
            synthetic_samples: w.synthetic_samples,
            seed: self.schedule.seed,
            image_caps: w.image_caps,
            model_name: w.model.name(),
        }
    }

    /// The learning rate asked for, or the optimizer's default.
    pub(crate) fn learning_rate(&self) -> f64 {
        self.optim.lr.unwrap_or(match self.optim.optimizer {
            OptimizerKind::Adam => 0.001,
            OptimizerKind::Sgd => 0.01,
            OptimizerKind::Lars => 0.1,
        })
    }

    /// What the run trains to: `--target-loss` or `--target-accuracy` (clap refuses both).
    pub(crate) fn target_goal(&self) -> Option<crate::record::TargetGoal> {
        use crate::record::TargetGoal;
        let s = &self.schedule;
        s.target_loss
            .map(TargetGoal::TrainingLoss)
            .or(s.target_accuracy.map(TargetGoal::ValidationAccuracy))
    }

    /// Samples one rank processes per optimizer step.
    pub(crate) fn samples_per_step(&self) -> usize {
        self.schedule.batch_size * self.schedule.grad_accum
    }

    /// Checks what needs no MPI, so bad input fails before any rendezvous: every number
    /// within what a run can use, every real number finite, the node type printable.
    pub(crate) fn validate(&self) -> Result<()> {
        let (w, s, o, p, c, out) = (
            &self.workload,
            &self.schedule,
            &self.optim,
            &self.placement,
            &self.comm,
            &self.output,
        );
        let hw = crate::topology::online_cpus();
        let whole: [(&str, Option<u64>, u64, u64, &str); 15] = [
            ("--node-slots", p.node_slots.map(|v| v as u64), 1, 4096, "ranks per node"),
            (
                "--batch-size",
                Some(s.batch_size as u64),
                1,
                crate::bounds::MAX_BATCH_PER_RANK,
                "samples per rank and step",
            ),
            (
                "--epochs",
                Some(s.epochs as u64),
                1,
                1_000_000,
                "passes (use --max-steps to stop earlier)",
            ),
            ("--max-steps", s.max_steps.map(|v| v as u64), 1, 1_000_000_000_000, "steps"),
            (
                "--grad-accum",
                Some(s.grad_accum as u64),
                1,
                crate::bounds::MAX_GRAD_ACCUM,
                "micro-batches per step",
            ),
            ("--warmup-steps", Some(s.warmup_steps as u64), 0, 1_000_000_000_000, "steps"),
            (
                "--threads",
                p.threads.map(|v| v as u64),
                1,
                hw as u64,
                "threads per rank (this node's hardware threads; leave it out to follow the core binding)",
            ),
            (
                "--workers",
                p.workers.map(|v| v as u64),
                0,
                crate::data::loader::max_workers(hw) as u64,
                "batch-preparing threads per rank",
            ),
            ("--seq-len", Some(w.seq_len as u64), 1, 1 << 16, "tokens"),
            (
                "--vocab-size",
                Some(w.vocab_size as u64),
                3,
                10_000_000,
                "words (padding, unknown and at least one word)",
            ),
            (
                "--synthetic-samples",
                Some(w.synthetic_samples as u64),
                1,
                1_000_000_000_000,
                "samples",
            ),
            ("--probe-iters", Some(c.probe_iters as u64), 0, 1_000_000, "iterations"),
            ("--telemetry-ms", Some(out.telemetry_ms), 0, 3_600_000, "milliseconds"),
            ("--val-samples", s.val_samples.map(|v| v as u64), 0, 1_000_000_000_000, "samples"),
            (
                "--val-every",
                s.val_every.map(|v| v as u64),
                1,
                1_000_000_000_000,
                "optimizer steps",
            ),
        ];
        for (flag, value, lo, hi, what) in whole {
            if let Some(v) = value.filter(|v| !(lo..=hi).contains(v)) {
                return Err(anyhow!("{flag} {v}: must be {lo} to {hi} {what}"));
            }
        }
        let real: [(&str, Option<f64>, f64, f64, bool, &str); 6] = [
            ("--lr", o.lr, 0.0, 1e6, false, "a learning rate above 0"),
            ("--momentum", Some(o.momentum), 0.0, 1.0, true, "a momentum from 0 to 1"),
            (
                "--weight-decay",
                Some(o.weight_decay),
                0.0,
                1e6,
                true,
                "a weight decay of 0 or more",
            ),
            ("--warmup-epochs", Some(o.warmup_epochs), 0.0, 1e6, true, "epochs, 0 or more"),
            ("--bucket-mb", Some(c.bucket_mb), 0.0, 65536.0, false, "MiB above 0"),
            ("--watchdog-s", out.watchdog_s, 0.0, 1e7, false, "seconds above 0"),
        ];
        for (flag, value, lo, hi, lo_inclusive, what) in real {
            if let Some(v) = value {
                let above = if lo_inclusive { v >= lo } else { v > lo };
                if !(v.is_finite() && above && v <= hi) {
                    return Err(anyhow!("{flag} {v}: must be {what} (at most {hi})"));
                }
            }
        }
        self.validate_combinations()
    }

    /// The checks [`TrainConfig::validate`] makes of flags together and of text.
    fn validate_combinations(&self) -> Result<()> {
        let (w, s, p, out) = (&self.workload, &self.schedule, &self.placement, &self.output);
        if s.target_accuracy.is_some() && s.val_samples == Some(0) {
            return Err(anyhow!(
                "--target-accuracy with --val-samples 0: the target is checked on validation, which 0 samples skips; \
                 give --val-samples N (or leave it out for the whole test split)"
            ));
        }
        if let (Some(accuracy), LossKind::None) = (s.target_accuracy, w.loss) {
            return Err(anyhow!(
                "--target-accuracy {accuracy} with --loss none: a model that returns its own loss gives no predictions, so \
                 validation has no accuracy to reach; train to --target-loss instead"
            ));
        }
        w.model_spec()?;
        if w.memory_format == Some(MemoryFormat::ChannelsLast) && matches!(w.model_spec()?.input, model::Input::Tokens { .. }) {
            return Err(anyhow!(
                "--memory-format channels-last: {} takes token ids, not images; leave the flag out or use contiguous",
                w.model.name()
            ));
        }
        if let Some(t) = &p.node_type {
            if t.trim().is_empty() || t.chars().any(|ch| ch.is_control() || ch == '|') {
                return Err(anyhow!(
                    "--node-type {t:?}: must be printable text without '|' (it names table rows)"
                ));
            }
        }
        if let Some(dir) = &out.out {
            // The folder's name becomes the run id, which `reduce` takes as a file name.
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if let Some(why) = crate::files::name_problem(&name) {
                return Err(anyhow!(
                    "--out {}: the run folder's name is the run id, and {why} (name the folder itself, e.g. results/my-run)",
                    dir.display()
                ));
            }
        }
        Ok(())
    }
}

impl TrainConfig {
    /// How phases are timed on `device`: as asked, else events on a GPU and `on` on CPU
    /// (where a boundary waits for nothing, so it is exact at no cost).
    pub(crate) fn phase_sync_on(&self, device: tch::Device) -> PhaseSync {
        match (self.placement.phase_sync, device) {
            (Some(p), _) => p,
            (None, tch::Device::Cpu) => PhaseSync::On,
            (None, _) => PhaseSync::Events,
        }
    }

    /// The layout on `device`: as asked, else channels-last for a convolution network on a
    /// GPU and contiguous otherwise.
    pub(crate) fn memory_format_on(&self, device: tch::Device) -> MemoryFormat {
        match (self.workload.memory_format, device) {
            (Some(f), _) => f,
            (None, tch::Device::Cuda(_)) if self.workload.model.is_convolutional() => MemoryFormat::ChannelsLast,
            (None, _) => MemoryFormat::Contiguous,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        cfg: TrainConfig,
    }

    /// The defaults `reduce` reads (`record/train_defaults.json`, for a binary without
    /// `train`) are these flags' own.
    #[test]
    fn the_recorded_defaults_are_the_flags_own() {
        let cfg = Train::try_parse_from(["train"]).unwrap().cfg;
        let now = serde_json::to_value(cfg).unwrap();
        let text = serde_json::to_string_pretty(&now).unwrap() + "\n";
        assert_eq!(
            serde_json::Value::Object(crate::record::train_defaults()),
            now,
            "a default of `train` changed: replace src/record/train_defaults.json with\n{text}"
        );
        assert_eq!(
            crate::record::TRAIN_DEFAULTS_JSON,
            text,
            "src/record/train_defaults.json: write it as\n{text}"
        );
    }

    /// A target accuracy is refused before training where validation cannot measure one:
    /// a model with its own loss, or no validation samples.
    #[test]
    fn a_target_accuracy_without_predictions_is_refused_before_training() {
        let check = |flags: &[&str]| {
            let line = std::iter::once("train").chain(flags.iter().copied());
            Train::try_parse_from(line).unwrap().cfg.validate().map_err(|e| e.to_string())
        };
        let e = check(&["--target-accuracy", "0.5", "--loss", "none"]).unwrap_err();
        assert!(e.contains("--loss none") && e.contains("--target-loss instead"), "{e}");
        let e = check(&["--target-accuracy", "0.5", "--val-samples", "0"]).unwrap_err();
        assert!(e.contains("--val-samples 0"), "{e}");
        check(&["--target-accuracy", "0.5"]).unwrap();
        // A target loss with --loss none is not this check's to refuse.
        if let Err(e) = check(&["--target-loss", "0.5", "--loss", "none"]) {
            assert!(!e.contains("--target-accuracy"), "{e}");
        }
    }

    /// Every `DDPBENCH_*` variable the code names is either held by the comparison key or
    /// said not to change a step, never both; the key's glibc variables are the ones
    /// `--malloc` yields to.
    #[test]
    fn every_environment_variable_read_is_in_the_key_or_says_why_not() {
        let prefix = concat!("DDPBENCH", "_");
        let mut named = std::collections::BTreeSet::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (at, _) in text.match_indices(&format!("\"{prefix}")) {
                        let name: String = text[at + 1..].chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
                        if name.len() > prefix.len() {
                            named.insert(name);
                        }
                    }
                }
            }
        }
        assert!(named.contains("DDPBENCH_SLOW_FORWARD"), "{named:?}");
        let listed = |list: &[(&str, &str)], n: &str| list.iter().filter(|(v, _)| *v == n).count();
        for n in &named {
            let (key, not) = (listed(ENV_IN_KEY, n), listed(ENV_NOT_IN_KEY, n));
            assert!(
                key + not == 1,
                "{n} must be listed once, in ENV_IN_KEY (it changes what a run does) or in ENV_NOT_IN_KEY (why it does \
                 not); it is in ENV_IN_KEY {key} time(s) and in ENV_NOT_IN_KEY {not} time(s)"
            );
        }
        for (n, _) in ENV_IN_KEY.iter().chain(ENV_NOT_IN_KEY).filter(|(n, _)| n.starts_with(prefix)) {
            assert!(named.contains(*n), "{n} is listed but no code names it");
        }
        let malloc = crate::train::host_memory::MALLOC_ENV;
        let in_key: Vec<&str> = ENV_IN_KEY.iter().map(|(n, _)| *n).filter(|n| n.starts_with("MALLOC_")).collect();
        assert_eq!(in_key, malloc, "the key's glibc variables are the ones --malloc yields to");
    }

    /// Every `train` flag is either a field of the comparison key or said not to change
    /// the step, never both: a new flag cannot merge different workloads unnoticed.
    #[test]
    fn every_train_flag_is_in_the_key_or_says_why_not() {
        let flags: Vec<String> = Train::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help")
            .collect();
        assert!(flags.len() >= 40, "{flags:?}");
        let listed = |list: &[(&str, &str)], f: &str| list.iter().filter(|(g, _)| *g == f).count();
        for f in &flags {
            let (key, not) = (listed(IN_KEY, f), listed(NOT_IN_KEY, f));
            assert!(
                key + not == 1,
                "{f} must be listed once, in IN_KEY (a field of ComparisonKey) or in NOT_IN_KEY (why it does not \
                 change the step); it is in IN_KEY {key} time(s) and in NOT_IN_KEY {not} time(s)"
            );
        }
        for (f, _) in IN_KEY.iter().chain(NOT_IN_KEY) {
            assert!(flags.iter().any(|g| g == f), "{f} is listed but is no train flag");
        }
        // Each key flag names a field the key writes (one with every field away from its
        // default, so none is left out).
        let unusual = crate::record::key::tests::unusual();
        let key = serde_json::to_value(&unusual).unwrap();
        for (f, field) in IN_KEY {
            assert!(key.get(field).is_some(), "{f}: the key has no field {field}");
        }
        // Each key flag but those a run names as given is one the key can set again, so
        // the command that adds a point's reference pins every field that ran.
        let one_thread = crate::record::ComparisonKey {
            threads_per_rank: vec![2],
            ..unusual
        };
        let set: Vec<&str> = one_thread.flags().iter().map(|f| f.flag()).collect();
        for (f, _) in IN_KEY
            .iter()
            .filter(|(f, _)| !["--model", "--dataset", "--input-shape", "--input-dtype"].contains(f))
        {
            assert!(set.contains(f), "{f}: ComparisonKey::flags does not set it");
        }
        for f in &set {
            assert!(IN_KEY.iter().any(|(g, _)| g == f), "{f} is set from the key but is not in IN_KEY");
        }
    }

    /// Every `train` flag may differ per rank or must be the same on every rank, never
    /// both, and each of the latter is compared: a new flag cannot be left out unnoticed.
    #[test]
    fn every_train_flag_is_compared_across_ranks_or_says_why_not() {
        let cfg = Train::try_parse_from(["train"]).unwrap().cfg;
        let launch = cfg.launch_flags();
        let command = Train::command().name("train");
        crate::job::same_flags::assert_every_flag_decided(&command, RANK_LOCAL, SAME_ON_EVERY_RANK, &launch);
        let flags = crate::job::same_flags::flag_names(&command);
        for f in launch.flags() {
            assert!(flags.iter().any(|g| g == f), "{f} is compared across ranks but is no train flag");
        }
    }
}
