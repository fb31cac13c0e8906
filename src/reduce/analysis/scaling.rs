//! `scaling.csv`: each point of a workload (its runs with the same configuration, rank
//! count and batch: repeats) against the 1-rank point it is compared with, weak (same
//! per-rank batch) and strong (same global batch) wherever that reference exists.
//!
//! Runs are comparable only when everything that changes a step's work matches
//! ([`ComparisonKey`], written by `train`): a reference is never filled with a substitute. A point on
//! several node types is compared with one 1-rank reference per node type: its ideal
//! throughput is the sum over its ranks of their type's reference throughput.
//!
//! A point's throughput is the geometric mean of its runs' throughputs, the estimator the
//! speedup's interval is built around ([`interval`]).

use super::interval::{self, Direction, Spread, Term};
use super::{advice, gating_type, RunStats};
use crate::record::{Backend, ComparisonKey, Phase, PhaseRole};
use crate::reduce::metrics;
use crate::stats::{self, Rng};
use serde::Serialize;
use std::collections::BTreeMap;

/// Runs with the same key, node types, rank count and batch: repeats of one point.
#[derive(Debug, Clone)]
pub(crate) struct ScalingPoint<'a> {
    pub key: ComparisonKey,
    /// Ranks per node type, by type.
    pub types: BTreeMap<String, usize>,
    pub ranks: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    pub runs: Vec<&'a RunStats>,
}

impl ScalingPoint<'_> {
    /// The geometric mean over the repeats of their throughputs.
    pub(crate) fn throughput(&self) -> f64 {
        stats::geometric_mean(&self.runs.iter().map(|r| samples_per_s(r)).collect::<Vec<_>>())
    }

    /// The log of each run's throughput.
    pub(crate) fn log_throughputs(&self) -> Vec<f64> {
        self.runs.iter().map(|r| samples_per_s(r).ln()).collect()
    }

    fn run_ids(&self) -> Vec<String> {
        self.runs.iter().map(|r| r.manifest.run_id.clone()).collect()
    }

    fn single_type(&self) -> Option<&str> {
        (self.types.len() == 1)
            .then(|| self.types.keys().next().map(String::as_str))
            .flatten()
    }
}

/// The points of `runs`: runs grouped by key, node types, ranks and batch, in key order.
/// Runs without an all-reduce (`--allreduce none`) are no point of a scaling study.
pub(crate) fn points<'a>(runs: &[&'a RunStats]) -> Vec<ScalingPoint<'a>> {
    let mut groups: BTreeMap<(ComparisonKey, Vec<(String, usize)>, usize, usize, usize), Vec<&'a RunStats>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.manifest.comm_backend != Backend::None) {
        let m = &r.manifest;
        // A run without a key has problems, and is no complete run.
        let Some(key) = r.key.clone() else { continue };
        let mut types: BTreeMap<String, usize> = BTreeMap::new();
        for t in &r.types {
            *types.entry(t.node_type.clone()).or_default() += t.ranks.len();
        }
        let k = (
            key,
            types.into_iter().collect(),
            m.world_size,
            m.batch_size_per_rank,
            m.global_batch_size,
        );
        groups.entry(k).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|((key, types, ranks, batch_per_rank, global_batch), mut runs)| {
            runs.sort_by(|a, b| a.manifest.start_utc.cmp(&b.manifest.start_utc));
            ScalingPoint {
                key,
                types: types.into_iter().collect(),
                ranks,
                batch_per_rank,
                global_batch,
                runs,
            }
        })
        .collect()
}

/// Mean seconds per step of each cause, averaged over ranks: the step splits exactly
/// into data (waiting for and copying the batch) + (transfer + wait) + compute
/// (forward, backward, optimizer, other).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepBreakdown {
    pub data_s: f64,
    pub transfer_s: f64,
    pub wait_s: f64,
    pub compute_s: f64,
}

