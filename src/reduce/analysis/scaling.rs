//! `scaling.csv`: each point of a workload (its runs with the same configuration, rank
//! count and batch: repeats) against the 1-rank point it is compared with, weak (same
//! per-rank batch) and strong (same global batch) wherever that reference exists.
//!
//! Runs are comparable only when everything that changes a step's work matches
//! ([`ComparisonKey`], written by `train`): a reference is never filled with a substitute. A point on
//! several node types is compared with one 1-rank reference per node type: its ideal
//! throughput is the sum over its ranks of their type's reference throughput.

use super::{gating_type, RunStats};
use crate::record::{Backend, ComparisonKey, Phase};
use crate::reduce::metrics;
use crate::stats::{self, Rng};
use serde::Serialize;
use std::collections::BTreeMap;

/// Runs with the same key, node types, rank count and batch: repeats of one point.
#[derive(Debug, Clone)]
pub struct ScalingPoint<'a> {
    pub key: ComparisonKey,
    /// Ranks per node type, by type.
    pub types: BTreeMap<String, usize>,
    pub ranks: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    pub runs: Vec<&'a RunStats>,
}

impl ScalingPoint<'_> {
    /// Mean throughput over the repeats.
    pub fn throughput(&self) -> f64 {
        self.runs.iter().map(|r| samples_per_s(r)).sum::<f64>() / self.runs.len() as f64
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
pub fn points<'a>(runs: &[&'a RunStats]) -> Vec<ScalingPoint<'a>> {
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
        let p = |ph: Phase| run.phase_mean(ph);
        StepBreakdown {
            data_s: p(Phase::Data) + p(Phase::BatchCopy),
            transfer_s: (p(Phase::CommExposed) - wait).max(0.0),
            wait_s: wait.min(p(Phase::CommExposed)),
            compute_s: p(Phase::Forward) + p(Phase::Backward) + p(Phase::Optimizer) + p(Phase::Other),
        }
    }

    /// The mean breakdown of several runs.
    fn mean(runs: &[&RunStats]) -> StepBreakdown {
        let n = runs.len().max(1) as f64;
        let all: Vec<StepBreakdown> = runs.iter().map(|r| StepBreakdown::of(r)).collect();
        let avg = |f: fn(&StepBreakdown) -> f64| all.iter().map(f).sum::<f64>() / n;
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
    /// Mean over repeats of the mean step time.
    pub step_s_mean: f64,
    /// Mean over repeats of the throughput, and its range.
    pub samples_per_s: f64,
    pub samples_per_s_min: f64,
    pub samples_per_s_max: f64,
    pub speedup: f64,
    pub speedup_low: f64,
    pub speedup_high: f64,
    /// How speedup_low..speedup_high was found (see [`Interval`]).
    pub interval_method: String,
    /// 1 when that interval contains 1.
    pub within_noise: u8,
    pub efficiency: f64,
    /// Strong scaling only ([`metrics::karp_flatt`]).
    pub karp_flatt: f64,
    /// Strong scaling with at least two points beyond the reference: Amdahl's fit.
    pub amdahl_serial_fraction: f64,
    pub amdahl_speedup: f64,
    /// Weak scaling only ([`metrics::gustafson_serial_fraction`]).
    pub gustafson_serial_fraction: f64,
    /// The reference throughput times the rank counts (per node type).
    pub ideal_samples_per_s: f64,
    /// Throughput lost to each cause; the four add up to ideal minus measured.
    pub loss_comm_samples_per_s: f64,
    pub loss_data_samples_per_s: f64,
    pub loss_straggler_samples_per_s: f64,
    pub loss_other_samples_per_s: f64,
    pub gating_node_type: String,
}

/// Throughput of a run ([`metrics::throughput`]): samples per step over the mean step time.
pub fn samples_per_s(run: &RunStats) -> f64 {
    metrics::throughput(run.samples as f64 / run.steps.max(1) as f64, run.job_step.mean())
}

