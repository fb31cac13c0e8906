//! One all-reduce (sum) of one buffer across the ranks of a communicator: the only code
//! that moves gradients, probe buffers or sweep buffers between ranks. Training's
//! reducers ([`super::mpi::MpiStaged`], [`super::nccl::NcclReducer`]) and the
//! `ddpbench allreduce` sweep call the same [`Transport::allreduce`], so a sweep row
//! times the code a training step runs.
//!
//! Two transports: [`mpi::Mpi`] runs `MPI_Allreduce` on host memory, and stages buffers
//! that live on a GPU (or are cast for the wire) through host buffers: copy to host,
//! `MPI_Allreduce`, copy back, pinned on a GPU. [`nccl::Nccl`] runs NCCL on device memory
//! on a stream of its own, its communicator joined by one rendezvous.
//!
//! What repeated all-reduces of one buffer reuse (the buffers themselves, host staging
//! buffers, CUDA events) is a [`Slot`], made and checked once before the timed steps, so
//! the per-step path neither allocates nor re-checks.

pub(crate) mod mpi;
pub(crate) mod nccl;

use super::ReduceDtype;
use crate::device::cuda::{Driver, Stream};
use anyhow::{bail, Result};
use tch::{Device, Tensor};

/// Which way a slot's buffers are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// `a` summed into `b`, or in place in `a` when the slot has no `b`.
    AToB,
    /// `b` summed into `a`: training's two gradient sets take turns as the source.
    BToA,
}

impl Dir {
    /// The direction whose source is gradient set `set` (0 is `a`, 1 is `b`).
    pub(crate) fn from_set(set: usize) -> Dir {
        if set == 0 {
            Dir::AToB
        } else {
            Dir::BToA
        }
    }
}

/// One buffer (or pair) bound to a transport, with what its all-reduces reuse.
pub(crate) struct Slot {
    a: Tensor,
    b: Option<Tensor>,
    numel: usize,
    device: Device,
    wire: ReduceDtype,
    /// MPI: host buffers (send, receive) of the wire dtype, when the buffers are on a GPU
    /// or travel in another dtype than they are held in.
    staging: Option<(Tensor, Tensor)>,
    /// NCCL: the events that order and time this buffer's all-reduces.
    events: Option<nccl::SlotEvents>,
}

impl Slot {
    /// Binds `a` (and `b`, the other buffer of an out-of-place all-reduce): both contiguous,
    /// with the same number of elements on the same device, and of the wire dtype unless
    /// `casts` (the staged path converts while it copies to and from the host).
    fn bind(a: &Tensor, b: Option<&Tensor>, wire: ReduceDtype, casts: bool) -> Result<Slot> {
        let numel = a.numel();
        let device = a.device();
        for t in std::iter::once(a).chain(b) {
            if !t.is_contiguous() || t.numel() != numel || t.device() != device {
                bail!(
                    "all-reduce buffers must be contiguous and alike: {:?} on {:?} against {numel} elements on {device:?} (internal error in the caller)",
                    t.size(),
                    t.device()
                );
            }
            if !casts && t.kind() != wire.kind() {
                bail!(
                    "all-reduce buffer of {:?} where the wire carries {:?} (internal error in the caller)",
                    t.kind(),
                    wire.kind()
                );
            }
        }
        Ok(Slot {
            a: a.shallow_clone(),
            b: b.map(Tensor::shallow_clone),
            numel,
            device,
            wire,
            staging: None,
            events: None,
        })
    }

    /// Elements per all-reduce.
    #[cfg(test)]
    pub(crate) fn numel(&self) -> usize {
        self.numel
    }

    /// The element type on the wire.
    #[cfg(test)]
    pub(crate) fn wire(&self) -> ReduceDtype {
        self.wire
    }

    /// The source and the destination (None: in place) of an all-reduce in `dir`, and
    /// the staging buffers, borrowed apart so that each may be written.
    #[allow(clippy::type_complexity)]
    fn parts(&mut self, dir: Dir) -> Result<(&mut Tensor, Option<&mut Tensor>, Option<(&mut Tensor, &mut Tensor)>)> {
        let staging = self.staging.as_mut().map(|(s, r)| (s, r));
        match (dir, self.b.as_mut()) {
            (Dir::AToB, b) => Ok((&mut self.a, b, staging)),
            (Dir::BToA, Some(b)) => Ok((b, Some(&mut self.a), staging)),
            (Dir::BToA, None) => bail!("an in-place all-reduce slot has no second buffer (internal error in the caller)"),
        }
    }

    /// The buffers (source, destination) of an all-reduce in `dir`; the destination is None in place.
    fn route(&self, dir: Dir) -> Result<(&Tensor, Option<&Tensor>)> {
        match (dir, &self.b) {
            (Dir::AToB, b) => Ok((&self.a, b.as_ref())),
            (Dir::BToA, Some(b)) => Ok((b, Some(&self.a))),
            (Dir::BToA, None) => bail!("an in-place all-reduce slot has no second buffer (internal error in the caller)"),
        }
    }

    /// The buffer that holds the sum after an all-reduce in `dir`.
    pub(crate) fn result(&self, dir: Dir) -> &Tensor {
        match (dir, &self.b) {
            (Dir::AToB, Some(b)) => b,
            _ => &self.a,
        }
    }
}

/// Seconds of the staging copies inside one all-reduce (0 where nothing is staged).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct StagingTimes {
    /// Device to host, before MPI.
    pub d2h_s: f64,
    /// Host to device, after MPI.
    pub h2d_s: f64,
}

/// An all-reduce (sum) of one buffer over every rank of a communicator.
pub(crate) trait Transport: Send {
    /// Binds `a` (summed in place) or `a` and `b` (summed from one into the other), sent
    /// as `wire`; `timed` asks for device-side timing of each all-reduce where the
    /// transport runs on a stream ([`nccl::Nccl::seconds`]). Made once per buffer.
    fn slot(&mut self, a: &Tensor, b: Option<&Tensor>, wire: ReduceDtype, timed: bool) -> Result<Slot>;

    /// Sums the slot's source over the ranks into its destination (`dir`). MPI returns
    /// with the sum in place; NCCL returns once it is queued after libtorch's work so far
    /// ([`Transport::wait`] waits for it).
    fn allreduce(&mut self, slot: &mut Slot, dir: Dir) -> Result<StagingTimes>;

    /// Returns once every all-reduce queued so far has finished.
    fn wait(&mut self) -> Result<()> {
        Ok(())
    }

    /// The CUDA stream the all-reduces run on; None when each is done before
    /// [`Transport::allreduce`] returns.
    fn stream(&self) -> Option<(&'static Driver, Stream)> {
        None
    }
}

#[cfg(test)]
mod tests;
