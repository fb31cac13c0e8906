//! The raw all-reduce probe a training run records in its manifest: the run's own
//! gradient buckets, in the dtype they travel in (`--grad-dtype`), all-reduced back to
//! back with the sweep's measurement ([`super::sweep::measure_set`]) on MPI and host
//! memory, through the same transport training uses, so the all-reduce inside training
//! can be compared with what the interconnect does without it, byte for byte.

use super::sweep::{measure_set, Target};
use crate::bandwidth::{algbw, busbw};
use crate::comm::transport::mpi::Mpi;
use crate::comm::{BucketPlan, GradDtype};
use crate::record::AllreduceProbe;
use anyhow::{bail, Result};
use mpi::topology::SimpleCommunicator;
use tch::Device;

/// Bytes written between cold-cache probe iterations: larger than the last-level
/// cache of most CPUs, as the activations a backward pass streams through it.
pub(crate) const CACHE_FLUSH_BYTES: usize = 64 << 20;

/// The probe stops after this long (and at least [`PROBE_MIN_ITERS`] iterations).
pub(crate) const PROBE_BUDGET_S: f64 = 5.0;
pub(crate) const PROBE_MIN_ITERS: usize = 10;

/// Times up to `iters` all-reduces of buffers shaped like `plan`, elements of `dtype` (the
/// run's wire dtype: the bytes training puts on the wire) (after one untimed
/// round, within [`PROBE_BUDGET_S`]), ranks aligned by a barrier. With `flush_bytes` > 0,
/// each iteration first writes that many bytes elsewhere, so the buffers come from
/// memory rather than cache, as gradients do right after backward (on a 32 MiB-L3 EPYC:
/// 1.9 ms cold vs 1.0 ms warm for 4.8 MB on shared memory). Fails when the sums are wrong.
pub(crate) fn probe_allreduce(
    comm: &SimpleCommunicator,
    world_size: usize,
    plan: &BucketPlan,
    dtype: GradDtype,
    iters: usize,
    flush_bytes: usize,
) -> Result<AllreduceProbe> {
    let _f = crate::flight::enter("all-reduce", "probe");
    let mut transport = Mpi::new(comm);
    let mut target = Target {
        comm,
        device: Device::Cpu,
        transport: &mut transport,
    };
    // Each bucket probed as buffers of the wire dtype holding the bytes it puts on the
    // wire (a bucket of another parameter dtype travels in its own: the same bytes).
    let numels: Vec<usize> = plan
        .wire_bytes(dtype)
        .iter()
        .map(|&b| (b as usize).div_ceil(dtype.bytes()))
        .collect();
    let m = measure_set(&mut target, &numels, dtype, iters, PROBE_BUDGET_S, PROBE_MIN_ITERS, flush_bytes)?;
    if m.wrong > 0 {
        bail!(
            "the all-reduce probe summed {} elements wrong over {world_size} ranks: MPI's all-reduce gives wrong results on this allocation (check the MPI installation and its network settings)",
            m.wrong
        );
    }
    let times = m.iter_s;
    let bytes = (numels.iter().sum::<usize>() * dtype.bytes()) as u64;
    let median_s = crate::stats::median(&times);
    Ok(AllreduceProbe {
        bytes,
        iters: times.len(),
        median_s,
        min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        busbw_bytes_per_s: busbw(bytes as f64, world_size, median_s),
        algbw_bytes_per_s: algbw(bytes as f64, median_s),
        cold_cache: flush_bytes > 0,
        dtype,
        p10_s: Some(crate::stats::quantile(&times, 0.1)),
        p90_s: Some(crate::stats::quantile(&times, 0.9)),
    })
}
