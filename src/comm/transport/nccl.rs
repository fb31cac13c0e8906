//! NCCL all-reduce of one buffer on device memory. The communicator is joined by one
//! rendezvous ([`Nccl::join`]: rank 0 makes the unique id, MPI broadcasts it), and
//! every all-reduce runs on a dedicated non-blocking CUDA stream.
//!
//! Ordering against libtorch's work (on the legacy default stream) is by events only:
//! before each all-reduce an event is recorded on libtorch's stream and NCCL's stream
//! waits for it, so the all-reduce starts once the kernels that wrote the buffer are
//! done while the host goes on queueing work. A timed slot's all-reduce is bracketed by
//! a pair of events on NCCL's stream ([`Nccl::seconds`]).

use super::{Dir, ReduceDtype, Slot, StagingTimes, Transport};
use crate::device::cuda::{self, Driver, Event, NcclComm, NcclDtype, NcclUniqueId, Stream, LEGACY_STREAM};
use crate::world::Group;
use anyhow::{anyhow, Result};
use mpi::collective::Root;
use mpi::topology::{Communicator, SimpleCommunicator};
use tch::{Device, Tensor};

/// NCCL's name for each wire dtype.
pub(crate) fn nccl_dtype(d: ReduceDtype) -> NcclDtype {
    match d {
        ReduceDtype::Fp32 => NcclDtype::Float32,
        ReduceDtype::Fp64 => NcclDtype::Float64,
        ReduceDtype::Fp16 => NcclDtype::Float16,
        ReduceDtype::Bf16 => NcclDtype::Bfloat16,
    }
}

/// Loads the CUDA driver and NCCL and makes `device_index` current: the part of joining
/// that can fail locally, to be agreed across ranks before anyone enters NCCL's
/// collective initialisation.
pub(crate) fn prepare(device_index: usize) -> Result<(&'static Driver, &'static cuda::Nccl)> {
    let d = cuda::driver()?;
    let n = cuda::nccl()?;
    d.use_device(device_index)?;
    Ok((d, n))
}

/// Which ranks of the group train on the same GPU as this one, said as a reason NCCL
/// cannot work (it needs a GPU per rank); None when this rank's GPU is its own. Every
/// rank of the group takes part. A GPU is its host and PCI bus id (the CUDA index
/// where the bus id is unknown).
pub(crate) fn shared_gpu(g: &Group, device: Device, bus_id: Option<&str>) -> Option<String> {
    let mine = match device {
        Device::Cuda(i) => format!("{} {}", g.host, bus_id.map(str::to_string).unwrap_or_else(|| format!("cuda:{i}"))),
        _ => String::new(),
    };
    let all = crate::world::all_strings(g, &mine);
    if mine.is_empty() {
        return None;
    }
    let same: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(r, gpu)| **gpu == mine && *r != g.rank)
        .map(|(r, _)| r.to_string())
        .collect();
    (!same.is_empty()).then(|| {
        format!(
            "rank {} shares its GPU ({mine}) with rank(s) {}, and NCCL needs one GPU per rank: \
             give each rank its own GPU, or all-reduce CPU-staged (--allreduce mpi)",
            g.rank,
            same.join(", ")
        )
    })
}

/// The events of one slot: `ready` on libtorch's stream, and for a timed slot the
/// (start, end) of its all-reduce on NCCL's stream.
pub(super) struct SlotEvents {
    ready: Event,
    timing: Option<(Event, Event)>,
}

/// An NCCL communicator over the members of an MPI communicator, and its stream.
pub(crate) struct Nccl {
    nccl: &'static cuda::Nccl,
    cuda: &'static Driver,
    comm: NcclComm,
    stream: Stream,
}

