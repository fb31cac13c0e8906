//! All-reduce of gradient buckets on the device through [`transport::nccl::Nccl`]
//! (its rendezvous joins the communicator; its stream runs the buckets, ordered after
//! libtorch's work by events). At the end, libtorch's stream waits for NCCL's last
//! event, so the optimizer reads reduced gradients. Each bucket's all-reduce is timed
//! with the pair of events of its timed slot.
//!
//! The host waits for NCCL's last event at the end of the all-reduce only to read those
//! times; with device-event phase times (`--phase-sync events`) it does not wait, and
//! each step's times are read when the clock gives that step ([`DeferredBanks`]): the
//! slots come in two banks, so a step records into the one the step waiting to be read
//! does not use.

use super::deferred::{comm_seconds, DeferredBanks};
use super::transport::{self, Dir, Slot, Transport};
use super::GradDtype;
use super::{BucketPlan, CommStats, FlatGrads, GradientReducer};
use crate::device::cuda::{Event, NcclUniqueId, LEGACY_STREAM};
use anyhow::{anyhow, Result};
use mpi::topology::SimpleCommunicator;
use std::collections::VecDeque;
use std::time::Instant;
use tch::Tensor;

pub(crate) struct NcclReducer {
    transport: transport::nccl::Nccl,
    plan: BucketPlan,
    dtype: GradDtype,
    flat: Option<FlatGrads>,
    /// Per bucket, device buffers (send, receive) of the wire dtype when it is not the
    /// bucket's own (an fp32 bucket cast by `--grad-dtype`).
    wire: Vec<Option<(Tensor, Tensor)>>,
    /// Per bank, one timed slot per bucket: the flat sets, or the wire buffers.
    slots: [Vec<Slot>; 2],
    /// Per bank, recorded on libtorch's stream when `finish` is called: backward's end
    /// on the device.
    backward_end: [Event; 2],
    done: Event,
    /// Per bank, the flight recorder's numbers of the step's bucket all-reduces (entered
    /// when enqueued on the host, completed when its times are read).
    seqs: [Vec<u64>; 2],
    /// Which bank each step records into and which wait to be read.
    banks: DeferredBanks,
    /// Times are read later ([`GradientReducer::read_deferred`]), not waited for.
    deferred: bool,
    /// Deferred times read before their turn (a bank about to be reused), oldest first.
    early: VecDeque<(f64, f64)>,
}

impl NcclReducer {
    /// Joins the NCCL communicator over the members of `comm` (every member calls this),
    /// rank 0's unique id passed through `agree` before MPI broadcasts it.
    pub(crate) fn join(
        comm: &SimpleCommunicator,
        device_index: usize,
        plan: BucketPlan,
        dtype: GradDtype,
        agree: impl FnOnce(Result<NcclUniqueId>) -> Result<NcclUniqueId>,
    ) -> Result<NcclReducer> {
        let transport = transport::nccl::Nccl::join(comm, device_index, agree)?;
        let cuda = transport.driver();
        Ok(NcclReducer {
            backward_end: [cuda.event(true)?, cuda.event(true)?],
            done: cuda.event(false)?,
            transport,
            seqs: Default::default(),
            banks: DeferredBanks::default(),
            deferred: false,
            early: VecDeque::new(),
            plan,
            dtype,
            flat: None,
            wire: Vec::new(),
            slots: Default::default(),
        })
    }

    /// The bank this step records into. Should its last reading still be waiting (its
    /// step not given by the clock in time), it is waited for and read now, kept for its
    /// turn, rather than overwritten.
    fn claim_bank(&mut self) -> Result<usize> {
        if let Some(overdue) = self.banks.overdue() {
            self.transport.driver().event_synchronize(&self.done)?;
            let times = self.read_bank(overdue)?;
            self.early.push_back(times);
        }
        Ok(self.banks.current())
    }

    /// Bank `bank`'s (`comm_s`, `hidden_s`), its NCCL work done, and its all-reduces
    /// completed in the flight recorder.
    fn read_bank(&mut self, bank: usize) -> Result<(f64, f64)> {
        for seq in self.seqs[bank].drain(..) {
            crate::flight::recorder().complete(seq);
        }
        let intervals = self.slots[bank]
            .iter()
            // Device time from the bucket's start to backward's end, cut to the bucket's work.
            .map(|slot| self.transport.seconds(slot, &self.backward_end[bank]))
            .collect::<Result<Vec<_>>>()?;
        Ok(comm_seconds(intervals))
    }
}

