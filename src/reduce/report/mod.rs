//! The report: one typed value ([`Report`]) holding every figure and sentence `reduce`
//! finds, built once from the runs ([`build`](mod@build)), and everything written from it:
//! summary.csv, scaling.csv, ranks.csv, projection.csv and report.json ([`files`]),
//! compute_comm_grid.csv ([`compute_comm_grid`]), report.md ([`markdown`], its sections in [`speedup`], [`communication`],
//! [`efficiency`], [`nodes`] and [`projection`]), the plots ([`plots`]) and the terminal
//! tables ([`terminal`]). Nothing written reads a run again: a study takes the same value.

mod build;
mod communication;
pub(crate) mod compute_comm_grid;
mod decision;
mod efficiency;
mod files;
pub(crate) mod html;
mod markdown;
mod nodes;
pub(crate) mod noise;
mod peer;
pub(crate) mod plots;
mod projection;
pub(crate) mod recommendation;
mod sections;
mod speedup;
mod step_phases;
pub(crate) mod target;
mod terminal;
pub(crate) mod times;
pub(crate) mod verdict;

pub(crate) use build::build;
pub(crate) use decision::WorkloadDecision;

/// report.md's first section ("What to run": each workload's decision), for study.md
/// to open with the same lines.
pub(crate) fn decisions_markdown(report: &Report) -> String {
    let mut md = String::new();
    decision::markdown(&mut md, &report.decisions);
    md
}
pub(crate) use files::write_locked;
#[cfg(feature = "train")]
pub(crate) use files::{csv_bytes, not_written};
pub use files::{stage, stage_within, write, write_within};
pub(crate) use projection::{left_out as projection_left_out, section as projection_section, TARGET_EFFICIENCY};
pub(crate) use step_phases::StepPhases;
pub(crate) use terminal::print;

use super::analysis::heatmap::StepHeatmap;
use super::analysis::projection::ProjectionRow;
use super::analysis::{RankSummary, ScalingRow, Stall, TypeSummary};
use crate::link::RouteLinkModel;
use crate::record::ComparisonKey;
use serde::{Serialize, Serializer};
use std::path::{Path, PathBuf};

/// Version of report.json's layout: its top-level keys and what each holds. 2: the
/// runs trained to a target are `targets` (was `target_loss`), each row with
/// `target_loss` or `target_accuracy`.
pub(crate) const REPORT_VERSION: u32 = 2;

/// Everything `reduce` found in a set of run folders.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub report_version: u32,
    /// The schema of the CSV files written from it (`record::SCHEMA_VERSION`).
    pub schema_version: u32,
    /// Every run folder found, usable or not.
    #[serde(serialize_with = "paths")]
    pub folders: Vec<PathBuf>,
    /// The complete runs, in the order read: what every figure is made of.
    pub runs: Vec<RunReport>,
    /// summary.csv: one row per run and node type.
    pub summary: Vec<TypeSummary>,
    /// ranks.csv: one row per rank.
    pub ranks: Vec<RankSummary>,
    /// scaling.csv: one row per point and mode.
    pub scaling: Vec<ScalingRow>,
    /// Per workload (runs compared with each other): what its points say.
    pub workloads: Vec<WorkloadVerdict>,
    /// Per workload, in the same order: what the report says first (verdict in a line,
    /// what to run or why nothing is recommended, the next command).
    pub decisions: Vec<WorkloadDecision>,
    /// The sentences under report.md's tables.
    pub findings: Findings,
    /// Per compared point with a measured gradient noise scale: the predicted samples to
    /// the same loss and the time-to-accuracy speedup.
    pub time_to_accuracy: Vec<noise::TimeToAccuracyRow>,
    /// Compared points whose noise scale predicts nothing (synthetic data, too few
    /// measured steps, no upper bound), with why.
    pub time_to_accuracy_none: Vec<noise::NoTimeToAccuracy>,
    /// Per workload, target and global batch of runs trained with `--target-loss` or
    /// `--target-accuracy`: the measured samples to the target against the predicted ratio.
    pub targets: Vec<target::TargetRow>,
    /// The projection beyond the allocation, when a link model was given or found.
    pub projection: Option<ProjectionReport>,
    /// Runs with holes, left out of every figure, with why.
    pub incomplete: Vec<LeftOut>,
    /// Folders that are no run at all (no readable manifest), with why.
    pub skipped: Vec<LeftOut>,
    /// Folders that are a run already counted (the same folder reached twice, a copy of
    /// a run), left out of every figure.
    pub duplicates: Vec<Duplicate>,
}

