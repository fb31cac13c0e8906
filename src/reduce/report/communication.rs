//! Compute against communication per epoch, and the all-reduce's bandwidth against the
//! raw probe of the same buckets.

use super::{gbs, ms, pct, RunReport};
use crate::reduce::analysis::TypeSummary;
use std::fmt::Write;

/// Seconds per epoch of compute, of the all-reduce's transfer (of it hidden behind
/// backward, of it exposed) and, apart, of waiting for a late rank; and R from the
/// transfer alone; then `sentence`.
pub fn compute_vs_comm(md: &mut String, runs: &[RunReport], sentence: &str) {
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The transfer is every bucket's all-reduce after the last rank entered it; with overlap the part that ran while backward still did, on resources of its own, is hidden (measured by the clocks; none when the all-reduce thread shared backward's cores), and the part the step waited for after backward is exposed. Waiting for a late rank is not communication: it is not in the transfer but shown apart (transfer + waiting = the all-reduce's whole time). R = (forward + backward) / transfer.\n\n| run | ranks | batch/rank | compute s/epoch | transfer s/epoch | of it hidden s/epoch | of it exposed s/epoch | waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let e = &r.per_epoch;
        let num = |v: f64| {
            if v.is_finite() && r.ranks > 1 {
                format!("{v:.2}")
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} | {} |",
            r.run_id,
            r.ranks,
            r.batch_per_rank,
            e.compute_s,
            num(e.comm_transfer_s),
            num(e.comm_hidden_s),
            num(e.comm_exposed_transfer_s),
            num(e.comm_wait_s),
            num(e.compute_comm_ratio)
        );
    }
    let _ = writeln!(md, "\n{sentence}");
}

/// What R implies for each multi-rank run (without overlap, efficiency ≤ R/(R+1)), and,
/// once, why 1-rank runs have no communication figures. Which loss is largest is the
/// waterfall's to say, not R's.
pub fn compute_vs_comm_sentence(runs: &[RunReport]) -> String {
    let caps: Vec<String> = runs
        .iter()
        .filter(|r| r.ranks > 1 && r.per_epoch.compute_comm_ratio.is_finite())
        .map(|r| {
            let q = r.per_epoch.compute_comm_ratio;
            format!("{} (R = {q:.2}: ≤ {})", r.run_id, pct(q / (q + 1.0)))
        })
        .collect();
    let mut s = String::new();
    if !caps.is_empty() {
        s.push_str(&format!(
            "Without overlap, transfer alone caps efficiency at R/(R+1): {}. Which loss is largest is measured in the waterfall below and said in each workload's verdict.",
            caps.join(", ")
        ));
    }
    if runs.iter().any(|r| r.ranks == 1) {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str("A 1-rank run all-reduces with nobody (its all-reduce is a local copy): it has no bytes on a wire, no R and no arrival order, so those cells are empty.");
    }
    s
}

/// Bus bandwidth inside training against the raw MPI_Allreduce probe; then `sentence`.
pub fn bandwidth(md: &mut String, runs: &[RunReport], summaries: &[TypeSummary], sentence: &str) {
    let _ = writeln!(md, "\n## All-reduce bandwidth\n\nBus bandwidth as nccl-tests define it: 2(n−1)/n · bytes / time, with time the all-reduce work after the last rank entered it (the straggler wait taken out, whole). The probe is a raw MPI_Allreduce of the same buckets timed in the same run with caches flushed between iterations, since gradients come from memory after backward; the warm-cache probe is the best case.\n\n| run | node type | ranks | bytes/step | transfer ms | busbw GB/s | algbw GB/s | probe busbw GB/s | warm probe GB/s | training / probe |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries.iter().filter(|s| s.busbw_bytes_per_s.is_finite()) {
        let bytes = runs
            .iter()
            .find(|r| r.run_id == s.run_id)
            .and_then(|r| r.bytes_per_step)
            .map_or(String::new(), |b| b.to_string());
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
    // A cause is named only where a column shows it: all-reduce work that ran while
    // backward did (comm_hidden_s) competes with compute for cores and memory.
    let slow_hidden = summaries.iter().any(|s| s.busbw_vs_probe < 0.9 && s.comm_hidden_s_mean > 0.0);
    let verdict = if hi > 1.1 {
        "above 110 % the probe, not training, is off: a raw all-reduce cannot be slower than the same one inside training, so the probe met a noisy moment (see its spread in manifest.json; run it longer with --probe-iters)"
    } else if lo >= 0.9 {
        "the training loop adds nothing measurable around the transfer"
    } else if slow_hidden {
        "below 90 %, part of the all-reduce ran while backward did (comm_hidden_s > 0), where it competes with compute for cores and memory; a run with --overlap off separates that from the rest of the gap"
    } else {
        "below 90 % training is slower than the probe, and none of its columns shows why (nothing ran during backward). To separate the causes: compare the warm-cache probe (cache misses), the rank files' comm_stage_d2h_s and comm_stage_h2d_s (staging copies), and the probe's spread in manifest.json (its own noise; --probe-iters)"
    };
    format!("Inside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth: {verdict}.")
}
