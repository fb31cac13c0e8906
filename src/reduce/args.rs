//! `ddpbench reduce`'s command line, and the request it makes of [`super::run`].

use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct ReduceArgs {
    /// Run folders written by `ddpbench train`, or folders holding such run folders.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,

    /// The run speedups are measured against (default: the 1-rank run of the same
    /// model and data set, else the run with the fewest ranks).
    #[arg(long)]
    pub baseline: Option<PathBuf>,

    /// Where to write summary.csv, scaling.csv, ranks.csv, report.md, report.json and plots
    /// (default: the run folder for one run, else the folder given or the runs' common parent).
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Skip the SVG/PNG plots.
    #[arg(long)]
    pub no_plots: bool,

    /// A folder written by `ddpbench allreduce` (or its link_model.json): project each
    /// workload to more ranks with its link model, the α–β fits (projection.csv). Found
    /// without this flag when such a folder is among the folders given.
    #[arg(long)]
    pub interconnect: Option<PathBuf>,

    /// Project up to this many ranks (powers of two from 1).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub project_to: u64,
}

/// What to reduce: the folders, the reference, the link model (where the files
/// go, and whether plots are drawn, is the writer's concern).
#[derive(Debug, Clone)]
pub struct ReduceRequest {
    /// Run folders, or folders holding run folders (and sweep folders).
    pub runs: Vec<PathBuf>,
    /// The run every point of its workload is compared with (`--baseline`).
    pub baseline: Option<PathBuf>,
    /// The sweep whose link model projects each workload; found among `runs` when None.
    pub interconnect: Option<PathBuf>,
    /// Project up to this many ranks.
    pub project_to: u64,
}

impl ReduceArgs {
    pub fn request(&self) -> ReduceRequest {
        ReduceRequest {
            runs: self.runs.clone(),
            baseline: self.baseline.clone(),
            interconnect: self.interconnect.clone(),
            project_to: self.project_to,
        }
    }

    /// Where the files go: `--out`, else the one folder given, else the runs' common parent.
    pub fn out(&self, run_dirs: &[PathBuf]) -> PathBuf {
        if let Some(o) = &self.out {
            return o.clone();
        }
        if self.runs.len() == 1 {
            return self.runs[0].clone();
        }
        let mut common: PathBuf = run_dirs.first().and_then(|r| r.parent()).map(Path::to_path_buf).unwrap_or_default();
        while !run_dirs.iter().all(|r| r.starts_with(&common)) {
            if !common.pop() {
                break;
            }
        }
        if common.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            common
        }
    }
}
