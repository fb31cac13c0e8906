//! Node types and stragglers, stalls, and the runs left out.

use super::{ms, pct, LeftOut, RunReport};
use crate::record::Backend;
use crate::reduce::analysis::{RankSummary, TypeSummary, STALL_FACTOR};
use std::fmt::Write;

/// Per run and node type: step times, waits for others, last arrivals, the gating type;
/// then `sentences`.
pub(super) fn node_types(md: &mut String, summaries: &[TypeSummary], sentences: &[String]) {
    let _ = writeln!(md, "\n## Node types and stragglers\n\n| run | node type | ranks | nodes | step ms (median) | p95 ms | waits for others ms (mean) | last into all-reduce | each other rank waits for it ms (mean) | gates the job |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for s in summaries {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            crate::escape::markdown(&s.node_type),
            s.ranks,
            s.nodes,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            ms(s.comm_wait_s_mean),
            pct(s.last_arrival_share),
            ms(s.caused_wait_s_mean),
            if s.gating == 1 { "yes" } else { "" }
        );
    }
    for s in sentences {
        let _ = writeln!(md, "\n{}", crate::escape::markdown(s));
    }
}

/// Per run on several node types: the type whose late arrivals set the job's pace.
pub(super) fn node_type_sentences(runs: &[RunReport], summaries: &[TypeSummary]) -> Vec<String> {
    runs.iter()
        .filter(|r| r.node_types.len() > 1)
        .filter_map(|r| {
            let g = summaries.iter().find(|s| s.run_id == r.run_id && s.gating == 1)?;
            Some(format!(
                "In `{}`, each other rank waits {} per step (mean over them) for ranks of type \"{}\" (they arrive last at {} of all-reduces): that type sets the job's pace.",
                r.run_id,
                ms(g.caused_wait_s_mean).replace(' ', "") + " ms",
                g.node_type,
                pct(g.last_arrival_share)
            ))
        })
        .collect()
}

/// A rank is named the straggler of its run when it entered the all-reduce last in at
/// least this share of the steps.
pub(super) const STRAGGLER_SHARE: f64 = 0.75;

/// Per multi-rank run, the rank that entered the all-reduce last in at least
/// [`STRAGGLER_SHARE`] of the steps, whatever the node types: how often, and how long
/// each other rank waited for it.
pub(super) fn straggler_sentences(ranks: &[RankSummary]) -> Vec<String> {
    ranks
        .iter()
        .filter(|r| r.last_arrival_share >= STRAGGLER_SHARE && r.caused_wait_s_mean.is_finite())
        .map(|r| {
            format!(
                "In `{}`, rank {} (on {}) entered the all-reduce last in {} of the steps: each other rank waited {} ms per step for it \
                 (mean over them), the wait in the waterfall's \"waiting for a late rank\".",
                r.run_id,
                r.rank,
                r.host,
                pct(r.last_arrival_share),
                ms(r.caused_wait_s_mean)
            )
        })
        .collect()
}

/// Per run whose clocks cannot order every step's arrivals: how often, by how much, and
/// what was done instead (no rank named last; waits within the error merged into transfer).
pub(super) fn arrival_sentences(runs: &[&crate::reduce::analysis::RunStats]) -> Vec<String> {
    let mut out = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.manifest.world_size > 1 && r.manifest.comm_backend != Backend::None)
    {
        let a = &r.arrivals;
        if a.waits_capped > 0 {
            out.push(format!(
                "In `{}`, in {} rank-steps the last rank entered the all-reduce later than the waiting rank's whole all-reduce took \
                 (comm_s): there the wait is counted as that whole all-reduce and the transfer as 0, so that transfer + wait = comm_s.",
                r.manifest.run_id, a.waits_capped
            ));
        }
        if !a.clocks_known {
            out.push(format!(
                "In `{}`, there is no clock.csv: arrival order and waits assume the ranks' clocks agree, with an error unknown.",
                r.manifest.run_id
            ));
            continue;
        }
        if a.unresolved_steps == 0 && a.waits_merged == 0 {
            continue;
        }
        out.push(format!(
            "In `{}`, the clocks cannot order the ranks' arrivals in {} of {} steps (the two ranks' offsets are right to within {} µs, more than the gap between them): no rank is named last there, and in {} rank-steps the wait for the last rank lies within that error, so it is counted as transfer (transfer and waiting merged). Ranks under one kernel have exact offsets; across hosts the error is half the shortest round trip of the clock estimate.",
            r.manifest.run_id,
            a.unresolved_steps,
            r.steps,
            format_us(a.max_error_s),
            a.waits_merged
        ));
    }
    out
}

fn format_us(s: f64) -> String {
    format!("{:.1}", s * 1e6)
}

/// Steps over ten times their rank's median, named one by one.
pub(super) fn stalls(md: &mut String, runs: &[RunReport]) {
    let all: Vec<(&str, &crate::reduce::analysis::Stall)> = runs
        .iter()
        .flat_map(|r| r.stalls.iter().map(move |s| (r.run_id.as_str(), s)))
        .collect();
    if all.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Stalls\n\nSteps that took over {} times their rank's median: a rank stopped, swapped or starved, not noise. They are in every figure above; here each is named.\n\n| run | rank | global step | step s | rank's median ms |\n|---|---:|---:|---:|---:|", STALL_FACTOR);
    for (run, s) in all.iter().take(50) {
        let _ = writeln!(
            md,
            "| {run} | {} | {} | {:.3} | {} |",
            s.rank,
            s.global_step,
            s.step_s,
            ms(s.median_s)
        );
    }
    if all.len() > 50 {
        let _ = writeln!(md, "\n{} more in the runs' rank files.", all.len() - 50);
    }
}

/// The incomplete runs and why they were left out.
pub(super) fn incomplete(md: &mut String, incomplete: &[LeftOut]) {
    if !incomplete.is_empty() {
        let _ = writeln!(md, "\n## Incomplete runs (left out of every figure)\n");
        for r in incomplete {
            let _ = writeln!(md, "- `{}`: {}", r.dir.display(), crate::escape::markdown(&r.problems.join("; ")));
        }
    }
}
