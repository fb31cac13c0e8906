//! report.md's paragraph on what its figures are: the scaling of ddpbench, a lean
//! data-parallel trainer, on this hardware; and, where the report holds a peer
//! trainer's runs of the same points (`study` with `peer`), the two side by side.

use super::Report;
use crate::record::Twin;
use crate::reduce::analysis::{ScalingMode, ScalingRow};
use std::fmt::Write;

/// The trainer of a scaling row's runs: None for ddpbench.
fn trainer(report: &Report, row: &ScalingRow) -> Option<Twin> {
    let id = row.run_ids.first()?;
    report
        .runs
        .iter()
        .find(|r| &r.run_id == id)
        .and_then(|r| r.comparison_key.as_ref())
        .and_then(|k| k.peer)
}

/// A point's efficiency and speedup as a clause, with the speedup's interval when it has one.
fn figures(row: &ScalingRow) -> String {
    let interval = if row.speedup_low.is_finite() && row.speedup_high.is_finite() {
        format!(", interval {:.2}–{:.2}", row.speedup_low, row.speedup_high)
    } else {
        String::new()
    };
    format!(
        "efficiency {:.0} % (speedup {:.2}{interval}, {} run(s))",
        row.efficiency * 100.0,
        row.speedup,
        row.repeats
    )
}

/// One sentence per point that both ddpbench and a peer measured, in `report`'s rows.
pub(super) fn side_by_side(report: &Report) -> Vec<String> {
    let compared = |r: &&ScalingRow| matches!(r.scaling_mode, ScalingMode::Weak | ScalingMode::Strong) && r.speedup.is_finite();
    let mut out = Vec::new();
    for peer_row in report.scaling.iter().filter(compared) {
        let Some(peer) = trainer(report, peer_row) else { continue };
        let same_point = |r: &&ScalingRow| {
            r.model == peer_row.model
                && r.dataset == peer_row.dataset
                && r.ranks == peer_row.ranks
                && r.nodes == peer_row.nodes
                && r.batch_per_rank == peer_row.batch_per_rank
                && r.scaling_mode == peer_row.scaling_mode
                && trainer(report, r).is_none()
        };
        let Some(own) = report.scaling.iter().filter(compared).find(same_point) else {
            continue;
        };
        out.push(format!(
            "{} on {}, {} rank(s) ({}, batch {} per rank): ddpbench's {}; {}'s {}.",
            peer_row.model,
            peer_row.dataset,
            peer_row.ranks,
            peer_row.scaling_mode.name(),
            peer_row.batch_per_rank,
            figures(own),
            peer.title(),
            figures(peer_row)
        ));
    }
    out
}

/// The paragraph, under the report's first line.
pub(super) fn what_the_figures_are(md: &mut String, report: &Report) {
    let _ = writeln!(
        md,
        "These figures are the scaling of ddpbench, a lean data-parallel trainer, on this hardware. A PyTorch DDP job of \
         the same workload has a heavier step and another all-reduce path, so it scales differently: measure it beside \
         ddpbench (BENCHMARKS.md, \"ddpbench beside PyTorch DDP\"; a study with `peer = \"pytorch-ddp\"`) rather than \
         read ddpbench's efficiency as its own.\n"
    );
    let rows = side_by_side(report);
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "Measured in this report, the same points by both trainers on the same ranks:\n");
    for r in rows {
        let _ = writeln!(md, "- {r}");
    }
    md.push('\n');
}
