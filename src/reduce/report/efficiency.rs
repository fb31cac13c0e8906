//! Epoch times, and where the efficiency goes (the waterfall).

use super::{pct, verdict, RunReport};
use crate::reduce::analysis::ScalingRow;
use std::fmt::Write;

/// Epoch time per run: measured over full epochs, or projected for runs stopped before
/// one ended (one definition, as summary.csv's `epoch_s`).
pub(super) fn epoch_times(md: &mut String, runs: &[RunReport]) {
    let _ = writeln!(
        md,
        "\n## Epoch time\n\n| run | ranks | batch/rank | epoch s | |\n|---|---:|---:|---:|---|"
    );
    for r in runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {} |",
            r.run_id,
            r.ranks,
            r.batch_per_rank,
            r.epoch_s,
            if r.epoch_s_projected { "projected" } else { "measured" }
        );
    }
    let _ = writeln!(md, "\nA measured epoch time is the median of full epochs (the slowest rank's time); a projected one is steps per epoch × the mean step time, for runs stopped before a full epoch. Speedups come from throughput, which gives the ratio of epoch times for the same data set.");
}

/// The compared points, those with a waterfall.
fn compared(scaling: &[ScalingRow]) -> Vec<&ScalingRow> {
    scaling.iter().filter(|r| r.loss_comm_samples_per_s.is_finite()).collect()
}

/// From ideal to measured throughput, cause by cause, for each compared point; then
/// `sentences`.
pub(super) fn waterfall(md: &mut String, scaling: &[ScalingRow], sentences: &[String]) {
    let multi = compared(scaling);
    if multi.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Where the efficiency goes\n\nFrom ideal throughput (the reference × the rank count) to measured: each cause's share of the extra time per step over the ideal step time. The losses add up to ideal − measured; a negative loss is a gain.\n\n| point | mode | ideal samples/s | − transfer | − data loading | − waiting for a late rank | − other | = measured |\n|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &multi {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            verdict::point_label(&r.run_ids),
            r.scaling_mode,
            r.ideal_samples_per_s,
            r.loss_comm_samples_per_s,
            r.loss_data_samples_per_s,
            r.loss_straggler_samples_per_s,
            r.loss_other_samples_per_s,
            r.samples_per_s
        );
    }
    for s in sentences {
        let _ = writeln!(md, "\n{}", crate::escape::markdown(s));
    }
}

/// Per compared point that lost throughput: how much, and its largest cause.
pub(super) fn waterfall_sentences(scaling: &[ScalingRow]) -> Vec<String> {
    let mut out = Vec::new();
    for r in compared(scaling) {
        let causes = verdict::losses(r);
        let (name, v) = causes.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or(("", 0.0));
        let lost = r.ideal_samples_per_s - r.samples_per_s;
        if lost > 0.0 && v > 0.0 {
            out.push(format!(
                "`{}` ({}) loses {:.1} samples/s ({} of ideal); the largest cause is {name} ({:.1} samples/s).",
                verdict::point_label(&r.run_ids),
                r.scaling_mode,
                lost,
                pct(lost / r.ideal_samples_per_s),
                v
            ));
        }
    }
    out
}
