//! `ddpbench study`'s arguments: the flags, the study they make with the study file
//! ([`spec_of`]), and which of them every rank must be given alike ([`launch_flags`]).

use super::spec::{self, NodeFill, Scaling, StudySpec};
use crate::job;
use crate::train;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// `ddpbench study` options. Every key of a study file can also be given here: the
/// grid keys by name, any `train` option after `--`.
#[derive(Args, Debug, Clone)]
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<name>` is a placeholder
pub struct StudyArgs {
    /// Study file (TOML): study keys and `train` options; a list makes a grid axis.
    /// Without one: mnist-cnn on Fashion-MNIST, batch 64 per rank, weak scaling over the
    /// default ladder.
    pub file: Option<PathBuf>,

    /// Study name (default: the file's name); the folder is results/study-<name>.
    #[arg(long)]
    pub name: Option<String>,

    /// Models, comma-separated (a grid axis).
    #[arg(long, value_delimiter = ',')]
    pub models: Option<Vec<String>>,

    /// Data sets, comma-separated (a grid axis).
    #[arg(long, value_delimiter = ',')]
    pub datasets: Option<Vec<String>>,

    /// Per-rank batch sizes, comma-separated (for strong scaling: the 1-rank batch, kept
    /// as the global batch).
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Option<Vec<usize>>,

    /// Weak (per-rank batch fixed), strong (global batch fixed) or both.
    #[arg(long, value_enum)]
    pub scaling: Option<Scaling>,

    /// Rank counts, comma-separated (default: 1, doubling within a node until it is
    /// full, then doubling the number of full nodes).
    #[arg(long, value_delimiter = ',')]
    pub ranks: Option<Vec<usize>>,

    /// How a point's ranks fill the nodes: pack, as few nodes as they can; spread, one
    /// per node (a point of more ranks than the allocation has nodes is refused)
    /// (`--placement` before).
    #[arg(long, value_enum, alias = "placement")]
    pub node_fill: Option<NodeFill>,

    /// Runs of each point, interleaved (all points, then all points again, ...)
    /// (`--repeat` before).
    #[arg(long, alias = "repeat")]
    pub repeats: Option<usize>,

    /// Study folder (default: results/study-<name>). Run again to resume, once the job
    /// before has ended: one job per study folder (its lock is .ddpbench.lock).
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Remove the study folder's lock left by a job that was killed on another host (a
    /// lock of this host is cleared by itself once its process is gone). Check first that
    /// the job named in the refusal has ended.
    #[arg(long)]
    pub break_lock: bool,

    /// Print the points, their ranks and nodes, time each workload for a few steps on
    /// one rank, print an estimate of the study's time, and stop.
    #[arg(long)]
    pub dry_run: bool,

    /// With --dry-run: plan for an allocation of this many nodes (with --ranks-per-node)
    /// instead of the job's own, so that a laptop or one node plans the cluster a study
    /// is meant for (`mpirun -n 1 ddpbench study FILE --dry-run --nodes 16
    /// --ranks-per-node 4`). The points are laid out on hosts named node000, node001, …;
    /// each workload is still timed on this machine, one rank.
    #[arg(long, requires_all = ["dry_run", "ranks_per_node"], value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub nodes: Option<u64>,

    /// With --nodes: ranks on each planned node (e.g. its GPUs).
    #[arg(long, requires = "nodes", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub ranks_per_node: Option<u64>,

    /// Seconds the dry run may spend timing workloads (each trains a few steps on rank
    /// 0): the workloads not reached by then are listed as not timed, and the estimate
    /// says how many points it leaves out.
    #[arg(long, default_value_t = DRY_RUN_BUDGET_S, value_name = "SECONDS")]
    pub budget_s: f64,

    /// Run again the points that failed before (by default a resumed study skips them).
    #[arg(long)]
    pub retry_failed: bool,

    /// Before the points, sweep the all-reduce on the whole allocation (`ddpbench
    /// allreduce`, 8 B to 64 MiB, MPI and, on GPUs, MPI from device memory and NCCL) into <study>/allreduce
    /// (kept when a resumed study already has it), so that the report projects every
    /// workload beyond the allocation and checks the projection against the points.
    #[arg(long)]
    pub allreduce_sweep: bool,

    /// `train` options for every point, after `--` (e.g. `-- --max-steps 50 --overlap off`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub train: Vec<String>,
}

/// The dry run's default time for timing workloads.
pub(super) const DRY_RUN_BUDGET_S: f64 = 600.0;

/// The `study` arguments that may differ between the ranks of one job, and why: every
/// other one is compared across ranks at start-up ([`launch_flags`]).
pub(super) const RANK_LOCAL: &[(&str, &str)] = &[(
    "FILE",
    "where this rank reads the study file: what it says is compared, as the resolved study",
)];

