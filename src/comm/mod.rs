//! Gradient all-reduce. Gradients live in flat buckets of at most `--bucket-mb` (as
//! PyTorch DDP's `bucket_cap_mb`, filled in the order backward makes them ready); each
//! bucket is all-reduced as soon as its gradients are final (`--overlap on`) or all
//! after backward (`--overlap off`), and the gradients are re-pointed at the result.
//!
//! The backend sits behind [`GradientReducer`]: [`mpi::MpiStaged`] is the CPU-staged
//! fallback (MPI_Allreduce over host memory, device gradients staged through pinned
//! buffers), [`nccl::NcclReducer`] all-reduces on the device, and [`none::NoReduce`]
//! keeps each rank's gradients (the step without communication). [`overlap`] cuts
//! backward so buckets leave while it runs. Every byte that leaves the rank goes
//! through [`transport`], the one all-reduce of a buffer that the `ddpbench allreduce`
//! sweep and the training probe time too.

pub(crate) mod deferred;
pub(crate) mod dtype;
pub(crate) mod mpi;
pub(crate) mod nccl;
pub(crate) mod noise;
pub(crate) mod none;
pub(crate) mod overlap;
pub(crate) mod transport;

#[cfg(test)]
mod layering_tests;

use crate::optim::{is_dense, FlatLayout, Slot};
/// Defined with the comparison key, which records it.
pub(crate) use crate::record::GradDtype;
use anyhow::{bail, Result};
pub(crate) use dtype::ReduceDtype;
use serde::{Deserialize, Serialize};
use std::time::Instant;
use tch::{Kind, Tensor};

use clap::ValueEnum;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllreduceChoice {
    /// NCCL when training on CUDA and libnccl loads, otherwise the CPU-staged MPI path (said once in the log).
    Auto,
    /// NCCL on device: rank 0 makes the unique id, MPI broadcasts it; buckets are reduced on a dedicated CUDA stream.
    Nccl,
    /// MPI_Allreduce over host memory; device gradients are staged through pinned host buffers.
    Mpi,
    /// No all-reduce: every rank keeps its own gradients. Measures the step without
    /// communication; such runs are marked in the manifest and never a scaling baseline.
    None,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverlapMode {
    /// Overlap where the all-reduce can run beside backward: NCCL's stream, or an MPI
    /// thread on a core backward does not compute on.
    On,
    Off,
    /// Overlap even where the MPI thread shares backward's cores: tests the mechanism; the
    /// manifest says so and none of the all-reduce counts as hidden.
    Force,
}

/// Parameters grouped into all-reduce buckets, each bucket of one dtype.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct BucketPlan {
    /// For each bucket, the indexes of its parameters (in the fixed parameter order).
    pub buckets: Vec<Vec<usize>>,
    /// Elements per bucket.
    pub numels: Vec<usize>,
    /// Each bucket's dtype: its parameters' own, the same for all of them.
    pub dtypes: Vec<ReduceDtype>,
}

impl BucketPlan {
    /// Fills buckets from the last parameter to the first (the order in which
    /// backward produces gradients of a sequential network), as [`BucketPlan::in_order`].
    #[cfg(test)]
    pub(crate) fn new(numels: &[usize], dtypes: &[ReduceDtype], cap_bytes: usize) -> BucketPlan {
        let order: Vec<usize> = (0..numels.len()).rev().collect();
        BucketPlan::in_order(numels, dtypes, &order, cap_bytes)
    }

