//! The CPU-staged fallback gradient reducer: each bucket goes through
//! [`transport::mpi::Mpi`] (MPI_Allreduce over host memory; on a GPU, or where the wire
//! dtype is not the bucket's, staged through host buffers of the wire dtype, the copies
//! timed apart).
//!
//! With `--overlap on` the all-reduces run on a communication thread, bucket by bucket
//! as backward hands them over, on a duplicate of the world communicator. MPI must then
//! be initialised with at least MPI_THREAD_SERIALIZED: while the thread works the main
//! thread makes no MPI call (it is in backward), so calls never run concurrently.

use super::transport::{self, Dir, Slot, Transport};
use super::GradDtype;
use super::{seconds_before, BucketPlan, BucketSpan, CommStats, FlatGrads, GradientReducer};
use anyhow::{anyhow, Result};
use mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;
use tch::Tensor;

/// One bucket's all-reduce, as the main or the communication thread runs it.
struct Job {
    bucket: usize,
    /// The flight recorder's number of this all-reduce.
    seq: u64,
    /// Which of the bucket's two buffer sets holds the gradients.
    dir: Dir,
}

/// When one bucket's all-reduce ran, and its staging copies' seconds.
#[derive(Debug, Clone, Copy)]
struct BucketTimes {
    bucket: usize,
    start: Instant,
    end: Instant,
    d2h_s: f64,
    h2d_s: f64,
}

/// The transport and one slot per bucket: used inline, or owned by the all-reduce thread.
struct Lane {
    transport: Box<dyn Transport>,
    slots: Vec<Slot>,
}

impl Lane {
    fn run(&mut self, job: &Job) -> Result<BucketTimes> {
        let flight = crate::flight::recorder();
        flight.start(job.seq);
        let start = Instant::now();
        let staging = self.transport.allreduce(&mut self.slots[job.bucket], job.dir)?;
        flight.complete(job.seq);
        Ok(BucketTimes {
            bucket: job.bucket,
            start,
            end: Instant::now(),
            d2h_s: staging.d2h_s,
            h2d_s: staging.h2d_s,
        })
    }
}

