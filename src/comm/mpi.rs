//! The CPU-staged fallback all-reduce: MPI_Allreduce over host memory.
//!
//! On CPU with fp32 gradients the buckets are all-reduced where they lie (no copy
//! besides MPI's own). Otherwise each bucket goes through host buffers of the wire
//! dtype: device→pinned host copy (and cast), MPI_Allreduce, host→device copy (and
//! cast back), the copies timed apart from MPI.
//!
//! With `--overlap on` the all-reduces run on a communication thread, bucket by bucket
//! as backward hands them over, on a duplicate of the world communicator. MPI must then
//! be initialised with at least MPI_THREAD_SERIALIZED: while the thread works the main
//! thread makes no MPI call (it is in backward), so calls never run concurrently.

use super::GradDtype;
use super::{seconds_before, wire_kind, BucketPlan, CommStats, FlatGrads, GradientReducer};
use anyhow::{anyhow, bail, Result};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::ffi::{c_int, c_void};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::OnceLock;
use std::time::Instant;
use tch::{Device, Tensor};

/// A raw communicator handle, moved to the communication thread.
#[derive(Clone, Copy)]
struct RawComm(ffi::MPI_Comm);
// SAFETY: MPI handles are plain identifiers; MPI_THREAD_SERIALIZED (checked at
// construction) allows any one thread at a time to use them.
unsafe impl Send for RawComm {}

/// The two user-defined sums of 16-bit floats, created once per process.
struct HalfOps {
    f16: ffi::MPI_Op,
    bf16: ffi::MPI_Op,
}
// SAFETY: MPI_Op handles are process-wide identifiers, never mutated after creation.
unsafe impl Send for HalfOps {}
unsafe impl Sync for HalfOps {}

/// MPI has no 16-bit float type (MPI-4.1's MPIX_C_FLOAT16 is not in Open MPI 4), so
/// fp16/bf16 travel as MPI_UINT16_T with these operations summing in f32 and rounding
/// back, element by element (what NCCL does for half types).
unsafe extern "C" fn sum_f16(inv: *mut c_void, inout: *mut c_void, len: *mut c_int, _t: *mut ffi::MPI_Datatype) {
    // SAFETY: MPI passes two buffers of `*len` elements of the MPI_UINT16_T we sent.
    let n = *len as usize;
    let a = std::slice::from_raw_parts(inv as *const u16, n);
    let b = std::slice::from_raw_parts_mut(inout as *mut u16, n);
    for (x, y) in a.iter().zip(b.iter_mut()) {
        *y = half::f16::from_f32(half::f16::from_bits(*x).to_f32() + half::f16::from_bits(*y).to_f32()).to_bits();
    }
}

unsafe extern "C" fn sum_bf16(inv: *mut c_void, inout: *mut c_void, len: *mut c_int, _t: *mut ffi::MPI_Datatype) {
    // SAFETY: as sum_f16.
    let n = *len as usize;
    let a = std::slice::from_raw_parts(inv as *const u16, n);
    let b = std::slice::from_raw_parts_mut(inout as *mut u16, n);
    for (x, y) in a.iter().zip(b.iter_mut()) {
        *y = half::bf16::from_f32(half::bf16::from_bits(*x).to_f32() + half::bf16::from_bits(*y).to_f32()).to_bits();
    }
}

fn half_ops() -> &'static HalfOps {
    static OPS: OnceLock<HalfOps> = OnceLock::new();
    OPS.get_or_init(|| {
        let mut f16 = std::mem::MaybeUninit::uninit();
        let mut bf16 = std::mem::MaybeUninit::uninit();
        // SAFETY: MPI is initialised (a communicator exists); both functions are commutative.
        unsafe {
            ffi::MPI_Op_create(Some(sum_f16), 1, f16.as_mut_ptr());
            ffi::MPI_Op_create(Some(sum_bf16), 1, bf16.as_mut_ptr());
            HalfOps {
                f16: f16.assume_init(),
                bf16: bf16.assume_init(),
            }
        }
    })
}

/// MPI_Allreduce(sum) of `count` elements of `dtype`.
///
/// SAFETY: `send` and `recv` point to `count` elements of `dtype` each, not overlapping.
unsafe fn allreduce_sum(comm: RawComm, send: *const c_void, recv: *mut c_void, count: usize, dtype: GradDtype) -> Result<()> {
    allreduce_sum_raw(comm.0, Some(send), recv, count, dtype)
}

/// MPI_IN_PLACE, which mpi.h defines as a cast the bindings do not carry: `(void *) 1`
/// in Open MPI, `(void *) -1` in MPICH and its derivatives (Intel MPI, MVAPICH, Cray MPICH).
pub(crate) fn mpi_in_place() -> Option<*const c_void> {
    static KIND: OnceLock<Option<usize>> = OnceLock::new();
    let v = *KIND.get_or_init(|| {
        let lib = mpi::environment::library_version().unwrap_or_default();
        if lib.contains("Open MPI") {
            Some(1)
        } else if ["MPICH", "Intel(R) MPI", "MVAPICH"].iter().any(|k| lib.contains(k)) {
            Some(usize::MAX)
        } else {
            None
        }
    });
    v.map(|a| a as *const c_void)
}