    /// Fills buckets with parameters in `order` (the order their gradients become
    /// final, as PyTorch DDP rebuilds its buckets after the first iteration), `dtypes[i]`
    /// being parameter i's. As c10d's `compute_bucket_assignment_by_size`, each dtype
    /// fills a bucket of its own, closed when the next parameter of that dtype would push
    /// it over `cap_bytes` (a parameter larger than the cap gets a bucket of its own, its
    /// bytes counted in its dtype), and buckets are ordered by when their first
    /// parameter comes in `order`. With one dtype: consecutive runs of `order`.
    pub(crate) fn in_order(numels: &[usize], dtypes: &[ReduceDtype], order: &[usize], cap_bytes: usize) -> BucketPlan {
        struct Filling {
            dtype: ReduceDtype,
            first: usize,
            members: Vec<usize>,
            numel: usize,
        }
        let mut done: Vec<Filling> = Vec::new();
        let mut open: Vec<Filling> = Vec::new();
        for (position, &i) in order.iter().enumerate() {
            let dtype = dtypes[i];
            let at = match open.iter().position(|f| f.dtype == dtype) {
                Some(at) => at,
                None => {
                    open.push(Filling {
                        dtype,
                        first: position,
                        members: Vec::new(),
                        numel: 0,
                    });
                    open.len() - 1
                }
            };
            let f = &mut open[at];
            if !f.members.is_empty() && (f.numel + numels[i]) * dtype.bytes() > cap_bytes {
                let fresh = Filling {
                    dtype,
                    first: position,
                    members: Vec::new(),
                    numel: 0,
                };
                done.push(std::mem::replace(f, fresh));
            }
            f.members.push(i);
            f.numel += numels[i];
        }
        done.extend(open.into_iter().filter(|f| !f.members.is_empty()));
        done.sort_by_key(|f| f.first);
        BucketPlan {
            numels: done.iter().map(|f| f.numel).collect(),
            dtypes: done.iter().map(|f| f.dtype).collect(),
            buckets: done.into_iter().map(|f| f.members).collect(),
        }
    }

    #[cfg(test)]
    pub(crate) fn total_numel(&self) -> usize {
        self.numels.iter().sum()
    }

    /// Bytes of each bucket in its own dtype: the gradients it holds.
    pub(crate) fn bytes(&self) -> Vec<usize> {
        self.numels.iter().zip(&self.dtypes).map(|(&n, d)| n * d.bytes()).collect()
    }

    /// Bytes of all gradients, each in its parameter's dtype.
    pub(crate) fn total_bytes(&self) -> usize {
        self.bytes().iter().sum()
    }

    /// What each bucket carries on the wire with `--grad-dtype wire` ([`ReduceDtype::on_wire`]).
    pub(crate) fn wire_dtypes(&self, wire: GradDtype) -> Vec<ReduceDtype> {
        self.dtypes.iter().map(|d| d.on_wire(wire)).collect()
    }

    /// Bytes each bucket puts on the wire with `--grad-dtype wire`.
    pub(crate) fn wire_bytes(&self, wire: GradDtype) -> Vec<u64> {
        self.numels
            .iter()
            .zip(self.wire_dtypes(wire))
            .map(|(&n, d)| (n * d.bytes()) as u64)
            .collect()
    }

    /// Bytes all buckets put on the wire in one step.
    pub(crate) fn total_wire_bytes(&self, wire: GradDtype) -> u64 {
        self.wire_bytes(wire).iter().sum()
    }
}

/// What one step's all-reduce cost on this rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CommStats {
    /// Bytes this rank put into the all-reduce (at the wire dtype).
    pub bytes: u64,
    /// Sum over buckets of each bucket's all-reduce, staging copies included: the
    /// communication work, whether or not it was hidden behind backward.
    pub comm_s: f64,
    /// The part of `comm_s` that ran before backward ended (by the clocks: each bucket's
    /// all-reduce interval cut at backward's end). 0 without overlap.
    pub hidden_s: f64,
    /// Device→host copies of the CPU-staged path, inside `comm_s` (0 on CPU and NCCL).
    pub stage_d2h_s: f64,
    /// Host→device copies of the CPU-staged path, inside `comm_s`.
    pub stage_h2d_s: f64,
    /// When this rank handed its first bucket to the all-reduce (host clock).
    pub first_launch: Option<Instant>,
    /// When it handed over its last bucket: from then on it only waits.
    pub last_launch: Option<Instant>,
    /// When it handed over each bucket (host clock), in bucket order.
    pub launches: Vec<Option<Instant>>,
    /// When this rank saw its last all-reduce complete (host clock), before any
    /// bookkeeping; None without an all-reduce.
    pub done_at: Option<Instant>,
    /// The all-reduce's completion is ordered on the compute stream and the host did not
    /// wait for it (NCCL with device-event phases): the step marks its end with a device
    /// event, not with `done_at`.
    pub done_on_stream: bool,
    /// When each bucket's all-reduce ran on the host clock, in the order they ended
    /// (empty where the device times them).
    pub spans: Vec<BucketSpan>,
}

