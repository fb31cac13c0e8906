//! Figures computed from [`RunStats`]: per node type (phases, R, bandwidth,
//! stragglers), per rank, and across runs of one workload (speedup, efficiency,
//! Karp–Flatt, Amdahl, bootstrap intervals, the efficiency waterfall).

use super::read::{RunStats, COMM};
use crate::comm::allreduce_busbw;
use crate::record::plain_decimal;
use crate::stats::{self, amdahl, amdahl_fit, bootstrap_means, karp_flatt};
use serde::Serialize;
use std::collections::BTreeSet;

/// One row of summary.csv: one node type of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TypeSummary {
    pub run_id: String,
    pub model: String,
    pub dataset: String,
    pub node_type: String,
    pub ranks: usize,
    pub nodes: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    /// Steps counted over all ranks of this type (warm-up excluded).
    pub steps: u64,
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_p95: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_max: f64,
    /// Samples per second of all ranks of this type together.
    #[serde(serialize_with = "plain_decimal")]
    pub samples_per_s: f64,
    /// Median of the run's epoch times (epochs.csv), empty when none finished.
    #[serde(serialize_with = "plain_decimal")]
    pub epoch_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub data_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub data_share: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub forward_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub forward_share: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub backward_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub backward_share: f64,
    /// The communication phase: waiting for the all-reduce after backward (comm_exposed_s).
    #[serde(serialize_with = "plain_decimal")]
    pub comm_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub comm_share: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub optimizer_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub optimizer_share: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub other_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub other_share: f64,
    /// All of the all-reduce work per step (comm_s), hidden behind backward or not.
    #[serde(serialize_with = "plain_decimal")]
    pub comm_total_s_median: f64,
    /// R = (forward + backward) / all-reduce work, from mean times.
    #[serde(serialize_with = "plain_decimal")]
    pub compute_comm_ratio: f64,
    /// Communication not hidden behind compute (all of it while nothing overlaps), mean per step,
    /// without the wait for the last rank.
    #[serde(serialize_with = "plain_decimal")]
    pub exposed_comm_s_mean: f64,
    /// Mean time a rank of this type waited in the all-reduce for the last rank to enter.
    #[serde(serialize_with = "plain_decimal")]
    pub wait_s_mean: f64,
    /// Median time of the transfer (comm_s minus the wait).
    #[serde(serialize_with = "plain_decimal")]
    pub transfer_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub busbw_bytes_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub algbw_bytes_per_s: f64,
    /// Bus bandwidth of the raw MPI_Allreduce probe of the same buckets in the same run,
    /// caches flushed between iterations (gradients come from memory after backward).
    #[serde(serialize_with = "plain_decimal")]
    pub probe_busbw_bytes_per_s: f64,
    /// The same probe with warm caches (the best case).
    #[serde(serialize_with = "plain_decimal")]
    pub probe_warm_busbw_bytes_per_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub busbw_vs_probe: f64,
    /// Share of steps in which a rank of this type was the last to enter the all-reduce.
    #[serde(serialize_with = "plain_decimal")]
    pub last_arrival_share: f64,
    /// 1 for the node type that gates the job (its ranks arrive last most often).
    pub gating: u8,
    /// Mean GPU utilisation over the telemetry samples of this type's ranks (empty without).
    #[serde(serialize_with = "plain_decimal")]
    pub gpu_util_pct_mean: f64,
    /// Peak GPU memory used by a rank of this type.
    #[serde(serialize_with = "plain_decimal")]
    pub gpu_mem_used_max_bytes: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub gpu_power_w_mean: f64,
}

/// The node type whose ranks were last into the all-reduce most often (ties: the
/// slower median step). A run of one node type returns that type; None without types.
pub fn gating_type(run: &RunStats) -> Option<String> {
    run.types
        .iter()
        .max_by(|a, b| {
            a.last_arrivals
                .cmp(&b.last_arrivals)
                .then(a.step.median().total_cmp(&b.step.median()))
        })
        .map(|t| t.node_type.clone())
}

