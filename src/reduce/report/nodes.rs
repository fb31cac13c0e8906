//! Node types and stragglers, and the runs left out.

use super::{ms, pct};
use crate::reduce::analysis::{RunStats, TypeSummary};
use std::fmt::Write;

/// Per run and node type: step times, waits for others, last arrivals, the gating type.
pub fn node_types(md: &mut String, runs: &[&RunStats], summaries: &[TypeSummary]) {
    // Stragglers and node types.
    let _ = writeln!(md, "\n## Node types and stragglers\n\n| run | node type | ranks | nodes | step ms (median) | p95 ms | waits for others ms (mean) | last into all-reduce | gates the job |\n|---|---|---:|---:|---:|---:|---:|---:|---|");
    for s in summaries {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            s.node_type,
            s.ranks,
            s.nodes,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            ms(s.comm_wait_s_mean),
            pct(s.last_arrival_share),
            if s.gating == 1 { "yes" } else { "" }
        );
    }
    let hetero: Vec<&&RunStats> = runs.iter().filter(|r| r.types.len() > 1).collect();
    for r in hetero {
        let g = summaries.iter().find(|s| s.run_id == r.manifest.run_id && s.gating == 1);
        if let Some(g) = g {
            let _ = writeln!(md, "\nIn `{}`, ranks of type \"{}\" arrive last at {} of all-reduces: the other types wait for them, so that type sets the job's pace.", r.manifest.run_id, g.node_type, pct(g.last_arrival_share));
        }
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
