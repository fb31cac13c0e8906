//! What a run's rows add up to: per rank and per node type, the phase times, the
//! straggler wait and transfer time of every step (from the ranks' entry times into the
//! all-reduce), and the job's step times ([`RunStats`]); then the summaries per node
//! type and rank ([`summary`]) and the scaling across runs ([`scaling`](mod@scaling)) with the
//! speedup's interval ([`interval`]).

pub(crate) mod advice;
pub(crate) mod heatmap;
pub(crate) mod interval;
pub(crate) mod link_models;
pub(crate) mod noise_window;
pub(crate) mod projection;
pub(crate) mod recommend;
pub(crate) mod samples_to_target;
pub mod scaling;
pub(crate) mod summary;

pub use interval::Direction;
pub(crate) use scaling::ScalingRow;
pub use scaling::{scaling, ScalingMode, StepBreakdown};
pub(crate) use summary::gating_type;
pub use summary::{rank_summaries, type_summaries};
pub(crate) use summary::{RankSummary, TypeSummary};

use super::metrics;
use super::read::{self, GpuTelemetry, Row};
use crate::record::{Backend, ComparisonKey, EpochRow, Manifest, Phase, PhaseArray, PhaseTimes};
use crate::stats::Sketch;
use std::path::{Path, PathBuf};

/// One rank's figures over its non-warm-up steps.
#[derive(Debug, Clone)]
pub struct RankStats {
    pub rank: usize,
    pub node_type: String,
    pub host: String,
    pub steps: u64,
    pub samples: u64,
    pub step: Sketch,
    /// Sum over steps of each phase, seconds.
    pub phase_sum: PhaseTimes,
    /// Sum over steps of the time this rank waited in the all-reduce for the last rank to enter.
    pub wait_sum: f64,
    /// Steps in which this rank was the last to enter the all-reduce.
    pub last_arrivals: u64,
    /// Seconds the other ranks waited, summed over them, in the steps this rank entered last.
    pub caused_wait_s: f64,
    /// The longest steps (global step, seconds), longest first, at most [`LONGEST_KEPT`].
    pub longest: Vec<(u64, f64)>,
}

/// Longest steps kept per rank, to name stalls.
pub(crate) const LONGEST_KEPT: usize = 16;

/// A step that took over [`STALL_FACTOR`] times its rank's median.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stall {
    pub rank: usize,
    pub global_step: u64,
    pub step_s: f64,
    pub median_s: f64,
}

/// A step this many times its rank's median step is a stall, named on its own.
pub(crate) const STALL_FACTOR: f64 = 10.0;

/// Figures of all ranks of one node type.
#[derive(Debug, Clone)]
pub struct TypeStats {
    pub node_type: String,
    pub ranks: Vec<usize>,
    pub step: Sketch,
    pub phase: PhaseArray<Sketch>,
    /// The transfer time of each rank-step ([`metrics::transfer_time`]).
    pub transfer: Sketch,
    /// The straggler wait of each rank-step ([`metrics::straggler_wait`]).
    pub wait: Sketch,
    /// comm_s: all of the all-reduce work, hidden behind backward or not.
    pub comm: Sketch,
    /// comm_hidden_s: all-reduce work before backward's end, as the rows say it (where the
    /// all-reduce thread shared backward's cores it time-sliced with backward there).
    pub hidden: Sketch,
    pub last_arrivals: u64,
    /// Seconds the other ranks waited in steps where a rank of this type entered last.
    pub caused_wait_s: f64,
    /// GPU telemetry of the type's ranks (`rank-NNNNN.gpu.csv`), when there is any.
    pub gpu: GpuTelemetry,
}

impl TypeStats {
    fn new(node_type: &str) -> TypeStats {
        TypeStats {
            node_type: node_type.into(),
            ranks: Vec::new(),
            step: Sketch::new(),
            phase: PhaseArray::from_fn(|_| Sketch::new()),
            transfer: Sketch::new(),
            wait: Sketch::new(),
            comm: Sketch::new(),
            hidden: Sketch::new(),
            last_arrivals: 0,
            caused_wait_s: 0.0,
            gpu: GpuTelemetry::default(),
        }
    }
}