impl StepBreakdown {
    pub fn of(run: &RunStats) -> StepBreakdown {
        let n = run.ranks.iter().map(|r| r.steps).sum::<u64>().max(1) as f64;
        let wait = run.ranks.iter().map(|r| r.wait_sum).sum::<f64>() / n;
        let of = |role: PhaseRole| -> f64 { Phase::ALL.iter().filter(|p| p.role() == role).map(|p| run.phase_mean(*p)).sum() };
        let comm = of(PhaseRole::Communication);
        StepBreakdown {
            data_s: of(PhaseRole::Data),
            transfer_s: (comm - wait).max(0.0),
            wait_s: wait.min(comm),
            compute_s: of(PhaseRole::Compute),
        }
    }

    /// The breakdown of several runs (repeats): each cause's geometric mean over them,
    /// the estimator of the point's throughput (0 where a run's cause is 0).
    fn mean(runs: &[&RunStats]) -> StepBreakdown {
        let all: Vec<StepBreakdown> = runs.iter().map(|r| StepBreakdown::of(r)).collect();
        let avg = |f: fn(&StepBreakdown) -> f64| {
            let v: Vec<f64> = all.iter().map(f).collect();
            if v.is_empty() || v.iter().any(|&x| x <= 0.0) {
                0.0
            } else {
                stats::geometric_mean(&v)
            }
        };
        StepBreakdown {
            data_s: avg(|b| b.data_s),
            transfer_s: avg(|b| b.transfer_s),
            wait_s: avg(|b| b.wait_s),
            compute_s: avg(|b| b.compute_s),
        }
    }

    pub fn total(&self) -> f64 {
        self.data_s + self.transfer_s + self.wait_s + self.compute_s
    }
}

/// How a point is compared, as scaling.csv's `scaling_mode` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalingMode {
    /// A 1-rank point: the reference itself.
    Baseline,
    /// Against the 1-rank point of the same per-rank batch.
    Weak,
    /// Against the 1-rank point of the same global batch.
    Strong,
    /// Against the run `--baseline` names.
    Explicit,
    /// No reference: `missing_reference` says what to add.
    None,
}

impl ScalingMode {
    pub fn name(self) -> &'static str {
        match self {
            ScalingMode::Baseline => "baseline",
            ScalingMode::Weak => "weak",
            ScalingMode::Strong => "strong",
            ScalingMode::Explicit => "explicit",
            ScalingMode::None => "none",
        }
    }
}

impl std::fmt::Display for ScalingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// The modes a multi-rank point is compared in, where its reference exists.
const COMPARED: [ScalingMode; 2] = [ScalingMode::Weak, ScalingMode::Strong];

