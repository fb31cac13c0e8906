//! Clock offsets between ranks. Every rank's CSV times (`step_start_at_s`, `comm_start_at_s`,
//! ...) count from its own start of the run, the moment it left a barrier; the ranks
//! leave it within the barrier's exit skew, and their clocks drift apart afterwards by
//! a few parts per million, milliseconds over a long run: the size of the straggler
//! waits measured.
//!
//! Ranks under one kernel share `CLOCK_MONOTONIC` (`std::time::Instant` reads it on
//! Linux), so each rank records its origin on that clock ([`Origin`]); two ranks whose
//! kernels have the same boot id then have an exact offset, the difference of their
//! origins, wrong only by the time it took to read the clock twice around the origin.
//! Across kernels the offset is estimated by ping-pong: round trips repeat until the
//! shortest one's half (the error bound: the true offset lies within it) is below
//! [`TARGET_ERROR_S`] or [`BUDGET_S`] is spent, at least [`MIN_ROUNDS`] times. Both are
//! estimated at the start and after every epoch, and rank 0 writes them to `clock.csv`;
//! `reduce` corrects times with the exact offset where there is one, else by
//! interpolating the estimates, and claims an arrival order only beyond the error.

use crate::record::clock::{ClockRow, MAX_ROUNDS};
use crate::world::Group;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::Communicator;
use std::time::Instant;

/// Round trips at least, per rank and estimate.
pub(crate) const MIN_ROUNDS: usize = 8;
/// Round trips stop once the error bound is below this.
pub(crate) const TARGET_ERROR_S: f64 = 50e-6;
/// Or once this much time was spent on one rank's estimate.
pub(crate) const BUDGET_S: f64 = 0.2;
/// Tag of the clock messages.
const TAG: i32 = 0x0c10;
/// A ping carrying this tells rank 0 the round trips are over.
const DONE: f64 = -1.0;

/// The common start of the run on this rank's clocks: the `Instant` every CSV time counts
/// from, and where it lies on `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub instant: Instant,
    /// `CLOCK_MONOTONIC` at `instant`, seconds: the middle of two reads around it.
    pub monotonic_s: f64,
    /// Half the time between those two reads: `monotonic_s` is right to within this.
    pub monotonic_error_s: f64,
}

impl Origin {
    pub(crate) fn now() -> Origin {
        let before = monotonic_s();
        let instant = Instant::now();
        let after = monotonic_s();
        Origin {
            instant,
            monotonic_s: (before + after) / 2.0,
            monotonic_error_s: (after - before) / 2.0,
        }
    }
}

/// `CLOCK_MONOTONIC` now, seconds.
pub(crate) fn monotonic_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// This kernel's boot id, hashed (0 where it cannot be read: no rank then counts as
/// sharing rank 0's clock). Equal ids: one kernel, one `CLOCK_MONOTONIC`.
pub(crate) fn boot_id_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) if !id.trim().is_empty() => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            id.trim().hash(&mut h);
            h.finish().max(1)
        }
        _ => 0,
    }
}

/// What a rank sends rank 0 after its round trips.
struct Estimate {
    rank0_at_s: f64,
    offset_s: f64,
    error_s: f64,
    rounds: usize,
}

/// Round trips to rank 0 until the error bound is below [`TARGET_ERROR_S`] or
/// [`BUDGET_S`] is spent (at least [`MIN_ROUNDS`]); the shortest wins.
fn round_trips(root: &mpi::topology::Process<'_>, now: &dyn Fn() -> f64) -> Estimate {
    let started = Instant::now();
    let mut best = Estimate {
        rank0_at_s: 0.0,
        offset_s: 0.0,
        error_s: f64::INFINITY,
        rounds: 0,
    };
    while best.rounds < MAX_ROUNDS
        && (best.rounds < MIN_ROUNDS || (best.error_s > TARGET_ERROR_S && started.elapsed().as_secs_f64() < BUDGET_S))
    {
        let sent = now();
        root.send_with_tag(&sent, TAG);
        let (theirs, _) = root.receive_with_tag::<f64>(TAG);
        let back = now();
        best.rounds += 1;
        // Rank 0 read `theirs` between `sent` and `back`: the offset lies within half
        // the round trip of the middle.
        if (back - sent) / 2.0 < best.error_s {
            best.error_s = (back - sent) / 2.0;
            best.offset_s = theirs - (sent + back) / 2.0;
            best.rank0_at_s = theirs;
        }
    }
    root.send_with_tag(&DONE, TAG);
    best
}

/// Estimates every rank's offset to rank 0 (a collective over `g`); rank 0 gets the
/// rows, the others an empty list.
pub(crate) fn estimate(g: &Group, origin: &Origin, boot_id: u64, sync: usize) -> Vec<ClockRow> {
    let _f = crate::flight::enter("point-to-point", "clock offsets");
    let now = || origin.instant.elapsed().as_secs_f64();
    if g.rank != 0 {
        let root = g.comm.process_at_rank(0);
        let e = round_trips(&root, &now);
        let est = [
            e.rank0_at_s,
            e.offset_s,
            e.error_s,
            e.rounds as f64,
            origin.monotonic_s,
            origin.monotonic_error_s,
        ];
        root.send_with_tag(&est[..], TAG);
        root.send_with_tag(&boot_id, TAG);
        return Vec::new();
    }
    let mut rows = vec![ClockRow {
        sync,
        rank: 0,
        rank0_at_s: now(),
        offset_s: 0.0,
        error_s: 0.0,
        rounds: Some(0),
        exact_offset_s: Some(0.0),
        exact_error_s: Some(0.0),
    }];
    for r in 1..g.size {
        let peer = g.comm.process_at_rank(r as i32);
        loop {
            let (ping, _) = peer.receive_with_tag::<f64>(TAG);
            if ping == DONE {
                break;
            }
            peer.send_with_tag(&now(), TAG);
        }
        let (est, _) = peer.receive_vec_with_tag::<f64>(TAG);
        let (their_boot, _) = peer.receive_with_tag::<u64>(TAG);
        let get = |i: usize| est.get(i).copied().unwrap_or(f64::NAN);
        let shared = boot_id != 0 && their_boot == boot_id;
        // Rank 0's clock minus rank r's at one instant T: (T − o₀) − (T − o_r) = o_r − o₀.
        rows.push(ClockRow {
            sync,
            rank: r,
            rank0_at_s: get(0),
            offset_s: get(1),
            error_s: get(2),
            rounds: Some(get(3) as usize),
            exact_offset_s: shared.then(|| get(4) - origin.monotonic_s),
            exact_error_s: shared.then(|| get(5) + origin.monotonic_error_s),
        });
    }
    rows
}
