//! Clock offsets between ranks. Every rank's CSV times (`step_start_at_s`, `comm_start_at_s`,
//! ...) count from its own start of the run, the moment it left a barrier; the ranks
//! leave it within the barrier's exit skew, and their clocks drift apart afterwards by
//! a few parts per million, milliseconds over a long run: the size of the straggler
//! waits measured. So at the start and after every epoch each rank's offset to rank 0
//! is estimated by ping-pong (the round trip with the shortest time wins; its half is
//! the error bound), and rank 0 writes them to `clock.csv`. `reduce` corrects times by
//! interpolating the offsets.

use crate::record::{plain_decimal, CsvLog};
use crate::world::Group;
use anyhow::Result;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::Communicator;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Round trips per rank and estimate.
const ROUNDS: usize = 8;
/// Tag of the clock messages.
const TAG: i32 = 0x0c10;

/// One rank's offset at one synchronisation point (a row of `clock.csv`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClockRow {
    /// 0 at the start of training, k after epoch k-1.
    pub sync: usize,
    pub rank: usize,
    /// Rank 0's clock (seconds since its start of the run) at this estimate
    /// (`rank0_elapsed_s` before schema 3).
    #[serde(alias = "rank0_elapsed_s")]
    pub rank0_at_s: f64,
    /// Rank 0's clock minus this rank's clock: add it to this rank's times.
    #[serde(serialize_with = "plain_decimal")]
    pub offset_s: f64,
    /// Half the shortest round trip: the offset is right to within this.
    #[serde(serialize_with = "plain_decimal")]
    pub error_s: f64,
}

/// Estimates every rank's offset to rank 0 (a collective over `g`); rank 0 gets the
/// rows, the others an empty list.
pub fn estimate(g: &Group, origin: Instant, sync: usize) -> Vec<ClockRow> {
    let _f = crate::flight::enter("point-to-point", "clock offsets");
    let now = || origin.elapsed().as_secs_f64();
    if g.rank == 0 {
        let mut rows = vec![ClockRow {
            sync,
            rank: 0,
            rank0_at_s: now(),
            offset_s: 0.0,
            error_s: 0.0,
        }];
        for r in 1..g.size {
            let peer = g.comm.process_at_rank(r as i32);
            for _ in 0..ROUNDS {
                let (_, _) = peer.receive_with_tag::<f64>(TAG);
                peer.send_with_tag(&now(), TAG);
            }
            let (row, _) = peer.receive_vec_with_tag::<f64>(TAG);
            rows.push(ClockRow {
                sync,
                rank: r,
                rank0_at_s: row[0],
                offset_s: row[1],
                error_s: row[2],
            });
        }
        rows
    } else {
        let root = g.comm.process_at_rank(0);
        let mut best = (f64::INFINITY, 0.0, 0.0);
        for _ in 0..ROUNDS {
            let sent = now();
            root.send_with_tag(&sent, TAG);
            let (theirs, _) = root.receive_with_tag::<f64>(TAG);
            let back = now();
            let rtt = back - sent;
            if rtt < best.0 {
                best = (rtt, theirs - (sent + back) / 2.0, theirs);
            }
        }
        root.send_with_tag(&[best.2, best.1, best.0 / 2.0][..], TAG);
        Vec::new()
    }
}

/// `clock.csv` in the run folder, written by rank 0.
pub struct ClockLog(CsvLog<ClockRow>);

impl ClockLog {
    pub fn create(path: &std::path::Path) -> Result<ClockLog> {
        Ok(ClockLog(CsvLog::create(path)?))
    }

    pub fn write(&mut self, rows: &[ClockRow]) -> Result<()> {
        for r in rows {
            self.0.write(r)?;
        }
        self.0.flush()
    }
}