/// One row of scaling.csv: one point (its repeats) against its reference, in one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    /// The point's runs (repeats of one configuration); space-separated in the CSV.
    pub run_ids: Vec<String>,
    pub repeats: usize,
    pub model: String,
    pub dataset: String,
    pub node_types: String,
    pub ranks: usize,
    pub nodes: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    /// What else the compared runs share (device, threads per rank, optimizer, ...).
    pub comparison: String,
    /// baseline (a 1-rank point), weak (against the same per-rank batch), strong (the
    /// same global batch), explicit (against --baseline), or none (no reference).
    pub scaling_mode: ScalingMode,
    pub baseline_run_ids: Vec<String>,
    pub baseline_repeats: usize,
    /// What run would give this point a reference, when it has none.
    pub missing_reference: String,
    /// Steps per rank of the first run (warm-up excluded).
    pub steps: u64,
    /// Geometric mean over repeats of each run's mean step time.
    pub step_s_mean: f64,
    /// Geometric mean over repeats of each run's throughput (samples per step over its
    /// mean step), and the range of those throughputs. Speedup, efficiency, the ideal and
    /// the waterfall's total come from these geometric means: one estimator per row.
    pub samples_per_s: f64,
    pub samples_per_s_min: f64,
    pub samples_per_s_max: f64,
    pub speedup: f64,
    /// The speedup's 95 % interval ([`interval::speedup_interval`]); empty without one.
    pub speedup_low: f64,
    pub speedup_high: f64,
    /// How speedup_low..speedup_high was found, with its df, and what a direction needs
    /// where none is claimed.
    pub interval_method: String,
    /// The interval's Welch–Satterthwaite degrees of freedom.
    pub interval_df: f64,
    /// 1 when that interval contains 1.
    pub within_noise: u8,
    /// faster, slower, within noise, or no interval ([`Direction::of`]); invalidated
    /// where a run of the point or its reference carries a warning that invalidates it.
    pub direction: Option<Direction>,
    /// Those warnings, as `run id: code` (not a column of scaling.csv: report.md and
    /// `interval_method` say them).
    #[serde(skip)]
    pub invalidated_by: Vec<String>,
    /// Without a direction: the fewest repeats per side that would give one for a
    /// speedup this large at the spreads seen (a lower bound where there is no interval).
    pub repeats_needed: Option<usize>,
    pub efficiency: f64,
    /// Strong scaling only ([`metrics::karp_flatt`]), with the range it takes over the
    /// speedup's interval; empty without one.
    pub karp_flatt: f64,
    pub karp_flatt_low: f64,
    pub karp_flatt_high: f64,
    /// Strong scaling with at least two points beyond the reference, each with an
    /// interval: Amdahl's fit, and the fits through the intervals' ends.
    pub amdahl_serial_fraction: f64,
    pub amdahl_serial_fraction_low: f64,
    pub amdahl_serial_fraction_high: f64,
    pub amdahl_speedup: f64,
    pub amdahl_speedup_low: f64,
    pub amdahl_speedup_high: f64,
    /// Weak scaling only ([`metrics::gustafson_serial_fraction`]), with its range over the
    /// speedup's interval; empty without one.
    pub gustafson_serial_fraction: f64,
    pub gustafson_serial_fraction_low: f64,
    pub gustafson_serial_fraction_high: f64,
    /// The reference throughput times the rank counts (per node type).
    pub ideal_samples_per_s: f64,
    /// The efficiency the transfer alone allows without overlap
    /// ([`metrics::transfer_limit_efficiency`]): T1 the reference's mean step at this
    /// per-rank batch (its step × the batch ratio), the transfer the mean over a run's
    /// rank-steps of the all-reduce after the last rank entered, each a geometric mean over
    /// repeats. NaN on several node types
    /// and where the all-reduce thread shared backward's cores (its transfer then
    /// time-sliced with backward).
    pub transfer_limit_efficiency: f64,
    /// Throughput lost to each cause; the four add up to ideal minus measured.
    pub loss_comm_samples_per_s: f64,
    pub loss_data_samples_per_s: f64,
    pub loss_straggler_samples_per_s: f64,
    pub loss_other_samples_per_s: f64,
    pub gating_node_type: String,
}

/// Throughput of a run ([`metrics::throughput`]): samples per step over the mean step time.
pub(crate) fn samples_per_s(run: &RunStats) -> f64 {
    metrics::throughput(run.samples as f64 / run.steps.max(1) as f64, run.job_step.mean())
}

/// Splits the gap between ideal and measured throughput into causes, in proportion
/// to each cause's share of the extra time per step over the ideal step time
/// (the reference's breakdown scaled by the per-rank batch ratio).
pub(crate) fn waterfall(run: &StepBreakdown, base: &StepBreakdown, batch_ratio: f64, ideal: f64, measured: f64) -> [f64; 4] {
    let d = [
        run.transfer_s - batch_ratio * base.transfer_s,
        run.data_s - batch_ratio * base.data_s,
        run.wait_s - batch_ratio * base.wait_s,
        run.compute_s - batch_ratio * base.compute_s,
    ];
    let total: f64 = d.iter().sum();
    let lost = ideal - measured;
    if total.abs() < 1e-15 {
        return [0.0, 0.0, 0.0, lost];
    }
    d.map(|x| lost * x / total)
}

/// A point's references: per node type, the 1-rank point it is compared with.
struct Reference<'p, 'a> {
    mode: ScalingMode,
    per_type: Vec<(&'p ScalingPoint<'a>, usize)>,
}

impl Reference<'_, '_> {
    /// The point's ideal throughput: each rank at its type's reference throughput.
    fn ideal(&self, throughput: impl Fn(&ScalingPoint) -> f64) -> f64 {
        self.per_type.iter().map(|(p, n)| throughput(p) * *n as f64).sum()
    }

