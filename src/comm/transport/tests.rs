//! The transport on CPU: training's reducer and the sweep's measurement go through one
//! [`Transport::allreduce`] (shown with a recording transport behind the same trait), and
//! the MPI transport sums in place, out of place and through cast staging buffers.

use super::mpi::Mpi;
use super::*;
use crate::allreduce::sweep::{measure, measure_set, SweepIters, Target};
use crate::comm::mpi::MpiStaged;
use crate::comm::{BucketPlan, GradDtype, GradientReducer};
use ::mpi::environment::Universe;
use ::mpi::topology::SimpleCommunicator;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tch::Kind;

/// MPI for this test process (one rank, a singleton), initialised once and used by one
/// test at a time: MPI allows one initialisation per process and these tests run on
/// several threads.
fn with_world<R>(f: impl FnOnce(&SimpleCommunicator) -> R) -> R {
    static UNIVERSE: OnceLock<Mutex<Universe>> = OnceLock::new();
    let universe = UNIVERSE.get_or_init(|| Mutex::new(::mpi::initialize().expect("MPI initialised once, here")));
    let guard = universe.lock().unwrap_or_else(|p| p.into_inner());
    f(&guard.world())
}

/// One all-reduce as the recording transport saw it.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    numel: usize,
    wire: ReduceDtype,
    dir: Dir,
    in_place: bool,
}

