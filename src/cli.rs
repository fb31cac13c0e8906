//! The command line: one subcommand each. `train` parses straight into
//! [`TrainConfig`], the run's configuration.

use crate::topology::BindPolicy;
use crate::train::TrainConfig;
use clap::{Args, Parser, Subcommand};
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

// Parsed once per process: the size of the largest variant (train's configuration) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train data-parallel (launch with mpirun or srun, one process per rank).
    #[command(allow_negative_numbers = true)]
    Train(TrainConfig),
    /// Run a whole scaling study in one job: a rank ladder × batch sizes × models, repeated,
    /// each point on its own ranks, one report (launch with the most ranks any point uses).
    #[command(allow_negative_numbers = true)]
    Study(crate::study::StudyArgs),
    /// Sweep all-reduce sizes on each backend and level (like nccl-tests), check every sum,
    /// and fit the latency–bandwidth model `reduce` projects with (launch with mpirun or srun).
    #[command(allow_negative_numbers = true)]
    Allreduce(crate::allreduce::AllreduceArgs),
    /// Measure the input pipeline alone: image files read cold and warm, then decoded and
    /// augmented by one worker and by N (no MPI needed): size --cpus-per-task and --workers.
    Loader(crate::data::pipeline::LoaderArgs),
    /// Summarise runs per node type, and scaling across runs (speedup, efficiency, waterfall, report, plots).
    Reduce(ReduceArgs),
    /// Print this machine's topology and the binding N local ranks would get.
    Topo(TopoArgs),
    /// Say which rank hung a run and in which collective, from the flight records the watchdog left.
    Diagnose(DiagnoseArgs),
    /// List the models with their parameter counts and gradient bytes (--file: a TorchScript file's).
    Models(ModelsArgs),
    /// Build bigMNIST: MNIST augmented and replicated into checksummed shards (resumable).
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

#[derive(Args, Debug, Clone)]
pub struct DiagnoseArgs {
    /// Run folder holding rank-NNNNN.flight.json files.
    pub run: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct ModelsArgs {
    /// A TorchScript file saved from PyTorch: print its parameter count, gradient bytes,
    /// buffer values and SHA-256 instead of the built-in networks.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Sequence length assumed for transformer models.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Vocabulary size assumed for transformer models.
    #[arg(long, default_value_t = 20_000)]
    pub vocab_size: usize,
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

    /// A folder written by `ddpbench allreduce` (or its allreduce_model.json): project each
    /// workload to more ranks with its fitted interconnect model (projection.csv). Found
    /// without this flag when such a folder is among the folders given.
    #[arg(long)]
    pub interconnect: Option<PathBuf>,

    /// Project up to this many ranks (powers of two from 1).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub project_to: u64,
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
