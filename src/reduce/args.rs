//! `ddpbench reduce`'s command line, and the request it makes of [`super::run`].

use super::analysis::recommend::Shape;
use super::report::TARGET_EFFICIENCY;
use crate::link::spec::LinkSpec;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
#[allow(rustdoc::invalid_html_tags)] // its doc comments are also `--help`, where `<name>` is a placeholder
pub struct ReduceArgs {
    /// Run folders written by `ddpbench train`, or folders holding such run folders.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,

    /// The run speedups are measured against (default: the 1-rank run of the same
    /// model and data set, else the run with the fewest ranks).
    #[arg(long)]
    pub baseline: Option<PathBuf>,

    /// Where to write summary.csv, scaling.csv, ranks.csv, times.csv, compute_comm_grid.csv,
    /// report.md, report.json, report.html, projection.csv (when projected) and the plots
    /// (default: a new folder report-<UTC time> beside the folders given: next to a folder
    /// of runs, not inside it; next to one run. --out DIR names the folder instead).
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

    /// The link between nodes, by specification instead of an inter-node sweep: a preset
    /// (eth-10g, eth-25g, eth-100g, roce-100g, ib-hdr, ib-ndr, pcie3-x16, pcie4-x16,
    /// pcie5-x16, nvlink-v100, nvlink-a100, nvlink-h100; figures in results/README.md) or
    /// BANDWIDTH,LATENCY (`100Gbit/s,5us`, `25GB/s,2us`), either optionally ending in
    /// `,efficiency=F` (the fraction of line rate an all-reduce reaches on it; a preset
    /// carries a published or assumed one, results/README.md says which). The projection
    /// gives the expected step with a band whose optimistic end is the line rate. Repeat
    /// it to set fabrics side by side (`--link roce-100g --link ib-ndr`): one projection
    /// and one recommendation per link.
    #[arg(long, value_name = "SPEC", value_parser = LinkSpec::parse, allow_hyphen_values = true)]
    pub link: Vec<LinkSpec>,

    /// The link inside a node, by specification (same forms as --link); default: the
    /// intra-node level `ddpbench allreduce` measured on the node you have.
    #[arg(long, value_name = "SPEC", value_parser = LinkSpec::parse, allow_hyphen_values = true)]
    pub link_intra: Option<LinkSpec>,

    /// Project to NODESxRANKS_PER_NODE (`16x4`): the ladder 1x1, 1x2, … 1x4, 2x4, 4x4, …
    /// 16x4 (node counts doubling), instead of --project-to's rank counts. Repeat it for
    /// more than one ladder.
    #[arg(long, value_name = "NODESxPER_NODE", value_parser = Shape::parse, allow_hyphen_values = true)]
    pub project_shape: Vec<Shape>,

    /// The parallel efficiency a shape must keep to be recommended (above 0, at most 1);
    /// the same target the projection's "R needed" line aims at.
    #[arg(long, default_value_t = TARGET_EFFICIENCY, value_parser = parse_target_efficiency, allow_hyphen_values = true)]
    pub target_efficiency: f64,

    /// What one GPU (one rank) costs per hour, in any currency: the recommendation then
    /// gives each shape's cost per epoch.
    #[arg(long, value_name = "PRICE", value_parser = parse_price, allow_hyphen_values = true)]
    pub price_per_gpu_hour: Option<f64>,

    /// The longest an epoch may take (`90s`, `15min`, `2h`; a bare number is seconds):
    /// the recommendation names the cheapest shape (fewest GPU-hours per epoch) whose
    /// expected epoch meets it, and says whether its band's slow end does too.
    #[arg(long, value_name = "DURATION", value_parser = parse_epoch_time, allow_hyphen_values = true)]
    pub epoch_time_target: Option<f64>,

    /// The most GPU-hours one epoch may cost: the recommendation names the fastest shape
    /// whose expected GPU-hours per epoch fit it.
    #[arg(long, value_name = "GPU_HOURS", value_parser = parse_gpu_hours, allow_hyphen_values = true)]
    pub gpu_hour_budget: Option<f64>,

    /// Clear the output folder's lock (`.ddpbench.lock`) when the job that took it cannot
    /// be checked from here (another host) and you know it has ended. One reduce writes a
    /// folder at a time: a second one is refused while the first holds the lock.
    #[arg(long)]
    pub break_lock: bool,
}