impl GradientReducer for NcclReducer {
    fn attach(&mut self, params: &[Tensor]) -> Result<()> {
        let flat = FlatGrads::attach(&self.plan, params)?;
        let device = flat.sets[0][0].device();
        let wires = self.plan.wire_dtypes(self.dtype);
        self.wire = (0..self.plan.numels.len())
            .map(|b| {
                let (n, wire) = (self.plan.numels[b] as i64, wires[b]);
                (wire != self.plan.dtypes[b])
                    .then(|| (Tensor::zeros([n], (wire.kind(), device)), Tensor::zeros([n], (wire.kind(), device))))
            })
            .collect();
        let pairs: Vec<(&Tensor, &Tensor)> = (0..wires.len())
            .map(|b| match &self.wire[b] {
                Some((send, recv)) => (send, recv),
                None => (&flat.sets[0][b], &flat.sets[1][b]),
            })
            .collect();
        for bank in 0..2 {
            self.slots[bank] = pairs
                .iter()
                .zip(&wires)
                .map(|((a, b), &wire)| self.transport.slot(a, Some(b), wire, true))
                .collect::<Result<Vec<_>>>()?;
        }
        self.flat = Some(flat);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let bank = self.claim_bank()?;
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        let Some(set) = flat.claim(b) else { return Ok(()) };
        let flight = crate::flight::recorder();
        let seq = flight.schedule("all-reduce", &format!("bucket {b}"));
        flight.start(seq);
        self.seqs[bank].push(seq);
        let dir = match &mut self.wire[b] {
            None => Dir::from_set(set),
            Some((send, _)) => {
                send.copy_(&flat.sets[set][b]); // the cast runs on libtorch's stream, before the ready event
                Dir::AToB
            }
        };
        self.transport.allreduce(&mut self.slots[bank][b], dir)?;
        Ok(())
    }

    fn finish(&mut self, params: &[Tensor], _backward_end: Instant) -> Result<CommStats> {
        let (cuda, stream) = self.transport.stream().ok_or_else(|| anyhow!("NCCL runs on a stream"))?;
        let bank = self.claim_bank()?;
        cuda.record(&self.backward_end[bank], LEGACY_STREAM)?;
        for b in 0..self.plan.buckets.len() {
            self.launch(b)?;
        }
        cuda.record(&self.done, stream)?;
        // The optimizer runs after the all-reduce by stream order alone.
        cuda.wait(LEGACY_STREAM, &self.done)?;
        let (comm_s, hidden_s, done_at) = if self.deferred {
            self.banks.end_step();
            (0.0, 0.0, None)
        } else {
            cuda.event_synchronize(&self.done)?;
            let done_at = Instant::now();
            let (comm_s, hidden_s) = self.read_bank(bank)?;
            (comm_s, hidden_s, Some(done_at))
        };
        let flat = self.flat.as_mut().expect("attached");
        let (first_launch, last_launch) = flat.claim_times();
        let launches = flat.claim_instants();
        let dst = 1 - flat.current;
        for (b, wire) in self.wire.iter().enumerate() {
            if let Some((_, recv)) = wire {
                flat.sets[dst][b].copy_(recv);
            }
        }
        flat.complete(params);
        Ok(CommStats {
            bytes: self.plan.total_wire_bytes(self.dtype),
            comm_s,
            hidden_s,
            stage_d2h_s: 0.0,
            stage_h2d_s: 0.0,
            first_launch,
            last_launch,
            launches,
            done_at,
            done_on_stream: self.deferred,
            spans: Vec::new(),
        })
    }

    fn reduced(&self) -> &[Tensor] {
        self.flat.as_ref().expect("attached").current_set()
    }

    fn local(&self) -> Option<&[Tensor]> {
        self.flat.as_ref().map(FlatGrads::previous_set)
    }

    fn layout(&self) -> Option<crate::optim::FlatLayout> {
        self.flat.as_ref().map(FlatGrads::layout)
    }

    fn zero_grads(&mut self) {
        if let Some(flat) = self.flat.as_mut() {
            flat.zero();
        }
    }

    fn defer_device_times(&mut self, on: bool) {
        self.deferred = on;
    }

    fn read_deferred(&mut self) -> Result<Option<(f64, f64)>> {
        if let Some(times) = self.early.pop_front() {
            return Ok(Some(times));
        }
        match self.banks.take_oldest() {
            Some(bank) => self.read_bank(bank).map(Some),
            None => Ok(None),
        }
    }
}