    fn runs(&self) -> Vec<&RunStats> {
        self.per_type.iter().flat_map(|(p, _)| p.runs.iter().copied()).collect()
    }
}

/// The 1-rank point of `t` that `p` is compared with in `mode`.
fn find_reference<'p, 'a>(points: &'p [ScalingPoint<'a>], p: &ScalingPoint, t: &str, mode: ScalingMode) -> Option<&'p ScalingPoint<'a>> {
    points.iter().find(|q| {
        q.ranks == 1
            && q.key == p.key
            && q.single_type() == Some(t)
            && match mode {
                ScalingMode::Weak => q.batch_per_rank == p.batch_per_rank,
                _ => q.global_batch == p.global_batch,
            }
    })
}

/// The rows of `runs`: for each point, its weak and strong rows where their references
/// exist, a baseline row for 1-rank points, and a row without speedup (saying what to
/// add) where none exists. `explicit` is a run every point of its workload is compared
/// with instead (`--baseline`).
pub fn scaling(runs: &[&RunStats], explicit: Option<&RunStats>) -> Vec<ScalingRow> {
    let pts = points(runs);
    let pools = Pools::of(&pts);
    let mut rows = Vec::new();
    for (i, p) in pts.iter().enumerate() {
        let refs = references(&pts, p, explicit);
        if refs.is_empty() {
            // The node types a reference is missing for (the others have theirs).
            let missing: Vec<&str> = p
                .types
                .keys()
                .filter(|t| COMPARED.iter().all(|&m| find_reference(&pts, p, t, m).is_none()))
                .map(String::as_str)
                .collect();
            let mut r = row(p, None, &pools, i);
            r.missing_reference = missing.iter().map(|t| reference_advice(p, t)).collect::<Vec<_>>().join("; ");
            rows.push(r);
        }
        for r in &refs {
            rows.push(row(p, Some(r), &pools, i));
        }
    }
    fit_laws(&mut rows);
    rows
}

/// The runs that would give `p` its 1-rank references on node type `t`: for weak scaling
/// at its per-rank batch, for strong scaling at its global batch (over its micro-batches
/// when it accumulates gradients), each as the exact command ([`advice::reference_command`]).
fn reference_advice(p: &ScalingPoint, t: &str) -> String {
    let accum = p.key.grad_accum.unwrap_or(1).max(1);
    let weak = advice::reference_command(p.runs[0], &p.key, p.batch_per_rank);
    let strong = if p.global_batch % accum == 0 {
        advice::reference_command(p.runs[0], &p.key, p.global_batch / accum).describe()
    } else {
        format!(
            "none: no 1-rank run with --grad-accum {accum} has the global batch {}, which {accum} does not divide",
            p.global_batch
        )
    };
    format!("a 1-rank run on {t}, weak: {}; strong: {strong}", weak.describe())
}

/// `p`'s references: the explicit baseline's point, or its weak and strong 1-rank points
/// (the point itself, for a 1-rank point: its baseline row).
fn references<'p, 'a>(pts: &'p [ScalingPoint<'a>], p: &'p ScalingPoint<'a>, explicit: Option<&RunStats>) -> Vec<Reference<'p, 'a>> {
    if let Some(e) = explicit {
        if let Some(q) = pts.iter().find(|q| q.runs.iter().any(|r| std::ptr::eq(*r, e))) {
            if q.key.model == p.key.model && q.key.dataset == p.key.dataset {
                let mode = if std::ptr::eq(q, p) {
                    ScalingMode::Baseline
                } else {
                    ScalingMode::Explicit
                };
                return vec![Reference {
                    mode,
                    per_type: vec![(q, p.ranks)],
                }];
            }
        }
    }
    if p.ranks == 1 {
        return vec![Reference {
            mode: ScalingMode::Baseline,
            per_type: vec![(p, 1)],
        }];
    }
    COMPARED
        .into_iter()
        .filter_map(|mode| {
            let per_type: Option<Vec<_>> = p
                .types
                .iter()
                .map(|(t, &n)| find_reference(pts, p, t, mode).map(|q| (q, n)))
                .collect();
            per_type.map(|per_type| Reference { mode, per_type })
        })
        // Where the per-rank and the global batch match the same point, one row says it.
        .fold(Vec::new(), |mut acc: Vec<Reference>, r| {
            let same = acc.iter().any(|a| {
                a.per_type
                    .iter()
                    .map(|x| x.0 as *const _)
                    .eq(r.per_type.iter().map(|x| x.0 as *const _))
            });
            if !same {
                acc.push(r);
            }
            acc
        })
}