pub fn type_summaries(run: &RunStats) -> Vec<TypeSummary> {
    let m = &run.manifest;
    let gating = gating_type(run);
    let epoch_s = stats::median(&run.epochs.iter().map(|e| e.epoch_s).collect::<Vec<_>>());
    let probe = m.allreduce_probe.as_ref().map(|p| p.busbw_bytes_per_s).unwrap_or(f64::NAN);
    let probe_warm = m.allreduce_probe_warm.as_ref().map(|p| p.busbw_bytes_per_s).unwrap_or(f64::NAN);
    let n = m.world_size;
    run.types
        .iter()
        .map(|t| {
            let med: Vec<f64> = t.phase.iter().map(|s| s.median()).collect();
            let mean: Vec<f64> = t.phase.iter().map(|s| s.mean()).collect();
            let step_median = t.step.median();
            let share = |v: f64| if step_median > 0.0 { v / step_median } else { f64::NAN };
            let ranks: Vec<_> = run.ranks.iter().filter(|r| r.node_type == t.node_type).collect();
            let samples_per_s: f64 = ranks
                .iter()
                .map(|r| if r.step.sum() > 0.0 { r.samples as f64 / r.step.sum() } else { 0.0 })
                .sum();
            let nodes = ranks.iter().map(|r| r.host.as_str()).collect::<BTreeSet<_>>().len();
            let transfer = t.transfer.median();
            let bytes = run.bytes_per_step as f64;
            let busbw = if n > 1 { allreduce_busbw(bytes, n, transfer) } else { f64::NAN };
            TypeSummary {
                run_id: m.run_id.clone(),
                model: m.model.clone(),
                dataset: m.dataset.clone(),
                node_type: t.node_type.clone(),
                ranks: t.ranks.len(),
                nodes,
                batch_per_rank: m.batch_size_per_rank,
                global_batch: m.global_batch_size,
                steps: t.step.count(),
                step_s_median: step_median,
                step_s_p95: t.step.quantile(0.95),
                step_s_max: t.step.max(),
                samples_per_s,
                epoch_s_median: epoch_s,
                data_s_median: med[0],
                data_share: share(med[0]),
                forward_s_median: med[1],
                forward_share: share(med[1]),
                backward_s_median: med[2],
                backward_share: share(med[2]),
                comm_s_median: med[3],
                comm_share: share(med[3]),
                optimizer_s_median: med[4],
                optimizer_share: share(med[4]),
                other_s_median: med[5],
                other_share: share(med[5]),
                comm_total_s_median: t.comm_total.median(),
                compute_comm_ratio: if t.comm_total.mean() > 0.0 {
                    (mean[1] + mean[2]) / t.comm_total.mean()
                } else {
                    f64::NAN
                },
                exposed_comm_s_mean: (mean[COMM] - t.wait.mean()).max(0.0),
                wait_s_mean: t.wait.mean(),
                transfer_s_median: transfer,
                busbw_bytes_per_s: busbw,
                algbw_bytes_per_s: if n > 1 && transfer > 0.0 { bytes / transfer } else { f64::NAN },
                probe_busbw_bytes_per_s: probe,
                probe_warm_busbw_bytes_per_s: probe_warm,
                busbw_vs_probe: busbw / probe,
                last_arrival_share: t.last_arrivals as f64 / run.steps.max(1) as f64,
                gating: u8::from(n > 1 && gating.as_deref() == Some(t.node_type.as_str())),
                gpu_util_pct_mean: t.gpu.util_pct_mean(),
                gpu_mem_used_max_bytes: t.gpu.mem_used_max_bytes.map_or(f64::NAN, |b| b as f64),
                gpu_power_w_mean: t.gpu.power_w_mean(),
            }
        })
        .collect()
}

/// One row of ranks.csv.
#[derive(Debug, Clone, Serialize)]
pub struct RankSummary {
    pub run_id: String,
    pub rank: usize,
    pub node_type: String,
    pub host: String,
    pub steps: u64,
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_median: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub step_s_p95: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub wait_s_mean: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub last_arrival_share: f64,
}

pub fn rank_summaries(run: &RunStats) -> Vec<RankSummary> {
    run.ranks
        .iter()
        .map(|r| RankSummary {
            run_id: run.manifest.run_id.clone(),
            rank: r.rank,
            node_type: r.node_type.clone(),
            host: r.host.clone(),
            steps: r.steps,
            step_s_median: r.step.median(),
            step_s_p95: r.step.quantile(0.95),
            wait_s_mean: r.wait_sum / r.steps.max(1) as f64,
            last_arrival_share: r.last_arrivals as f64 / run.steps.max(1) as f64,
        })
        .collect()
}

/// Mean seconds per step of each cause, averaged over ranks: the step splits exactly
/// into data + (transfer + wait) + compute (forward, backward, optimizer, other).
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
        let sum = |k: usize| run.ranks.iter().map(|r| r.phase_sum[k]).sum::<f64>() / n;
        let wait = run.ranks.iter().map(|r| r.wait_sum).sum::<f64>() / n;
        StepBreakdown {
            data_s: sum(0),
            transfer_s: sum(COMM) - wait,
            wait_s: wait,
            compute_s: sum(1) + sum(2) + sum(4) + sum(5),
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

/// Throughput of a run: samples per step over the mean step time.
pub fn samples_per_s(run: &RunStats) -> f64 {
    let per_step = run.samples as f64 / run.steps.max(1) as f64;
    per_step / run.job_step.mean()
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
    let speedups: Vec<(f64, f64)> = runs.iter().map(|r| (p_of(r), samples_per_s(r) / base_thr)).collect();
    let serial = amdahl_fit(&speedups);
    runs.iter()
        .enumerate()
        .map(|(i, r)| {
            let m = &r.manifest;
            let p = p_of(r);
            let thr = samples_per_s(r);
            let speedup = thr / base_thr;
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
                efficiency: speedup / p,
                karp_flatt: karp_flatt(speedup, p),
                amdahl_serial_fraction: serial,
                amdahl_speedup: amdahl(serial, p),
                ideal_samples_per_s: ideal,
                loss_comm_samples_per_s: loss[0],
                loss_data_samples_per_s: loss[1],
                loss_straggler_samples_per_s: loss[2],
                loss_other_samples_per_s: loss[3],
            }
        })
        .collect()
}
