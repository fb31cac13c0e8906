//! `scaling.csv`: each run of a workload against its baseline, with the efficiency
//! waterfall that splits the gap between ideal and measured throughput into causes.

use super::{gating_type, RunStats};
use crate::record::{plain_decimal, Phase};
use crate::reduce::metrics;
use crate::stats::{self, bootstrap_means};
use serde::Serialize;

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
            transfer_s: p(Phase::CommExposed) - wait,
            wait_s: wait,
            compute_s: p(Phase::Forward) + p(Phase::Backward) + p(Phase::Optimizer) + p(Phase::Other),
        }
    }
    pub fn total(&self) -> f64 {
        self.data_s + self.transfer_s + self.wait_s + self.compute_s
    }
}

/// One row of scaling.csv: one run against its workload's baseline.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    pub run_id: String,
    pub start_utc: String,
    #[serde(serialize_with = "plain_decimal")]
    pub wall_s: f64,
    pub model: String,
    pub dataset: String,
    pub ranks: usize,
    pub nodes: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    pub node_types: usize,
    pub gating_node_type: String,
    /// weak (per-rank batch as the baseline's), strong (global batch as the baseline's), baseline, or mixed.
    pub scaling_mode: String,
    pub baseline_run_id: String,
    pub steps: u64,
    /// Mean over steps of the ranks' mean step time.
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_mean: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub samples_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub speedup: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub speedup_ci_low: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub speedup_ci_high: f64,
    /// 1 when the 95 % interval of the speedup contains the baseline's 1.0.
    pub within_noise: u8,
    #[serde(serialize_with = "plain_decimal")]
    pub efficiency: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub karp_flatt: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub amdahl_serial_fraction: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub amdahl_speedup: f64,
    /// Baseline throughput times the rank ratio.
    #[serde(serialize_with = "plain_decimal")]
    pub ideal_samples_per_s: f64,
    /// Throughput lost to each cause; the four add up to ideal minus measured.
    #[serde(serialize_with = "plain_decimal")]
    pub loss_comm_samples_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub loss_data_samples_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub loss_straggler_samples_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub loss_other_samples_per_s: f64,
}

/// Throughput of a run ([`metrics::throughput`]): samples per step over the mean step time.
pub fn samples_per_s(run: &RunStats) -> f64 {
    metrics::throughput(run.samples as f64 / run.steps.max(1) as f64, run.job_step.mean())
}

/// Splits the gap between ideal and measured throughput into causes, in proportion
/// to each cause's share of the extra time per step over the ideal step time
/// (the baseline's breakdown scaled by the per-rank batch ratio).
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

/// Scaling rows for the runs of one workload against `base` (an index into `runs`).
pub fn scaling(runs: &[&RunStats], base: usize) -> Vec<ScalingRow> {
    const REPLICATES: usize = 2000;
    let b = runs[base];
    let base_thr = samples_per_s(b);
    let base_breakdown = StepBreakdown::of(b);
    let base_sps = b.samples as f64 / b.steps.max(1) as f64;
    let base_reps = bootstrap_means(&b.job_step_sample.values, b.steps, REPLICATES, 11);
    let p_of = |r: &RunStats| r.manifest.world_size as f64 / b.manifest.world_size as f64;
    let speedups: Vec<(f64, f64)> = runs
        .iter()
        .map(|r| (p_of(r), metrics::speedup(samples_per_s(r), base_thr)))
        .collect();
    let serial = metrics::amdahl_fit(&speedups);
    runs.iter()
        .enumerate()
        .map(|(i, r)| {
            let m = &r.manifest;
            let p = p_of(r);
            let thr = samples_per_s(r);
            let speedup = metrics::speedup(thr, base_thr);
            let mode = if i == base {
                "baseline"
            } else if m.batch_size_per_rank == b.manifest.batch_size_per_rank {
                "weak"
            } else if m.global_batch_size == b.manifest.global_batch_size {
                "strong"
            } else {
                "mixed"
            };
            let (lo, hi) = if i == base {
                (f64::NAN, f64::NAN)
            } else {
                let sps = r.samples as f64 / r.steps.max(1) as f64;
                let reps = bootstrap_means(&r.job_step_sample.values, r.steps, REPLICATES, 17 + i as u64);
                let ratios: Vec<f64> = reps.iter().zip(&base_reps).map(|(t, tb)| (sps / t) / (base_sps / tb)).collect();
                (stats::quantile(&ratios, 0.025), stats::quantile(&ratios, 0.975))
            };
            let ideal = base_thr * p;
            let batch_ratio = m.batch_size_per_rank as f64 / b.manifest.batch_size_per_rank as f64;
            let loss = waterfall(&StepBreakdown::of(r), &base_breakdown, batch_ratio, ideal, thr);
            ScalingRow {
                run_id: m.run_id.clone(),
                start_utc: m.start_utc.clone(),
                wall_s: m.wall_s.unwrap_or(f64::NAN),
                model: m.model.clone(),
                dataset: m.dataset.clone(),
                ranks: m.world_size,
                nodes: m.nodes,
                batch_per_rank: m.batch_size_per_rank,
                global_batch: m.global_batch_size,
                node_types: r.types.len(),
                gating_node_type: gating_type(r).unwrap_or_default(),
                scaling_mode: mode.into(),
                baseline_run_id: b.manifest.run_id.clone(),
                steps: r.steps,
                step_s_mean: r.job_step.mean(),
                samples_per_s: thr,
                speedup,
                speedup_ci_low: lo,
                speedup_ci_high: hi,
                within_noise: u8::from(lo <= 1.0 && 1.0 <= hi),
                efficiency: metrics::efficiency(speedup, p),
                karp_flatt: metrics::karp_flatt(speedup, p),
                amdahl_serial_fraction: serial,
                amdahl_speedup: metrics::amdahl(serial, p),
                ideal_samples_per_s: ideal,
                loss_comm_samples_per_s: loss[0],
                loss_data_samples_per_s: loss[1],
                loss_straggler_samples_per_s: loss[2],
                loss_other_samples_per_s: loss[3],
            }
        })
        .collect()
}