fn row(p: &ScalingPoint, reference: Option<&Reference>, pools: &Pools, index: usize) -> ScalingRow {
    let thr: Vec<f64> = p.runs.iter().map(|r| samples_per_s(r)).collect();
    let measured = p.throughput();
    let first = p.runs[0];
    let mut out = ScalingRow {
        run_ids: p.run_ids(),
        repeats: p.runs.len(),
        model: p.key.model.clone(),
        dataset: p.key.dataset.clone(),
        node_types: p.types.iter().map(|(t, n)| format!("{t} ×{n}")).collect::<Vec<_>>().join(" + "),
        ranks: p.ranks,
        nodes: first.manifest.nodes,
        batch_per_rank: p.batch_per_rank,
        global_batch: p.global_batch,
        comparison: p.key.describe(),
        scaling_mode: ScalingMode::None,
        baseline_run_ids: Vec::new(),
        baseline_repeats: 0,
        missing_reference: String::new(),
        steps: first.steps,
        step_s_mean: stats::geometric_mean(&p.runs.iter().map(|r| r.job_step.mean()).collect::<Vec<_>>()),
        samples_per_s: measured,
        samples_per_s_min: thr.iter().copied().fold(f64::INFINITY, f64::min),
        samples_per_s_max: thr.iter().copied().fold(0.0, f64::max),
        speedup: f64::NAN,
        speedup_low: f64::NAN,
        speedup_high: f64::NAN,
        interval_method: String::new(),
        interval_df: f64::NAN,
        within_noise: 0,
        direction: None,
        invalidated_by: Vec::new(),
        repeats_needed: None,
        efficiency: f64::NAN,
        karp_flatt: f64::NAN,
        karp_flatt_low: f64::NAN,
        karp_flatt_high: f64::NAN,
        amdahl_serial_fraction: f64::NAN,
        amdahl_serial_fraction_low: f64::NAN,
        amdahl_serial_fraction_high: f64::NAN,
        amdahl_speedup: f64::NAN,
        amdahl_speedup_low: f64::NAN,
        amdahl_speedup_high: f64::NAN,
        gustafson_serial_fraction: f64::NAN,
        gustafson_serial_fraction_low: f64::NAN,
        gustafson_serial_fraction_high: f64::NAN,
        ideal_samples_per_s: f64::NAN,
        transfer_limit_efficiency: f64::NAN,
        loss_comm_samples_per_s: f64::NAN,
        loss_data_samples_per_s: f64::NAN,
        loss_straggler_samples_per_s: f64::NAN,
        loss_other_samples_per_s: f64::NAN,
        gating_node_type: gating_type(first).unwrap_or_default(),
    };
    let Some(reference) = reference else { return out };
    compare(&mut out, p, reference, pools, index);
    out
}

