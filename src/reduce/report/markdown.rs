//! report.md: the tables a scaling study is read from, each with the sentences the
//! report found under it.

use super::{communication, compute_comm_grid, efficiency, nodes, noise, peer, projection, speedup, target, times, Duplicate, Report};
use std::fmt::Write;

/// report.md of `report` (with links to the plots when they are drawn).
pub(super) fn markdown(report: &Report, with_plots: bool) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# ddpbench report\n");
    let _ = writeln!(
        md,
        "{} complete run(s), {} incomplete. Steps flagged as warm-up are excluded; times are per step unless said otherwise.\n",
        report.runs.len(),
        report.incomplete.len()
    );
    peer::what_the_figures_are(&mut md, report);
    let f = &report.findings;
    speedup::runs_table(&mut md, &report.runs, &report.summary);
    speedup::per_workload(&mut md, &report.scaling, &report.workloads);
    communication::compute_vs_comm(&mut md, &report.runs, &f.compute_vs_comm);
    compute_comm_grid::markdown(&mut md, &report.runs);
    communication::bandwidth(&mut md, &report.runs, &report.summary, &f.bandwidth);
    efficiency::epoch_times(&mut md, &report.runs);
    times::markdown(&mut md, &report.runs);
    efficiency::waterfall(&mut md, &report.scaling, &f.waterfall);
    noise::section(&mut md, &report.runs, &report.time_to_accuracy, &report.time_to_accuracy_none);
    target::section(&mut md, &report.target_loss);
    nodes::node_types(&mut md, &report.summary, &f.node_types);
    nodes::stalls(&mut md, &report.runs);
    nodes::incomplete(&mut md, &report.incomplete);
    duplicates(&mut md, &report.duplicates);
    if with_plots {
        let _ = writeln!(md, "\n## Plots\n\n![speedup](speedup.svg) ![efficiency](efficiency.svg) ![bandwidth](bandwidth.svg)\n\nMean time per step by phase, one panel per model and batch per rank: `phases-<model>-b<batch>.svg`. Step time per rank: `step_time_per_rank-<run>.svg`.");
    }
    if let Some(p) = &report.projection {
        md.push_str(&projection::markdown(p, with_plots));
    }
    md
}

/// The folders that held a run counted from another folder, and which one was kept.
fn duplicates(md: &mut String, duplicates: &[Duplicate]) {
    if duplicates.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Runs reached twice (counted once)\n\n| folder | is | kept |\n|---|---|---|"
    );
    for d in duplicates {
        let _ = writeln!(
            md,
            "| `{}` | {} | `{}` |",
            d.dir.display(),
            d.why.replace('|', "/"),
            d.kept.display()
        );
    }
}