/// Everything the summaries need of one run.
#[derive(Debug, Clone)]
pub struct RunStats {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// What the run is compared by (None only for a run with problems).
    pub key: Option<ComparisonKey>,
    pub ranks: Vec<RankStats>,
    pub types: Vec<TypeStats>,
    /// Per step, the mean over ranks of step_s: its sketch, and the series in step
    /// order (for the block bootstrap of a single run).
    pub job_step: Sketch,
    pub job_step_series: Vec<f64>,
    /// Each rank-step's own work: `step_s` minus the exposed all-reduce (what a rank
    /// does before it can finish the step, the draws of the straggler projection).
    pub local_work: Sketch,
    /// The step's own work split into what all ranks share and each rank's share apart:
    /// per step, the mean over ranks of own work (`own_common`), and each rank's own work
    /// minus that mean (`own_deviation`, the spread between ranks that a straggler is).
    pub own_common: Sketch,
    pub own_deviation: Sketch,
    /// Per step, the largest own work of any rank (what the step waited for).
    pub own_max: Sketch,
    /// Per rank-step, the all-reduce after the last rank entered ([`metrics::transfer_time`]).
    pub transfer: Sketch,
    /// Non-warm-up steps per rank.
    pub steps: u64,
    /// The arrival order the clocks can resolve ([`Arrivals`]).
    pub arrivals: Arrivals,
    /// Samples of all ranks over the counted steps.
    pub samples: u64,
    /// Samples of all ranks over the warm-up steps.
    pub warmup_samples: u64,
    /// Gradient bytes all-reduced per step.
    pub bytes_per_step: u64,
    pub warmup_steps: u64,
    pub epochs: Vec<EpochRow>,
    /// Each rank's own work per counted step, binned ([`heatmap::StepHeatmap`]).
    pub heatmap: heatmap::StepHeatmap,
    /// Why the run cannot be used (empty when it is complete).
    pub problems: Vec<String>,
    /// Every step that measured the gradient noise scale's norms, warm-up included
    /// (training steps like any other), in step order.
    pub noise_steps: Vec<noise_window::NoiseStep>,
}

impl RunStats {
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }

    /// Steps of any rank that took over [`STALL_FACTOR`] times that rank's median.
    pub(crate) fn stalls(&self) -> Vec<Stall> {
        let mut out: Vec<Stall> = self
            .ranks
            .iter()
            .flat_map(|r| {
                let median_s = r.step.median();
                r.longest
                    .iter()
                    .filter(move |l| l.1 > STALL_FACTOR * median_s)
                    .map(move |&(g, s)| Stall {
                        rank: r.rank,
                        global_step: g,
                        step_s: s,
                        median_s,
                    })
            })
            .collect();
        out.sort_by(|a, b| b.step_s.total_cmp(&a.step_s));
        out
    }

    /// The epoch time: the median of the full epochs measured (epochs.csv), or, when no
    /// epoch ran whole, steps per epoch × the mean step time, marked projected (true).
    pub(crate) fn epoch_s(&self) -> (f64, bool) {
        let full: Vec<f64> = self
            .epochs
            .iter()
            .filter(|e| e.steps == self.manifest.steps_per_epoch)
            .map(|e| e.epoch_s)
            .collect();
        if full.is_empty() {
            (self.job_step.mean() * self.manifest.steps_per_epoch as f64, true)
        } else {
            (crate::stats::median(&full), false)
        }
    }

    /// Mean over rank-steps of phase `p`, seconds.
    pub(crate) fn phase_mean(&self, p: Phase) -> f64 {
        let n = self.ranks.iter().map(|r| r.steps).sum::<u64>().max(1) as f64;
        self.ranks.iter().map(|r| r.phase_sum[p]).sum::<f64>() / n
    }
}