/// One bucket's all-reduce on the host clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BucketSpan {
    pub bucket: usize,
    pub start: Instant,
    pub end: Instant,
}

impl CommStats {
    /// Where the step's exposed all-reduce ends, for a backward that ended at
    /// `backward_end`: when the last all-reduce completed, but never later than
    /// `backward_end` plus the all-reduce work after it (`comm_s − hidden_s`), so the
    /// exposed phase is at most `comm_s` by construction. Launching buckets, handing
    /// them between threads and finishing their records fall after it (in `other_s`).
    /// Without an all-reduce nothing is exposed: `backward_end` itself.
    pub(crate) fn exposed_end(&self, backward_end: Instant) -> Instant {
        let Some(done) = self.done_at else { return backward_end };
        // Whole nanoseconds, rounded down: the phase never rounds above the work.
        let after_ns = ((self.comm_s - self.hidden_s).max(0.0) * 1e9).floor();
        let after = std::time::Duration::from_nanos(after_ns.min(u64::MAX as f64) as u64);
        done.max(backward_end).min(backward_end + after)
    }
}

/// Seconds of `[start, end]` before `cut`.
pub(crate) fn seconds_before(start: Instant, end: Instant, cut: Instant) -> f64 {
    if cut <= start {
        0.0
    } else {
        (end.min(cut) - start).as_secs_f64()
    }
}

/// Sums gradients across all ranks (the loss is pre-divided by the world size before
/// backward, so the sum is the mean, as Horovod's predivide does).
pub(crate) trait GradientReducer {
    /// Moves the (defined) gradients of `params` into flat buckets and makes them views
    /// of those; from then on backward accumulates straight into the buckets.
    fn attach(&mut self, params: &[Tensor]) -> Result<()>;
    /// Bucket `b`'s gradients are final: start its all-reduce (it may run on while
    /// the caller goes on with backward).
    fn launch(&mut self, b: usize) -> Result<()>;
    /// Launches the buckets not yet launched, waits for all, and re-points the
    /// gradients of `params` at the reduced values. `backward_end` is when this step's
    /// backward ended: all-reduce work before it was hidden.
    fn finish(&mut self, params: &[Tensor], backward_end: Instant) -> Result<CommStats>;
    /// The flat buffers holding the reduced gradients after [`GradientReducer::finish`].
    fn reduced(&self) -> &[Tensor];
    /// After [`GradientReducer::finish`], until the next step's all-reduce: the flat
    /// buffers still holding this rank's own gradients as they entered the all-reduce;
    /// None where nothing was reduced.
    fn local(&self) -> Option<&[Tensor]> {
        None
    }
    /// Zeroes the gradients for the next step without freeing them.
    fn zero_grads(&mut self);
    /// After [`GradientReducer::attach`]: where each parameter's gradient sits in the
    /// flat buckets ([`GradientReducer::reduced`] holds bucket b's at index b), for the
    /// optimizer to lay the parameters out alike; None before.
    fn layout(&self) -> Option<FlatLayout>;
    /// With `on`, [`GradientReducer::finish`] does not wait for the device: its
    /// `comm_s` and `hidden_s` are 0 and each step's are read later, oldest first, by
    /// [`GradientReducer::read_deferred`] (once the phase clock has given that step, so
    /// its device work is done). Only a reducer timed by device events defers.
    fn defer_device_times(&mut self, _on: bool) {}
    /// The oldest deferred step's (`comm_s`, `hidden_s`); None when nothing is deferred.
    fn read_deferred(&mut self) -> Result<Option<(f64, f64)>> {
        Ok(None)
    }
}

/// Gradients living in flat bucket buffers, as PyTorch DDP's
/// `gradient_as_bucket_view`: each parameter's `.grad` is a view into one of two
/// buffer sets. The all-reduce reads the current set and writes the other, then
/// the views are re-pointed, so on CPU no byte is copied besides MPI's own.
pub(crate) struct FlatGrads {
    /// Two sets of per-bucket buffers on the gradients' device.
    pub sets: [Vec<Tensor>; 2],
    pub current: usize,
    /// (bucket, element offset) of each parameter.
    slot: Vec<(usize, i64)>,
    /// The strides of each parameter's gradient view: the parameter's own layout
    /// ([`bucket_strides`]), so a channels-last weight's gradient is channels-last too.
    strides: Vec<Vec<i64>>,
    /// Buckets handed to the all-reduce in this step.
    launched: Vec<bool>,
    /// When the first and the last bucket were claimed in this step.
    first_claim: Option<Instant>,
    last_claim: Option<Instant>,
    /// When each bucket was claimed in this step.
    claimed_at: Vec<Option<Instant>>,
}

