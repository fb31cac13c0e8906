//! Node types and stragglers, stalls, and the runs left out.

use super::{ms, pct};
use crate::reduce::analysis::{RunStats, TypeSummary};
use std::fmt::Write;

/// Per run and node type: step times, waits for others, last arrivals, the gating type.
pub fn node_types(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary]) {
    let _ = writeln!(md, "\n## Node types and stragglers\n\n| run | node type | ranks | nodes | step ms (median) | p95 ms | waits for others ms (mean) | last into all-reduce | others wait for it ms (mean) | gates the job |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for s in summaries {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            s.node_type.replace(['|', '\n', '\r'], " "),
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
    let hetero: Vec<&&RunStats> = runs.iter().filter(|r| r.types.len() > 1).collect();
    for r in hetero {
        let g = summaries.iter().find(|s| s.run_id == r.manifest.run_id && s.gating == 1);
        if let Some(g) = g {
            let _ = writeln!(
                md,
                "\nIn `{}`, the other types wait {} per step for ranks of type \"{}\" (they arrive last at {} of all-reduces): that type sets the job's pace.",
                r.manifest.run_id,
                ms(g.caused_wait_s_mean).replace(' ', "") + " ms",
                g.node_type,
                pct(g.last_arrival_share)
            );
        }
    }
}

/// Steps over ten times their rank's median, named one by one.
pub fn stalls(md: &mut String, runs: &[&RunStats]) {
    let all: Vec<(String, crate::reduce::analysis::Stall)> = runs
        .iter()
        .flat_map(|r| r.stalls().into_iter().map(|s| (r.manifest.run_id.clone(), s)))
        .collect();
    if all.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Stalls\n\nSteps that took over {} times their rank's median: a rank stopped, swapped or starved, not noise. They are in every figure above; here each is named.\n\n| run | rank | global step | step s | rank's median ms |\n|---|---:|---:|---:|---:|", crate::reduce::analysis::STALL_FACTOR);
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
pub fn incomplete(md: &mut String, incomplete: &[&RunStats]) {
    if !incomplete.is_empty() {
        let _ = writeln!(md, "\n## Incomplete runs (left out of every figure)\n");
        for r in incomplete {
            let _ = writeln!(md, "- `{}`: {}", r.dir.display(), r.problems.join("; "));
        }
    }
}
