//! The command line's root: one subcommand each. Each command's arguments live with
//! the command (`train` parses straight into [`TrainConfig`], the run's configuration);
//! no library module imports anything from here. A binary built without the `train`
//! feature has the analysis commands alone (`reduce`, `compare`, `trace`, `diagnose`).

#[cfg(feature = "train")]
use crate::train::TrainConfig;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ddpbench",
    version,
    about = "How well does data-parallel training scale on this machine, and where does the time go?"
)]
#[cfg_attr(
    feature = "train",
    command(long_about = "ddpbench trains a real network data-parallel, one MPI rank per CPU socket or GPU, \
times every phase of every step on every rank, writes one CSV per rank, and reduces those \
files into throughput and phase breakdowns per node type.\n\n\
Typical use:\n  \
mpirun -n 2 ddpbench train --epochs 1          # two ranks on CPU, Fashion-MNIST\n  \
srun -N 2 --ntasks-per-node 4 --gpus-per-task 1 -c 8 ddpbench train\n                                               # one rank per GPU, 4 GPUs on each of two nodes\n  \
ddpbench reduce results/<run-id>               # summary table and summary.csv\n  \
ddpbench compare A B                           # two reports side by side (two clusters)\n  \
ddpbench topo --ranks 4                        # the binding 4 local ranks would get")
)]
#[cfg_attr(
    not(feature = "train"),
    command(
        long_about = "ddpbench reduces the run folders a data-parallel training run wrote (one CSV per rank) \
into throughput and phase breakdowns per node type. This binary was built without the trainer \
(`--no-default-features --features report`): it reads and reports, it does not train.\n\n\
Typical use:\n  \
ddpbench reduce results/<run-id>               # summary table and summary.csv\n  \
ddpbench compare A B                           # two reports side by side (two clusters)\n  \
ddpbench trace results/<run-id>                # a traced run's timeline.json\n  \
ddpbench diagnose results/<run-id>             # which rank hung a run"
    )
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
    #[cfg(feature = "train")]
    #[command(allow_negative_numbers = true)]
    Train(TrainConfig),
    /// Run a whole scaling study in one job: a rank ladder × batch sizes × models, repeated,
    /// each point on its own ranks, one report (launch with the most ranks any point uses).
    #[cfg(feature = "train")]
    #[command(allow_negative_numbers = true)]
    Study(crate::study::StudyArgs),
    /// Sweep all-reduce sizes on each backend and level (like nccl-tests), check every sum,
    /// and fit the latency–bandwidth model `reduce` projects with (launch with mpirun or srun).
    #[cfg(feature = "train")]
    #[command(allow_negative_numbers = true)]
    Allreduce(crate::allreduce::AllreduceArgs),
    /// Measure the input pipeline alone: image files read cold and warm, then decoded and
    /// augmented by one worker and by N (no MPI needed): size --cpus-per-task and --workers.
    #[cfg(feature = "train")]
    Loader(crate::data::pipeline::LoaderArgs),
    /// Summarise runs per node type, and scaling across runs (speedup, efficiency, waterfall, report, plots).
    Reduce(crate::reduce::ReduceArgs),
    /// Compare two reports side by side (e.g. two clusters): per workload and shape, step,
    /// phases, throughput, speedup and bus bandwidth, with ratios B / A and their intervals.
    #[command(long_about = crate::compare::LONG_ABOUT)]
    Compare(crate::compare::CompareArgs),
    /// Merge a traced run's per-rank traces (`train --trace`) into RUN_DIR/timeline.json on
    /// one clock, for Perfetto UI or chrome://tracing.
    Trace(crate::reduce::timeline::TraceArgs),
    /// Print this machine's topology and the binding N local ranks would get.
    #[cfg(feature = "train")]
    Topo(crate::topology::TopoArgs),
    /// Say which rank hung a run and in which collective, from the flight records the watchdog left.
    Diagnose(crate::diagnose::DiagnoseArgs),
    /// List the models with their parameter counts and gradient bytes (--file: a TorchScript file's).
    #[cfg(feature = "train")]
    Models(crate::model::ModelsArgs),
    /// Build bigMNIST: MNIST augmented and replicated into checksummed shards (resumable).
    #[cfg(feature = "train")]
    GenBigmnist(crate::data::bigmnist::GenBigMnistArgs),
}