impl FlatGrads {
    /// Moves the (defined) gradients of `params` into set 0 and makes them views of it.
    /// Each bucket is a buffer of its dtype ([`BucketPlan::dtypes`]), each parameter at
    /// its offset in elements of that dtype. Set 1 is allocated once the gradients
    /// backward made have moved into set 0 (and their own memory is freed), so that
    /// attaching never holds three copies of the gradients.
    pub(crate) fn attach(plan: &BucketPlan, params: &[Tensor]) -> Result<FlatGrads> {
        let device = params[0].device();
        let alloc = || -> Vec<Tensor> {
            plan.numels
                .iter()
                .zip(&plan.dtypes)
                .map(|(&n, d)| Tensor::zeros([n as i64], (d.kind(), device)))
                .collect()
        };
        let mut slot = vec![(usize::MAX, 0); params.len()];
        for (b, members) in plan.buckets.iter().enumerate() {
            let mut offset = 0i64;
            for &p in members {
                if params[p].kind() != plan.dtypes[b].kind() {
                    bail!(
                        "parameter {p} is {:?} in a bucket of {:?} (internal error in the bucket plan)",
                        params[p].kind(),
                        plan.dtypes[b]
                    );
                }
                slot[p] = (b, offset);
                offset += params[p].numel() as i64;
            }
        }
        if let Some(p) = slot.iter().position(|s| s.0 == usize::MAX) {
            bail!("parameter {p} is in no gradient bucket (internal error in the bucket plan)");
        }
        let mut flat = FlatGrads {
            sets: [alloc(), Vec::new()],
            current: 0,
            slot,
            strides: params.iter().map(bucket_strides).collect(),
            launched: vec![false; plan.buckets.len()],
            first_claim: None,
            last_claim: None,
            claimed_at: vec![None; plan.buckets.len()],
        };
        for (p, param) in params.iter().enumerate() {
            let grad = param.grad();
            if !grad.defined() {
                bail!(
                    "parameter {p} ({:?}) got no gradient in the first backward pass: every parameter must take part in the loss",
                    param.size()
                );
            }
            flat.view(0, p, param).copy_(&grad);
        }
        flat.point_grads_at(0, params);
        flat.sets[1] = alloc();
        Ok(flat)
    }

    /// Parameter `p`'s place in bucket set `set`: a view of the flat buffer with the
    /// parameter's shape and layout (what c10d's bucket views are).
    pub(crate) fn view(&self, set: usize, p: usize, param: &Tensor) -> Tensor {
        let (b, off) = self.slot[p];
        self.sets[set][b].as_strided(param.size().as_slice(), self.strides[p].as_slice(), off)
    }

    pub(crate) fn point_grads_at(&mut self, set: usize, params: &[Tensor]) {
        for (p, param) in params.iter().enumerate() {
            let (b, off) = self.slot[p];
            let size = param.size();
            let mut grad = param.grad();
            let _ = grad.set_source_tensor_storage_offset_(&self.sets[set][b], off, size.as_slice(), self.strides[p].as_slice());
        }
        self.current = set;
    }

    /// Where each parameter's gradient sits: its bucket, offset and strides.
    pub(crate) fn layout(&self) -> FlatLayout {
        FlatLayout {
            numels: self.sets[0].iter().map(Tensor::numel).collect(),
            slots: self
                .slot
                .iter()
                .zip(&self.strides)
                .map(|(&(bucket, offset), strides)| Slot {
                    bucket,
                    offset,
                    strides: strides.clone(),
                })
                .collect(),
        }
    }

