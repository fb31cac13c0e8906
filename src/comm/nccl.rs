//! All-reduce of gradient buckets on the device through [`transport::nccl::Nccl`]
//! (its rendezvous joins the communicator; its stream runs the buckets, ordered after
//! libtorch's work by events). At the end, libtorch's stream waits for NCCL's last
//! event, so the optimizer reads reduced gradients. Each bucket's all-reduce is timed
//! with the pair of events of its timed slot.

use super::transport::{self, Dir, Slot, Transport};
use super::GradDtype;
use super::{wire_kind, BucketPlan, CommStats, FlatGrads, GradientReducer};
use crate::device::cuda::{Event, NcclUniqueId, LEGACY_STREAM};
use anyhow::{anyhow, Result};
use mpi::topology::SimpleCommunicator;
use std::time::Instant;
use tch::Tensor;

pub struct NcclReducer {
    transport: transport::nccl::Nccl,
    plan: BucketPlan,
    dtype: GradDtype,
    flat: Option<FlatGrads>,
    /// Device buffers (send, receive) of the wire dtype, when it is not fp32.
    wire: Vec<(Tensor, Tensor)>,
    /// One timed slot per bucket: the flat sets, or the wire buffers.
    slots: Vec<Slot>,
    /// Recorded on libtorch's stream when `finish` is called: backward's end on the device.
    backward_end: Event,
    done: Event,
    /// The flight recorder's numbers of this step's bucket all-reduces (entered when
    /// enqueued on the host, completed when the step's NCCL work is done).
    seqs: Vec<u64>,
}

impl NcclReducer {
    /// Joins the NCCL communicator over the members of `comm` (every member calls this),
    /// rank 0's unique id passed through `agree` before MPI broadcasts it.
    pub fn join(
        comm: &SimpleCommunicator,
        device_index: usize,
        plan: BucketPlan,
        dtype: GradDtype,
        agree: impl FnOnce(Result<NcclUniqueId>) -> Result<NcclUniqueId>,
    ) -> Result<NcclReducer> {
        let transport = transport::nccl::Nccl::join(comm, device_index, agree)?;
        let cuda = transport.driver();
        Ok(NcclReducer {
            backward_end: cuda.event(true)?,
            done: cuda.event(false)?,
            transport,
            seqs: Vec::new(),
            plan,
            dtype,
            flat: None,
            wire: Vec::new(),
            slots: Vec::new(),
        })
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
        let pairs: Vec<(&Tensor, &Tensor)> = if self.wire.is_empty() {
            flat.sets[0].iter().zip(&flat.sets[1]).collect()
        } else {
            self.wire.iter().map(|(s, r)| (s, r)).collect()
        };
        self.slots = pairs
            .into_iter()
            .map(|(a, b)| self.transport.slot(a, Some(b), self.dtype, true))
            .collect::<Result<Vec<_>>>()?;
        self.flat = Some(flat);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        let Some(set) = flat.claim(b) else { return Ok(()) };
        let flight = crate::flight::recorder();
        let seq = flight.schedule("all-reduce", &format!("bucket {b}"));
        flight.start(seq);
        self.seqs.push(seq);
        let dir = if self.wire.is_empty() {
            Dir::from_set(set)
        } else {
            self.wire[b].0.copy_(&flat.sets[set][b]); // the cast runs on libtorch's stream, before the ready event
            Dir::AToB
        };
        self.transport.allreduce(&mut self.slots[b], dir)?;
        Ok(())
    }

    fn finish(&mut self, params: &[Tensor], _backward_end: Instant) -> Result<CommStats> {
        let (cuda, stream) = self.transport.stream().ok_or_else(|| anyhow!("NCCL runs on a stream"))?;
        cuda.record(&self.backward_end, LEGACY_STREAM)?;
        for b in 0..self.plan.buckets.len() {
            self.launch(b)?;
        }
        cuda.record(&self.done, stream)?;
        cuda.wait(LEGACY_STREAM, &self.done)?;
        cuda.event_synchronize(&self.done)?;
        let done_at = Some(Instant::now());
        for seq in self.seqs.drain(..) {
            crate::flight::recorder().complete(seq);
        }
        let (mut comm_s, mut hidden_s) = (0.0, 0.0);
        for slot in &self.slots {
            // Device time from the bucket's start to backward's end, cut to the bucket's work.
            let (work, before) = self.transport.seconds(slot, &self.backward_end)?;
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
            done_at,
            bytes: (self.plan.total_numel() * self.dtype.bytes()) as u64,
            comm_s,
            hidden_s,
            stage_d2h_s: 0.0,
            stage_h2d_s: 0.0,
            first_launch,
            last_launch,
            launches,
            spans: Vec::new(),
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