/// The communication thread of `--overlap on`.
struct Worker {
    jobs: Option<Sender<Job>>,
    done: Receiver<(usize, std::result::Result<BucketTimes, String>)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread, owning `lane`, pinned to `pus` when given (a core backward does not use).
    fn start(mut lane: Lane, pus: Option<Vec<u32>>) -> Worker {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name("ddpbench-allreduce".into())
            .spawn(move || {
                if let Some(pus) = pus {
                    crate::topology::pin_this_thread(&pus);
                }
                for job in rx {
                    let result = lane.run(&job).map_err(|e| format!("{e:#}"));
                    if tx.send((job.bucket, result)).is_err() {
                        break;
                    }
                }
            })
            .expect("cannot start the all-reduce thread");
        Worker {
            jobs: Some(jobs),
            done,
            handle: Some(handle),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Buckets all-reduced through one transport, inline or on a communication thread.
pub(crate) struct MpiStaged {
    plan: BucketPlan,
    dtype: GradDtype,
    flat: Option<FlatGrads>,
    /// Until `attach` binds the buckets: the transport.
    transport: Option<Box<dyn Transport>>,
    /// `Some` asks for the thread (pinned to these PUs when there are any).
    overlap: Option<Vec<u32>>,
    /// After `attach`: the transport and slots, here (no overlap) or in `worker`.
    lane: Option<Lane>,
    worker: Option<Worker>,
    pending: usize,
    /// This step's buckets' times, in the order they finished.
    times: Vec<BucketTimes>,
    /// A duplicate of the world communicator, for gradients only: its traffic can never
    /// match a collective the main thread makes on the world communicator. Declared
    /// after the lane and the worker so that it is freed after them.
    dup: Option<SimpleCommunicator>,
}

impl MpiStaged {
    /// `overlap` runs the all-reduces on a thread (pinned to `overlap`'s PUs when there
    /// are any), which needs MPI_THREAD_SERIALIZED or better; without it the caller must
    /// not ask for overlap.
    pub(crate) fn new(world: &SimpleCommunicator, plan: BucketPlan, dtype: GradDtype, overlap: Option<Vec<u32>>) -> Result<MpiStaged> {
        let dup = world.duplicate();
        // SAFETY: `dup` is kept in the reducer and freed after the lane and the worker
        // that hold the transport (field order).
        let transport = Box::new(unsafe { transport::mpi::Mpi::unbound(&dup) });
        let mut reducer = MpiStaged::with_transport(plan, dtype, transport, overlap);
        reducer.dup = Some(dup);
        Ok(reducer)
    }

    /// The reducer over any transport (a test's recording one included).
    pub(crate) fn with_transport(
        plan: BucketPlan,
        dtype: GradDtype,
        transport: Box<dyn Transport>,
        overlap: Option<Vec<u32>>,
    ) -> MpiStaged {
        MpiStaged {
            plan,
            dtype,
            flat: None,
            transport: Some(transport),
            overlap,
            lane: None,
            worker: None,
            pending: 0,
            times: Vec::new(),
            dup: None,
        }
    }
}

impl GradientReducer for MpiStaged {
    fn attach(&mut self, params: &[Tensor]) -> Result<()> {
        let mut transport = self.transport.take().ok_or_else(|| anyhow!("gradient buckets attached twice"))?;
        let flat = FlatGrads::attach(&self.plan, params)?;
        let slots = flat.sets[0]
            .iter()
            .zip(&flat.sets[1])
            .zip(self.plan.wire_dtypes(self.dtype))
            .map(|((a, b), wire)| transport.slot(a, Some(b), wire, false))
            .collect::<Result<Vec<_>>>()?;
        let lane = Lane { transport, slots };
        match self.overlap.take() {
            Some(pus) => self.worker = Some(Worker::start(lane, (!pus.is_empty()).then_some(pus))),
            None => self.lane = Some(lane),
        }
        self.flat = Some(flat);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        let Some(set) = flat.claim(b) else { return Ok(()) };
        let job = Job {
            bucket: b,
            seq: crate::flight::recorder().schedule("all-reduce", &format!("bucket {b}")),
            dir: Dir::from_set(set),
        };
        match (&self.worker, self.lane.as_mut()) {
            (Some(w), _) => {
                w.jobs
                    .as_ref()
                    .expect("sender lives as long as the worker")
                    .send(job)
                    .map_err(|_| anyhow!("the all-reduce thread has stopped"))?;
                self.pending += 1;
            }
            (None, Some(lane)) => {
                let times = lane.run(&job)?;
                self.times.push(times);
            }
            (None, None) => return Err(anyhow!("gradient buckets used before attach")),
        }
        Ok(())
    }

    fn finish(&mut self, params: &[Tensor], backward_end: Instant) -> Result<CommStats> {
        for b in 0..self.plan.buckets.len() {
            self.launch(b)?;
        }
        while self.pending > 0 {
            let w = self.worker.as_ref().expect("pending jobs imply a worker");
            let (bucket, result) = w.done.recv().map_err(|_| anyhow!("the all-reduce thread died"))?;
            self.pending -= 1;
            let times = result.map_err(|e| anyhow!("all-reduce of bucket {bucket}: {e}"))?;
            self.times.push(times);
        }
        let done_at = self.times.iter().map(|t| t.end).max();
        let flat = self.flat.as_mut().expect("attached");
        let (first_launch, last_launch) = flat.claim_times();
        let launches = flat.claim_instants();
        flat.complete(params);
        let times = &self.times;
        let comm_s = times.iter().map(|t| (t.end - t.start).as_secs_f64()).sum();
        let hidden_s = times.iter().map(|t| seconds_before(t.start, t.end, backward_end)).sum();
        let stage_d2h_s = times.iter().map(|t| t.d2h_s).sum();
        let stage_h2d_s = times.iter().map(|t| t.h2d_s).sum();
        // Drained, not taken: the step's buffer keeps its capacity for the next step.
        let spans = self
            .times
            .drain(..)
            .map(|t| BucketSpan {
                bucket: t.bucket,
                start: t.start,
                end: t.end,
            })
            .collect();
        Ok(CommStats {
            done_at,
            done_on_stream: false,
            bytes: self.plan.total_wire_bytes(self.dtype),
            comm_s,
            hidden_s,
            stage_d2h_s,
            stage_h2d_s,
            first_launch,
            last_launch,
            launches,
            spans,
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
}