    /// The set holding bucket `b`'s gradients (the other set receives the reduced
    /// values), the first time it is asked for in a step; None when it was already launched.
    pub(crate) fn claim(&mut self, b: usize) -> Option<usize> {
        if std::mem::replace(&mut self.launched[b], true) {
            return None;
        }
        let now = Instant::now();
        self.first_claim.get_or_insert(now);
        self.last_claim = Some(now);
        self.claimed_at[b] = Some(now);
        Some(self.current)
    }

    /// The step is over without any reduction: the gradients stay where they are.
    pub(crate) fn keep(&mut self) {
        self.launched.iter_mut().for_each(|l| *l = false);
        self.claimed_at.iter_mut().for_each(|c| *c = None);
        self.first_claim = None;
        self.last_claim = None;
    }

    /// When each bucket was claimed in this step (None: not yet).
    pub(crate) fn claim_instants(&self) -> Vec<Option<Instant>> {
        self.claimed_at.clone()
    }

    /// When the step's first and last bucket were claimed.
    pub(crate) fn claim_times(&self) -> (Option<Instant>, Option<Instant>) {
        (self.first_claim, self.last_claim)
    }

    /// Every bucket is reduced: the gradients of `params` become views of the results.
    pub(crate) fn complete(&mut self, params: &[Tensor]) {
        self.point_grads_at(1 - self.current, params);
        self.keep();
    }

    /// The buffers holding the current (after `complete`, the reduced) gradients.
    pub(crate) fn current_set(&self) -> &[Tensor] {
        &self.sets[self.current]
    }

    /// After [`FlatGrads::complete`], the buffers the all-reduce read: this rank's own
    /// gradients, untouched until the next step's all-reduce writes into them.
    pub(crate) fn previous_set(&self) -> &[Tensor] {
        &self.sets[1 - self.current]
    }

    pub(crate) fn zero(&mut self) {
        for t in self.sets[self.current].iter_mut() {
            let _ = t.zero_();
        }
    }
}

/// The strides a parameter's gradient takes in its bucket: the parameter's own when they
/// lay its elements out densely in some order of dimensions (row-major, channels-last),
/// as c10d makes its bucket views; row-major otherwise. Either way the view covers
/// exactly the parameter's `numel` elements of the bucket from its offset.
pub(crate) fn bucket_strides(param: &Tensor) -> Vec<i64> {
    let (size, stride) = (param.size(), param.stride());
    if is_dense(&size, &stride) {
        stride
    } else {
        contiguous_strides(&size)
    }
}

fn contiguous_strides(size: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; size.len()];
    for i in (0..size.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * size[i + 1];
    }
    strides
}

