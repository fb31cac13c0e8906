//! `ddpbench trace RUN_DIR`, and `reduce` on a traced run: every rank's trace file
//! ([`crate::trace::writer`]) merged on rank 0's clock into `timeline.json` ([`merge`]),
//! corrected by the same [`super::read::ClockOffsets`] that `reduce` compares the
//! ranks' CSV times with (exact offsets where ranks share rank 0's kernel).

pub mod merge;
pub mod read;

use crate::trace::writer::TRACE_DIR;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// `ddpbench trace RUN_DIR`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A run folder written by `ddpbench train --trace`: its trace/rank-*.trace.json files
    /// are merged into RUN_DIR/timeline.json on rank 0's clock (open it in Perfetto UI or
    /// chrome://tracing).
    pub run_dir: PathBuf,
}

/// Entry point of `ddpbench trace`.
pub fn main(args: TraceArgs) -> Result<()> {
    let m = merge::merge(&args.run_dir)?;
    report(&m);
    Ok(())
}

/// After `reduce`: merges the timeline of every run folder given that holds traces.
pub fn merge_traced(runs: &[PathBuf]) -> Result<()> {
    for dir in runs.iter().filter(|d| d.join(TRACE_DIR).is_dir()) {
        report(&merge::merge(dir)?);
    }
    Ok(())
}

/// Logs what a merge wrote, and which ranks' files were cut short or absent.
pub fn report(m: &merge::Merged) {
    println!("{}: {} events of {} rank(s) on one clock", m.path.display(), m.events, m.ranks);
    if !m.partial.is_empty() {
        eprintln!(
            "rank(s) {:?} stopped before the run completed their trace: their events up to the last whole one are merged",
            m.partial
        );
    }
    if !m.missing.is_empty() {
        eprintln!("rank(s) {:?} left no trace file", m.missing);
    }
}