/// Fills speedup, efficiency, interval and waterfall of `out` against `reference`.
fn compare(out: &mut ScalingRow, p: &ScalingPoint, reference: &Reference, pools: &Pools, index: usize) {
    let ideal = reference.ideal(|q| q.throughput());
    let measured = p.throughput();
    let n = p.ranks as f64;
    out.scaling_mode = reference.mode;
    let base_runs = reference.runs();
    out.baseline_run_ids = base_runs.iter().map(|r| r.manifest.run_id.clone()).collect();
    out.baseline_repeats = reference.per_type.iter().map(|(q, _)| q.runs.len()).min().unwrap_or(0);
    out.ideal_samples_per_s = ideal;
    out.speedup = metrics::speedup(measured, ideal / n);
    out.efficiency = metrics::efficiency(out.speedup, n);
    if reference.mode == ScalingMode::Baseline {
        return;
    }
    let i = interval_of(p, reference, out.speedup, pools, 17 + index as u64);
    (out.speedup_low, out.speedup_high, out.interval_df) = (i.low, i.high, i.df);
    out.interval_method = i.method;
    out.within_noise = u8::from(i.low <= 1.0 && 1.0 <= i.high);
    out.invalidated_by = invalidating_warnings(p.runs.iter().chain(&base_runs).copied());
    out.direction = Some(i.direction.unless_invalidated(!out.invalidated_by.is_empty()));
    if !out.invalidated_by.is_empty() {
        out.interval_method = format!(
            "{}; no direction: runs carry warnings that invalidate them ({})",
            out.interval_method,
            out.invalidated_by.join(", ")
        );
    }
    out.repeats_needed = i.repeats_needed;
    serial_fraction(out, n);
    if reference.per_type.len() == 1 {
        let base = StepBreakdown::mean(&base_runs);
        let ratio = p.batch_per_rank as f64 / reference.per_type[0].0.batch_per_rank as f64;
        let loss = waterfall(&StepBreakdown::mean(&p.runs), &base, ratio, ideal, measured);
        if !p.runs.iter().any(|r| r.manifest.comm.overlap_shares_core) {
            // Over repeats, geometric means: the estimator of step_s_mean.
            let geo = |runs: &[&RunStats], f: fn(&RunStats) -> f64| stats::geometric_mean(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
            let t1 = geo(&base_runs, |r| r.job_step.mean()) * ratio;
            out.transfer_limit_efficiency = metrics::transfer_limit_efficiency(t1, geo(&p.runs, |r| r.transfer.mean()));
        }
        [
            out.loss_comm_samples_per_s,
            out.loss_data_samples_per_s,
            out.loss_straggler_samples_per_s,
            out.loss_other_samples_per_s,
        ] = loss;
    }
}

/// The warnings of `runs` that invalidate a direction, as `run id: code`.
fn invalidating_warnings<'r>(runs: impl Iterator<Item = &'r RunStats>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        for w in r.manifest.warnings.iter().filter(|w| w.invalidates_direction) {
            let said = format!("{}: {}", r.manifest.run_id, w.code.as_str());
            if !out.contains(&said) {
                out.push(said);
            }
        }
    }
    out
}

/// The run-to-run spreads of one `scaling` call: one pool per comparison key and node
/// types (so per rank count), over its points, which differ in batch only.
struct Pools {
    keys: Vec<(ComparisonKey, BTreeMap<String, usize>)>,
    spreads: Vec<Spread>,
}

impl Pools {
    fn of(pts: &[ScalingPoint]) -> Pools {
        let mut keys: Vec<(ComparisonKey, BTreeMap<String, usize>)> = Vec::new();
        let mut members: Vec<Vec<Vec<f64>>> = Vec::new();
        for p in pts {
            let k = (p.key.clone(), p.types.clone());
            let at = keys.iter().position(|x| *x == k).unwrap_or_else(|| {
                keys.push(k);
                members.push(Vec::new());
                keys.len() - 1
            });
            members[at].push(p.log_throughputs());
        }
        let spreads = members.iter().map(|m| Spread::pooled(m.iter().map(Vec::as_slice))).collect();
        Pools { keys, spreads }
    }

    fn index(&self, p: &ScalingPoint) -> usize {
        self.keys
            .iter()
            .position(|(key, types)| *key == p.key && *types == p.types)
            .expect("every point has its pool")
    }
}

/// The variance of a run's log throughput from within-run noise alone: its step series
/// resampled in blocks of `n^(1/3)` steps (neighbouring steps' dependence kept).
fn within_run_variance(run: &RunStats, rng: &mut Rng) -> f64 {
    let series = &run.job_step_series;
    let block = ((series.len() as f64).cbrt().round() as usize).max(1);
    let logs: Vec<f64> = (0..400).map(|_| stats::block_resample_mean(series, block, rng).ln()).collect();
    stats::mean_variance(&logs).1
}

