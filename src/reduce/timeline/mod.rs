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
    /// chrome://tracing). Each file is read a line at a time, so memory does not grow with
    /// it; a line that is not a whole event of its rank is skipped, and stderr says how
    /// many and why, per rank, as it says where a rank's trace stopped at its size bound.
    /// timeline.json is replaced only once written whole; only regular files are read.
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

/// Most ranks named one per line in what a merge says; the rest are counted, and
/// timeline.json's `otherData` lists every one.
const RANKS_NAMED: usize = 8;
/// About what Perfetto's UI loads in one browser tab.
const PERFETTO_TAB_BYTES: u64 = 2_000_000_000;

/// Logs what a merge wrote, which ranks' files were cut short or absent, where a rank's
/// trace stops at its byte bound, and what lines were skipped.
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
    for (rank, step, bound) in m.stopped.iter().take(RANKS_NAMED) {
        eprintln!(
            "trace of rank {rank} stops at step {step}: its file reached the per-rank bound of {bound} bytes; \
             the steps before are merged whole"
        );
    }
    for (rank, s) in m.skipped.iter().take(RANKS_NAMED) {
        eprintln!(
            "rank {rank}: {} line(s) of {}/{} skipped, not whole events of this rank ({}{})",
            s.count,
            TRACE_DIR,
            crate::trace::writer::file_name(*rank),
            s.first.join("; "),
            if s.count > s.first.len() { "; ..." } else { "" }
        );
    }
    let more = m.stopped.len().saturating_sub(RANKS_NAMED) + m.skipped.len().saturating_sub(RANKS_NAMED);
    if more > 0 {
        eprintln!("... and {more} more as above: otherData in {} names every rank", m.path.display());
    }
    if m.bytes > PERFETTO_TAB_BYTES {
        eprintln!(
            "{} is {:.1} GB, more than Perfetto's UI holds in one tab (about 2 GB): trace fewer steps \
             (--trace-steps A:B) or open it with Perfetto's trace_processor",
            m.path.display(),
            m.bytes as f64 / 1e9
        );
    }
}