/// libtorch's dtype for gradients on the wire.
pub(crate) fn wire_kind(dtype: GradDtype) -> Kind {
    match dtype {
        GradDtype::Fp32 => Kind::Float,
        GradDtype::Fp16 => Kind::Half,
        GradDtype::Bf16 => Kind::BFloat16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: ReduceDtype = ReduceDtype::Fp32;

    #[test]
    fn buckets_fill_in_reverse_order_under_the_cap() {
        // 4-byte elements, cap 40 bytes = 10 elements.
        let plan = BucketPlan::new(&[4, 4, 4, 20, 2], &[F32; 5], 40);
        assert_eq!(plan.buckets, vec![vec![4], vec![3], vec![2, 1], vec![0]]);
        assert_eq!(plan.numels, vec![2, 20, 8, 4]);
        assert_eq!(plan.total_numel(), 34);
        assert_eq!(plan.total_bytes(), 34 * 4);
        // One bucket when everything fits; same plan every time (fixed order).
        let plan = BucketPlan::new(&[1, 2, 3], &[F32; 3], 1 << 20);
        assert_eq!(plan.buckets, vec![vec![2, 1, 0]]);
        assert_eq!(plan, BucketPlan::new(&[1, 2, 3], &[F32; 3], 1 << 20));
        // A zero cap degenerates to one parameter per bucket.
        assert_eq!(BucketPlan::new(&[1, 2], &[F32; 2], 0).buckets.len(), 2);
    }

    #[test]
    fn each_dtype_fills_buckets_of_its_own_counted_in_its_own_bytes() {
        use ReduceDtype::{Bf16, Fp16, Fp64};
        // Ready order 0..6; cap 32 bytes: 8 fp32, 4 fp64 or 16 fp16 elements.
        let numels = [4, 4, 2, 3, 8, 4, 10];
        let dtypes = [F32, Fp64, Fp16, Fp64, Fp16, F32, Fp16];
        let plan = BucketPlan::in_order(&numels, &dtypes, &[0, 1, 2, 3, 4, 5, 6], 32);
        // fp64: 4 elements (32 bytes) fill one bucket, the next 3 open another; fp16 takes
        // 2 + 8 = 10 elements (20 bytes), and 10 more would pass 32 bytes.
        assert_eq!(plan.buckets, vec![vec![0, 5], vec![1], vec![2, 4], vec![3], vec![6]]);
        assert_eq!(plan.dtypes, vec![F32, Fp64, Fp16, Fp64, Fp16]);
        assert_eq!(plan.numels, vec![8, 4, 10, 3, 10]);
        assert_eq!(plan.bytes(), vec![32, 32, 20, 24, 20]);
        assert_eq!(plan.total_bytes(), 128);
        // The wire dtype casts the fp32 bucket only.
        assert_eq!(plan.wire_bytes(GradDtype::Fp16), vec![16, 32, 20, 24, 20]);
        assert_eq!(plan.total_wire_bytes(GradDtype::Fp32), 128);
        // A parameter over the cap in its own bytes gets a bucket of its own: 5 fp64
        // elements are 40 bytes, 5 bf16 are 10.
        let plan = BucketPlan::in_order(&[5, 5, 1], &[Fp64, Bf16, Fp64], &[0, 1, 2], 32);
        assert_eq!(plan.buckets, vec![vec![0], vec![1], vec![2]]);
        // One dtype: exactly the consecutive runs of the order, as before dtypes counted.
        let plan = BucketPlan::in_order(&[4; 6], &[F32; 6], &[5, 0, 4, 1, 3, 2], 32);
        assert_eq!(plan.buckets, vec![vec![5, 0], vec![4, 1], vec![3, 2]]);
    }

    #[test]
    fn bucket_buffers_take_their_dtype_and_views_alias_them_at_their_byte_offsets() {
        // fp16 between fp32 parameters: an fp16 gradient must not land at an fp32 offset.
        let opts = |k| (k, tch::Device::Cpu);
        let ps = [
            Tensor::ones([3], opts(Kind::Float)).set_requires_grad(true),
            Tensor::ones([4], opts(Kind::Half)).set_requires_grad(true),
            Tensor::ones([5], opts(Kind::Float)).set_requires_grad(true),
        ];
        let loss = (&ps[0] * 2.0).sum(Kind::Float) + (&ps[1] * 0.0).sum(Kind::Float) + (&ps[2] * 3.0).sum(Kind::Float);
        loss.backward();
        let plan = BucketPlan::new(&[3, 4, 5], &[F32, ReduceDtype::Fp16, F32], 1 << 20);
        let mut flat = FlatGrads::attach(&plan, &ps).unwrap();
        for set in [0, 1] {
            flat.point_grads_at(set, &ps);
            for (p, param) in ps.iter().enumerate() {
                let (bucket, off) = flat.slot[p];
                let buffer = &flat.sets[set][bucket];
                assert_eq!(buffer.kind(), param.kind(), "set {set}, parameter {p}");
                let at = buffer.data_ptr() as usize + off as usize * param.kind().elt_size_in_bytes();
                assert_eq!(param.grad().data_ptr() as usize, at, "set {set}, parameter {p}");
            }
        }
        flat.point_grads_at(0, &ps);
        assert_eq!(Vec::<f32>::try_from(ps[0].grad()).unwrap(), [2.0; 3]);
        assert_eq!(Vec::<f32>::try_from(ps[1].grad().to_kind(Kind::Float)).unwrap(), [0.0; 4]);
        assert_eq!(Vec::<f32>::try_from(ps[2].grad()).unwrap(), [3.0; 5]);
        // A plan that puts a parameter in a bucket of another dtype is refused.
        let wrong = BucketPlan::new(&[3, 4, 5], &[F32; 3], 1 << 20);
        let e = FlatGrads::attach(&wrong, &ps).err().expect("refused").to_string();
        assert!(e.contains("internal error"), "{e}");
    }

    #[test]
    fn dense_layouts_are_kept_and_others_made_row_major() {
        assert!(is_dense(&[2, 3, 4, 5], &[60, 20, 5, 1]), "row-major");
        assert!(is_dense(&[2, 3, 4, 5], &[60, 1, 15, 3]), "channels-last");
        assert!(is_dense(&[2, 1, 4, 5], &[20, 7, 5, 1]), "a size-1 dimension's stride is free");
        assert!(!is_dense(&[2, 3], &[6, 1]), "a gap");
        assert!(!is_dense(&[2, 3], &[0, 1]), "an expanded dimension");
        let t = Tensor::zeros([2, 3, 4, 5], (Kind::Float, tch::Device::Cpu));
        let cl = t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]);
        assert_eq!(bucket_strides(&cl), vec![60, 1, 15, 3]);
        let one = Tensor::zeros([1, 3, 4, 5], (Kind::Float, tch::Device::Cpu));
        assert_eq!(bucket_strides(&one.expand([4, 3, 4, 5], false)), vec![60, 20, 5, 1]);
    }

    /// A channels-last convolution weight and a bias, their gradients from one backward.
    fn conv_params() -> (Tensor, Tensor, impl Fn(&Tensor, &Tensor)) {
        tch::manual_seed(3);
        let opts = (Kind::Float, tch::Device::Cpu);
        let w =
            crate::model::in_format(&Tensor::randn([4, 3, 2, 2], opts), crate::record::MemoryFormat::ChannelsLast).set_requires_grad(true);
        let b = Tensor::randn([4], opts).set_requires_grad(true);
        let x = crate::model::in_format(&Tensor::randn([2, 3, 5, 5], opts), crate::record::MemoryFormat::ChannelsLast);
        let backward = move |w: &Tensor, b: &Tensor| {
            x.conv2d(w, Some(b), [1, 1], [0, 0], [1, 1], 1).square().sum(Kind::Float).backward();
        };
        backward(&w, &b);
        (w, b, backward)
    }

    #[test]
    fn bucket_views_keep_each_parameters_strides_and_alias_the_flat_buffer() {
        let (w, b, backward) = conv_params();
        assert_eq!(w.stride(), vec![12, 1, 6, 3], "channels-last");
        assert_eq!(w.grad().stride(), w.stride(), "autograd lays a gradient out as its parameter");
        let want: Vec<Tensor> = [&w, &b].iter().map(|p| p.grad().copy()).collect();
        let params = [w.shallow_clone(), b.shallow_clone()];
        let plan = BucketPlan::new(&[48, 4], &[F32; 2], 1 << 20);
        let mut flat = FlatGrads::attach(&plan, &params).unwrap();
        for set in [0, 1] {
            if set == 1 {
                flat.point_grads_at(1, &params);
            }
            for (p, param) in params.iter().enumerate() {
                let g = param.grad();
                let (bucket, off) = flat.slot[p];
                let base = flat.sets[set][bucket].data_ptr() as usize;
                assert_eq!(
                    g.data_ptr() as usize,
                    base + 4 * off as usize,
                    "set {set}, parameter {p}: a view, no copy"
                );
                assert_eq!(g.stride(), param.stride(), "set {set}, parameter {p}");
            }
        }
        // Set 0 holds the first backward's gradients, element for element.
        flat.point_grads_at(0, &params);
        for (p, param) in params.iter().enumerate() {
            assert!(param.grad().equal(&want[p]), "parameter {p}");
        }
        // A second backward accumulates into the flat buffer itself, through the views.
        backward(&w, &b);
        let (bucket, off) = flat.slot[0];
        let in_buffer = flat.sets[0][bucket].as_strided([4, 3, 2, 2], [12, 1, 6, 3], off);
        assert!(in_buffer.allclose(&(&want[0] * 2.0), 1e-6, 1e-6, false));
    }

    #[test]
    fn buckets_follow_the_order_gradients_become_ready() {
        // Parameters 0 and 3 become ready first (a head registered early by name, say).
        let plan = BucketPlan::in_order(&[4, 4, 4, 4], &[F32; 4], &[3, 0, 2, 1], 32);
        assert_eq!(plan.buckets, vec![vec![3, 0], vec![2, 1]]);
        assert_eq!(plan.numels, vec![8, 8]);
    }
}
