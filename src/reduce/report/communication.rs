//! Compute against communication per epoch, and the all-reduce's bandwidth against the
//! raw probe of the same buckets.

use super::{gbs, ms};
use crate::record::Phase;
use crate::reduce::analysis::{RunStats, StepBreakdown, TypeSummary};
use crate::reduce::metrics;
use std::fmt::Write;

/// Seconds per epoch of compute and of all-reduce work (hidden, exposed transfer,
/// waiting for a late rank), and R from the transfer alone.
pub fn compute_vs_comm(md: &mut String, runs: &[&RunStats]) {
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The all-reduce work is every bucket's all-reduce; with overlap the part that ran while backward still did, on resources of its own, is hidden (measured by the clocks; none when the all-reduce thread shared backward's cores). Waiting for a late rank is not communication: it is shown apart, and R = (forward + backward) / transfer, the all-reduce work after the last rank entered it.\n\n| run | ranks | batch/rank | compute s/epoch | all-reduce s/epoch | hidden s/epoch | exposed transfer s/epoch | waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut low_r = Vec::new();
    for r in runs {
        let b = StepBreakdown::of(r);
        let spe = r.manifest.steps_per_epoch as f64;
        let (forward, backward) = (r.phase_mean(Phase::Forward), r.phase_mean(Phase::Backward));
        let mean_over = |f: fn(&crate::reduce::analysis::TypeStats) -> &crate::stats::Sketch| {
            let (sum, n) = r.types.iter().fold((0.0, 0u64), |a, t| (a.0 + f(t).sum(), a.1 + f(t).count()));
            if n > 0 {
                sum / n as f64
            } else {
                0.0
            }
        };
        let (work, hidden, transfer) = (mean_over(|t| &t.comm), mean_over(|t| &t.hidden), mean_over(|t| &t.transfer));
        let ratio = metrics::compute_comm_ratio(forward, backward, transfer);
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
            (forward + backward) * spe,
            work * spe,
            hidden * spe,
            b.transfer_s * spe,
            b.wait_s * spe,
            rs
        );
    }
    if low_r.is_empty() {
        let _ = writeln!(
            md,
            "\nEvery multi-rank run computes at least 3× longer than it transfers gradients, so communication is not what limits scaling here."
        );
    } else {
        let _ = writeln!(
            md,
            "\nBelow R ≈ 3 the gradient transfer takes a large share of each step and scaling suffers: {}.",
            low_r.join(", ")
        );
    }
}

/// Bus bandwidth inside training against the raw MPI_Allreduce probe.
pub fn bandwidth(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary]) {
    // Bandwidth.
    let _ = writeln!(md, "\n## All-reduce bandwidth\n\nBus bandwidth as nccl-tests define it: 2(n−1)/n · bytes / time, with time the all-reduce work after the last rank entered it (the straggler wait taken out, whole). The probe is a raw MPI_Allreduce of the same buckets timed in the same run with caches flushed between iterations, since gradients come from memory after backward; the warm-cache probe is the best case.\n\n| run | node type | ranks | bytes/step | transfer ms | busbw GB/s | algbw GB/s | probe busbw GB/s | warm probe GB/s | training / probe |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
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
        let verdict = if hi > 1.1 {
            "above 110 % the probe, not training, is off: a raw all-reduce cannot be slower than the same one inside training, so the probe met a noisy moment (see its spread in manifest.json; run it longer with --probe-iters)"
        } else if lo >= 0.9 {
            "the training loop adds nothing measurable around the transfer"
        } else {
            "below 90 % the training loop adds cost around the transfer (staging copies, contention with compute)"
        };
        let _ = writeln!(
            md,
            "\nInside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth: {verdict}."
        );
    }
}
