//! The rows of `allreduce.csv` (and of `allreduce.json`'s `rows`): one size, one
//! buffer arrangement, on one backend and level. Times in seconds and bandwidths in
//! bytes per second, as every other file (schema 3; microseconds and GB/s before).

use super::settings::{Backend, Memory};
use serde::{Deserialize, Serialize};

/// Where an all-reduce's result goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Buffer {
    /// Into a second buffer (as a reducer into its bucket's result).
    OutOfPlace,
    /// Over its own input.
    InPlace,
}

/// One row of `allreduce.csv`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct SweepRow {
    pub level: String,
    pub backend: Backend,
    /// Where the buffers lived: `host`, or `device` (NCCL, or MPI staged through pinned
    /// host buffers: the sweep's backend `staged` before schema 4).
    pub memory: Memory,
    pub dtype: String,
    /// `out-of-place` or `in-place` (the column `placement` before schema 3).
    pub buffer: Buffer,
    /// Ranks in the all-reduce, the nodes they span, ranks per node.
    pub ranks: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub bytes: u64,
    pub count: u64,
    pub iters: usize,
    /// Seconds every rank left the link idle before each timed all-reduce (0: back to
    /// back); not part of any time. Absent in files before it existed: back to back.
    #[serde(default)]
    pub idle_before_s: f64,
    /// Mean seconds per all-reduce over the timed loop, averaged over ranks.
    pub time_s: f64,
    /// The same on the slowest rank.
    pub time_max_rank_s: f64,
    /// Single iterations (each the slowest rank's): 10th, 50th, 90th percentile, seconds.
    pub iter_p10_s: f64,
    pub iter_median_s: f64,
    pub iter_p90_s: f64,
    /// bytes / time_s.
    pub algbw_bytes_per_s: f64,
    /// algbw × 2(n−1)/n.
    pub busbw_bytes_per_s: f64,
    /// Elements that differed from the exact expected sum, over all ranks.
    pub wrong: u64,
    pub node_type: String,
}
