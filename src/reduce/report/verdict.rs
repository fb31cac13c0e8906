//! The sentence said of one compared point, made from the typed report alone: its
//! direction (claimed only when the speedup's interval excludes 1, [`Direction::of`]),
//! what a direction needs where none is claimed, the largest measured
//! loss of its efficiency waterfall with its share of what was lost, and R with the
//! efficiency the transfer alone allows. report.md (each workload's verdict) and study.md
//! print this same sentence.

use super::{pct, RunReport};
use crate::record::Overlap;
use crate::reduce::analysis::interval::what_a_direction_needs;
use crate::reduce::analysis::{Direction, ScalingRow};
use std::fmt::Write;

/// The four measured losses of a point's waterfall, named as the verdict says them.
pub(crate) fn losses(row: &ScalingRow) -> [(&'static str, f64); 4] {
    [
        ("transfer", row.loss_comm_samples_per_s),
        ("waiting for a late rank", row.loss_straggler_samples_per_s),
        ("data loading", row.loss_data_samples_per_s),
        ("other (compute slower than alone, contention)", row.loss_other_samples_per_s),
    ]
}

/// The speedup, with a direction only where its interval excludes 1 (the row's
/// `direction`), and what a direction needs where none is claimed.
pub(crate) fn direction(row: &ScalingRow) -> String {
    let (s, lo, hi) = (row.speedup, row.speedup_low, row.speedup_high);
    let direction = row.direction.unwrap_or(Direction::NoInterval);
    let needs = what_a_direction_needs(direction, row.repeats, row.baseline_repeats, row.repeats_needed);
    match direction {
        Direction::Slower => format!("scales negatively: speedup {s:.2} ({lo:.2}–{hi:.2})"),
        Direction::Faster => format!("scales: speedup {s:.2} ({lo:.2}–{hi:.2}), efficiency {}", pct(row.efficiency)),
        Direction::WithinNoise => {
            format!("has speedup {s:.2} ({lo:.2}–{hi:.2}): indistinguishable from no speedup at this noise: {needs}")
        }
        Direction::NoInterval if !row.invalidated_by.is_empty() => format!(
            "has speedup {s:.2} with no interval, and no direction would be claimed: its runs carry warnings that invalidate them ({})",
            row.invalidated_by.join(", ")
        ),
        Direction::NoInterval => format!("has speedup {s:.2} with no interval: {needs}"),
        Direction::Invalidated => format!(
            "has speedup {s:.2} ({lo:.2}–{hi:.2}), but no direction is claimed: its runs carry warnings that invalidate them ({})",
            row.invalidated_by.join(", ")
        ),
    }
}

/// The largest measured loss and its share of what was lost, or why there is none.
pub(crate) fn largest_loss(row: &ScalingRow) -> String {
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

/// R of the point's runs (their geometric mean, the estimator of study.csv and scaling.csv), and the efficiency the transfer alone allows
/// without overlap (`T1 / (T1 + transfer)`, the row's `transfer_limit_efficiency`); where
/// the all-reduce thread shared backward's cores, why neither is defined. None when no
/// run of the point has an R.
pub(crate) fn r_sentence(row: &ScalingRow, runs: &[RunReport]) -> Option<String> {
    let of_point: Vec<&RunReport> = runs.iter().filter(|r| row.run_ids.contains(&r.run_id)).collect();
    let overlap = |o: Overlap| of_point.iter().any(|x| x.comparison_key.as_ref().is_some_and(|k| k.overlap == o));
    if overlap(Overlap::Force) {
        return Some(
            "R and the limit the transfer sets are not defined here: the all-reduce thread shared backward's cores \
             (--overlap force), so its time-sliced work is inside backward and in the transfer both."
                .into(),
        );
    }
    let rs: Vec<f64> = of_point
        .iter()
        .map(|r| r.per_epoch.compute_comm_ratio)
        .filter(|v| v.is_finite())
        .collect();
    if rs.is_empty() {
        return None;
    }
    // Over the repeats as every figure of a point: their geometric mean.
    let r = crate::stats::geometric_mean(&rs);
    let mut s = format!("R = {r:.2} (forward + backward over the transfer).");
    let limit = row.transfer_limit_efficiency;
    if limit.is_finite() {
        let _ = write!(
            s,
            " {} the transfer alone limits efficiency to T1/(T1 + transfer) = {}, with T1 the 1-rank step at this batch per \
             rank and the rest of the step as alone.",
            if overlap(Overlap::On) {
                "With overlap the transfer can hide behind backward; without it,"
            } else {
                "Without overlap,"
            },
            pct(limit)
        );
    }
    Some(s)
}

/// The point as lists and verdicts name it: its runs, its mode and its batch.
pub(crate) fn point_name(row: &ScalingRow) -> String {
    format!(
        "`{}` ({}, batch {} per rank)",
        point_label(&row.run_ids),
        row.scaling_mode,
        row.batch_per_rank
    )
}

/// A point as tables and sentences name it: a point of one run by its id; repeats by
/// their shared id without the repeat suffix and their count (`001-…-r2 ×3`), else by
/// the first id and how many more. Each run's id is in scaling.csv's `run_ids` and in
/// report.md's list of each point's runs.
pub(crate) fn point_label(run_ids: &[String]) -> String {
    let stem = |id: &str| -> String {
        id.rsplit_once("-rep")
            .filter(|(_, n)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
            .map_or(id.to_string(), |(s, _)| s.to_string())
    };
    match run_ids {
        [] => "–".into(),
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|r| stem(r) == stem(first)) && stem(first) != *first => {
            format!("{} ×{}", stem(first), run_ids.len())
        }
        [first, rest @ ..] => format!("{first} and {} more", rest.len()),
    }
}

/// The whole sentence on `row`: ranks, mode and batch, direction, largest loss, R.
pub(crate) fn point_verdict(row: &ScalingRow, runs: &[RunReport]) -> String {
    let mut s = format!(
        "At {} ranks ({}, batch {} per rank, global batch {}) it {}. {}",
        row.ranks,
        row.scaling_mode,
        row.batch_per_rank,
        row.global_batch,
        direction(row),
        largest_loss(row)
    );
    if let Some(r) = r_sentence(row, runs) {
        let _ = write!(s, " {r}");
    }
    s
}
