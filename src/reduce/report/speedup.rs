//! The runs table, and per workload the speedup and efficiency of each point (weak and
//! strong, with the interval and how it was found), what it says, and the batch × ranks grid.

use super::{comm_setup, ms, pct};
use crate::reduce::analysis::{RunStats, ScalingRow, TypeSummary};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Every run: workload, ranks, batches, steps, step time, throughput, how it communicated.
pub fn runs_table(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary]) {
    let _ = writeln!(md, "## Runs\n\n| run | model | data | ranks | nodes | batch/rank | global batch | steps | step ms (median) | samples/s | all-reduce |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in runs {
        let m = &r.manifest;
        let med = summaries
            .iter()
            .filter(|s| s.run_id == m.run_id)
            .map(|s| s.step_s_median)
            .fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            m.run_id,
            m.model,
            m.dataset,
            m.world_size,
            m.nodes,
            m.batch_size_per_rank,
            m.global_batch_size,
            r.steps,
            ms(med),
            crate::reduce::analysis::scaling::samples_per_s(r),
            comm_setup(m)
        );
    }
}

/// Per workload (the runs compared with each other): speedup and efficiency of each
/// point against its reference, what they say, and the batch × ranks grid.
pub fn per_workload(md: &mut String, scaling: &[ScalingRow]) {
    let mut workloads: BTreeMap<(String, String, String), Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling {
        workloads
            .entry((r.model.clone(), r.dataset.clone(), r.comparison.clone()))
            .or_default()
            .push(r);
    }
    for ((model, dataset, comparison), rows) in &workloads {
        let mut rows = rows.clone();
        rows.sort_by_key(|r| (r.scaling_mode != "baseline", r.batch_per_rank, r.ranks));
        let _ = writeln!(
            md,
            "\n## Speedup and efficiency: {model} on {dataset}\n\nRuns compared: {comparison}.\n"
        );
        workload_table(md, &rows);
        workload_verdict(md, &rows);
        for mode in ["weak", "strong"] {
            batch_grid(md, &rows, mode);
        }
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
        } else {
            "–".into()
        };
        let serial = match r.scaling_mode.as_str() {
            "strong" => format!("Karp–Flatt {}", num(r.karp_flatt, 3)),
            "weak" => format!("Gustafson {}", num(r.gustafson_serial_fraction, 3)),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            r.run_ids,
            r.scaling_mode,
            if r.baseline_run_ids.is_empty() {
                "–"
            } else {
                &r.baseline_run_ids
            },
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

/// The best speedup, points inside the noise, negative scaling, the fitted laws, points
/// without a reference, and what a single run's interval covers.
fn workload_verdict(md: &mut String, rows: &[&ScalingRow]) {
    let compared: Vec<&&ScalingRow> = rows
        .iter()
        .filter(|r| ["weak", "strong", "explicit"].contains(&r.scaling_mode.as_str()))
        .collect();
    let mut text = String::new();
    if let Some(best) = compared.iter().max_by(|a, b| a.speedup.total_cmp(&b.speedup)) {
        let _ = write!(
            text,
            "The best speedup is {:.2} on {} ranks ({} scaling, efficiency {}).",
            best.speedup,
            best.ranks,
            best.scaling_mode,
            pct(best.efficiency)
        );
    } else {
        let _ = write!(
            text,
            "No point here has a reference to be compared with: run more rank counts to see scaling."
        );
    }
    let noisy: Vec<String> = compared.iter().filter(|r| r.within_noise == 1).map(|r| r.run_ids.clone()).collect();
    if !noisy.is_empty() {
        let _ = write!(
            text,
            " The speedup of {} is inside the noise (its interval contains 1).",
            noisy.join(", ")
        );
    }
    let slower: Vec<String> = compared
        .iter()
        .filter(|r| r.speedup_high < 1.0)
        .map(|r| format!("{} ({:.2}×)", r.run_ids, r.speedup))
        .collect();
    if !slower.is_empty() {
        let _ = write!(text, " Negative scaling: {} ran slower than its reference.", slower.join(", "));
    }
    if let Some(r) = compared.iter().find(|r| r.amdahl_serial_fraction.is_finite()) {
        let f = r.amdahl_serial_fraction;
        let largest = compared.iter().map(|r| r.ranks).max().unwrap_or(1) as f64;
        if f * largest < 0.01 {
            let _ = write!(
                text,
                " An Amdahl fit through the strong-scaling points finds no serial fraction distinguishable from 0."
            );
        } else {
            let _ = write!(text, " An Amdahl fit through the strong-scaling points puts the serial fraction at {f:.3}, which caps the strong speedup at {:.1}.", 1.0 / f);
        }
    }
    if compared.iter().any(|r| r.interval_method.contains("within runs")) {
        let _ = write!(text, " Intervals from blocks within runs cover within-run noise only: repeat each point (3 runs or more) for intervals that include run-to-run variation.");
    }
    for r in rows.iter().filter(|r| r.scaling_mode == "none") {
        let _ = write!(text, " `{}` has no reference: add {}.", r.run_ids, r.missing_reference);
    }
    let _ = writeln!(md, "\n{text}");
}

/// Speedup by per-rank batch × ranks in one mode, when its points differ in either.
fn batch_grid(md: &mut String, rows: &[&ScalingRow], mode: &str) {
    let cells: Vec<&&ScalingRow> = rows
        .iter()
        .filter(|r| r.scaling_mode == mode || r.scaling_mode == "baseline")
        .collect();
    let batches: BTreeSet<usize> = cells.iter().map(|r| r.batch_per_rank).collect();
    let rank_counts: BTreeSet<usize> = cells.iter().map(|r| r.ranks).collect();
    if !cells.iter().any(|r| r.scaling_mode == mode) || (batches.len() < 2 && rank_counts.len() < 2) {
        return;
    }
    let _ = writeln!(md, "\n### {mode} speedup by batch per rank × ranks\n");
    let _ = write!(md, "| batch/rank |");
    for n in &rank_counts {
        let _ = write!(md, " {n} rank(s) |");
    }
    let _ = write!(md, "\n|---:|");
    for _ in &rank_counts {
        let _ = write!(md, "---:|");
    }
    let _ = writeln!(md);
    for b in &batches {
        let _ = write!(md, "| {b} |");
        for n in &rank_counts {
            match cells.iter().find(|r| r.batch_per_rank == *b && r.ranks == *n) {
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
    let _ = writeln!(md, "\nEach cell is throughput relative to its reference; a larger batch per rank does more compute per all-reduce, so it usually scales better.");
}
