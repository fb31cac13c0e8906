//! The command line. `TrainArgs` is also the run's configuration: it is written
//! verbatim into `manifest.json`, so every run can be repeated from its own folder.

use crate::amp::AmpMode;
use crate::comm::{AllreduceChoice, GradDtype, OverlapMode};
use crate::data::DatasetKind;
use crate::device::DeviceChoice;
use crate::model::ModelKind;
use crate::optim::{LrScaling, OptimizerKind};
use crate::topology::BindPolicy;
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "ddpbench",
    version,
    about = "How well does data-parallel training scale on this machine, and where does the time go?",
    long_about = "ddpbench trains a real network data-parallel, one MPI rank per CPU socket or GPU, \
times every phase of every step on every rank, writes one CSV per rank, and reduces those \
files into throughput and phase breakdowns per node type.\n\n\
Typical use:\n  \
mpirun -n 2 ddpbench train --epochs 1          # two ranks on CPU, Fashion-MNIST\n  \
srun -N 2 --gpus-per-node 4 ddpbench train     # one rank per GPU on two nodes\n  \
ddpbench reduce results/<run-id>               # summary table and summary.csv\n  \
ddpbench topo --ranks 4                        # the binding 4 local ranks would get"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train data-parallel (launch with mpirun or srun, one process per rank).
    Train(TrainArgs),
    /// Summarise runs per node type, and scaling across runs (speedup, efficiency, waterfall, report, plots).
    Reduce(ReduceArgs),
    /// Print this machine's topology and the binding N local ranks would get.
    Topo(TopoArgs),
    /// List the models with their parameter counts and gradient bytes.
    Models(ModelsArgs),
    /// Build seed 000's bigMNIST: augmented, replicated MNIST in checksummed shards (resumable).
    GenBigmnist(GenBigMnistArgs),
}

#[derive(Args, Debug, Clone)]
pub struct GenBigMnistArgs {
    /// MNIST-format folder to start from (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]).
    #[arg(long)]
    pub from: PathBuf,
    /// Augmented versions of each training image.
    #[arg(long, default_value_t = 6)]
    pub augment: usize,
    /// Copies of the augmented set (200 gives seed 000's 72,000,000 samples, ~52 GiB).
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

#[derive(Args, Debug, Clone)]
pub struct ModelsArgs {
    /// Sequence length assumed for transformer models.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Vocabulary size assumed for transformer models.
    #[arg(long, default_value_t = 20_000)]
    pub vocab_size: usize,
}

#[derive(Args, Debug, Clone, Serialize)]
pub struct TrainArgs {
    /// Network to train.
    #[arg(long, value_enum, default_value_t = ModelKind::MnistCnn)]
    pub model: ModelKind,

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

    /// Passes over the training split.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,

    /// Stop after this many steps in total (per rank), whatever --epochs says.
    #[arg(long)]
    pub max_steps: Option<usize>,

    /// Samples per step on each rank (the global batch is this times the number of ranks).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,

    /// Learning rate (default: 0.001 for adam, 0.01 for sgd, 0.1 for lars).
    #[arg(long)]
    pub lr: Option<f64>,

    /// Optimizer, stepped by every rank on the averaged gradients.
    #[arg(long, value_enum, default_value_t = OptimizerKind::Adam)]
    pub optimizer: OptimizerKind,

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

    /// Micro-batches accumulated per optimizer step; gradients are all-reduced once per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,

    /// Threads preparing batches ahead of the step (0: prepare each batch inline). The queue
    /// holds two batches per worker; data_s is the time a step waited for its batch.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,

    /// Seed of parameter initialisation, shuffling and dropout.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Ask libtorch for deterministic algorithms (slower on GPU; repeatable results).
    #[arg(long)]
    pub deterministic: bool,

    /// Disable dropout layers, so that 1-rank and N-rank runs see bit-comparable updates.
    #[arg(long)]
    pub no_dropout: bool,

    /// Intra-op threads per rank (default: the number of cores the rank is bound to).
    #[arg(long)]
    pub threads: Option<usize>,

    /// How each rank is pinned to cores with hwloc.
    #[arg(long, value_enum, default_value_t = BindPolicy::Auto)]
    pub bind: BindPolicy,

    /// Where to train.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,

    /// Gradient bucket size in MiB for the all-reduce (PyTorch DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,

    /// Gradient all-reduce backend.
    #[arg(long, value_enum, default_value_t = AllreduceChoice::Auto)]
    pub allreduce: AllreduceChoice,

    /// All-reduce each bucket while backward is still running (as PyTorch DDP). Backward runs
    /// in segments cut where a bucket's last gradient is made, and the bucket leaves at once;
    /// the CSV's comm_exposed_s is the part of comm_s not hidden behind backward. Needs more
    /// than one bucket: when all gradients fit one, the run says so (lower --bucket-mb).
    #[arg(long, value_enum, default_value_t = OverlapMode::On)]
    pub overlap: OverlapMode,

    /// Automatic mixed precision for forward and backward (parameters and optimizer stay fp32).
    #[arg(long, value_enum, default_value_t = AmpMode::Off)]
    pub amp: AmpMode,

    /// Data type of gradients on the wire (compression; `bytes` in the CSV counts what was sent).
    #[arg(long, value_enum, default_value_t = GradDtype::Fp32)]
    pub grad_dtype: GradDtype,

    /// GPU telemetry (NVML) sampling period in ms, written to rank-NNNNN.gpu.csv (0: off).
    #[arg(long, default_value_t = 200)]
    pub telemetry_ms: u64,

    /// Node type label for this rank, overriding the one detected from the hardware.
    #[arg(long)]
    pub node_type: Option<String>,

    /// Output folder (default: results/<run-id>/). Must not already hold a run.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Steps at the start flagged as warm-up in the CSV (kept, but excluded by `reduce`).
    #[arg(long, default_value_t = 5)]
    pub warmup_steps: usize,

    /// Iterations of the raw MPI_Allreduce probe run before training (0 to skip).
    #[arg(long, default_value_t = 10)]
    pub probe_iters: usize,

    /// Log progress on rank 0 every N steps (0: only per epoch).
    #[arg(long, default_value_t = 100)]
    pub log_every: usize,

    /// Validate on the first N test samples after each epoch (default: all; 0 skips validation).
    #[arg(long)]
    pub val_samples: Option<usize>,

    /// Write the final parameters to model.safetensors in the run folder (rank 0).
    #[arg(long)]
    pub save_model: bool,
}

impl TrainArgs {
    /// The learning rate asked for, or the optimizer's default.
    pub fn learning_rate(&self) -> f64 {
        self.lr.unwrap_or(match self.optimizer {
            OptimizerKind::Adam => 0.001,
            OptimizerKind::Sgd => 0.01,
            OptimizerKind::Lars => 0.1,
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReduceArgs {
    /// Run folders written by `ddpbench train`, or folders holding such run folders.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,

    /// The run speedups are measured against (default: the 1-rank run of the same
    /// model and data set, else the run with the fewest ranks).
    #[arg(long)]
    pub baseline: Option<PathBuf>,

    /// Where to write summary.csv, scaling.csv, ranks.csv, report.md and plots
    /// (default: the run folder for one run, else the folder given or the runs' common parent).
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Skip the SVG/PNG plots.
    #[arg(long)]
    pub no_plots: bool,
}

#[derive(Args, Debug, Clone)]
pub struct TopoArgs {
    /// Number of local ranks to show a binding for.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,

    /// Binding policy to show.
    #[arg(long, value_enum, default_value_t = BindPolicy::Auto)]
    pub bind: BindPolicy,
}
