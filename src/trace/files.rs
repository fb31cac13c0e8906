//! Where a run's traces lie and how large a reader takes them: what the writer
//! (`train --trace` writes them) and the merge (`crate::reduce::timeline`) share.

/// The trace folder inside a run folder.
pub(crate) const TRACE_DIR: &str = "trace";
/// The largest rank trace file read back to merge it.
pub(crate) const MAX_FILE_BYTES: u64 = 1 << 30;
/// A rank's trace file in the trace folder: `rank-NNNNN.trace.json`.
pub(crate) fn file_name(rank: usize) -> String {
    format!("rank-{rank:05}.trace.json")
}
