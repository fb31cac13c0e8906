//! Gradient all-reduce. Gradients are copied, in one fixed parameter order, into
//! flat buckets of at most `--bucket-mb` (as PyTorch DDP's `bucket_cap_mb`), each
//! bucket is all-reduced and averaged, and the result is copied back.
//!
//! The backend sits behind [`GradientReducer`]. [`MpiStaged`] is the design card's
//! CPU-staged fallback: buckets live in host memory and MPI_Allreduce sums them,
//! whatever device the gradients are on. An NCCL backend plugs in beside it.

use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::SimpleCommunicator;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

/// Parameters grouped into all-reduce buckets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BucketPlan {
    /// For each bucket, the indexes of its parameters (in the fixed parameter order).
    pub buckets: Vec<Vec<usize>>,
    /// Elements per bucket.
    pub numels: Vec<usize>,
}

impl BucketPlan {
    /// Fills buckets from the last parameter to the first (the order in which
    /// backward produces gradients, as PyTorch DDP does), closing a bucket when the
    /// next parameter would push it over `cap_bytes`. A parameter larger than the
    /// cap gets a bucket of its own.
    pub fn new(numels: &[usize], elem_bytes: usize, cap_bytes: usize) -> BucketPlan {
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        let mut current: Vec<usize> = Vec::new();
        let mut current_numel = 0usize;
        for i in (0..numels.len()).rev() {
            let bytes = (current_numel + numels[i]) * elem_bytes;
            if !current.is_empty() && bytes > cap_bytes {
                buckets.push(std::mem::take(&mut current));
                sizes.push(current_numel);
                current_numel = 0;
            }
            current.push(i);
            current_numel += numels[i];
        }
        if !current.is_empty() {
            buckets.push(current);
            sizes.push(current_numel);
        }
        BucketPlan { buckets, numels: sizes }
    }

    pub fn total_numel(&self) -> usize {
        self.numels.iter().sum()
    }
}

/// Averages gradients across all ranks in place.
pub trait GradientReducer {
    /// Short name recorded in the manifest, e.g. `mpi-cpu-staged`.
    fn backend(&self) -> &'static str;
    /// Replaces every gradient by its mean over all ranks. Returns the bytes all-reduced.
    fn reduce_mean(&mut self, grads: &[Tensor]) -> Result<u64>;
}

/// MPI_Allreduce over host-memory buckets.
pub struct MpiStaged<'a> {
    comm: &'a SimpleCommunicator,
    plan: BucketPlan,
    world_size: usize,
    send: Vec<Tensor>,
    recv: Vec<Tensor>,
}

impl<'a> MpiStaged<'a> {
    pub fn new(comm: &'a SimpleCommunicator, world_size: usize, plan: BucketPlan) -> MpiStaged<'a> {
        let alloc = |n: usize| Tensor::zeros([n as i64], (Kind::Float, Device::Cpu));
        let send = plan.numels.iter().map(|&n| alloc(n)).collect();
        let recv = plan.numels.iter().map(|&n| alloc(n)).collect();
        MpiStaged { comm, plan, world_size, send, recv }
    }
}

/// A contiguous f32 CPU tensor's storage as a slice.
///
/// SAFETY: the caller guarantees `t` is a contiguous CPU Float tensor that outlives
/// the slice and is not resized meanwhile.
unsafe fn f32_slice_mut(t: &mut Tensor) -> &mut [f32] {
    std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, t.numel())
}

impl GradientReducer for MpiStaged<'_> {
    fn backend(&self) -> &'static str {
        "mpi-cpu-staged"
    }

    fn reduce_mean(&mut self, grads: &[Tensor]) -> Result<u64> {
        let scale = 1.0 / self.world_size as f64;
        for (b, params) in self.plan.buckets.iter().enumerate() {
            let mut offset = 0i64;
            for &p in params {
                let n = grads[p].numel() as i64;
                self.send[b].narrow(0, offset, n).copy_(&grads[p].view([-1]));
                offset += n;
            }
            // SAFETY: send/recv are contiguous CPU f32 tensors owned by self.
            let (send, recv) = unsafe { (f32_slice_mut(&mut self.send[b]), f32_slice_mut(&mut self.recv[b])) };
            self.comm.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            let _ = self.recv[b].g_mul_scalar_(scale);
            let mut offset = 0i64;
            for &p in params {
                let n = grads[p].numel() as i64;
                let mut g = grads[p].view([-1]);
                g.copy_(&self.recv[b].narrow(0, offset, n));
                offset += n;
            }
        }
        Ok((self.plan.total_numel() * 4) as u64)
    }
}