/// A transport for one rank that records every all-reduce: the sum over one rank is the
/// buffer itself, copied into the destination as a real out-of-place all-reduce would.
#[derive(Clone, Default)]
struct Recording {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Recording {
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Transport for Recording {
    fn slot(&mut self, a: &Tensor, b: Option<&Tensor>, wire: ReduceDtype, _timed: bool) -> Result<Slot> {
        // A wire dtype other than the buffers' is a cast, as the staged MPI path makes.
        Slot::bind(a, b, wire, a.kind() != wire.kind())
    }

    fn allreduce(&mut self, slot: &mut Slot, dir: Dir) -> Result<StagingTimes> {
        let (numel, wire) = (slot.numel(), slot.wire());
        let (src, dst, _) = slot.parts(dir)?;
        let in_place = dst.is_none();
        if let Some(dst) = dst {
            dst.copy_(src);
        }
        self.calls.lock().unwrap().push(Call {
            numel,
            wire,
            dir,
            in_place,
        });
        Ok(StagingTimes::default())
    }
}

fn call(numel: usize, dir: Dir) -> Call {
    Call {
        numel,
        wire: ReduceDtype::Fp32,
        dir,
        in_place: false,
    }
}

/// Three parameters with gradients from one backward pass; the gradients are 1, 2, 3 per parameter.
fn params() -> Vec<Tensor> {
    let ps: Vec<Tensor> = [6i64, 10, 3]
        .iter()
        .map(|&n| Tensor::zeros([n], (Kind::Float, Device::Cpu)).set_requires_grad(true))
        .collect();
    let loss = ps
        .iter()
        .enumerate()
        .map(|(i, p)| p.sum(Kind::Float) * (i as f64 + 1.0))
        .reduce(|a, b| a + b)
        .unwrap();
    loss.backward();
    ps
}

#[test]
fn training_and_the_sweep_all_reduce_through_one_transport() {
    let rec = Recording::default();
    // Training: a gradient reducer's step over buckets of 3, 10 and 6 elements (40-byte
    // cap, filled from the last parameter), launched in bucket order.
    let ps = params();
    let plan = BucketPlan::new(&[6, 10, 3], &[ReduceDtype::Fp32; 3], 40);
    assert_eq!(plan.numels, vec![3, 10, 6]);
    let mut reducer = MpiStaged::with_transport(plan, GradDtype::Fp32, Box::new(rec.clone()), None);
    reducer.attach(&ps).unwrap();
    reducer.launch(1).unwrap();
    let stats = reducer.finish(&ps, Instant::now()).unwrap();
    assert_eq!(stats.bytes, 19 * 4);
    assert_eq!(rec.take(), vec![call(10, Dir::AToB), call(3, Dir::AToB), call(6, Dir::AToB)]);
    // The reduced gradients are what the transport wrote (one rank: the gradients themselves).
    for (i, p) in ps.iter().enumerate() {
        assert_eq!(p.grad().sum(Kind::Float).double_value(&[]), p.numel() as f64 * (i as f64 + 1.0));
    }
    // The next step reads the other gradient set: the same slots, the other way.
    reducer.finish(&ps, Instant::now()).unwrap();
    assert_eq!(rec.take(), vec![call(3, Dir::BToA), call(10, Dir::BToA), call(6, Dir::BToA)]);

    with_world(|world| {
        // The sweep: buffers of 5 and 7 elements back to back per iteration (the probe's
        // measurement), then one size in place, through the same transport.
        let mut transport = rec.clone();
        let mut target = Target {
            comm: world,
            device: Device::Cpu,
            transport: &mut transport,
        };
        let set = measure_set(&mut target, &[5, 7], GradDtype::Fp32, 2, 0.0, 2, 0).unwrap();
        assert_eq!(set.wrong, 0, "the sums came back through the transport");
        let calls = rec.take();
        // One untimed iteration, two timed, and the check: each the two buffers in order.
        assert_eq!(calls.len(), 8, "{calls:?}");
        for pair in calls.chunks(2) {
            assert_eq!(pair, [call(5, Dir::AToB), call(7, Dir::AToB)]);
        }
        let timing = SweepIters {
            warmup_iters: 1,
            iters: 3,
            budget_s: 1.0,
            min_iters: 3,
            idle: crate::allreduce::sweep::Idle::Fixed(0.0),
        };
        let m = measure(&mut target, 64, GradDtype::Fp32, true, timing).unwrap();
        assert_eq!((m.count, m.iters, m.wrong), (16, 3, 0));
        let calls = rec.take();
        // Warm-up, three timed iterations, the check.
        assert_eq!(calls.len(), 5, "{calls:?}");
        assert!(calls.iter().all(|c| c.numel == 16 && c.in_place && c.dir == Dir::AToB), "{calls:?}");
    });
}

#[test]
fn mpi_sums_in_place_out_of_place_and_through_cast_staging() {
    with_world(|world| {
        let mut t = Mpi::new(world);
        let a = Tensor::from_slice(&[1.0f32, 2.5, -3.0]);
        let b = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        // fp32 on the host: no staging; either direction; in place.
        let mut slot = t.slot(&a, Some(&b), ReduceDtype::Fp32, false).unwrap();
        assert!(slot.staging.is_none());
        assert_eq!(t.allreduce(&mut slot, Dir::AToB).unwrap(), StagingTimes::default());
        assert_eq!(Vec::<f32>::try_from(&b).unwrap(), [1.0, 2.5, -3.0]);
        let _ = b.shallow_clone().fill_(7.0);
        t.allreduce(&mut slot, Dir::BToA).unwrap();
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [7.0, 7.0, 7.0]);
        let mut alone = t.slot(&a, None, ReduceDtype::Fp32, false).unwrap();
        t.allreduce(&mut alone, Dir::AToB).unwrap();
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [7.0, 7.0, 7.0]);
        assert!(t.allreduce(&mut alone, Dir::BToA).is_err(), "an in-place slot has no second buffer");

        // fp32 buffers with an fp16 wire: staged through host buffers that cast both ways.
        let g = Tensor::from_slice(&[0.1f32, 1000.0, 1.0 / 3.0]);
        let out = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let mut slot = t.slot(&g, Some(&out), ReduceDtype::Fp16, false).unwrap();
        let (send, _) = slot.staging.as_ref().expect("a cast is staged");
        assert_eq!(send.kind(), Kind::Half);
        t.allreduce(&mut slot, Dir::AToB).unwrap();
        let want: Vec<f32> = [0.1f32, 1000.0, 1.0 / 3.0]
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect();
        assert_eq!(Vec::<f32>::try_from(&out).unwrap(), want, "rounded through fp16");

        // Buffers that are not alike are refused when bound, not when summed.
        let short = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        assert!(t.slot(&a, Some(&short), ReduceDtype::Fp32, false).is_err());
        let h16 = Tensor::zeros([3], (Kind::Half, Device::Cpu));
        assert!(
            Mpi::new(world).slot(&h16, None, ReduceDtype::Fp32, false).is_ok(),
            "cast staging takes any float"
        );
        let strided = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)).transpose(0, 1);
        assert!(t.slot(&strided, None, ReduceDtype::Fp32, false).is_err());
    });
}

