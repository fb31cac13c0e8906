//! All-reduce on the device with NCCL: rank 0 makes the unique id, MPI broadcasts it
//! (the rendezvous), every rank joins one communicator.
//!
//! Buckets are reduced on a dedicated non-blocking CUDA stream. Ordering against
//! libtorch's work (on the legacy default stream) is by events only: when backward
//! hands over bucket b, an event is recorded on libtorch's stream and NCCL's stream
//! waits for it, so the all-reduce starts once the kernels that wrote the bucket are
//! done while the host goes on queueing backward. At the end, libtorch's stream waits
//! for NCCL's last event, so the optimizer reads reduced gradients. Each bucket's
//! all-reduce is timed with a pair of events on NCCL's stream.

use super::GradDtype;
use super::{wire_kind, BucketPlan, CommStats, FlatGrads, GradientReducer};
use crate::device::cuda::{self, Driver, Event, Nccl, NcclComm, NcclDtype, NcclUniqueId, Stream, LEGACY_STREAM};
use anyhow::{anyhow, Result};
use std::time::Instant;
use tch::Tensor;

pub struct NcclReducer {
    nccl: &'static Nccl,
    cuda: &'static Driver,
    comm: NcclComm,
    stream: Stream,
    plan: BucketPlan,
    dtype: GradDtype,
    flat: Option<FlatGrads>,
    /// Device buffers (send, receive) of the wire dtype, when it is not fp32.
    wire: Vec<(Tensor, Tensor)>,
    ready: Vec<Event>,
    start: Vec<Event>,
    end: Vec<Event>,
    /// Recorded on libtorch's stream when `finish` is called: backward's end on the device.
    backward_end: Event,
    done: Event,
    /// The flight recorder's numbers of this step's bucket all-reduces (entered when
    /// enqueued on the host, completed when the step's NCCL work is done).
    seqs: Vec<u64>,
}

/// Loads the CUDA driver and NCCL and makes `device_index` current: the part of joining
/// that can fail locally, to be agreed across ranks before anyone enters NCCL's
/// collective initialisation.
pub fn prepare(device_index: usize) -> Result<(&'static Driver, &'static Nccl)> {
    let d = cuda::driver()?;
    let n = cuda::nccl()?;
    d.use_device(device_index)?;
    Ok((d, n))
}

impl NcclReducer {
    /// Joins the communicator named by `id` (every rank calls this with the same id).
    pub fn join(
        rank: usize,
        ranks: usize,
        id: NcclUniqueId,
        device_index: usize,
        plan: BucketPlan,
        dtype: GradDtype,
    ) -> Result<NcclReducer> {
        let (cuda, nccl) = prepare(device_index)?;
        let comm = nccl.init_rank(ranks, id, rank)?;
        let stream = cuda.non_blocking_stream()?;
        let n = plan.buckets.len();
        let events = |timing: bool| (0..n).map(|_| cuda.event(timing)).collect::<Result<Vec<_>>>();
        Ok(NcclReducer {
            nccl,
            cuda,
            comm,
            stream,
            ready: events(false)?,
            start: events(true)?,
            end: events(true)?,
            backward_end: cuda.event(true)?,
            done: cuda.event(false)?,
            seqs: Vec::new(),
            plan,
            dtype,
            flat: None,
            wire: Vec::new(),
        })
    }

    fn nccl_dtype(&self) -> NcclDtype {
        match self.dtype {
            GradDtype::Fp32 => NcclDtype::Float32,
            GradDtype::Fp16 => NcclDtype::Float16,
            GradDtype::Bf16 => NcclDtype::Bfloat16,
        }
    }
}

impl GradientReducer for NcclReducer {
    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn attach(&mut self, params: &[Tensor]) -> Result<()> {
        let flat = FlatGrads::attach(&self.plan, params)?;
        let device = flat.sets[0][0].device();
        if self.dtype != GradDtype::Fp32 {
            let kind = wire_kind(self.dtype);
            self.wire = self
                .plan
                .numels
                .iter()
                .map(|&n| (Tensor::zeros([n as i64], (kind, device)), Tensor::zeros([n as i64], (kind, device))))
                .collect();
        }
        self.flat = Some(flat);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        let Some((src, dst)) = flat.claim(b) else { return Ok(()) };
        let flight = crate::flight::recorder();
        let seq = flight.schedule("all-reduce", &format!("bucket {b}"));
        flight.start(seq);
        self.seqs.push(seq);
        let (send, recv) = if self.wire.is_empty() {
            (src, dst)
        } else {
            let (s, r) = &self.wire[b];
            let mut s = s.shallow_clone();
            s.copy_(&src); // the cast runs on libtorch's stream, before the ready event
            (s, r.shallow_clone())
        };
        self.cuda.record(&self.ready[b], LEGACY_STREAM)?;
        self.cuda.wait(self.stream, &self.ready[b])?;
        self.cuda.record(&self.start[b], self.stream)?;
        // SAFETY: both buffers are device allocations of `numel` elements of the wire
        // dtype, owned by self (flat sets or wire buffers) for the whole run.
        unsafe {
            self.nccl.all_reduce_sum(
                send.data_ptr(),
                recv.data_ptr(),
                send.numel(),
                self.nccl_dtype(),
                self.comm,
                self.stream,
            )?;
        }
        self.cuda.record(&self.end[b], self.stream)?;
        Ok(())
    }

    fn finish(&mut self, params: &[Tensor], _backward_end: Instant) -> Result<CommStats> {
        self.cuda.record(&self.backward_end, LEGACY_STREAM)?;
        for b in 0..self.plan.buckets.len() {
            self.launch(b)?;
        }
        self.cuda.record(&self.done, self.stream)?;
        self.cuda.wait(LEGACY_STREAM, &self.done)?;
        self.cuda.event_synchronize(&self.done)?;
        for seq in self.seqs.drain(..) {
            crate::flight::recorder().complete(seq);
        }
        let (mut comm_s, mut hidden_s) = (0.0, 0.0);
        for b in 0..self.plan.buckets.len() {
            let work = self.cuda.elapsed_s(&self.start[b], &self.end[b])?;
            // Device time from the bucket's start to backward's end, cut to the bucket's work.
            let before = self.cuda.elapsed_s(&self.start[b], &self.backward_end)?;
            comm_s += work;
            hidden_s += before.clamp(0.0, work);
        }
        let flat = self.flat.as_mut().expect("attached");
        let (first_launch, last_launch) = flat.claim_times();
        let launches = flat.claim_instants();
        let dst = 1 - flat.current;
        for (b, (_, recv)) in self.wire.iter().enumerate() {
            flat.sets[dst][b].copy_(recv);
        }
        flat.complete(params);
        Ok(CommStats {
            bytes: (self.plan.total_numel() * self.dtype.bytes()) as u64,
            comm_s,
            hidden_s,
            stage_d2h_s: 0.0,
            stage_h2d_s: 0.0,
            first_launch,
            last_launch,
            launches,
        })
    }

    fn reduced(&self) -> &[Tensor] {
        self.flat.as_ref().expect("attached").current_set()
    }

    fn zero_grads(&mut self) {
        if let Some(flat) = self.flat.as_mut() {
            flat.zero();
        }
    }
}

impl Drop for NcclReducer {
    fn drop(&mut self) {
        let _ = self.cuda.synchronize(self.stream);
        self.nccl.destroy(self.comm);
    }
}