/// `--target-efficiency` (and a study's `target_efficiency`): a number above 0 and at most 1.
pub fn parse_target_efficiency(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("'{s}' is no efficiency: give a number above 0 and at most 1 (0.8 is 80 %)")),
    }
}

/// `--price-per-gpu-hour` (and a study's `price_per_gpu_hour`): a finite number from 0.
pub fn parse_price(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is no price: give a number from 0 (what one GPU costs per hour, e.g. 2.5)"
        )),
    }
}

/// `--epoch-time-target`: a positive duration, a number with `s`, `min` or `h` (a bare
/// number is seconds), in seconds.
pub(crate) fn parse_epoch_time(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, per) = if let Some(n) = t.strip_suffix("min") {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && (v * per).is_finite() => Ok(v * per),
        _ => Err(format!(
            "'{s}' is no epoch time: give a duration above 0, e.g. 90s, 15min or 2h (a bare number is seconds)"
        )),
    }
}

/// `--gpu-hour-budget`: a finite number above 0.
pub(crate) fn parse_gpu_hours(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "'{s}' is no GPU-hour budget: give the most GPU-hours one epoch may cost, a number above 0 (e.g. 4.5)"
        )),
    }
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
    /// The inter-node levels by specification (nominal), one projection each, and the
    /// intra-node one, where given.
    pub link: Vec<LinkSpec>,
    pub link_intra: Option<LinkSpec>,
    /// Ladders of nodes × ranks per node to project to (empty: `project_to`'s ranks).
    pub project_shape: Vec<Shape>,
    /// The efficiency a recommended shape keeps.
    pub target_efficiency: f64,
    /// What one GPU costs per hour, for the cost per epoch.
    pub price_per_gpu_hour: Option<f64>,
    /// The longest an epoch may take (seconds), and the most GPU-hours it may cost.
    pub epoch_time_target_s: Option<f64>,
    pub gpu_hour_budget: Option<f64>,
}

impl Default for ReduceRequest {
    /// Nothing named, projecting to 1024 ranks, the default target efficiency.
    fn default() -> ReduceRequest {
        ReduceRequest {
            runs: Vec::new(),
            baseline: None,
            interconnect: None,
            project_to: 1024,
            link: Vec::new(),
            link_intra: None,
            project_shape: Vec::new(),
            target_efficiency: TARGET_EFFICIENCY,
            price_per_gpu_hour: None,
            epoch_time_target_s: None,
            gpu_hour_budget: None,
        }
    }
}

impl ReduceArgs {
    pub(crate) fn request(&self) -> ReduceRequest {
        ReduceRequest {
            runs: self.runs.clone(),
            baseline: self.baseline.clone(),
            interconnect: self.interconnect.clone(),
            project_to: self.project_to,
            link: self.link.clone(),
            link_intra: self.link_intra.clone(),
            project_shape: self.project_shape.clone(),
            target_efficiency: self.target_efficiency,
            price_per_gpu_hour: self.price_per_gpu_hour,
            epoch_time_target_s: self.epoch_time_target,
            gpu_hour_budget: self.gpu_hour_budget,
        }
    }

    /// Where the files go when no `--out` is given: the folder beside the folders given
    /// that a new `report-<time>` folder goes into ([`default_out_parent`]).
    pub(crate) fn default_out_parent(&self) -> PathBuf {
        default_out_parent(&self.runs)
    }
}

/// The folder a new report folder goes into when no `--out` is given, beside the
/// folders given: the inputs' common ancestor (made absolute), or its parent where that
/// ancestor is itself an input or a run, or the folder of runs the inputs all are. A
/// folder of runs gets its report beside it; one run, beside the run.
pub(crate) fn default_out_parent(inputs: &[PathBuf]) -> PathBuf {
    let absolute: Vec<PathBuf> = inputs
        .iter()
        .map(|p| {
            p.canonicalize()
                .unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        })
        .collect();
    let Some(first) = absolute.first() else {
        return PathBuf::from(".");
    };
    let mut common = first.clone();
    while !absolute.iter().all(|r| r.starts_with(&common)) {
        if !common.pop() {
            break;
        }
    }
    // A training run: its manifest and rank 0's rows (an all-reduce sweep has a manifest too).
    let is_run = |d: &Path| d.join("manifest.json").is_file() && d.join("rank-00000.csv").is_file();
    let runs_of_it = absolute.len() > 1 && absolute.iter().all(|a| a.parent() == Some(common.as_path()) && is_run(a));
    if absolute.contains(&common) || is_run(&common) || runs_of_it {
        common.pop();
    }
    common
}
