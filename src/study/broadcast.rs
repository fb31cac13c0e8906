//! The study's own collectives on the world: one rank's string to every rank, and a
//! barrier that leaves a waiting rank's core idle.

use crate::world::Group;
use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;
use std::time::Duration;

/// Rank `root`'s string, on every rank.
pub(super) fn broadcast_from(g: &Group, root: usize, s: &str) -> String {
    use mpi::collective::Root;
    let _f = crate::flight::enter("broadcast", "study point outcome");
    let r = g.comm.process_at_rank(root as i32);
    let mut bytes = if g.rank == root { s.as_bytes().to_vec() } else { Vec::new() };
    let mut len = bytes.len() as u64;
    r.broadcast_into(&mut len);
    bytes.resize(len as usize, 0);
    r.broadcast_into(&mut bytes[..]);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A barrier on the world that leaves a waiting rank's core idle: a non-blocking
/// barrier tested every few milliseconds, sleeping in between (a blocking MPI barrier
/// busy-polls).
pub(super) fn wait_without_spinning(g: &Group, what: &str) {
    let _f = crate::flight::enter("barrier", &format!("end of {what}"));
    let mut req = g.comm.immediate_barrier();
    let mut nap = Duration::from_micros(200);
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}
