//! The runs table, and per workload the speedup and efficiency table with the batch ×
//! ranks grid.

use super::{comm_setup, ms, pct};
use crate::reduce::analysis::{RunStats, ScalingRow, TypeSummary};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Every run: workload, ranks, batches, steps, step time, throughput, how it communicated.
pub fn runs_table(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary], scaling: &[ScalingRow]) {
    let _ = writeln!(md, "## Runs\n\n| run | model | data | ranks | nodes | batch/rank | global batch | steps | step ms (median) | samples/s | all-reduce |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in scaling {
        let med = summaries
            .iter()
            .filter(|s| s.run_id == r.run_id)
            .map(|s| s.step_s_median)
            .fold(f64::NAN, f64::max);
        let comm = runs
            .iter()
            .find(|x| x.manifest.run_id == r.run_id)
            .map(|x| comm_setup(&x.manifest))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            r.run_id,
            r.model,
            r.dataset,
            r.ranks,
            r.nodes,
            r.batch_per_rank,
            r.global_batch,
            r.steps,
            ms(med),
            r.samples_per_s,
            comm
        );
    }
}

/// Per workload: speedup and efficiency against its baseline, and the batch × ranks grid.
pub fn per_workload(md: &mut String, scaling: &[ScalingRow]) {
    let mut workloads: BTreeMap<(String, String), Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling {
        workloads.entry((r.model.clone(), r.dataset.clone())).or_default().push(r);
    }
    for ((model, dataset), rows) in &workloads {
        let mut rows = rows.clone();
        rows.sort_by_key(|r| (r.batch_per_rank, r.ranks));
        let _ = writeln!(md, "\n## Speedup and efficiency: {model} on {dataset}\n");
        workload_table(md, &rows);
        workload_verdict(md, &rows);
        batch_grid(md, &rows);
    }
}

/// The workload's baseline and one row per run.
fn workload_table(md: &mut String, rows: &[&ScalingRow]) {
    let base = rows.iter().find(|r| r.scaling_mode == "baseline").copied();
    if let Some(b) = base {
        let _ = writeln!(
            md,
            "Baseline: `{}` ({} rank(s), batch {} per rank, {:.1} samples/s).\n",
            b.run_id, b.ranks, b.batch_per_rank, b.samples_per_s
        );
    }
    let _ = writeln!(md, "| run | mode | ranks | batch/rank | samples/s | speedup | 95 % interval | efficiency | Karp–Flatt | Amdahl fit |\n|---|---|---:|---:|---:|---:|---|---:|---:|---:|");
    for r in rows {
        let ci = if r.speedup_ci_low.is_finite() {
            format!(
                "{:.3}–{:.3}{}",
                r.speedup_ci_low,
                r.speedup_ci_high,
                if r.within_noise == 1 { " (inside the noise)" } else { "" }
            )
        } else {
            "–".into()
        };
        let kf = if r.karp_flatt.is_finite() {
            format!("{:.3}", r.karp_flatt)
        } else {
            "–".into()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:.3} | {} | {} | {} | {:.3} |",
            r.run_id,
            r.scaling_mode,
            r.ranks,
            r.batch_per_rank,
            r.samples_per_s,
            r.speedup,
            ci,
            pct(r.efficiency),
            kf,
            r.amdahl_speedup
        );
    }
}

/// The best speedup, runs inside the noise, negative scaling, the Amdahl fit.
fn workload_verdict(md: &mut String, rows: &[&ScalingRow]) {
    let others: Vec<&&ScalingRow> = rows.iter().filter(|r| r.scaling_mode != "baseline").collect();
    if let Some(best) = others.iter().max_by(|a, b| a.speedup.total_cmp(&b.speedup)) {
        let _ = write!(
            md,
            "\nThe best speedup is {:.2} on {} ranks ({} scaling, efficiency {}).",
            best.speedup,
            best.ranks,
            best.scaling_mode,
            pct(best.efficiency)
        );
        let noisy: Vec<String> = others.iter().filter(|r| r.within_noise == 1).map(|r| r.run_id.clone()).collect();
        if !noisy.is_empty() {
            let _ = write!(
                md,
                " The difference from the baseline of {} is inside the noise (its 95 % interval contains 1).",
                noisy.join(", ")
            );
        }
        let slower: Vec<String> = others
            .iter()
            .filter(|r| r.speedup_ci_high < 1.0)
            .map(|r| format!("{} ({:.2}×)", r.run_id, r.speedup))
            .collect();
        if !slower.is_empty() {
            let _ = write!(md, " Negative scaling: {} ran slower than the baseline.", slower.join(", "));
        }
        let serial = others[0].amdahl_serial_fraction;
        if serial.is_finite() {
            let _ = write!(
                md,
                " An Amdahl fit through these points puts the serial fraction at {:.3}, which caps the speedup at {:.1}.",
                serial,
                if serial > 0.0 { 1.0 / serial } else { f64::INFINITY }
            );
        }
        let _ = writeln!(md);
    } else {
        let _ = writeln!(
            md,
            "\nOnly the baseline ran for this workload: run more rank counts to see scaling."
        );
    }
}

/// Speedup by per-rank batch × ranks, when runs differ in either.
fn batch_grid(md: &mut String, rows: &[&ScalingRow]) {
    let batches: BTreeSet<usize> = rows.iter().map(|r| r.batch_per_rank).collect();
    let rank_counts: BTreeSet<usize> = rows.iter().map(|r| r.ranks).collect();
    if batches.len() > 1 || rank_counts.len() > 1 {
        let _ = writeln!(md, "\n### Speedup by batch per rank × ranks\n");
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
                match rows.iter().find(|r| r.batch_per_rank == *b && r.ranks == *n) {
                    Some(r) => {
                        let _ = write!(md, " {:.2} |", r.speedup);
                    }
                    None => {
                        let _ = write!(md, " |");
                    }
                }
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md, "\nEach cell is throughput relative to the baseline; rows with a larger batch per rank do more compute per all-reduce, so they usually scale better.");
    }
}