/// Splits the gap between ideal and measured throughput into causes, in proportion
/// to each cause's share of the extra time per step over the ideal step time
/// (the reference's breakdown scaled by the per-rank batch ratio).
pub fn waterfall(run: &StepBreakdown, base: &StepBreakdown, batch_ratio: f64, ideal: f64, measured: f64) -> [f64; 4] {
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

/// How a speedup's interval comes about, by the repeats there are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interval {
    /// 3 or more repeats on both sides: the point's and the reference's repeats are
    /// resampled independently (2000 bootstrap replicates, 2.5th to 97.5th percentile).
    RunToRun,
    /// 2 repeats on one side: the range of the ratios over all pairs of runs.
    Range,
    /// A single run on one side: blocks of consecutive steps resampled (length
    /// `n^(1/3)`), and a side's repeats, where it has several, drawn with replacement:
    /// the single run's side holds within-run noise only.
    Blocks(usize),
}

impl Interval {
    pub fn describe(&self) -> String {
        match self {
            Interval::RunToRun => "bootstrap over repeats (run-to-run)".into(),
            Interval::Range => "range over 2 repeats".into(),
            Interval::Blocks(l) => format!("blocks of {l} steps within runs (within-run noise only)"),
        }
    }
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
            let mut r = row(p, None, i);
            r.missing_reference = missing
                .iter()
                .map(|t| {
                    format!(
                        "a 1-rank run on {t} with batch {} per rank (weak) or {} (strong), the same settings",
                        p.batch_per_rank, p.global_batch
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            rows.push(r);
        }
        for r in &refs {
            rows.push(row(p, Some(r), i));
        }
    }
    fit_laws(&mut rows);
    rows
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

fn row(p: &ScalingPoint, reference: Option<&Reference>, index: usize) -> ScalingRow {
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
        step_s_mean: p.runs.iter().map(|r| r.job_step.mean()).sum::<f64>() / p.runs.len() as f64,
        samples_per_s: measured,
        samples_per_s_min: thr.iter().copied().fold(f64::INFINITY, f64::min),
        samples_per_s_max: thr.iter().copied().fold(0.0, f64::max),
        speedup: f64::NAN,
        speedup_low: f64::NAN,
        speedup_high: f64::NAN,
        interval_method: String::new(),
        within_noise: 0,
        efficiency: f64::NAN,
        karp_flatt: f64::NAN,
        amdahl_serial_fraction: f64::NAN,
        amdahl_speedup: f64::NAN,
        gustafson_serial_fraction: f64::NAN,
        ideal_samples_per_s: f64::NAN,
        loss_comm_samples_per_s: f64::NAN,
        loss_data_samples_per_s: f64::NAN,
        loss_straggler_samples_per_s: f64::NAN,
        loss_other_samples_per_s: f64::NAN,
        gating_node_type: gating_type(first).unwrap_or_default(),
    };
    let Some(reference) = reference else { return out };
    compare(&mut out, p, reference, index);
    out
}

/// Fills speedup, efficiency, interval and waterfall of `out` against `reference`.
fn compare(out: &mut ScalingRow, p: &ScalingPoint, reference: &Reference, index: usize) {
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
    let (lo, hi, method) = interval(p, reference, 17 + index as u64);
    out.speedup_low = lo;
    out.speedup_high = hi;
    out.interval_method = method.describe();
    out.within_noise = u8::from(lo <= 1.0 && 1.0 <= hi);
    // Both laws share a gain out between serial and parallel work: below speedup 1 there
    // is no gain and the fraction passes 1, so it is left undefined (not applicable).
    match reference.mode {
        _ if out.speedup < 1.0 => {}
        ScalingMode::Strong => out.karp_flatt = metrics::karp_flatt(out.speedup, n),
        ScalingMode::Weak => out.gustafson_serial_fraction = metrics::gustafson_serial_fraction(out.speedup, n),
        _ => {}
    }
    if reference.per_type.len() == 1 {
        let base = StepBreakdown::mean(&base_runs);
        let ratio = p.batch_per_rank as f64 / reference.per_type[0].0.batch_per_rank as f64;
        let loss = waterfall(&StepBreakdown::mean(&p.runs), &base, ratio, ideal, measured);
        [
            out.loss_comm_samples_per_s,
            out.loss_data_samples_per_s,
            out.loss_straggler_samples_per_s,
            out.loss_other_samples_per_s,
        ] = loss;
    }
}

/// The speedup's interval, by the repeats on each side ([`Interval`]).
fn interval(p: &ScalingPoint, reference: &Reference, seed: u64) -> (f64, f64, Interval) {
    let repeats = reference
        .per_type
        .iter()
        .map(|(q, _)| q.runs.len())
        .chain([p.runs.len()])
        .min()
        .unwrap_or(1);
    let n = p.ranks as f64;
    let runs_thr = |q: &ScalingPoint| q.runs.iter().map(|r| samples_per_s(r)).collect::<Vec<f64>>();
    let point_thr = runs_thr(p);
    let ref_thr: Vec<(Vec<f64>, usize)> = reference.per_type.iter().map(|(q, k)| (runs_thr(q), *k)).collect();
    let ratio = |point: f64, refs: &[f64]| point / (refs.iter().zip(&ref_thr).map(|(t, (_, k))| t * *k as f64).sum::<f64>() / n);
    if repeats >= 3 {
        let mut rng = Rng(seed);
        let mut resample = |v: &[f64]| (0..v.len()).map(|_| v[rng.below(v.len() as u64) as usize]).sum::<f64>() / v.len() as f64;
        let reps: Vec<f64> = (0..2000)
            .map(|_| {
                let pt = resample(&point_thr);
                let refs: Vec<f64> = ref_thr.iter().map(|(v, _)| resample(v)).collect();
                ratio(pt, &refs)
            })
            .collect();
        return (stats::quantile(&reps, 0.025), stats::quantile(&reps, 0.975), Interval::RunToRun);
    }
    if repeats == 2 {
        let mut all = Vec::new();
        for &pt in &point_thr {
            let combos = ref_thr.iter().fold(vec![Vec::new()], |acc: Vec<Vec<f64>>, (v, _)| {
                acc.iter()
                    .flat_map(|c| v.iter().map(move |&t| [c.clone(), vec![t]].concat()))
                    .take(4096)
                    .collect()
            });
            all.extend(combos.iter().map(|refs| ratio(pt, refs)));
        }
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        return (lo, hi, Interval::Range);
    }
    block_interval(p, reference, seed)
}

/// A side's throughput in one replicate, by the point estimate's own estimator (the mean
/// over runs of samples per step / mean step): its runs drawn with replacement where
/// there are several (their spread), each run's steps resampled in blocks of `block`.
fn resampled_throughput(runs: &[&RunStats], block: usize, rng: &mut Rng) -> f64 {
    let k = runs.len();
    let mut sum = 0.0;
    for i in 0..k {
        let r = if k > 1 { runs[rng.below(k as u64) as usize] } else { runs[i] };
        let per_step = r.samples as f64 / r.steps.max(1) as f64;
        sum += metrics::throughput(per_step, stats::block_resample_mean(&r.job_step_series, block, rng));
    }
    sum / k.max(1) as f64
}

/// The interval where one side has a single run: each run's step series resampled in
/// blocks of `n^(1/3)` steps, the runs of a side with repeats drawn with replacement too.
fn block_interval(p: &ScalingPoint, reference: &Reference, seed: u64) -> (f64, f64, Interval) {
    let longest = p.runs.iter().map(|r| r.job_step_series.len()).max().unwrap_or(1);
    let block = ((longest as f64).cbrt().round() as usize).max(1);
    let mut rng = Rng(seed);
    let n = p.ranks as f64;
    let reps: Vec<f64> = (0..2000)
        .map(|_| {
            let pt = resampled_throughput(&p.runs, block, &mut rng);
            let ideal: f64 = reference
                .per_type
                .iter()
                .map(|(q, k)| resampled_throughput(&q.runs, block, &mut rng) * *k as f64)
                .sum();
            pt / (ideal / n)
        })
        .collect();
    (
        stats::quantile(&reps, 0.025),
        stats::quantile(&reps, 0.975),
        Interval::Blocks(block),
    )
}

/// A strong series: model, data set, comparison, the reference's runs, global batch.
type SeriesKey = (String, String, String, Vec<String>, usize);

/// Amdahl's fit through each strong series (same key, node types and global batch)
/// with at least two points beyond its reference.
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
        let points: Vec<(f64, f64)> = members.iter().map(|&i| (rows[i].ranks as f64, rows[i].speedup)).collect();
        let f = metrics::amdahl_fit(&points);
        for &i in members {
            rows[i].amdahl_serial_fraction = f;
            rows[i].amdahl_speedup = metrics::amdahl(f, rows[i].ranks as f64);
        }
    }
}