/// Parameters of three dtypes, each gradient distinct: fp32 [6], fp16 [4] (a zero
/// gradient, as a buffer-like parameter the loss does not move), fp64 [5], fp32 [3].
fn mixed_params() -> Vec<Tensor> {
    let ps: Vec<Tensor> = [(6i64, Kind::Float), (4, Kind::Half), (5, Kind::Double), (3, Kind::Float)]
        .iter()
        .map(|&(n, k)| Tensor::ones([n], (k, Device::Cpu)).set_requires_grad(true))
        .collect();
    let loss = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let weight = Tensor::arange(p.numel() as i64, (Kind::Double, Device::Cpu)) + 10.0 * i as f64;
            let used = if i == 1 { 0.0 } else { 1.0 };
            (p.to_kind(Kind::Double) * weight).sum(Kind::Double) * used
        })
        .reduce(|a, b| a + b)
        .unwrap();
    loss.backward();
    ps
}

#[test]
fn each_bucket_holds_one_dtype_and_only_fp32_buckets_are_cast_for_the_wire() {
    let rec = Recording::default();
    let ps = mixed_params();
    let want: Vec<Tensor> = ps.iter().map(|p| p.grad().copy()).collect();
    let numels: Vec<usize> = ps.iter().map(Tensor::numel).collect();
    let dtypes = [ReduceDtype::Fp32, ReduceDtype::Fp16, ReduceDtype::Fp64, ReduceDtype::Fp32];
    let plan = BucketPlan::new(&numels, &dtypes, 1 << 20);
    // Filled from the last parameter: the fp32 bucket opens first, then fp64, then fp16.
    assert_eq!(plan.buckets, vec![vec![3, 0], vec![2], vec![1]]);
    assert_eq!(plan.dtypes, vec![ReduceDtype::Fp32, ReduceDtype::Fp64, ReduceDtype::Fp16]);
    let mut reducer = MpiStaged::with_transport(plan, GradDtype::Bf16, Box::new(rec.clone()), None);
    reducer.attach(&ps).unwrap();
    let stats = reducer.finish(&ps, Instant::now()).unwrap();
    // 9 fp32 elements as bf16, 5 fp64 as fp64, 4 fp16 as fp16.
    assert_eq!(stats.bytes, 9 * 2 + 5 * 8 + 4 * 2);
    let wires: Vec<(usize, ReduceDtype)> = rec.take().iter().map(|c| (c.numel, c.wire)).collect();
    assert_eq!(wires, [(9, ReduceDtype::Bf16), (5, ReduceDtype::Fp64), (4, ReduceDtype::Fp16)]);
    // Every gradient comes back whole in its own dtype: neighbours never overlap.
    for (i, p) in ps.iter().enumerate() {
        let g = p.grad();
        assert_eq!(g.kind(), p.kind(), "parameter {i}");
        assert!(g.equal(&want[i]), "parameter {i}: {g:?} against {:?}", want[i]);
    }
    assert_eq!(Vec::<f64>::try_from(ps[1].grad().to_kind(Kind::Double)).unwrap(), [0.0; 4]);
    let reduced: Vec<Kind> = reducer.reduced().iter().map(Tensor::kind).collect();
    assert_eq!(reduced, [Kind::Float, Kind::Double, Kind::Half]);
}

#[test]
fn mpi_sums_fp64_in_fp64_without_staging() {
    with_world(|world| {
        let mut t = Mpi::new(world);
        // 1 + 2^-40 has no fp32 neighbour: a sum through fp32 would round it to 1.
        let fine = 1.0 + 2f64.powi(-40);
        let a = Tensor::from_slice(&[fine, -1e300]);
        let b = Tensor::zeros([2], (Kind::Double, Device::Cpu));
        let mut slot = t.slot(&a, Some(&b), ReduceDtype::Fp64, false).unwrap();
        assert!(slot.staging.is_none(), "fp64 is MPI_DOUBLE: summed where it lies");
        t.allreduce(&mut slot, Dir::AToB).unwrap();
        assert_eq!(Vec::<f64>::try_from(&b).unwrap(), [fine, -1e300]);
    });
}
