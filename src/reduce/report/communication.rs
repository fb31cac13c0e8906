//! Compute against communication per epoch, and the all-reduce's bandwidth against the
//! raw probe of the same buckets.

use super::{gbs, ms, RunReport};
use crate::reduce::analysis::TypeSummary;
use std::fmt::Write;

/// Seconds per epoch of compute and of all-reduce work (hidden, exposed transfer,
/// waiting for a late rank), and R from the transfer alone; then `sentence`.
pub fn compute_vs_comm(md: &mut String, runs: &[RunReport], sentence: &str) {
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The all-reduce work is every bucket's all-reduce; with overlap the part that ran while backward still did, on resources of its own, is hidden (measured by the clocks; none when the all-reduce thread shared backward's cores). Waiting for a late rank is not communication: it is shown apart, and R = (forward + backward) / transfer, the all-reduce work after the last rank entered it.\n\n| run | ranks | batch/rank | compute s/epoch | all-reduce s/epoch | hidden s/epoch | exposed transfer s/epoch | waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let e = &r.per_epoch;
        let ratio = e.compute_comm_ratio;
        let rs = if ratio.is_finite() { format!("{ratio:.2}") } else { "–".into() };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            r.run_id, r.ranks, r.batch_per_rank, e.compute_s, e.comm_s, e.comm_hidden_s, e.comm_exposed_transfer_s, e.comm_wait_s, rs
        );
    }
    let _ = writeln!(md, "\n{sentence}");
}

/// Whether communication limits scaling: the multi-rank runs with R below 3.
pub fn compute_vs_comm_sentence(runs: &[RunReport]) -> String {
    let low_r: Vec<String> = runs
        .iter()
        .filter(|r| r.per_epoch.compute_comm_ratio < 3.0 && r.ranks > 1)
        .map(|r| format!("{} (R = {:.2})", r.run_id, r.per_epoch.compute_comm_ratio))
        .collect();
    if low_r.is_empty() {
        "Every multi-rank run computes at least 3× longer than it transfers gradients, so communication is not what limits scaling here."
            .into()
    } else {
        format!(
            "Below R ≈ 3 the gradient transfer takes a large share of each step and scaling suffers: {}.",
            low_r.join(", ")
        )
    }
}

/// Bus bandwidth inside training against the raw MPI_Allreduce probe; then `sentence`.
pub fn bandwidth(md: &mut String, runs: &[RunReport], summaries: &[TypeSummary], sentence: &str) {
    let _ = writeln!(md, "\n## All-reduce bandwidth\n\nBus bandwidth as nccl-tests define it: 2(n−1)/n · bytes / time, with time the all-reduce work after the last rank entered it (the straggler wait taken out, whole). The probe is a raw MPI_Allreduce of the same buckets timed in the same run with caches flushed between iterations, since gradients come from memory after backward; the warm-cache probe is the best case.\n\n| run | node type | ranks | bytes/step | transfer ms | busbw GB/s | algbw GB/s | probe busbw GB/s | warm probe GB/s | training / probe |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries.iter().filter(|s| s.busbw_bytes_per_s.is_finite()) {
        let bytes = runs.iter().find(|r| r.run_id == s.run_id).map(|r| r.bytes_per_step).unwrap_or(0);
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
    let _ = writeln!(md, "\n{sentence}");
}

/// How training's bus bandwidth compares with the probe's, and what that says.
pub fn bandwidth_sentence(summaries: &[TypeSummary]) -> String {
    let ratios: Vec<f64> = summaries.iter().map(|s| s.busbw_vs_probe).filter(|v| v.is_finite()).collect();
    if ratios.is_empty() {
        return "No multi-rank run: nothing was all-reduced.".into();
    }
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
    format!("Inside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth: {verdict}.")
}