/// nccl-tests' bus bandwidth of an all-reduce: 2(n−1)/n · bytes / time, in bytes/s.
/// For one rank there is nothing to move and the result is 0.
pub fn allreduce_busbw(bytes: f64, ranks: usize, seconds: f64) -> f64 {
    if ranks <= 1 || seconds <= 0.0 {
        return 0.0;
    }
    2.0 * (ranks as f64 - 1.0) / ranks as f64 * bytes / seconds
}

/// A raw MPI_Allreduce of the same buckets, timed in the same run as training.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct AllreduceProbe {
    pub bytes: u64,
    pub iters: usize,
    /// Median over iterations of the slowest rank's time for all buckets.
    pub median_s: f64,
    pub min_s: f64,
    pub busbw_bytes_per_s: f64,
    pub algbw_bytes_per_s: f64,
}

/// Times `iters` all-reduces of buffers shaped like `plan` (after one untimed round).
pub fn probe_allreduce(comm: &SimpleCommunicator, world_size: usize, plan: &BucketPlan, iters: usize) -> AllreduceProbe {
    let send: Vec<Vec<f32>> = plan.numels.iter().map(|&n| vec![1.0f32; n]).collect();
    let mut recv: Vec<Vec<f32>> = plan.numels.iter().map(|&n| vec![0.0f32; n]).collect();
    let mut times = Vec::with_capacity(iters);
    for it in 0..=iters {
        comm.barrier();
        let t0 = mpi::time();
        for (s, r) in send.iter().zip(recv.iter_mut()) {
            comm.all_reduce_into(&s[..], &mut r[..], SystemOperation::sum());
        }
        let local = mpi::time() - t0;
        let mut slowest = 0.0f64;
        comm.all_reduce_into(&local, &mut slowest, SystemOperation::max());
        if it > 0 {
            times.push(slowest);
        }
    }
    let bytes = (plan.total_numel() * 4) as u64;
    let median_s = crate::stats::median(&times);
    AllreduceProbe {
        bytes,
        iters,
        median_s,
        min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        busbw_bytes_per_s: allreduce_busbw(bytes as f64, world_size, median_s),
        algbw_bytes_per_s: if median_s > 0.0 { bytes as f64 / median_s } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_in_reverse_order_under_the_cap() {
        // 4-byte elements, cap 40 bytes = 10 elements.
        let plan = BucketPlan::new(&[4, 4, 4, 20, 2], 4, 40);
        assert_eq!(plan.buckets, vec![vec![4], vec![3], vec![2, 1], vec![0]]);
        assert_eq!(plan.numels, vec![2, 20, 8, 4]);
        assert_eq!(plan.total_numel(), 34);
        // One bucket when everything fits; same plan every time (fixed order).
        let plan = BucketPlan::new(&[1, 2, 3], 4, 1 << 20);
        assert_eq!(plan.buckets, vec![vec![2, 1, 0]]);
        assert_eq!(plan, BucketPlan::new(&[1, 2, 3], 4, 1 << 20));
        // A zero cap degenerates to one parameter per bucket.
        assert_eq!(BucketPlan::new(&[1, 2], 4, 0).buckets.len(), 2);
    }

    #[test]
    fn busbw_follows_nccl_tests_definition() {
        // 2 ranks: factor 1; 4 ranks: factor 1.5.
        assert_eq!(allreduce_busbw(1e9, 2, 1.0), 1e9);
        assert_eq!(allreduce_busbw(1e9, 4, 0.5), 3e9);
        assert_eq!(allreduce_busbw(1e9, 1, 0.5), 0.0);
    }
}
