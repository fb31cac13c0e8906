//! The runs table, and per workload the speedup and efficiency of each point (weak and
//! strong, with the interval and how it was found), what it says, and the batch × ranks grid.

use super::{ms, pct, verdict, RunReport, WorkloadVerdict};
use crate::reduce::analysis::interval::what_a_direction_needs;
use crate::reduce::analysis::{Direction, ScalingMode, ScalingRow, TypeSummary};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Every run: workload, ranks, batches, steps, step time, throughput, how it communicated.
pub(super) fn runs_table(md: &mut String, runs: &[RunReport], summaries: &[TypeSummary]) {
    let _ = writeln!(md, "## Runs\n\n| run | model | data | ranks | nodes | batch/rank | global batch | steps | step ms (median) | samples/s | all-reduce |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in runs {
        let med = summaries
            .iter()
            .filter(|s| s.run_id == r.run_id)
            .map(|s| s.step_s_median)
            .fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            r.run_id,
            crate::escape::markdown(&r.model),
            crate::escape::markdown(&r.dataset),
            r.ranks,
            r.nodes,
            r.batch_per_rank,
            r.global_batch,
            r.steps,
            ms(med),
            r.samples_per_s,
            r.communication
        );
    }
    warnings(md, runs);
}

/// Under the runs table, each run's warnings: what it was accepted with but may have
/// measured wrongly, and whether its points are given a direction at all.
fn warnings(md: &mut String, runs: &[RunReport]) {
    let warned: Vec<&RunReport> = runs.iter().filter(|r| !r.warnings.is_empty()).collect();
    if warned.is_empty() {
        return;
    }
    let _ = writeln!(md, "\nWarnings the runs carry (their manifests' `warnings`):\n");
    for r in warned {
        for w in &r.warnings {
            let effect = if w.invalidates_direction {
                "no direction is claimed for its points"
            } else {
                "its figures stand, with this cost"
            };
            let _ = writeln!(
                md,
                "- `{}`: `{}` ({effect}): {}",
                r.run_id,
                w.code.as_str(),
                crate::escape::markdown(&w.message)
            );
        }
    }
}

/// The rows of each workload (the runs compared with each other), by model, data set and
/// comparison; within one, baselines first, then by batch per rank and ranks.
pub(super) fn by_workload(scaling: &[ScalingRow]) -> BTreeMap<(&str, &str, &str), Vec<&ScalingRow>> {
    let mut workloads: BTreeMap<(&str, &str, &str), Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling {
        workloads
            .entry((r.model.as_str(), r.dataset.as_str(), r.comparison.as_str()))
            .or_default()
            .push(r);
    }
    for rows in workloads.values_mut() {
        rows.sort_by_key(|r| (r.scaling_mode != ScalingMode::Baseline, r.batch_per_rank, r.ranks));
    }
    workloads
}

/// What each workload's points say.
pub(super) fn verdicts(scaling: &[ScalingRow], runs: &[RunReport]) -> Vec<WorkloadVerdict> {
    by_workload(scaling)
        .into_iter()
        .map(|((model, dataset, comparison), rows)| WorkloadVerdict {
            model: model.into(),
            dataset: dataset.into(),
            comparison: comparison.into(),
            verdict: workload_verdict(&rows, runs),
        })
        .collect()
}

/// The point a workload's verdict is about: the most ranks, weak before strong at equal
/// counts (as `ddpbench study` picks it).
pub(super) fn headline<'a>(compared: &[&'a ScalingRow]) -> Option<&'a ScalingRow> {
    compared
        .iter()
        .copied()
        .filter(|r| r.speedup.is_finite())
        .max_by_key(|r| (r.ranks, r.scaling_mode == ScalingMode::Weak))
}

/// Per workload: speedup and efficiency of each point against its reference, what they
/// say (`verdicts`, in the same order), and the batch × ranks grid.
pub(super) fn per_workload(md: &mut String, scaling: &[ScalingRow], verdicts: &[WorkloadVerdict]) {
    for (((model, dataset, comparison), rows), v) in by_workload(scaling).iter().zip(verdicts) {
        let _ = writeln!(
            md,
            "\n## Speedup and efficiency: {} on {}\n\nRuns compared: {}.\n",
            crate::escape::markdown(model),
            crate::escape::markdown(dataset),
            crate::escape::markdown(comparison)
        );
        workload_table(md, rows);
        runs_of_points(md, rows);
        let _ = writeln!(md, "\n{}", crate::escape::markdown(&v.verdict));
        for mode in [ScalingMode::Weak, ScalingMode::Strong] {
            batch_grid(md, rows, mode);
        }
    }
}

