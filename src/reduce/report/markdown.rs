//! report.md: the tables a scaling study is read from, each with the sentences the
//! report found under it.

use super::sections::Section;
use super::{projection, Report};
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
    for section in Section::ALL {
        section.markdown(&mut md, report);
    }
    if with_plots {
        let _ = writeln!(md, "\n## Plots\n\n![speedup](speedup.svg) ![efficiency](efficiency.svg) ![bandwidth](bandwidth.svg)\n\nMean time per step by phase, one panel per model and batch per rank: `phases-<model>-b<batch>.svg`. Step time per rank: `step_time_per_rank-<run>.svg`.");
    }
    if let Some(p) = &report.projection {
        md.push_str(&projection::markdown(p, with_plots));
    }
    md
}