/// The interval of `p`'s speedup against `reference` ([`interval::speedup_interval`]):
/// the point's term, then one per reference node type weighted by its share of the ideal.
fn interval_of(p: &ScalingPoint, reference: &Reference, speedup: f64, pools: &Pools, seed: u64) -> interval::SpeedupInterval {
    let ideal = reference.ideal(|q| q.throughput());
    let mut rng = Rng(seed);
    let mut term = |q: &ScalingPoint, weight: f64| {
        let pool = pools.index(q);
        Term {
            runs: q.runs.len(),
            weight,
            pool,
            within_run_variance: if pools.spreads[pool].df > 0.0 {
                f64::NAN
            } else {
                within_run_variance(q.runs[0], &mut rng)
            },
        }
    };
    let mut terms = vec![term(p, 1.0)];
    for (q, k) in &reference.per_type {
        terms.push(term(q, q.throughput() * *k as f64 / ideal));
    }
    interval::speedup_interval(speedup, &terms, &pools.spreads)
}

/// Karp–Flatt (strong) or Gustafson (weak) serial fraction of `out`'s speedup on `n`
/// times the ranks, and the range it takes over the speedup's interval (both laws fall
/// as the speedup rises). Both laws share a gain out between serial and parallel work,
/// their fraction between 0 (speedup n) and 1 (speedup 1): the range stops there where
/// the interval reaches beyond (unless the speedup itself does). Below speedup 1 there
/// is no gain and the fraction passes 1, so it is left undefined (not applicable);
/// without an interval it is not stated.
fn serial_fraction(out: &mut ScalingRow, n: f64) {
    if out.speedup < 1.0 || !out.speedup_low.is_finite() {
        return;
    }
    let s = out.speedup;
    let (low, high) = (out.speedup_low.max(1.0), out.speedup_high.min(n.max(s)));
    match out.scaling_mode {
        ScalingMode::Strong => {
            let f = |s| metrics::karp_flatt(s, n);
            (out.karp_flatt, out.karp_flatt_low, out.karp_flatt_high) = (f(s), f(high), f(low));
        }
        ScalingMode::Weak => {
            let f = |s| metrics::gustafson_serial_fraction(s, n);
            (
                out.gustafson_serial_fraction,
                out.gustafson_serial_fraction_low,
                out.gustafson_serial_fraction_high,
            ) = (f(s), f(high), f(low));
        }
        _ => {}
    }
}

/// A strong series: model, data set, comparison, the reference's runs, global batch.
type SeriesKey = (String, String, String, Vec<String>, usize);

/// Amdahl's fit through each strong series (same key, node types and global batch)
/// with at least two points beyond its reference, each with an interval: the fit through
/// the speedups, and through their intervals' high and low ends (the fitted fraction
/// falls as any speedup rises, so those bound it while every point stays inside its
/// interval). Without every interval the fit is not stated.
fn fit_laws(rows: &mut [ScalingRow]) {
    let mut series: BTreeMap<SeriesKey, Vec<usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| r.scaling_mode == ScalingMode::Strong) {
        series
            .entry((
                r.model.clone(),
                r.dataset.clone(),
                r.comparison.clone(),
                r.baseline_run_ids.clone(),
                r.global_batch,
            ))
            .or_default()
            .push(i);
    }
    for members in series.values().filter(|m| m.len() >= 2) {
        if members.iter().any(|&i| !rows[i].speedup_low.is_finite()) {
            continue;
        }
        let fit = |end: fn(&ScalingRow) -> f64| {
            let points: Vec<(f64, f64)> = members.iter().map(|&i| (rows[i].ranks as f64, end(&rows[i]))).collect();
            metrics::amdahl_fit(&points)
        };
        let (f, low, high) = (fit(|r| r.speedup), fit(|r| r.speedup_high), fit(|r| r.speedup_low));
        for &i in members {
            let r = &mut rows[i];
            let p = r.ranks as f64;
            (
                r.amdahl_serial_fraction,
                r.amdahl_serial_fraction_low,
                r.amdahl_serial_fraction_high,
            ) = (f, low, high);
            (r.amdahl_speedup, r.amdahl_speedup_low, r.amdahl_speedup_high) =
                (metrics::amdahl(f, p), metrics::amdahl(high, p), metrics::amdahl(low, p));
        }
    }
}