/// Reads a run folder and adds up its rows. Err only when the folder is not a run at
/// all; a run with holes comes back with `problems` filled in.
pub fn read_run(dir: &Path) -> Result<RunStats, String> {
    let mut files = read::open(dir)?;
    let ranks = files.ranks();
    let mut run = RunStats {
        dir: dir.to_path_buf(),
        ranks: ranks
            .iter()
            .map(|&r| RankStats {
                rank: r,
                node_type: String::new(),
                host: files.hosts.get(&r).cloned().unwrap_or_default(),
                steps: 0,
                samples: 0,
                step: Sketch::new(),
                phase_sum: PhaseTimes::default(),
                wait_sum: 0.0,
                last_arrivals: 0,
                caused_wait_s: 0.0,
                longest: Vec::new(),
            })
            .collect(),
        types: Vec::new(),
        job_step: Sketch::new(),
        job_step_series: Vec::new(),
        local_work: Sketch::new(),
        own_common: Sketch::new(),
        own_deviation: Sketch::new(),
        own_max: Sketch::new(),
        transfer: Sketch::new(),
        steps: 0,
        arrivals: Arrivals {
            clocks_known: files.clock.known(),
            ..Arrivals::default()
        },
        samples: 0,
        warmup_samples: 0,
        bytes_per_step: 0,
        warmup_steps: 0,
        epochs: std::mem::take(&mut files.epochs),
        heatmap: heatmap::StepHeatmap::new(ranks.len(), heatmap::HEATMAP_LIMITS),
        problems: Vec::new(),
        manifest: files.manifest.clone(),
        key: files.key.clone(),
        noise_steps: Vec::new(),
    };
    let mut type_of: Vec<usize> = Vec::new();
    let clock = files.clock.clone();
    let communicates = run.manifest.comm_backend != Backend::None;
    // Per rank, the span of its timed steps in step_start_at_s: GPU telemetry is averaged there.
    let mut timed: Vec<Option<(f64, f64)>> = vec![None; ranks.len()];
    files.for_each_step(|rows, node_types| {
        for (span, row) in timed.iter_mut().zip(rows) {
            if !row.warmup && row.step_start_at_s.is_finite() {
                let (from, to) = span.unwrap_or((row.step_start_at_s, row.step_start_at_s));
                *span = Some((from.min(row.step_start_at_s), to.max(row.step_start_at_s + row.step_s)));
            }
        }
        if type_of.is_empty() {
            type_of = run.assign_types(node_types);
        }
        run.noise_steps.extend(noise_window::NoiseStep::of(rows));
        let entries: Vec<Entry> = rows
            .iter()
            .zip(&ranks)
            .map(|(row, &r)| Entry {
                at_s: clock.correct(r, row.comm_last_start_at_s),
                error_s: clock.error_s(r, row.comm_last_start_at_s),
            })
            .collect();
        run.add_step(rows, &entries, &type_of, communicates)
    });
    for (i, &r) in ranks.iter().enumerate() {
        if let Some(t) = type_of.get(i).and_then(|&t| run.types.get_mut(t)) {
            if let Err(e) = t.gpu.add_file(&dir.join(crate::record::gpu_file_name(r)), timed[i]) {
                files.problems.push(e);
            }
        }
    }
    run.problems = files.problems;
    if run.steps == 0 && run.problems.is_empty() {
        run.problems.push(format!(
            "no steps after the {} warm-up step(s): run longer or lower --warmup-steps",
            run.warmup_steps
        ));
    }
    Ok(run)
}

impl RunStats {
    /// Groups the ranks by node type; returns each rank's type index.
    fn assign_types(&mut self, node_types: &[String]) -> Vec<usize> {
        node_types
            .iter()
            .enumerate()
            .map(|(i, nt)| {
                let t = self.types.iter().position(|t| &t.node_type == nt).unwrap_or_else(|| {
                    self.types.push(TypeStats::new(nt));
                    self.types.len() - 1
                });
                self.types[t].ranks.push(self.ranks[i].rank);
                self.ranks[i].node_type = nt.clone();
                t
            })
            .collect()
    }