/// What one complete run adds up to, beyond its rows in the tables.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    pub run_id: String,
    #[serde(serialize_with = "path")]
    pub dir: PathBuf,
    pub model: String,
    pub dataset: String,
    /// What it is compared by (every complete run has one).
    pub comparison_key: Option<ComparisonKey>,
    pub ranks: usize,
    pub nodes: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    /// Steps per rank after the warm-up.
    pub steps: u64,
    /// Samples per step over the mean step time (the mean over ranks of `step_s`).
    pub samples_per_s: f64,
    /// How it communicated, in a few words: backend, overlap, wire dtype, AMP.
    pub communication: String,
    /// Gradient bytes all-reduced per step; None for a 1-rank run, whose all-reduce
    /// is a local copy that puts nothing on a wire.
    pub bytes_per_step: Option<u64>,
    /// Samples every rank together trained on, warm-up steps included: what two runs'
    /// validation figures are compared at.
    pub samples_trained: u64,
    /// The median of the full epochs, or steps per epoch × the mean step (projected).
    pub epoch_s: f64,
    pub epoch_s_projected: bool,
    /// Seconds per epoch of compute and of the all-reduce (per-step means × steps per epoch).
    pub per_epoch: EpochBreakdown,
    /// Mean seconds per step by phase, the all-reduce split into transfer and waiting.
    pub per_step: StepPhases,
    /// The raw MPI_Allreduce probe with flushed caches (bytes, bus bandwidth), when run.
    pub probe: Option<ProbeReading>,
    /// Its node types, in order of first rank.
    pub node_types: Vec<String>,
    /// What it ran with, as its manifest says: ddpbench, libtorch and the MPI library.
    pub versions: Versions,
    /// Per rank: the 5th, 25th, 50th, 75th and 95th percentile of its step time.
    pub rank_step_quantiles_s: Vec<RankQuantiles>,
    /// Steps over ten times their rank's median, longest first.
    pub stalls: Vec<Stall>,
    /// The last epoch's validation (None without validation).
    pub final_val_loss: Option<f64>,
    pub final_val_accuracy: Option<f64>,
    /// The warnings the run carries (its manifest's `warnings`).
    pub warnings: Vec<crate::record::RunWarning>,
    /// Seconds of validation after an epoch (the median over the epochs that validated).
    pub val_s_per_epoch: Option<f64>,
    /// The whole run's wall time as its manifest says (setup, training, validation, teardown).
    pub wall_s: Option<f64>,
    /// Each rank's own work per step, binned: report.html's heatmap (not in report.json,
    /// whose size must not grow with the ranks).
    #[serde(skip)]
    pub heatmap: StepHeatmap,
    /// B_simple per epoch that measured it (`--noise-scale`; empty otherwise).
    pub noise_scale: Vec<noise::EpochNoiseScale>,
    /// What `--target-loss` asked and whether the run reached it (its manifest's `target`).
    pub target: Option<crate::record::TargetOutcome>,
    /// The study point and repeat it is (its manifest's `study_run`; not in report.json).
    #[serde(skip)]
    pub study_run: Option<crate::record::StudyRun>,
    /// B_simple over windows of the run's measured steps, from its rank files: the
    /// thirds (the drift), then the last 50 steps to the target when it reached one
    /// ([`crate::reduce::analysis::noise_window`]); empty without `--noise-scale`.
    pub noise_windows: Vec<crate::reduce::analysis::noise_window::NoiseWindow>,
    /// Every step that measured the norms, in step order (not in report.json): the
    /// integrated predictions' windows ([`crate::reduce::analysis::samples_to_target`]).
    #[serde(skip)]
    pub noise_steps: Vec<crate::reduce::analysis::noise_window::NoiseStep>,
}

/// Seconds per epoch: compute (forward + backward), all-reduce work, its transfer (the
/// work without the wait), the part of it hidden behind backward, the exposed transfer,
/// the wait for a late rank; and R. Every all-reduce figure is NaN for a 1-rank run
/// (its all-reduce is a local copy); R is NaN too where the all-reduce thread shared
/// backward's cores.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EpochBreakdown {
    pub compute_s: f64,
    /// All of the all-reduce's time, the wait for a late rank included.
    pub comm_s: f64,
    /// The all-reduce's time after the last rank entered it: `comm_s` without the wait.
    pub comm_transfer_s: f64,
    /// The transfer that ran before backward ended (comm_hidden_s, as the rows say it).
    pub comm_hidden_s: f64,
    /// The exposed all-reduce without the wait: the transfer after backward ended.
    pub comm_exposed_transfer_s: f64,
    pub comm_wait_s: f64,
    /// (forward + backward) / transfer, from the means per step.
    pub compute_comm_ratio: f64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProbeReading {
    pub bytes: u64,
    pub busbw_bytes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RankQuantiles {
    pub rank: usize,
    pub node_type: String,
    /// p5, p25, p50, p75, p95.
    pub step_s: [f64; 5],
}

/// The software a run ran with (its manifest's `ddpbench_version`, `libtorch_version`
/// and `mpi_library`).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Versions {
    pub ddpbench: String,
    pub libtorch: String,
    pub mpi: String,
}