/// The `study` arguments every rank of a job must be given alike (`--`: the `train`
/// options, each compared but those `train` lets differ per rank): what the completeness
/// test checks [`launch_flags`] against.
#[cfg(test)]
pub(super) const SAME_ON_EVERY_RANK: &[&str] = &[
    "--name",
    "--models",
    "--datasets",
    "--batch-sizes",
    "--scaling",
    "--ranks",
    "--node-fill",
    "--repeats",
    "--out",
    "--break-lock",
    "--dry-run",
    "--nodes",
    "--ranks-per-node",
    "--budget-s",
    "--retry-failed",
    "--allreduce-sweep",
    "--",
];

/// The command and the resolved study (file and command line) compared across ranks.
pub(super) fn launch_flags(spec: &StudySpec, args: &StudyArgs) -> job::same_flags::LaunchFlags {
    use serde_json::json;
    let mut flags = job::same_flags::LaunchFlags::new("study", RANK_LOCAL)
        .with("--name", json!(spec.name))
        .with("--models", json!(spec.models))
        .with("--datasets", json!(spec.datasets))
        .with("--batch-sizes", json!(spec.batch_sizes))
        .with("--scaling", json!(spec.scaling))
        .with("--ranks", json!(spec.ranks))
        .with("--node-fill", json!(spec.node_fill))
        .with("--repeats", json!(spec.repeats))
        .with("study key threads_per_rank", json!(spec.threads_per_rank))
        .with("study key data_dirs", json!(spec.data_dirs))
        .with("study key peer", json!(spec.peer))
        .with("study key link", json!(spec.report.link.as_ref().map(|l| &l.name)))
        .with("study key link_intra", json!(spec.report.link_intra.as_ref().map(|l| &l.name)))
        .with("study key project_shape", json!(spec.report.project_shape))
        .with("study key target_efficiency", json!(spec.report.target_efficiency))
        .with("study key price_per_gpu_hour", json!(spec.report.price_per_gpu_hour))
        .with("--out", json!(args.out))
        .with("--break-lock", json!(args.break_lock))
        .with("--dry-run", json!(args.dry_run))
        .with("--nodes", json!(args.nodes))
        .with("--ranks-per-node", json!(args.ranks_per_node))
        .with("--budget-s", json!(args.budget_s))
        .with("--retry-failed", json!(args.retry_failed))
        .with("--allreduce-sweep", json!(args.allreduce_sweep));
    for (name, values) in &spec.train {
        let flag = format!("--{name}");
        if !train::config::RANK_LOCAL.iter().any(|(f, _)| *f == flag) {
            flags = flags.with(&format!("-- {flag}"), json!(values));
        }
    }
    flags
}

/// The study as written: the file, then the command line.
pub(super) fn spec_of(args: &StudyArgs) -> Result<StudySpec> {
    let (text, default_name) = match &args.file {
        Some(f) => (
            std::fs::read_to_string(f).with_context(|| format!("cannot read the study file {}", f.display()))?,
            spec::name_from_file(&f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()),
        ),
        None => (String::new(), "default".to_string()),
    };
    let mut s = StudySpec::from_toml(&text, &default_name).with_context(|| match &args.file {
        Some(f) => format!("in {}", f.display()),
        None => "the default study".into(),
    })?;
    if let Some(v) = &args.name {
        spec::check_name(v).context("--name")?;
        s.name = v.clone();
    }
    if let Some(v) = &args.models {
        s.models = v.clone();
    }
    if let Some(v) = &args.datasets {
        s.datasets = v.clone();
    }
    if let Some(v) = &args.batch_sizes {
        s.batch_sizes = v.clone();
    }
    if let Some(v) = args.scaling {
        s.scaling = v;
    }
    if let Some(v) = &args.ranks {
        s.ranks = Some(v.clone());
    }
    if let Some(v) = args.node_fill {
        s.node_fill = v;
    }
    if let Some(v) = args.repeats {
        anyhow::ensure!(v >= 1, "--repeats must be at least 1");
        s.repeats = v;
    }
    s.apply_flags(&args.train)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `study` argument is compared across ranks (or says why it may differ), the
    /// `train` options after `--` each under its name but `train`'s own rank-local ones.
    #[test]
    fn every_study_argument_is_compared_across_ranks_or_says_why_not() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        #[command(name = "study")]
        struct Line {
            #[command(flatten)]
            args: StudyArgs,
        }
        let args = Line::try_parse_from(["study", "--", "--max-steps", "7", "--node-type", "x"])
            .unwrap()
            .args;
        let flags = launch_flags(&spec_of(&args).unwrap(), &args);
        crate::job::same_flags::assert_every_flag_decided(&Line::command(), RANK_LOCAL, SAME_ON_EVERY_RANK, &flags);
        let compared: Vec<&str> = flags.flags().collect();
        assert!(compared.contains(&"-- --max-steps"), "{compared:?}");
        assert!(!compared.iter().any(|f| f.contains("--node-type")), "{compared:?}");
    }
}