    /// One step of every rank. The all-reduce completes only when the last rank has
    /// entered its last bucket, so each rank's wait runs from its own entry (`entries`,
    /// on rank 0's clock) to the last one; a run without all-reduce waits for nobody.
    /// A wait no larger than the two clocks' errors is not told apart from transfer:
    /// it counts as transfer (the two merged), and a last arrival is claimed only when
    /// it entered later than every other rank by more than their clocks' errors. A wait
    /// happens inside the rank's all-reduce, so it is at most that all-reduce's time
    /// (`comm_s`): where the clocks put the last entry further off, the wait is `comm_s`
    /// and the transfer 0, so that transfer + wait = `comm_s` in every rank-step.
    /// Err when a count no longer fits its sum.
    fn add_step(&mut self, rows: &[Row], entries: &[Entry], type_of: &[usize], communicates: bool) -> Result<(), String> {
        if rows[0].warmup {
            self.warmup_steps += 1;
            for row in rows {
                add_count(&mut self.warmup_samples, row.samples, "warm-up samples of the run")?;
            }
            return Ok(());
        }
        let last = last_entry(entries);
        let order = communicates && rows.len() > 1;
        let claimed = order && arrival_resolved(entries, last);
        let mut step_mean = 0.0;
        let mut waited = 0.0;
        let own: Vec<f64> = rows
            .iter()
            .map(|row| (row.step_s - row.phases[Phase::CommExposed]).max(0.0))
            .collect();
        let own_mean = own.iter().sum::<f64>() / own.len() as f64;
        self.own_common.push(own_mean);
        self.own_max.push(own.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        for o in &own {
            self.own_deviation.push(o - own_mean);
        }
        self.heatmap.push(rows[0].global_step, &own);
        for (i, row) in rows.iter().enumerate() {
            let gap = metrics::straggler_wait(entries[last].at_s, entries[i].at_s);
            let resolved = gap > entries[i].error_s + entries[last].error_s;
            let wait = if order && resolved { gap.min(row.comm_s) } else { 0.0 };
            if order && gap > 0.0 && !resolved {
                self.arrivals.waits_merged += 1;
            }
            if order && resolved && gap > row.comm_s {
                self.arrivals.waits_capped += 1;
            }
            if order && i != last {
                self.arrivals.max_error_s = self.arrivals.max_error_s.max(entries[i].error_s + entries[last].error_s);
            }
            waited += wait;
            keep_longest(&mut self.ranks[i].longest, row.global_step, row.step_s);
            let rs = &mut self.ranks[i];
            rs.steps += 1;
            add_count(&mut rs.samples, row.samples, "samples of one rank")?;
            rs.step.push(row.step_s);
            for (sum, v) in rs.phase_sum.values_mut().zip(row.phases.values()) {
                *sum += v;
            }
            rs.wait_sum += wait;
            let ts = &mut self.types[type_of[i]];
            ts.step.push(row.step_s);
            self.local_work.push(own[i]);
            self.transfer.push(metrics::transfer_time(row.comm_s, wait));
            for (sketch, v) in ts.phase.values_mut().zip(row.phases.values()) {
                sketch.push(*v);
            }
            ts.transfer.push(metrics::transfer_time(row.comm_s, wait));
            ts.wait.push(wait);
            ts.comm.push(row.comm_s);
            ts.hidden.push(row.comm_hidden_s);
            add_count(&mut self.samples, row.samples, "samples of the run")?;
            step_mean += row.step_s;
        }
        if claimed {
            self.ranks[last].last_arrivals += 1;
            self.types[type_of[last]].last_arrivals += 1;
        } else if order {
            self.arrivals.unresolved_steps += 1;
        }
        self.types[type_of[last]].caused_wait_s += waited;
        self.ranks[last].caused_wait_s += waited;
        step_mean /= rows.len() as f64;
        self.job_step.push(step_mean);
        self.job_step_series.push(step_mean);
        self.bytes_per_step = rows[0].bytes;
        self.steps += 1;
        Ok(())
    }
}

/// A rank's entry into a step's all-reduce on rank 0's clock, and how far off that may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub at_s: f64,
    pub error_s: f64,
}