/// Each point of several runs with their ids, where the table names it by its label.
fn runs_of_points(md: &mut String, rows: &[&ScalingRow]) {
    let mut seen: Vec<&Vec<String>> = Vec::new();
    let mut lines = Vec::new();
    for r in rows {
        if r.run_ids.len() > 1 && !seen.contains(&&r.run_ids) {
            seen.push(&r.run_ids);
            lines.push(format!("- `{}`: {}", verdict::point_label(&r.run_ids), r.run_ids.join(", ")));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(md, "\nThe runs of each point:\n\n{}", lines.join("\n"));
    }
}

/// One row per point and mode.
fn workload_table(md: &mut String, rows: &[&ScalingRow]) {
    let _ = writeln!(md, "| point | mode | against | repeats | ranks | batch/rank | samples/s | speedup | interval | efficiency | serial fraction |\n|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|");
    for r in rows {
        let num = |v: f64, digits: usize| if v.is_finite() { format!("{v:.digits$}") } else { "–".into() };
        let interval = if r.speedup_low.is_finite() {
            format!(
                "{:.3}–{:.3} ({}){}",
                r.speedup_low,
                r.speedup_high,
                r.interval_method,
                if r.within_noise == 1 { ", inside the noise" } else { "" }
            )
        } else if !r.interval_method.is_empty() {
            r.interval_method.clone()
        } else {
            "–".into()
        };
        let with_range = |law: &str, f: f64, low: f64, high: f64| {
            if f.is_finite() {
                format!("{law} {} ({}–{})", num(f, 3), num(low, 3), num(high, 3))
            } else {
                format!("{law}: not stated (no interval)")
            }
        };
        let serial = match r.scaling_mode {
            // Both laws describe a gain shared out; below 1 their fraction exceeds 1.
            ScalingMode::Strong | ScalingMode::Weak if r.speedup < 1.0 => {
                "not applicable (speedup < 1: the law assumes a gain)".to_string()
            }
            ScalingMode::Strong => with_range("Karp–Flatt", r.karp_flatt, r.karp_flatt_low, r.karp_flatt_high),
            ScalingMode::Weak => with_range(
                "Gustafson",
                r.gustafson_serial_fraction,
                r.gustafson_serial_fraction_low,
                r.gustafson_serial_fraction_high,
            ),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            verdict::point_label(&r.run_ids),
            r.scaling_mode,
            verdict::point_label(&r.baseline_run_ids),
            r.repeats,
            r.ranks,
            r.batch_per_rank,
            r.samples_per_s,
            num(r.speedup, 3),
            interval,
            pct(r.efficiency),
            serial
        );
    }
}

/// The headline point's sentence ([`verdict::point_verdict`]), the other points inside
/// the noise or slower than their reference, the fitted laws, points without a
/// reference, and what a single run's interval covers.
fn workload_verdict(rows: &[&ScalingRow], runs: &[RunReport]) -> String {
    let all: Vec<&ScalingRow> = rows
        .iter()
        .copied()
        .filter(|r| [ScalingMode::Weak, ScalingMode::Strong, ScalingMode::Explicit].contains(&r.scaling_mode))
        .collect();
    let head = headline(&all);
    let mut text = String::new();
    if let Some(h) = head {
        text.push_str(&verdict::point_verdict(h, runs));
    } else {
        let _ = write!(
            text,
            "No point here has a reference to be compared with: run more rank counts to see scaling."
        );
    }
    let compared: Vec<&&ScalingRow> = all.iter().filter(|r| !head.is_some_and(|h| std::ptr::eq(h, **r))).collect();
    let noisy: Vec<String> = compared
        .iter()
        .filter(|r| r.within_noise == 1)
        .map(|r| verdict::point_name(r))
        .collect();
    if !noisy.is_empty() {
        let _ = write!(
            text,
            " The speedup of {} is indistinguishable from no speedup at this noise (its interval contains 1); add repeats.",
            noisy.join(", ")
        );
    }
    let slower: Vec<String> = compared
        .iter()
        .filter(|r| r.direction == Some(Direction::Slower))
        .map(|r| format!("{} at {:.2}×", verdict::point_name(r), r.speedup))
        .collect();
    if !slower.is_empty() {
        let _ = write!(text, " Negative scaling: {} ran slower than its reference.", slower.join(", "));
    }
    text.push_str(&amdahl_sentence(&all));
    for r in compared.iter().filter(|r| r.direction == Some(Direction::NoInterval)) {
        let _ = write!(
            text,
            " {} at {} ranks: {}.",
            verdict::point_name(r),
            r.ranks,
            what_a_direction_needs(Direction::NoInterval, r.repeats, r.baseline_repeats, r.repeats_needed)
        );
    }
    for r in rows.iter().filter(|r| r.scaling_mode == ScalingMode::None) {
        let _ = write!(
            text,
            " `{}` (batch {} per rank) has no reference: add {}.",
            verdict::point_label(&r.run_ids),
            r.batch_per_rank,
            r.missing_reference
        );
    }
    text
}

/// Amdahl's fit through the strong points with its range over their intervals, whether
/// its serial fraction is distinguishable from 0, and the cap it implies; or that no fit
/// is stated where a strong point it would go through has no interval.
fn amdahl_sentence(all: &[&ScalingRow]) -> String {
    let Some(r) = all.iter().find(|r| r.amdahl_serial_fraction.is_finite()) else {
        let strong: Vec<&&ScalingRow> = all.iter().filter(|r| r.scaling_mode == ScalingMode::Strong).collect();
        return if strong.len() >= 2 && strong.iter().any(|r| !r.speedup_low.is_finite()) {
            " No Amdahl fit is stated: a strong point it would go through has no interval.".into()
        } else {
            String::new()
        };
    };
    let (f, low, high) = (
        r.amdahl_serial_fraction,
        r.amdahl_serial_fraction_low,
        r.amdahl_serial_fraction_high,
    );
    let largest = all.iter().map(|r| r.ranks).max().unwrap_or(1) as f64;
    let range = format!("{low:.3}–{high:.3} over the speedups' intervals");
    if low * largest >= 0.01 {
        format!(
            " An Amdahl fit through the strong-scaling points puts the serial fraction at {f:.3} ({range}), which caps the strong speedup at {:.1} ({:.1}–{:.1}).",
            1.0 / f,
            1.0 / high,
            1.0 / low
        )
    } else if f * largest < 0.01 {
        format!(" An Amdahl fit through the strong-scaling points finds no serial fraction distinguishable from 0 ({range}).")
    } else {
        format!(" An Amdahl fit through the strong-scaling points puts the serial fraction at {f:.3}, but {range}: not distinguishable from 0, so it caps nothing.")
    }
}

/// Speedup by per-rank batch × ranks in one mode, when its points differ in either.
fn batch_grid(md: &mut String, rows: &[&ScalingRow], mode: ScalingMode) {
    let cells: Vec<&&ScalingRow> = rows
        .iter()
        .filter(|r| r.scaling_mode == mode || r.scaling_mode == ScalingMode::Baseline)
        .collect();
    // Weak scaling keeps the batch per rank, strong the global batch: each row is the
    // batch its mode holds, so a point and its reference share a row.
    let (key, what): (fn(&ScalingRow) -> usize, &str) = if mode == ScalingMode::Strong {
        (|r| r.global_batch, "global batch")
    } else {
        (|r| r.batch_per_rank, "batch per rank")
    };
    let batches: BTreeSet<usize> = cells.iter().map(|r| key(r)).collect();
    let rank_counts: BTreeSet<usize> = cells.iter().map(|r| r.ranks).collect();
    if !cells.iter().any(|r| r.scaling_mode == mode) || (batches.len() < 2 && rank_counts.len() < 2) {
        return;
    }
    let _ = writeln!(md, "\n### {mode} speedup by {what} × ranks\n");
    let _ = write!(
        md,
        "| {} | 1-rank step ms |",
        if mode == ScalingMode::Strong {
            "global batch"
        } else {
            "batch/rank"
        }
    );
    for n in &rank_counts {
        let _ = write!(md, " {n} rank(s) |");
    }
    let _ = write!(md, "\n|---:|---:|");
    for _ in &rank_counts {
        let _ = write!(md, "---:|");
    }
    let _ = writeln!(md);
    for b in &batches {
        // The 1-rank time: what the batch costs before any communication.
        let alone = cells
            .iter()
            .find(|r| key(r) == *b && r.ranks == 1)
            .map_or("–".into(), |r| super::ms(r.step_s_mean));
        let _ = write!(md, "| {b} | {alone} |");
        for n in &rank_counts {
            match cells.iter().find(|r| key(r) == *b && r.ranks == *n) {
                Some(r) if r.speedup.is_finite() => {
                    let _ = write!(md, " {:.2} |", r.speedup);
                }
                _ => {
                    let _ = write!(md, " |");
                }
            }
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "\nEach cell is throughput relative to its reference (1-rank step ms: the mean step of the 1-rank runs at that batch, what it costs alone); a larger batch per rank does more compute per all-reduce, so it usually scales better.{}", if mode == ScalingMode::Strong { " Strong scaling splits each row's global batch over the ranks: at n ranks each holds 1/n of it." } else { "" });
}
