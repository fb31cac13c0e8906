//! Epoch times against the baseline, and where the efficiency goes (the waterfall).

use super::{epoch_time, pct};
use crate::reduce::analysis::{RunStats, ScalingRow};
use std::fmt::Write;

/// Epoch time per run (measured, or projected for partial epochs), with speedup and efficiency.
pub fn epoch_times(md: &mut String, runs: &[&RunStats], scaling: &[ScalingRow]) {
    // 1-rank vs N-rank epoch time.
    let _ = writeln!(
        md,
        "\n## Epoch time: baseline vs N ranks\n\n| run | ranks | epoch s | speedup | efficiency |\n|---|---:|---:|---:|---:|"
    );
    for r in scaling {
        if let Some(run) = runs.iter().find(|x| x.manifest.run_id == r.run_id) {
            let (t, measured) = epoch_time(run);
            let _ = writeln!(
                md,
                "| {} | {} | {:.2}{} | {:.2} | {} |",
                r.run_id,
                r.ranks,
                t,
                if measured { "" } else { " (projected)" },
                r.speedup,
                pct(r.efficiency)
            );
        }
    }
    let _ = writeln!(md, "\nEpoch times marked projected are steps per epoch × the mean step time, for runs stopped before a full epoch. Speedup and efficiency come from throughput, which equals the ratio of epoch times for the same data set.");
}

/// From ideal to measured throughput, cause by cause.
pub fn waterfall(md: &mut String, scaling: &[ScalingRow]) {
    // Waterfall.
    let multi: Vec<&ScalingRow> = scaling.iter().filter(|r| r.scaling_mode != "baseline").collect();
    if !multi.is_empty() {
        let _ = writeln!(md, "\n## Where the efficiency goes\n\nFrom ideal throughput (baseline × rank ratio) to measured: each cause's share of the extra time per step over the ideal step time. The losses add up to ideal − measured; a negative loss is a gain.\n\n| run | ideal samples/s | − comm | − data loading | − stragglers | − other | = measured |\n|---|---:|---:|---:|---:|---:|---:|");
        for r in &multi {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                r.run_id,
                r.ideal_samples_per_s,
                r.loss_comm_samples_per_s,
                r.loss_data_samples_per_s,
                r.loss_straggler_samples_per_s,
                r.loss_other_samples_per_s,
                r.samples_per_s
            );
        }
        for r in &multi {
            let causes = [
                ("communication", r.loss_comm_samples_per_s),
                ("data loading", r.loss_data_samples_per_s),
                ("waiting for stragglers", r.loss_straggler_samples_per_s),
                ("other (compute slower than alone, contention)", r.loss_other_samples_per_s),
            ];
            let (name, v) = causes.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            let lost = r.ideal_samples_per_s - r.samples_per_s;
            if lost > 0.0 && v > 0.0 {
                let _ = writeln!(
                    md,
                    "\n`{}` loses {:.1} samples/s ({} of ideal); the largest cause is {name} ({:.1} samples/s).",
                    r.run_id,
                    lost,
                    pct(lost / r.ideal_samples_per_s),
                    v
                );
            }
        }
    }
}