/// What the clocks let a run say about the order the ranks entered the all-reduce.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Arrivals {
    /// The run has clock offsets (`clock.csv`); without them their error is unknown and
    /// taken as 0.
    pub clocks_known: bool,
    /// Steps whose last rank entered within the clocks' error of another rank: no rank
    /// is named last.
    pub unresolved_steps: u64,
    /// Rank-steps whose wait for the last rank was within the two clocks' error: the
    /// wait is counted as transfer (transfer and waiting merged).
    pub waits_merged: u64,
    /// The largest error of the difference of two ranks' entries (the sum of theirs).
    pub max_error_s: f64,
    /// Rank-steps whose gap to the last entry exceeded the rank's whole all-reduce
    /// (`comm_s`): the clocks disagree with the rows there, and the wait is capped at `comm_s`.
    pub waits_capped: u64,
}

/// The index of the latest entry (the first of equal ones).
fn last_entry(entries: &[Entry]) -> usize {
    entries
        .iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |acc, (i, e)| if e.at_s > acc.1 { (i, e.at_s) } else { acc })
        .0
}

/// Whether entry `last` is later than every other by more than the two clocks' errors.
fn arrival_resolved(entries: &[Entry], last: usize) -> bool {
    let l = entries[last];
    entries
        .iter()
        .enumerate()
        .all(|(i, e)| i == last || l.at_s - e.at_s > l.error_s + e.error_s)
}

/// Adds `v` to the count `sum`; Err says `what` no longer fits 64 bits (a sum that
/// wrapped would report a fraction of what was counted).
fn add_count(sum: &mut u64, v: u64, what: &str) -> Result<(), String> {
    *sum = sum
        .checked_add(v)
        .ok_or_else(|| format!("the {what} add up to more than {}: the files are damaged", u64::MAX))?;
    Ok(())
}

/// Keeps the [`LONGEST_KEPT`] longest steps in `kept`, longest first.
fn keep_longest(kept: &mut Vec<(u64, f64)>, step: u64, seconds: f64) {
    if kept.len() == LONGEST_KEPT && kept.last().is_some_and(|l| l.1 >= seconds) {
        return;
    }
    let at = kept.partition_point(|k| k.1 >= seconds);
    kept.insert(at, (step, seconds));
    kept.truncate(LONGEST_KEPT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_is_claimed_only_beyond_the_clocks_error() {
        let e = |at_s: f64, error_s: f64| Entry { at_s, error_s };
        // 32 µs apart with 4 ms of error: no order.
        let v = [e(1.0, 0.0), e(1.000032, 0.004)];
        assert_eq!(last_entry(&v), 1);
        assert!(!arrival_resolved(&v, 1));
        // 32 µs apart with exact clocks (error 0): rank 1 was last.
        let v = [e(1.0, 0.0), e(1.000032, 0.0)];
        assert!(arrival_resolved(&v, 1));
        // Clear of one rank but not of the other: no order.
        let v = [e(1.0, 0.0), e(1.5, 1e-6), e(1.500001, 1e-6)];
        assert_eq!(last_entry(&v), 2);
        assert!(!arrival_resolved(&v, 2));
    }

    #[test]
    fn counts_that_would_wrap_are_refused() {
        let mut sum = 1u64 << 63;
        assert_eq!(add_count(&mut sum, 5, "samples"), Ok(()));
        assert_eq!(sum, (1 << 63) + 5);
        let e = add_count(&mut sum, 1 << 63, "samples of one rank").unwrap_err();
        assert!(
            e.contains("the samples of one rank add up to more than 18446744073709551615"),
            "{e}"
        );
    }
}