/// MPI_Allreduce(sum) of `count` elements of `dtype` on `comm`; `send` None sums in
/// place in `recv` (MPI_IN_PLACE).
///
/// SAFETY: `send` (when given) and `recv` point to `count` elements of `dtype` each,
/// not overlapping; `comm` is a valid communicator this thread may use.
pub(crate) unsafe fn allreduce_sum_raw(
    comm: ffi::MPI_Comm,
    send: Option<*const c_void>,
    recv: *mut c_void,
    count: usize,
    dtype: GradDtype,
) -> Result<()> {
    let n = c_int::try_from(count)
        .map_err(|_| anyhow!("all-reduce of {count} elements exceeds MPI's int count: use smaller buckets or messages"))?;
    let (datatype, op) = match dtype {
        GradDtype::Fp32 => (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM),
        GradDtype::Fp16 => (ffi::RSMPI_UINT16_T, half_ops().f16),
        GradDtype::Bf16 => (ffi::RSMPI_UINT16_T, half_ops().bf16),
    };
    let send = match send {
        Some(p) => p,
        None => {
            mpi_in_place().ok_or_else(|| anyhow!("this MPI library's MPI_IN_PLACE is not known to ddpbench (Open MPI and MPICH are)"))?
        }
    };
    let rc = ffi::MPI_Allreduce(send, recv, n, datatype, op, comm);
    if rc != 0 {
        bail!("MPI_Allreduce of {count} elements failed with MPI error {rc}");
    }
    Ok(())
}

/// One bucket's all-reduce, as the main or the communication thread runs it.
struct Job {
    bucket: usize,
    /// The flight recorder's number of this all-reduce.
    seq: u64,
    /// The bucket's gradients (flat, f32, on the training device).
    src: Tensor,
    /// Where the reduced gradients go (the other buffer set).
    dst: Tensor,
    /// Host buffers (send, receive) of the wire dtype; None: reduce `src` into `dst` in place on CPU.
    host: Option<(Tensor, Tensor)>,
    dtype: GradDtype,
}

/// When one bucket's all-reduce ran, and its staging copies' seconds.
#[derive(Debug, Clone, Copy)]
struct BucketTimes {
    start: Instant,
    end: Instant,
    d2h_s: f64,
    h2d_s: f64,
}

fn run_job(comm: RawComm, job: &mut Job) -> Result<BucketTimes> {
    let flight = crate::flight::recorder();
    flight.start(job.seq);
    let t0 = Instant::now();
    let on_device = job.src.device() != Device::Cpu;
    let numel = job.src.numel();
    let (mut d2h_s, mut h2d_s) = (0.0, 0.0);
    match &mut job.host {
        None => {
            // SAFETY: contiguous CPU f32 buffers of `numel` elements owned by the reducer,
            // not touched by anyone else until the job is reported done.
            unsafe { allreduce_sum(comm, job.src.data_ptr(), job.dst.data_ptr(), numel, GradDtype::Fp32)? };
        }
        Some((send, recv)) => {
            let ta = Instant::now();
            send.copy_(&job.src); // casts to the wire dtype; on a GPU, waits for the copy
            let tb = Instant::now();
            // SAFETY: contiguous host buffers of `numel` wire-dtype elements owned by the job.
            unsafe { allreduce_sum(comm, send.data_ptr(), recv.data_ptr(), numel, job.dtype)? };
            let tc = Instant::now();
            // copy_ without non_blocking returns once the copy is done, on CPU or GPU.
            job.dst.copy_(recv);
            if on_device {
                d2h_s = (tb - ta).as_secs_f64();
                h2d_s = tc.elapsed().as_secs_f64();
            }
        }
    }
    flight.complete(job.seq);
    Ok(BucketTimes {
        start: t0,
        end: Instant::now(),
        d2h_s,
        h2d_s,
    })
}

