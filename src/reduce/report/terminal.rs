//! What `ddpbench reduce` prints: the tables, the projection, and where the files went.

use super::projection::print_projection;
use super::{gbs, ms, pct, Report};
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use std::path::Path;

/// The tables of `report`, then the files written into `out`.
pub fn print(report: &Report, out: &Path, plots: bool) {
    print_tables(&report.summary, &report.scaling);
    let projected = report.projection.as_ref().is_some_and(|p| !p.rows.is_empty());
    if let Some(p) = report.projection.as_ref().filter(|_| projected) {
        print_projection(&p.rows);
    }
    println!(
        "\nwrote {}/{{summary.csv, scaling.csv, ranks.csv, report.md, report.json{}{}}}",
        out.display(),
        if projected { ", projection.csv" } else { "" },
        if plots { ", *.svg, *.png" } else { "" }
    );
}

fn print_tables(summaries: &[TypeSummary], scaling: &[ScalingRow]) {
    println!(
        "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9}",
        "run", "node type", "ranks", "steps", "step ms", "p95 ms", "samples/s", "fwd%", "bwd%", "comm%", "busbw GB/s"
    );
    for s in summaries {
        let nt: String = s.node_type.chars().take(28).collect();
        let run: String = s.run_id.chars().take(34).collect();
        let share = |v: f64| if v.is_finite() { format!("{:.0}", v * 100.0) } else { "–".into() };
        println!(
            "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11.1} {:>6} {:>6} {:>7} {:>9}",
            run,
            nt,
            s.ranks,
            s.rank_steps,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            s.samples_per_s,
            share(s.forward_share),
            share(s.backward_share),
            share(s.comm_exposed_share),
            gbs(s.busbw_bytes_per_s)
        );
    }
    if scaling.iter().any(|r| r.scaling_mode != ScalingMode::Baseline) {
        println!(
            "\n{:<34} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
            "point", "ranks", "mode", "repeats", "speedup", "interval", "efficiency"
        );
        for r in scaling {
            let run: String = r.run_ids.join(" ").chars().take(34).collect();
            let num = |v: f64| if v.is_finite() { format!("{v:.3}") } else { "-".into() };
            let ci = if r.speedup_low.is_finite() {
                format!("{:.3}-{:.3}", r.speedup_low, r.speedup_high)
            } else {
                "-".into()
            };
            println!(
                "{:<34} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
                run,
                r.ranks,
                r.scaling_mode.to_string(),
                r.repeats,
                num(r.speedup),
                ci,
                pct(r.efficiency)
            );
        }
    }
}
