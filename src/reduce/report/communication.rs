//! Compute against communication per epoch, and the all-reduce's bandwidth against the
//! raw probe of the same buckets.

use super::{gbs, ms};
use crate::record::Phase;
use crate::reduce::analysis::{RunStats, StepBreakdown, TypeSummary};
use crate::reduce::metrics;
use std::fmt::Write;

/// Seconds per epoch of compute and of all-reduce work (hidden, exposed, waiting), and R.
pub fn compute_vs_comm(md: &mut String, runs: &[&RunStats]) {
    // Compute vs communication per epoch.
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The all-reduce work is every bucket's all-reduce; with `--overlap on` part of it runs behind backward (hidden) and only the rest holds the step up. R = (forward + backward) / all-reduce work.\n\n| run | ranks | batch/rank | compute s/epoch | all-reduce s/epoch | hidden s/epoch | exposed s/epoch | of which waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut low_r = Vec::new();
    for r in runs {
        let b = StepBreakdown::of(r);
        let spe = r.manifest.steps_per_epoch as f64;
        let (forward, backward) = (r.phase_mean(Phase::Forward), r.phase_mean(Phase::Backward));
        let fb = forward + backward;
        let comm = b.transfer_s + b.wait_s;
        let (work_sum, work_n) = r.types.iter().fold((0.0, 0u64), |a, t| (a.0 + t.comm.sum(), a.1 + t.comm.count()));
        let work = if work_n > 0 { work_sum / work_n as f64 } else { comm };
        let ratio = metrics::compute_comm_ratio(forward, backward, work);
        if ratio < 3.0 && r.manifest.world_size > 1 {
            low_r.push(format!("{} (R = {:.2})", r.manifest.run_id, ratio));
        }
        let rs = if ratio.is_finite() { format!("{ratio:.2}") } else { "–".into() };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            r.manifest.run_id,
            r.manifest.world_size,
            r.manifest.batch_size_per_rank,
            fb * spe,
            work * spe,
            (work - comm).max(0.0) * spe,
            comm * spe,
            b.wait_s * spe,
            rs
        );
    }
    if low_r.is_empty() {
        let _ = writeln!(
            md,
            "\nEvery multi-rank run computes at least 3× longer than it communicates, so communication is not what limits scaling here."
        );
    } else {
        let _ = writeln!(
            md,
            "\nBelow R ≈ 3 communication takes a large share of each step and scaling suffers: {}.",
            low_r.join(", ")
        );
    }
}

/// Bus bandwidth inside training against the raw MPI_Allreduce probe.
pub fn bandwidth(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary]) {
    // Bandwidth.
    let _ = writeln!(md, "\n## All-reduce bandwidth\n\nBus bandwidth as nccl-tests define it: 2(n−1)/n · bytes / time, with time the all-reduce after the last rank entered it. The probe is a raw MPI_Allreduce of the same buckets timed in the same run with caches flushed between iterations, since gradients come from memory after backward; the warm-cache probe is the best case.\n\n| run | node type | ranks | bytes/step | transfer ms | busbw GB/s | algbw GB/s | probe busbw GB/s | warm probe GB/s | training / probe |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries.iter().filter(|s| s.busbw_bytes_per_s.is_finite()) {
        let bytes = runs
            .iter()
            .find(|r| r.manifest.run_id == s.run_id)
            .map(|r| r.bytes_per_step)
            .unwrap_or(0);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            s.node_type,
            s.ranks,
            bytes,
            ms(s.comm_transfer_s_median),
            gbs(s.busbw_bytes_per_s),
            gbs(s.algbw_bytes_per_s),
            gbs(s.probe_busbw_bytes_per_s),
            gbs(s.probe_warm_busbw_bytes_per_s),
            if s.busbw_vs_probe.is_finite() {
                format!("{:.2}", s.busbw_vs_probe)
            } else {
                "–".into()
            }
        );
    }
    let ratios: Vec<f64> = summaries.iter().map(|s| s.busbw_vs_probe).filter(|v| v.is_finite()).collect();
    if ratios.is_empty() {
        let _ = writeln!(md, "\nNo multi-rank run: nothing was all-reduced.");
    } else {
        let (lo, hi) = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        );
        let range = if (hi - lo) * 100.0 < 0.5 {
            format!("{:.0} %", lo * 100.0)
        } else {
            format!("{:.0}–{:.0} %", lo * 100.0, hi * 100.0)
        };
        let verdict = if lo >= 0.9 {
            "the training loop adds nothing measurable around the transfer"
        } else {
            "below 90 % the training loop adds cost around the transfer (staging copies, contention with compute, arrival skew)"
        };
        let _ = writeln!(
            md,
            "\nInside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth: {verdict}."
        );
    }
}