/// The communication thread of `--overlap on`.
struct Worker {
    jobs: Option<Sender<Job>>,
    done: Receiver<(usize, std::result::Result<BucketTimes, String>)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread, pinned to `pus` when given (a core backward does not use).
    fn start(comm: RawComm, pus: Option<Vec<u32>>) -> Worker {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel();
        let handle = std::thread::Builder::new()
            .name("ddpbench-allreduce".into())
            .spawn(move || {
                if let Some(pus) = pus {
                    crate::topology::pin_this_thread(&pus);
                }
                for mut job in rx {
                    let result = run_job(comm, &mut job).map_err(|e| format!("{e:#}"));
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

/// MPI_Allreduce over host memory, inline or on a communication thread.
pub struct MpiStaged {
    plan: BucketPlan,
    dtype: GradDtype,
    /// A duplicate of the world communicator, for gradients only: its traffic can never
    /// match a collective the main thread makes on the world communicator.
    dup: SimpleCommunicator,
    flat: Option<FlatGrads>,
    /// Host buffers per bucket (None for in-place CPU fp32).
    host: Vec<Option<(Tensor, Tensor)>>,
    worker: Option<Worker>,
    pending: usize,
    /// This step's buckets' times, in the order they finished.
    times: Vec<BucketTimes>,
}

impl MpiStaged {
    /// `overlap` runs the all-reduces on a thread (pinned to `overlap`'s PUs when there
    /// are any), which needs MPI_THREAD_SERIALIZED or better; without it the caller must
    /// not ask for overlap.
    pub fn new(world: &SimpleCommunicator, plan: BucketPlan, dtype: GradDtype, overlap: Option<Vec<u32>>) -> Result<MpiStaged> {
        let dup = world.duplicate();
        let worker = overlap.map(|pus| Worker::start(RawComm(dup.as_raw()), (!pus.is_empty()).then_some(pus)));
        if dtype != GradDtype::Fp32 {
            half_ops();
        }
        Ok(MpiStaged {
            plan,
            dtype,
            dup,
            flat: None,
            host: Vec::new(),
            worker,
            pending: 0,
            times: Vec::new(),
        })
    }
}

impl GradientReducer for MpiStaged {
    fn backend(&self) -> &'static str {
        "mpi-cpu-staged"
    }

    fn attach(&mut self, params: &[Tensor]) -> Result<()> {
        let flat = FlatGrads::attach(&self.plan, params)?;
        let device = flat.sets[0][0].device();
        let kind = wire_kind(self.dtype);
        self.host = self
            .plan
            .numels
            .iter()
            .map(|&n| {
                if device == Device::Cpu && self.dtype == GradDtype::Fp32 {
                    return None;
                }
                let buf = || {
                    let t = Tensor::zeros([n as i64], (kind, Device::Cpu));
                    if device == Device::Cpu {
                        t
                    } else {
                        t.pin_memory(device)
                    }
                };
                Some((buf(), buf()))
            })
            .collect();
        self.flat = Some(flat);
        Ok(())
    }

    fn launch(&mut self, b: usize) -> Result<()> {
        let flat = self.flat.as_mut().ok_or_else(|| anyhow!("gradient buckets used before attach"))?;
        let Some((src, dst)) = flat.claim(b) else { return Ok(()) };
        let mut job = Job {
            bucket: b,
            seq: crate::flight::recorder().schedule("all-reduce", &format!("bucket {b}")),
            src,
            dst,
            host: self.host[b].as_ref().map(|(s, r)| (s.shallow_clone(), r.shallow_clone())),
            dtype: self.dtype,
        };
        match &self.worker {
            Some(w) => {
                w.jobs
                    .as_ref()
                    .expect("sender lives as long as the worker")
                    .send(job)
                    .map_err(|_| anyhow!("the all-reduce thread has stopped"))?;
                self.pending += 1;
            }
            None => {
                let times = run_job(RawComm(self.dup.as_raw()), &mut job)?;
                self.times.push(times);
            }
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
        let flat = self.flat.as_mut().expect("attached");
        let (first_launch, last_launch) = flat.claim_times();
        let launches = flat.claim_instants();
        flat.complete(params);
        let times = std::mem::take(&mut self.times);
        Ok(CommStats {
            bytes: (self.plan.total_numel() * self.dtype.bytes()) as u64,
            comm_s: times.iter().map(|t| (t.end - t.start).as_secs_f64()).sum(),
            hidden_s: times.iter().map(|t| seconds_before(t.start, t.end, backward_end)).sum(),
            stage_d2h_s: times.iter().map(|t| t.d2h_s).sum(),
            stage_h2d_s: times.iter().map(|t| t.h2d_s).sum(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_sums_round_like_the_wire_types() {
        let mut len: c_int = 3;
        let a: Vec<u16> = [1.0f32, 0.1, 60000.0].iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        let mut b: Vec<u16> = [2.0f32, 0.2, 60000.0].iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        // SAFETY: two buffers of `len` u16 each; the datatype argument is unused.
        unsafe {
            sum_f16(
                a.as_ptr() as *mut c_void,
                b.as_mut_ptr() as *mut c_void,
                &mut len,
                std::ptr::null_mut(),
            )
        };
        let got: Vec<f32> = b.iter().map(|&x| half::f16::from_bits(x).to_f32()).collect();
        assert_eq!(got[0], 3.0);
        assert!((got[1] - 0.3).abs() < 1e-3, "{}", got[1]);
        assert!(got[2].is_infinite(), "fp16 overflows past 65504: {}", got[2]);

        let a: Vec<u16> = [1.0f32, 1e30].iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
        let mut b: Vec<u16> = [2.0f32, 1e30].iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
        len = 2;
        // SAFETY: as above.
        unsafe {
            sum_bf16(
                a.as_ptr() as *mut c_void,
                b.as_mut_ptr() as *mut c_void,
                &mut len,
                std::ptr::null_mut(),
            )
        };
        let got: Vec<f32> = b.iter().map(|&x| half::bf16::from_bits(x).to_f32()).collect();
        assert_eq!(got[0], 3.0);
        assert!((got[1] / 2e30 - 1.0).abs() < 1e-2, "bf16 keeps fp32's range: {}", got[1]);
    }
}
