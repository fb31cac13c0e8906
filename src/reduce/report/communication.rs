//! Compute against communication per epoch, and the all-reduce's bandwidth against the
//! raw probe of the same buckets.

use super::{gbs, ms, RunReport};
use crate::record::Overlap;
use crate::reduce::analysis::TypeSummary;
use std::fmt::Write;

/// Seconds per epoch of compute, of the all-reduce's transfer (of it hidden behind
/// backward, of it exposed) and, apart, of waiting for a late rank; and R from the
/// transfer alone; then `sentence`.
pub(super) fn compute_vs_comm(md: &mut String, runs: &[RunReport], sentence: &str) {
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The transfer is every bucket's all-reduce after the last rank entered it: the part that ran while backward still did is hidden (measured by the clocks; where the all-reduce thread shared backward's cores, `--overlap force`, it time-sliced with backward there rather than hid), and the part the step waited for after backward is exposed, so hidden + exposed = transfer. Waiting for a late rank is not communication: it is not in the transfer but shown apart (transfer + waiting = the all-reduce's whole time). R = (forward + backward) / transfer.\n\n| run | ranks | batch/rank | compute s/epoch | transfer s/epoch | of it hidden s/epoch | of it exposed s/epoch | waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let e = &r.per_epoch;
        let num = |v: f64| if v.is_finite() { format!("{v:.2}") } else { String::new() };
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
    let _ = writeln!(md, "\n{}", crate::escape::markdown(sentence));
}

/// What R is and is not (no limit on efficiency: the optimizer, data and other phases are
/// outside it), which runs have none and why: 1-rank runs, and runs whose all-reduce
/// thread shared backward's cores. Which loss is largest is the waterfall's to say.
pub(super) fn compute_vs_comm_sentence(runs: &[RunReport]) -> String {
    let mut s = String::new();
    if runs.iter().any(|r| r.per_epoch.compute_comm_ratio.is_finite()) {
        s.push_str(
            "R says how many times the transfer the forward and backward passes take; it is no limit on efficiency by itself \
             (the optimizer, data loading and other work are outside it). The limit the transfer alone sets without overlap, \
             T1/(T1 + transfer) with T1 the measured 1-rank step, is in each compared point's verdict; which loss is largest \
             is measured in the waterfall below.",
        );
    }
    let forced: Vec<&str> = runs
        .iter()
        .filter(|r| r.ranks > 1 && r.comparison_key.as_ref().is_some_and(|k| k.overlap == Overlap::Force))
        .map(|r| r.run_id.as_str())
        .collect();
    let mut add = |t: &str| {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(t);
    };
    if !forced.is_empty() {
        add(&format!(
            "{} ran with --overlap force: the all-reduce thread shared backward's cores, so its time-sliced work is inside \
             backward and in the transfer both, and R, which would count it twice, is not defined.",
            forced.join(", ")
        ));
    }
    if runs.iter().any(|r| r.ranks == 1) {
        add("A 1-rank run all-reduces with nobody (its all-reduce is a local copy): it has no bytes on a wire, no R and no arrival order, so those cells are empty.");
    }
    s
}

/// Bus bandwidth inside training against the raw MPI_Allreduce probe; then `sentence`.
pub(super) fn bandwidth(md: &mut String, runs: &[RunReport], summaries: &[TypeSummary], sentence: &str) {
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
            crate::escape::markdown(&s.node_type),
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
    let _ = writeln!(md, "\n{}", crate::escape::markdown(sentence));
}

/// How training's bus bandwidth compares with the probe's (each run's probe in its wire
/// dtype), and for each end of the range, the run there and what its columns show.
pub(super) fn bandwidth_sentence(summaries: &[TypeSummary]) -> String {
    let compared: Vec<&TypeSummary> = summaries.iter().filter(|s| s.busbw_vs_probe.is_finite()).collect();
    let unlike: Vec<&str> = summaries
        .iter()
        .filter(|s| s.busbw_bytes_per_s.is_finite() && s.probe_busbw_bytes_per_s.is_finite() && !s.busbw_vs_probe.is_finite())
        .map(|s| s.run_id.as_str())
        .collect();
    let mut out = String::new();
    let lo = compared.iter().min_by(|a, b| a.busbw_vs_probe.total_cmp(&b.busbw_vs_probe));
    let hi = compared.iter().max_by(|a, b| a.busbw_vs_probe.total_cmp(&b.busbw_vs_probe));
    match (lo, hi) {
        (Some(lo), Some(hi)) => {
            let (l, h) = (lo.busbw_vs_probe, hi.busbw_vs_probe);
            let range = if (h - l) * 100.0 < 0.5 {
                format!("{:.0} %", l * 100.0)
            } else {
                format!("{:.0}–{:.0} %", l * 100.0, h * 100.0)
            };
            out.push_str(&format!(
                "Inside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth, each run's probe \
                 in the dtype its gradients travel in."
            ));
            if std::ptr::eq(*lo, *hi) {
                out.push_str(&format!(" {}", end_sentence(None, lo)));
            } else {
                out.push_str(&format!(" {} {}", end_sentence(Some("low"), lo), end_sentence(Some("high"), hi)));
            }
        }
        _ if summaries.iter().any(|s| s.busbw_bytes_per_s.is_finite()) && unlike.is_empty() => {
            out.push_str("No multi-rank run has a probe to compare its all-reduce with (it ran with --probe-iters 0).");
        }
        _ if unlike.is_empty() => out.push_str("No multi-rank run: nothing was all-reduced."),
        _ => {}
    }
    if !unlike.is_empty() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&format!(
            "{} probed the all-reduce in another dtype than its gradients travel in (probes before the probe followed \
             --grad-dtype ran in fp32): bytes of one size at another element type are no comparison, so training / probe \
             is left empty there.",
            unlike.join(", ")
        ));
    }
    out
}

/// What one end of the range (`which`: "low" or "high"; None: the one run) shows: above
/// 110 % the probe is off; below 90 %, what ran during backward where a column shows it,
/// else that none does and how to tell the causes apart; between, nothing measurable.
fn end_sentence(which: Option<&str>, s: &TypeSummary) -> String {
    let ratio = s.busbw_vs_probe;
    let head = match which {
        Some(w) => format!("At the {w} end, `{}` ({:.0} %):", s.run_id, ratio * 100.0),
        None => format!("`{}` ({:.0} %):", s.run_id, ratio * 100.0),
    };
    let what = if ratio > 1.1 {
        "above 110 % the probe, not training, is off: a raw all-reduce cannot be slower than the same one inside \
         training, so the probe met a noisy moment (see its spread in manifest.json; run it longer with --probe-iters)."
            .to_string()
    } else if ratio >= 0.9 {
        "the training loop adds nothing measurable around the transfer.".to_string()
    } else if s.comm_hidden_s_mean > 0.0 {
        format!(
            "below 90 %, part of the all-reduce ran while backward did ({} ms per step of comm_hidden_s), where it competes \
             with compute for cores and memory; a run with --overlap off separates that from the rest of the gap.",
            ms(s.comm_hidden_s_mean)
        )
    } else {
        format!(
            "below 90 % training is slower than the probe, and none of its columns shows why (nothing ran during \
             backward). To separate the causes: compare the warm-cache probe ({} against {} GB/s cold: cache misses), \
             the rank files' comm_stage_d2h_s and comm_stage_h2d_s (staging copies), and the probe's spread in \
             manifest.json (its own noise; --probe-iters).",
            gbs(s.probe_warm_busbw_bytes_per_s),
            gbs(s.probe_busbw_bytes_per_s)
        )
    };
    format!("{head} {what}")
}
