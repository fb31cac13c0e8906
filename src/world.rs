//! The MPI world as a rank sees it ([`World`], initialised once), the communicator a
//! command runs on ([`Group`]: the world, or a part of it), and the collective helpers
//! every command uses: agreeing on an error ([`agree`]), broadcasting and gathering strings.

use anyhow::{Context, Result};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::topology::{Communicator, SimpleCommunicator};

/// MPI for this process: initialised on creation, finalised when dropped.
pub(crate) struct World {
    /// Held for its drop, which finalises MPI.
    _universe: mpi::environment::Universe,
    /// All ranks of the job.
    pub group: Group,
}

impl World {
    pub(crate) fn init() -> Result<World> {
        // Serialized: the all-reduce thread of --overlap makes MPI calls while the main
        // thread makes none.
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .context("MPI could not be initialised (already initialised?). Launch with mpirun or srun")?;
        let group = Group::new(universe.world(), threading);
        Ok(World {
            _universe: universe,
            group,
        })
    }
}

/// A communicator and the facts a rank needs about it: its rank and size, its rank
/// among the members on the same node, its host, and how many nodes the members span.
pub(crate) struct Group {
    pub comm: SimpleCommunicator,
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub host: String,
    /// Number of distinct nodes (shared-memory domains) among the members.
    pub nodes: usize,
    /// MPI's thread support as granted to the process.
    pub threading: mpi::Threading,
}

impl Group {
    /// Collective over `comm`: every member must call it.
    pub(crate) fn new(comm: SimpleCommunicator, threading: mpi::Threading) -> Group {
        let local = comm.split_shared(0);
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "unknown".into());
        let is_leader = u32::from(local.rank() == 0);
        let mut nodes = 0u32;
        let f = crate::flight::enter("all-reduce", "node count");
        comm.all_reduce_into(&is_leader, &mut nodes, SystemOperation::sum());
        drop(f);
        Group {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            local_rank: local.rank() as usize,
            local_size: local.size() as usize,
            host,
            nodes: nodes as usize,
            threading,
            comm,
        }
    }

    /// True when MPI calls may come from a thread other than the main one (one at a time).
    pub(crate) fn threads_may_call_mpi(&self) -> bool {
        matches!(self.threading, mpi::Threading::Serialized | mpi::Threading::Multiple)
    }
}

/// An error every rank knows about (agreed through MPI), reported once by rank 0.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct AgreedError {
    /// The lowest rank that hit it.
    pub rank: usize,
    pub message: String,
}

/// Turns a per-rank result into one every rank agrees on: if any rank failed,
/// all ranks return the lowest failing rank's message as an [`AgreedError`].
pub(crate) fn agree<T>(g: &Group, result: Result<T>) -> Result<T> {
    let _f = crate::flight::enter("all-reduce", "set-up check");
    let mine: i32 = if result.is_err() { g.rank as i32 } else { i32::MAX };
    let mut first = 0i32;
    g.comm.all_reduce_into(&mine, &mut first, SystemOperation::min());
    if first == i32::MAX {
        return result;
    }
    let mut text = match &result {
        Err(e) if g.rank as i32 == first => format!("{e:#}").into_bytes(),
        _ => Vec::new(),
    };
    let root = g.comm.process_at_rank(first);
    let mut len = text.len() as u64;
    root.broadcast_into(&mut len);
    text.resize(len as usize, 0);
    if len > 0 {
        root.broadcast_into(&mut text[..]);
    }
    Err(AgreedError {
        rank: first as usize,
        message: String::from_utf8_lossy(&text).into_owned(),
    }
    .into())
}

/// Rank 0's string, on every rank.
pub(crate) fn broadcast_string(g: &Group, s: &str) -> String {
    let _f = crate::flight::enter("broadcast", "text");
    let root = g.comm.process_at_rank(0);
    let mut bytes = if g.rank == 0 { s.as_bytes().to_vec() } else { Vec::new() };
    let mut len = bytes.len() as u64;
    root.broadcast_into(&mut len);
    bytes.resize(len as usize, 0);
    // MPI refuses a broadcast of zero bytes; every rank knows the length is 0.
    if len > 0 {
        root.broadcast_into(&mut bytes[..]);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every rank's string, on rank 0 (None elsewhere).
pub(crate) fn gather_strings(g: &Group, s: &str) -> Option<Vec<String>> {
    let _f = crate::flight::enter("gather", "text");
    let mut width = 0u64;
    g.comm.all_reduce_into(&(s.len() as u64), &mut width, SystemOperation::max());
    // MPI refuses a gather of zero bytes: every string empty still sends one.
    let width = width.max(1);
    let mut mine = s.as_bytes().to_vec();
    mine.resize(width as usize, 0);
    let root = g.comm.process_at_rank(0);
    if g.rank == 0 {
        let mut all = vec![0u8; width as usize * g.size];
        root.gather_into_root(&mine[..], &mut all[..]);
        Some(
            all.chunks(width as usize)
                .take(g.size)
                .map(|c| String::from_utf8_lossy(c).trim_end_matches('\0').to_string())
                .collect(),
        )
    } else {
        root.gather_into(&mine[..]);
        None
    }
}

/// Every rank's string, on every rank.
pub(crate) fn all_strings(g: &Group, s: &str) -> Vec<String> {
    let gathered = gather_strings(g, s).unwrap_or_default();
    let joined = broadcast_string(g, &serde_json::to_string(&gathered).unwrap_or_default());
    serde_json::from_str(&joined).unwrap_or_default()
}

/// This process's rank as the launcher set it (Open MPI, PMIx, Slurm, MPICH), before MPI
/// starts; None outside a launcher.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

/// Launcher variables worth keeping with a run (Open MPI, Slurm, CUDA).
pub(crate) fn launcher_env() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("OMPI_COMM_WORLD_")
                || k.starts_with("SLURM_")
                || k == "CUDA_VISIBLE_DEVICES"
                || k == "PMIX_RANK"
                || k == "OMP_NUM_THREADS"
        })
        .collect();
    vars.sort();
    vars
}
