//! The sentence said of one compared point, made from the typed report alone: its
//! direction (claimed only when the speedup's interval excludes 1, [`Direction::of`]),
//! what a direction needs where none is claimed, the largest measured
//! loss of its efficiency waterfall with its share of what was lost, and R with what it
//! implies. report.md (each workload's verdict) and study.md print this same sentence.

use super::{pct, RunReport};
use crate::record::Overlap;
use crate::reduce::analysis::interval::what_a_direction_needs;
use crate::reduce::analysis::{Direction, ScalingRow};
use std::fmt::Write;

/// The four measured losses of a point's waterfall, named as the verdict says them.
pub fn losses(row: &ScalingRow) -> [(&'static str, f64); 4] {
    [
        ("transfer", row.loss_comm_samples_per_s),
        ("waiting for a late rank", row.loss_straggler_samples_per_s),
        ("data loading", row.loss_data_samples_per_s),
        ("other (compute slower than alone, contention)", row.loss_other_samples_per_s),
    ]
}

/// The speedup, with a direction only where its interval excludes 1 (the row's
/// `direction`), and what a direction needs where none is claimed.
pub fn direction(row: &ScalingRow) -> String {
    let (s, lo, hi) = (row.speedup, row.speedup_low, row.speedup_high);
    let direction = row.direction.unwrap_or(Direction::NoInterval);
    let needs = what_a_direction_needs(direction, row.repeats, row.baseline_repeats, row.repeats_needed);
    match direction {
        Direction::Slower => format!("scales negatively: speedup {s:.2} ({lo:.2}–{hi:.2})"),
        Direction::Faster => format!("scales: speedup {s:.2} ({lo:.2}–{hi:.2}), efficiency {}", pct(row.efficiency)),
        Direction::WithinNoise => {
            format!("has speedup {s:.2} ({lo:.2}–{hi:.2}): indistinguishable from no speedup at this noise: {needs}")
        }
        Direction::NoInterval => format!("has speedup {s:.2} with no interval: {needs}"),
    }
}

/// The largest measured loss and its share of what was lost, or why there is none.
pub fn largest_loss(row: &ScalingRow) -> String {
    let lost = row.ideal_samples_per_s - row.samples_per_s;
    if !row.loss_comm_samples_per_s.is_finite() {
        return "Its ranks are of several node types, so no waterfall splits what it lost.".into();
    }
    if lost.is_nan() || lost <= 0.0 {
        return "It loses nothing against ideal (the reference's throughput × its ranks).".into();
    }
    let all = losses(row);
    let (name, v) = all.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or(("", 0.0));
    let others: Vec<String> = all
        .iter()
        .filter(|(n, _)| *n != name)
        .map(|(n, x)| format!("{} {x:.1}", n.split(" (").next().unwrap_or(n)))
        .collect();
    format!(
        "Against ideal, the largest measured loss is {name}: {v:.1} of the {lost:.1} samples/s lost ({}); the others: {}.",
        pct(v / lost),
        others.join(", ")
    )
}

/// R of the point's runs (their median) and what it implies, or None without one.
pub fn r_sentence(row: &ScalingRow, runs: &[RunReport]) -> Option<String> {
    let of_point: Vec<&RunReport> = runs.iter().filter(|r| row.run_ids.contains(&r.run_id)).collect();
    let rs: Vec<f64> = of_point
        .iter()
        .map(|r| r.per_epoch.compute_comm_ratio)
        .filter(|v| v.is_finite())
        .collect();
    if rs.is_empty() {
        return None;
    }
    let r = crate::stats::median(&rs);
    let cap = pct(r / (r + 1.0));
    let overlapped = of_point
        .iter()
        .any(|x| x.comparison_key.as_ref().is_some_and(|k| k.overlap == Overlap::On));
    let mut s = format!("R = {r:.2}: ");
    if overlapped {
        let _ = write!(
            s,
            "with overlap the transfer can hide behind backward; without it, efficiency ≤ R/(R+1) = {cap}."
        );
    } else {
        let _ = write!(s, "without overlap, communication alone caps efficiency at R/(R+1) = {cap}.");
    }
    Some(s)
}

/// The whole sentence on `row`: ranks and mode, direction, largest loss, R.
pub fn point_verdict(row: &ScalingRow, runs: &[RunReport]) -> String {
    let mut s = format!(
        "At {} ranks ({}) it {}. {}",
        row.ranks,
        row.scaling_mode,
        direction(row),
        largest_loss(row)
    );
    if let Some(r) = r_sentence(row, runs) {
        let _ = write!(s, " {r}");
    }
    s
}
