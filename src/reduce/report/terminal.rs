//! What `ddpbench reduce` prints: the tables, the projection, and where the files went.

use super::projection::print_projection;
use super::{gbs, ms, pct, Report};
use crate::record::Phase;
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use std::path::Path;

/// The tables of `report`, then the files written into `out`.
pub(crate) fn print(report: &Report, out: &Path, plots: bool) {
    print_tables(&report.summary, &report.scaling);
    for line in super::noise::terminal_lines(&report.runs, &report.time_to_accuracy, &report.time_to_accuracy_none) {
        println!("{}", crate::escape::terminal(&line));
    }
    for line in super::target::terminal_lines(&report.targets) {
        println!("{}", crate::escape::terminal(&line));
    }
    let projected = report.projection.as_ref().is_some_and(|p| !p.rows.is_empty());
    if let Some(p) = report.projection.as_ref().filter(|_| projected) {
        print_projection(&p.rows);
        super::recommendation::print(p);
    }
    for line in super::decision::terminal_lines(&report.decisions) {
        println!("{}", crate::escape::terminal(&line));
    }
    let mut names: Vec<&str> = super::files::REPORT_FILES.to_vec();
    if projected {
        names.push(super::files::PROJECTION_FILE);
    }
    if plots {
        names.push("*.svg, *.png");
    }
    println!("\nwrote {}/{{{}}}", out.display(), names.join(", "));
}

/// The width of a column of `names`: the longest, so that no two run ids (repeats that
/// differ only in their last characters) are cut to the same text.
fn width<'a>(names: impl Iterator<Item = &'a str>, title: &str) -> usize {
    names.map(|n| n.chars().count()).chain([title.len()]).max().unwrap_or(0)
}

fn print_tables(summaries: &[TypeSummary], scaling: &[ScalingRow]) {
    let w = width(summaries.iter().map(|s| s.run_id.as_str()), "run");
    println!(
        "{:<w$} {:<28} {:>5} {:>10} {:>9} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9}",
        "run", "node type", "ranks", "steps/rank", "step ms", "p95 ms", "samples/s", "fwd%", "bwd%", "comm%", "busbw GB/s"
    );
    for s in summaries {
        let nt: String = crate::escape::terminal(&s.node_type).chars().take(28).collect();
        let share = |v: f64| if v.is_finite() { format!("{:.0}", v * 100.0) } else { "–".into() };
        println!(
            "{:<w$} {:<28} {:>5} {:>10} {:>9} {:>9} {:>11.1} {:>6} {:>6} {:>7} {:>9}",
            s.run_id,
            nt,
            s.ranks,
            s.rank_steps / s.ranks.max(1) as u64,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            s.samples_per_s,
            share(s.phases[Phase::Forward].share),
            share(s.phases[Phase::Backward].share),
            share(s.phases[Phase::CommExposed].share),
            gbs(s.busbw_bytes_per_s)
        );
    }
    if scaling.iter().any(|r| r.scaling_mode != ScalingMode::Baseline) {
        let points: Vec<String> = scaling.iter().map(|r| r.run_ids.join(" ")).collect();
        let w = width(points.iter().map(String::as_str), "point");
        println!(
            "\n{:<w$} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
            "point", "ranks", "mode", "repeats", "speedup", "interval", "efficiency"
        );
        for (r, run) in scaling.iter().zip(&points) {
            let num = |v: f64| if v.is_finite() { format!("{v:.3}") } else { "-".into() };
            let ci = if r.speedup_low.is_finite() {
                format!("{:.3}-{:.3}", r.speedup_low, r.speedup_high)
            } else {
                "-".into()
            };
            println!(
                "{:<w$} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
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