/// The runs compared with each other (same model, data set and comparison), and one
/// paragraph on their points.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadVerdict {
    pub model: String,
    pub dataset: String,
    pub comparison: String,
    pub verdict: String,
}

/// The sentences report.md says under its tables.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    /// Under compute vs communication: whether R limits scaling.
    pub compute_vs_comm: String,
    /// Under the bandwidth table: training's bus bandwidth against the probe's.
    pub bandwidth: String,
    /// Per compared point that lost throughput: the largest cause.
    pub waterfall: Vec<String>,
    /// Per run on several node types: the type that sets its pace.
    pub node_types: Vec<String>,
}

/// The projection beyond the allocation (projection.csv and report.md's section).
#[derive(Debug, Clone, Serialize)]
pub struct ProjectionReport {
    /// The sweep folder whose model projected.
    #[serde(serialize_with = "path")]
    pub sweep: PathBuf,
    /// Why its model was refused (then nothing was projected).
    pub left_out: Option<String>,
    /// The fitted link models, per route (backend and memory).
    pub models: Vec<RouteLinkModel>,
    pub rows: Vec<ProjectionRow>,
    /// Workloads that could not be projected, and why; and warnings on those that were
    /// (starting `warning: `), e.g. a reference of one run.
    pub notes: Vec<String>,
    /// Per projected workload and mode: what the projection says.
    pub workloads: Vec<ProjectedWorkload>,
    /// Per level, whether it was measured by a sweep or given by specification (nominal).
    pub levels: Vec<String>,
    /// Per workload (weak scaling): the shape to run, and each shape's epoch and cost.
    pub recommendations: Vec<crate::reduce::analysis::recommend::Recommendation>,
}

/// Two projections of the same runs through different links, as one (rows, notes,
/// models, workloads, levels and recommendations of both, in order).
pub(crate) fn merge_projections(mut a: ProjectionReport, b: ProjectionReport) -> ProjectionReport {
    a.rows.extend(b.rows);
    a.notes.extend(b.notes);
    a.models.extend(b.models);
    a.workloads.extend(b.workloads);
    a.levels.extend(b.levels);
    a.recommendations.extend(b.recommendations);
    a
}

/// One workload's projection (rows with its `from_runs` and `scaling`), in sentences.
#[derive(Debug, Clone, Serialize)]
pub struct ProjectedWorkload {
    /// Its name in report.md (the run is added where two workloads share a name).
    pub name: String,
    pub from_runs: String,
    pub scaling: String,
    /// How the projection compares with the measured shapes.
    pub checked: String,
    /// Weak scaling, per full-node shape of its table: the efficiency, the per-rank batch
    /// that reaches the target efficiency (`--target-efficiency`, the recommendation's
    /// target), and the what-ifs (2-byte gradients, one bucket), all from the rows.
    pub answers: Vec<String>,
    /// Strong scaling with per-rank batches outside those measured: how they were guessed.
    pub strong_note: Option<String>,
}

/// A folder left out, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftOut {
    #[serde(serialize_with = "path")]
    pub dir: PathBuf,
    pub problems: Vec<String>,
}

/// A folder left out because the run it holds is counted already, from another folder.
#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    #[serde(serialize_with = "path")]
    pub dir: PathBuf,
    /// The folder counted instead.
    #[serde(serialize_with = "path")]
    pub kept: PathBuf,
    /// What makes it the same: "the same folder", "the same run (...)", or another run
    /// under the same id.
    pub why: String,
}

impl Duplicate {
    /// One line: the folder, why, and the folder kept.
    pub(crate) fn sentence(&self) -> String {
        format!(
            "counted once: {} is {} as {} (kept)",
            self.dir.display(),
            self.why,
            self.kept.display()
        )
    }
}

/// A path as text (a name that is not UTF-8 with its odd bytes replaced).
fn path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

fn paths<S: Serializer>(ps: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ps.iter().map(|p| p.to_string_lossy()))
}

pub(crate) fn gbs(bytes_per_s: f64) -> String {
    if bytes_per_s.is_finite() {
        format!("{:.2}", bytes_per_s / 1e9)
    } else {
        "–".into()
    }
}

pub(crate) fn ms(s: f64) -> String {
    if s.is_finite() {
        format!("{:.2}", s * 1e3)
    } else {
        "–".into()
    }
}

pub(crate) fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0} %", x * 100.0)
    } else {
        "–".into()
    }
}
