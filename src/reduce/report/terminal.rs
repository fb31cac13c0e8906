//! What `ddpbench reduce` prints: the tables, the projection, and where the files went.

use super::projection::print_projection;
use super::sections::Section;
use super::{gbs, ms, pct, Report};
use crate::record::Phase;
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use std::path::Path;

/// report.md's sections in their order ([`Section::ALL`]) as the terminal has them, the
/// projection after them, and the decision last, right above where the files went: what
/// a person sees when `reduce` returns is the end of its output.
pub(crate) fn print(report: &Report, out: &Path, plots: bool) {
    for s in Section::ALL.into_iter().filter(|s| *s != Section::Decision) {
        for line in section_lines(s, report) {
            println!("{line}");
        }
    }
    let projected = report.projection.as_ref().is_some_and(|p| !p.rows.is_empty());
    if let Some(p) = report.projection.as_ref().filter(|_| projected) {
        print_projection(&p.rows);
        super::recommendation::print(p);
    }
    for line in section_lines(Section::Decision, report) {
        println!("{line}");
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

/// What the terminal prints of a section, each line escaped for it. One match with no
/// catch-all: a new section does not compile until it says what the terminal shows of
/// it. The terminal keeps to the tables, the noise and target lines and the decision;
/// the rest is in report.md and report.html, which the last line names.
fn section_lines(s: Section, report: &Report) -> Vec<String> {
    let escaped = |lines: Vec<String>| lines.iter().map(|l| crate::escape::terminal(l).into_owned()).collect();
    match s {
        Section::Decision => escaped(super::decision::terminal_lines(&report.decisions)),
        Section::Runs => summary_lines(&report.summary),
        Section::PerWorkload => scaling_lines(&report.scaling),
        Section::NoiseScale => escaped(super::noise::terminal_lines(
            &report.runs,
            &report.time_to_accuracy,
            &report.time_to_accuracy_none,
        )),
        Section::TargetLoss => escaped(super::target::terminal_lines(&report.targets)),
        Section::WhatTheFiguresAre
        | Section::ComputeVsComm
        | Section::ComputeCommGrid
        | Section::Bandwidth
        | Section::EpochTimes
        | Section::Times
        | Section::Waterfall
        | Section::NodeTypes
        | Section::Stalls
        | Section::Incomplete
        | Section::Duplicates => Vec::new(),
    }
}

/// The width of a column of `names`: the longest, so that no two run ids (repeats that
/// differ only in their last characters) are cut to the same text.
fn width<'a>(names: impl Iterator<Item = &'a str>, title: &str) -> usize {
    names.map(|n| n.chars().count()).chain([title.len()]).max().unwrap_or(0)
}

/// The runs' table: one line per run and node type. Its cells are escaped as they are made.
fn summary_lines(summaries: &[TypeSummary]) -> Vec<String> {
    let w = width(summaries.iter().map(|s| s.run_id.as_str()), "run");
    let mut out = vec![format!(
        "{:<w$} {:<28} {:>5} {:>10} {:>9} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9}",
        "run", "node type", "ranks", "steps/rank", "step ms", "p95 ms", "samples/s", "fwd%", "bwd%", "comm%", "busbw GB/s"
    )];
    for s in summaries {
        let nt: String = crate::escape::terminal(&s.node_type).chars().take(28).collect();
        let share = |v: f64| if v.is_finite() { format!("{:.0}", v * 100.0) } else { "–".into() };
        out.push(format!(
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
        ));
    }
    out
}

/// The points' table of speedups, when a point has a reference; empty otherwise.
fn scaling_lines(scaling: &[ScalingRow]) -> Vec<String> {
    let mut out = Vec::new();
    if scaling.iter().any(|r| r.scaling_mode != ScalingMode::Baseline) {
        let points: Vec<String> = scaling.iter().map(|r| r.run_ids.join(" ")).collect();
        let w = width(points.iter().map(String::as_str), "point");
        out.push(format!(
            "\n{:<w$} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
            "point", "ranks", "mode", "repeats", "speedup", "interval", "efficiency"
        ));
        for (r, run) in scaling.iter().zip(&points) {
            let num = |v: f64| if v.is_finite() { format!("{v:.3}") } else { "-".into() };
            let ci = if r.speedup_low.is_finite() {
                format!("{:.3}-{:.3}", r.speedup_low, r.speedup_high)
            } else {
                "-".into()
            };
            out.push(format!(
                "{:<w$} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
                run,
                r.ranks,
                r.scaling_mode.to_string(),
                r.repeats,
                num(r.speedup),
                ci,
                pct(r.efficiency)
            ));
        }
    }
    out
}
