//! `MPI_Allreduce` of one buffer. Host buffers of the wire dtype are summed where they
//! lie (no copy besides MPI's own). Buffers on a GPU, or held in another dtype than the
//! wire's, go through host buffers of the wire dtype: a copy to the host (which casts),
//! `MPI_Allreduce`, a copy back (which casts back), the copies timed apart from MPI;
//! the host buffers are pinned when the buffers are on a GPU.

use super::{Dir, ReduceDtype, Slot, StagingTimes, Transport};
use anyhow::{anyhow, bail, Result};
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::Instant;
use tch::{Device, Tensor};

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

/// MPI_IN_PLACE, which mpi.h defines as a cast the bindings do not carry: `(void *) 1`
/// in Open MPI, `(void *) -1` in MPICH and its derivatives (Intel MPI, MVAPICH, Cray MPICH).
fn mpi_in_place() -> Option<*const c_void> {
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
unsafe fn allreduce_sum_raw(
    comm: ffi::MPI_Comm,
    send: Option<*const c_void>,
    recv: *mut c_void,
    count: usize,
    dtype: ReduceDtype,
) -> Result<()> {
    let n = c_int::try_from(count)
        .map_err(|_| anyhow!("all-reduce of {count} elements exceeds MPI's int count: use smaller buckets or messages"))?;
    let (datatype, op) = match dtype {
        ReduceDtype::Fp32 => (ffi::RSMPI_FLOAT, ffi::RSMPI_SUM),
        ReduceDtype::Fp64 => (ffi::RSMPI_DOUBLE, ffi::RSMPI_SUM),
        ReduceDtype::Fp16 => (ffi::RSMPI_UINT16_T, half_ops().f16),
        ReduceDtype::Bf16 => (ffi::RSMPI_UINT16_T, half_ops().bf16),
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

/// MPI_Allreduce on one communicator, from whichever thread holds the transport.
pub(crate) struct Mpi<'c> {
    comm: ffi::MPI_Comm,
    /// The communicator the handle belongs to outlives the transport.
    _comm: PhantomData<&'c ()>,
}

// SAFETY: MPI handles are plain identifiers; MPI_THREAD_SERIALIZED (which training checks
// before it hands a transport to a thread) allows any one thread at a time to use them.
unsafe impl Send for Mpi<'_> {}

impl<'c> Mpi<'c> {
    /// All-reduces over `comm`, every member taking part.
    pub(crate) fn new(comm: &'c SimpleCommunicator) -> Mpi<'c> {
        Mpi {
            comm: comm.as_raw(),
            _comm: PhantomData,
        }
    }
}

impl Mpi<'static> {
    /// As [`Mpi::new`], for a transport that moves to another thread.
    ///
    /// # Safety
    /// `comm` must stay alive (not be freed) for as long as the transport is used.
    pub(crate) unsafe fn unbound(comm: &SimpleCommunicator) -> Mpi<'static> {
        Mpi {
            comm: comm.as_raw(),
            _comm: PhantomData,
        }
    }
}

impl Transport for Mpi<'_> {
    fn slot(&mut self, a: &Tensor, b: Option<&Tensor>, wire: ReduceDtype, _timed: bool) -> Result<Slot> {
        let direct = a.device() == Device::Cpu && a.kind() == wire.kind();
        let mut slot = Slot::bind(a, b, wire, !direct)?;
        if matches!(wire, ReduceDtype::Fp16 | ReduceDtype::Bf16) {
            half_ops();
        }
        if !direct {
            let buf = || {
                let t = Tensor::zeros([slot.numel as i64], (wire.kind(), Device::Cpu));
                match slot.device {
                    Device::Cpu => t,
                    d => t.pin_memory(d),
                }
            };
            slot.staging = Some((buf(), buf()));
        }
        Ok(slot)
    }

    fn allreduce(&mut self, slot: &mut Slot, dir: Dir) -> Result<StagingTimes> {
        let (count, wire, on_device) = (slot.numel, slot.wire, slot.device != Device::Cpu);
        let (src, dst, staging) = slot.parts(dir)?;
        let Some((send, recv)) = staging else {
            // SAFETY: contiguous CPU buffers of `count` wire-dtype elements, checked when the
            // slot was bound and held by it; the caller touches neither until this returns.
            unsafe {
                match dst {
                    Some(dst) => allreduce_sum_raw(self.comm, Some(src.data_ptr()), dst.data_ptr(), count, wire)?,
                    None => allreduce_sum_raw(self.comm, None, src.data_ptr(), count, wire)?,
                }
            }
            return Ok(StagingTimes::default());
        };
        let ta = Instant::now();
        send.copy_(src); // casts to the wire dtype; from a GPU, returns once the copy is done
        let tb = Instant::now();
        // SAFETY: contiguous host buffers of `count` wire-dtype elements made with the slot.
        unsafe {
            match dst {
                Some(_) => allreduce_sum_raw(self.comm, Some(send.data_ptr()), recv.data_ptr(), count, wire)?,
                None => allreduce_sum_raw(self.comm, None, send.data_ptr(), count, wire)?,
            }
        }
        let tc = Instant::now();
        // copy_ without non_blocking returns once the copy is done, on CPU or GPU.
        match dst {
            Some(dst) => dst.copy_(recv),
            None => src.copy_(send),
        }
        Ok(if on_device {
            StagingTimes {
                d2h_s: (tb - ta).as_secs_f64(),
                h2d_s: tc.elapsed().as_secs_f64(),
            }
        } else {
            StagingTimes::default()
        })
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