impl Nccl {
    /// Joins an NCCL communicator over the members of `comm` on GPU `device_index`, every
    /// member taking part: rank 0 makes the unique id, `agree` turns its result into one
    /// every member shares (or passes it on where a failure on rank 0 ends the job
    /// anyway), and MPI broadcasts it.
    pub(crate) fn join(
        comm: &SimpleCommunicator,
        device_index: usize,
        agree: impl FnOnce(Result<NcclUniqueId>) -> Result<NcclUniqueId>,
    ) -> Result<Nccl> {
        let (cuda, nccl) = prepare(device_index)?;
        let mine = if comm.rank() == 0 {
            nccl.unique_id()
        } else {
            Ok(NcclUniqueId { internal: [0; 128] })
        };
        let mut id = agree(mine)?;
        {
            let _f = crate::flight::enter("broadcast", "NCCL unique id");
            comm.process_at_rank(0).broadcast_into(&mut id.internal[..]);
        }
        // Not agreed: a rank whose ncclCommInitRank fails leaves the others waiting in it,
        // so its error ends the job rather than meeting them in a collective.
        let nc = nccl.init_rank(comm.size() as usize, id, comm.rank() as usize)?;
        let stream = match cuda.non_blocking_stream() {
            Ok(s) => s,
            Err(e) => {
                nccl.destroy(nc);
                return Err(e);
            }
        };
        Ok(Nccl {
            nccl,
            cuda,
            comm: nc,
            stream,
        })
    }

    /// The CUDA driver the transport runs on.
    pub(crate) fn driver(&self) -> &'static Driver {
        self.cuda
    }

    /// For a timed slot whose all-reduce has finished: its seconds on the device, and the
    /// device seconds from its start to `mark` (negative when `mark` came first).
    pub(crate) fn seconds(&self, slot: &Slot, mark: &Event) -> Result<(f64, f64)> {
        let (start, end) = slot
            .events
            .as_ref()
            .and_then(|e| e.timing.as_ref())
            .ok_or_else(|| anyhow!("an NCCL slot made without timing was asked for its time (internal error)"))?;
        Ok((self.cuda.elapsed_s(start, end)?, self.cuda.elapsed_s(start, mark)?))
    }
}

impl Transport for Nccl {
    fn slot(&mut self, a: &Tensor, b: Option<&Tensor>, wire: ReduceDtype, timed: bool) -> Result<Slot> {
        let mut slot = Slot::bind(a, b, wire, false)?;
        let timing = if timed {
            Some((self.cuda.event(true)?, self.cuda.event(true)?))
        } else {
            None
        };
        slot.events = Some(SlotEvents {
            ready: self.cuda.event(false)?,
            timing,
        });
        Ok(slot)
    }

    fn allreduce(&mut self, slot: &mut Slot, dir: Dir) -> Result<StagingTimes> {
        let events = slot
            .events
            .as_ref()
            .ok_or_else(|| anyhow!("an NCCL all-reduce on a slot made by another transport (internal error)"))?;
        self.cuda.record(&events.ready, LEGACY_STREAM)?;
        self.cuda.wait(self.stream, &events.ready)?;
        if let Some((start, _)) = &events.timing {
            self.cuda.record(start, self.stream)?;
        }
        let (src, dst) = slot.route(dir)?;
        let recv = dst.unwrap_or(src).data_ptr();
        // SAFETY: device buffers of `numel` wire-dtype elements, checked when the slot was
        // bound and held by it until the stream has run the operation; in place, NCCL
        // allows send == recv.
        unsafe {
            self.nccl
                .all_reduce_sum(src.data_ptr(), recv, slot.numel, nccl_dtype(slot.wire), self.comm, self.stream)?;
        }
        if let Some((_, end)) = &events.timing {
            self.cuda.record(end, self.stream)?;
        }
        Ok(StagingTimes::default())
    }

    fn wait(&mut self) -> Result<()> {
        self.cuda.synchronize(self.stream)
    }

    fn stream(&self) -> Option<(&'static Driver, Stream)> {
        Some((self.cuda, self.stream))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let _ = self.cuda.synchronize(self.stream);
        self.nccl.destroy(self.comm);
    }
}
