//! report.md: the tables a scaling study is read from, each with a sentence saying
//! what its numbers say; the terminal tables ([`terminal`]) and the plots ([`plots`]).

mod communication;
mod efficiency;
mod nodes;
mod plots;
mod projection;
mod speedup;
mod terminal;

pub use plots::plots;
pub use projection::{print_projection, projection_left_out, projection_markdown, projection_plot};
pub use terminal::print_tables;

use super::analysis::{RunStats, ScalingRow, TypeSummary};
use std::fmt::Write;

pub(crate) fn gbs(bytes_per_s: f64) -> String {
    if bytes_per_s.is_finite() {
        format!("{:.2}", bytes_per_s / 1e9)
    } else {
        "–".into()
    }
}

pub(crate) fn ms(s: f64) -> String {
    if s.is_finite() {
        format!("{:.2}", s * 1e3)
    } else {
        "–".into()
    }
}

pub(crate) fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0} %", x * 100.0)
    } else {
        "–".into()
    }
}

/// report.md for the complete runs, their summaries and scaling rows, naming the
/// incomplete runs left out.
pub fn markdown(
    runs: &[&RunStats],
    incomplete: &[&RunStats],
    summaries: &[TypeSummary],
    scaling: &[ScalingRow],
    with_plots: bool,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# ddpbench report\n");
    let _ = writeln!(
        md,
        "{} complete run(s), {} incomplete. Steps flagged as warm-up are excluded; times are per step unless said otherwise.\n",
        runs.len(),
        incomplete.len()
    );
    speedup::runs_table(&mut md, runs, summaries);
    speedup::per_workload(&mut md, scaling);
    communication::compute_vs_comm(&mut md, runs);
    communication::bandwidth(&mut md, runs, summaries);
    efficiency::epoch_times(&mut md, runs);
    efficiency::waterfall(&mut md, scaling);
    nodes::node_types(&mut md, runs, summaries);
    nodes::stalls(&mut md, runs);
    nodes::incomplete(&mut md, incomplete);
    if with_plots {
        let _ = writeln!(md, "\n## Plots\n\n![speedup](speedup.svg) ![efficiency](efficiency.svg) ![phases](phases.svg) ![bandwidth](bandwidth.svg)\n\nStep time per rank: `step_time_per_rank-<run>.svg`.");
    }
    md
}

/// How a run communicated, in a few words: backend, overlap, wire dtype, AMP.
pub(crate) fn comm_setup(m: &crate::record::Manifest) -> String {
    let mut parts = vec![m.comm_backend.clone()];
    if m.comm.overlap {
        parts.push(format!("overlap ({} segments)", m.comm.backward_stages));
    }
    if !m.comm.grad_dtype.is_empty() && m.comm.grad_dtype != "fp32" {
        parts.push(format!("{} gradients", m.comm.grad_dtype));
    }
    if !m.comm.amp.is_empty() && m.comm.amp != "off" {
        parts.push(format!("amp {}", m.comm.amp));
    }
    parts.join(", ")
}
