//! SGD and Adam over flat buckets against the same optimizers parameter by parameter:
//! the same bits, and updates issued per bucket rather than per parameter.

use super::tests::{bits, copies, everything, set_grads, set_piece};
use super::{FlatLayout, Gate, Optimizer, OptimizerKind, Slot};
use crate::amp::LossScaler;
use crate::comm::{BucketPlan, FlatGrads, ReduceDtype};
use crate::record::MemoryFormat;
use tch::{Device, Kind, Tensor};

/// Parameters of `dtype` from a seed: two channels-last convolution weights, a matrix
/// and vectors, so that buckets hold several shapes and layouts.
fn mixed_params(seed: i64, dtype: Kind) -> Vec<Tensor> {
    let _seeded = crate::torch_seed::seed(seed);
    let shapes: [&[i64]; 6] = [&[8, 3, 3, 3], &[8], &[16, 8, 3, 3], &[16], &[10, 37], &[10]];
    shapes
        .iter()
        .map(|&shape| {
            let t = Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(dtype);
            crate::model::in_format(&t, MemoryFormat::ChannelsLast).set_requires_grad(true)
        })
        .collect()
}

/// The gradient buckets of `params` (at most `cap_elements` elements each, so several)
/// with every gradient a view of them, as training attaches them.
fn buckets_of(params: &[Tensor], cap_elements: usize) -> FlatGrads {
    let zeros: Vec<Tensor> = params.iter().map(Tensor::zeros_like).collect();
    set_grads(params, &zeros);
    let numels: Vec<usize> = params.iter().map(Tensor::numel).collect();
    let dtypes: Vec<ReduceDtype> = params.iter().map(|p| ReduceDtype::of(p.kind()).unwrap()).collect();
    let plan = BucketPlan::new(&numels, &dtypes, cap_elements * dtypes[0].bytes());
    FlatGrads::attach(&plan, params).unwrap()
}

/// A gradient for each of `params`, random but for `zero` (a skipped step's gradients,
/// as fp16 AMP's unscale leaves them).
fn gradients(params: &[Tensor], zero: bool) -> Vec<Tensor> {
    params
        .iter()
        .map(|p| {
            if zero {
                p.zeros_like()
            } else {
                p.to_kind(Kind::Float).randn_like().to_kind(p.kind())
            }
        })
        .collect()
}

/// How the steps of [`flat_buckets_move_every_bit_as_parameter_by_parameter`] are gated.
#[derive(Debug, Clone, Copy)]
enum Gating {
    Always,
    /// Gated on the device, the third step skipped (its gradients zeroed).
    SkipThird,
}

/// Six steps of one optimizer over flat buckets (re-pointed between the two gradient
/// sets each step, as the all-reduce does) and of the same parameter by parameter.
fn same_bits_flat_and_alone(kind: OptimizerKind, momentum: f64, wd: f64, dtype: Kind, piece: Option<usize>, gating: Gating) {
    let alone = mixed_params(11, dtype);
    let flat_params = copies(&alone);
    let strides: Vec<Vec<i64>> = alone.iter().map(Tensor::stride).collect();
    let mut ref_opt = Optimizer::new(kind, &alone, 0.0123, momentum, wd);
    let mut opt = Optimizer::new(kind, &flat_params, 0.0123, momentum, wd);
    let mut flat = buckets_of(&flat_params, 700);
    assert!(flat.current_set().len() >= 3, "several buckets");
    opt.use_flat_buckets(&flat.layout());
    if let Some(n) = piece {
        set_piece(&mut ref_opt, n);
        set_piece(&mut opt, n);
    }
    let why = |step: usize| format!("{kind:?} momentum {momentum} wd {wd} on {dtype:?}, piece {piece:?}, {gating:?}, step {step}");
    for (p, s) in flat_params.iter().zip(&strides) {
        assert_eq!(&p.stride(), s, "a parameter keeps its layout (channels-last too)");
    }
    assert_eq!(bits(&flat_params), bits(&alone), "laying out keeps the values");
    for step in 0..6 {
        let skipped = matches!(gating, Gating::SkipThird) && step == 2;
        let grads = gradients(&alone, skipped);
        flat.point_grads_at(1 - flat.current, &flat_params);
        set_grads(&alone, &grads);
        set_grads(&flat_params, &grads);
        let before = everything(&opt, &flat_params);
        let gate = || match gating {
            Gating::Always => Gate::always(),
            Gating::SkipThird => Gate::skip_if(&Tensor::from(if skipped { 1.0f32 } else { 0.0 })),
        };
        ref_opt.step(&gate(), &[]);
        opt.step(&gate(), flat.current_set());
        if skipped {
            assert_eq!(everything(&opt, &flat_params), before, "{}: a skipped step moved a bit", why(step));
        }
        assert_eq!(bits(&flat_params), bits(&alone), "{}: parameters", why(step));
        assert_eq!(everything(&opt, &flat_params), everything(&ref_opt, &alone), "{}: state", why(step));
    }
}

#[test]
fn flat_buckets_move_every_bit_as_parameter_by_parameter() {
    let runs = [
        (OptimizerKind::Sgd, 0.9, 0.3),
        (OptimizerKind::Sgd, 0.9, 0.0),
        (OptimizerKind::Sgd, 0.0, 0.3),
        (OptimizerKind::Adam, 0.0, 0.3),
        (OptimizerKind::Adam, 0.0, 0.0),
    ];
    for (kind, momentum, wd) in runs {
        for dtype in [Kind::Float, Kind::Double, Kind::Half, Kind::BFloat16] {
            for gating in [Gating::Always, Gating::SkipThird] {
                same_bits_flat_and_alone(kind, momentum, wd, dtype, None, gating);
            }
        }
        // Pieces that end inside parameters and inside vector registers.
        same_bits_flat_and_alone(kind, momentum, wd, Kind::Float, Some(101), Gating::SkipThird);
    }
}

/// fp16 AMP's path over flat buckets: an overflowing step's gradients are unscaled in
/// the buckets, found, and the step skipped with every bit of parameters and state kept;
/// the run then goes on as parameter by parameter.
#[test]
fn an_overflowing_step_over_flat_buckets_moves_nothing() {
    for kind in [OptimizerKind::Sgd, OptimizerKind::Adam] {
        let alone = mixed_params(5, Kind::Float);
        let flat_params = copies(&alone);
        let mut ref_opt = Optimizer::new(kind, &alone, 0.05, 0.9, 1e-3);
        let mut opt = Optimizer::new(kind, &flat_params, 0.05, 0.9, 1e-3);
        let mut flat = buckets_of(&flat_params, 700);
        opt.use_flat_buckets(&flat.layout());
        let (mut scaler, mut ref_scaler) = (LossScaler::new(Device::Cpu), LossScaler::new(Device::Cpu));
        for step in 0..4 {
            let grads: Vec<Tensor> = gradients(&alone, false).iter().map(|g| g * scaler.scale()).collect();
            if step == 2 {
                let _ = grads[2].get(1).get(3).fill_(f64::INFINITY);
            }
            flat.point_grads_at(1 - flat.current, &flat_params);
            set_grads(&alone, &grads);
            set_grads(&flat_params, &grads);
            let before = everything(&opt, &flat_params);
            let ref_grads: Vec<Tensor> = alone.iter().map(Tensor::grad).collect();
            let ref_inf = ref_opt.step_unscaled(&ref_grads, Some(&mut ref_scaler)).unwrap();
            let found_inf = opt.step_unscaled(flat.current_set(), Some(&mut scaler)).unwrap();
            assert_eq!(
                found_inf.double_value(&[]),
                if step == 2 { 1.0 } else { 0.0 },
                "{kind:?} step {step}"
            );
            assert_eq!(ref_inf.double_value(&[]), found_inf.double_value(&[]));
            if step == 2 {
                assert_eq!(everything(&opt, &flat_params), before, "{kind:?}: the skipped step moved a bit");
            }
            assert_eq!(everything(&opt, &flat_params), everything(&ref_opt, &alone), "{kind:?} step {step}");
        }
    }
}

/// Parameters of `count` vectors of 10 elements, with their gradient buckets of at most
/// `cap_elements` elements.
fn vectors(count: usize, cap_elements: usize) -> (Vec<Tensor>, FlatGrads) {
    let params: Vec<Tensor> = (0..count)
        .map(|_| Tensor::randn([10], (Kind::Float, Device::Cpu)).set_requires_grad(true))
        .collect();
    let flat = buckets_of(&params, cap_elements);
    (params, flat)
}

/// The element-wise updates of a step (each a fixed few kernels) follow the flat
/// buckets, not the parameters: 4 or 40 parameters in 2 buckets issue 2 updates, where
/// parameter by parameter they issue 4 or 40. Pieces still bound each update's size.
#[test]
fn a_step_issues_updates_per_bucket_not_per_parameter() {
    for kind in [OptimizerKind::Sgd, OptimizerKind::Adam] {
        for count in [4, 40] {
            let (params, flat) = vectors(count, count * 10 / 2);
            assert_eq!(flat.current_set().len(), 2);
            let alone = copies(&params);
            set_grads(&alone, &gradients(&alone, false));
            let mut ref_opt = Optimizer::new(kind, &alone, 0.1, 0.9, 0.0);
            ref_opt.step(&Gate::always(), &[]);
            assert_eq!(ref_opt.updates_last_step(), count, "{kind:?}: per parameter");
            let mut opt = Optimizer::new(kind, &params, 0.1, 0.9, 0.0);
            opt.use_flat_buckets(&flat.layout());
            opt.step(&Gate::always(), flat.current_set());
            assert_eq!(opt.updates_last_step(), 2, "{kind:?} with {count} parameters: per bucket");
            // Pieces of 7 elements: ⌈(count·10/2)/7⌉ per bucket.
            set_piece(&mut opt, 7);
            opt.step(&Gate::always(), flat.current_set());
            assert_eq!(opt.updates_last_step(), 2 * (count * 10 / 2).div_ceil(7), "{kind:?}: in pieces");
        }
    }
    // LARS takes each layer's norms: it stays per parameter.
    let (params, flat) = vectors(6, 30);
    let mut lars = Optimizer::new(OptimizerKind::Lars, &params, 0.1, 0.9, 0.0);
    lars.use_flat_buckets(&flat.layout());
    lars.step(&Gate::always(), flat.current_set());
    assert_eq!(lars.updates_last_step(), 6);
}

/// Gradient views of `params` into `buffers` at `layout`'s slots (as the buckets make them).
fn point_grads(params: &[Tensor], buffers: &[Tensor], layout: &FlatLayout) {
    for (p, slot) in params.iter().zip(&layout.slots) {
        let mut g = p.grad();
        let _ = g.set_source_tensor_storage_offset_(&buffers[slot.bucket], slot.offset, p.size().as_slice(), slot.strides.as_slice());
    }
}

/// A bucket whose layout leaves gaps is updated whole, its gap elements staying 0; a
/// bucket whose slot would change a parameter's layout is updated parameter by
/// parameter. Either way the bits are those of the parameters updated alone.
#[test]
fn gaps_stay_zero_and_a_bucket_that_cannot_be_flat_stays_per_parameter() {
    let shapes: [&[i64]; 4] = [&[3, 4], &[5], &[2, 3], &[7]];
    let _seeded = crate::torch_seed::seed(2);
    let alone: Vec<Tensor> = shapes
        .iter()
        .map(|&s| Tensor::randn(s, (Kind::Float, Device::Cpu)).set_requires_grad(true))
        .collect();
    let params = copies(&alone);
    let slot = |bucket, offset, strides: &[i64]| Slot {
        bucket,
        offset,
        strides: strides.to_vec(),
    };
    // Bucket 0: parameter 1 at 0, a gap of 3, parameter 0 at 8, a gap of 2 at the end.
    // Bucket 1: parameter 2 column-major (not its own layout), parameter 3 after it.
    let layout = FlatLayout {
        numels: vec![22, 13],
        slots: vec![slot(0, 8, &[4, 1]), slot(0, 0, &[1]), slot(1, 0, &[1, 2]), slot(1, 6, &[1])],
    };
    for kind in [OptimizerKind::Sgd, OptimizerKind::Adam] {
        let ps = copies(&params);
        let refs = copies(&alone);
        set_grads(&ps, &gradients(&ps, false));
        let buffers: Vec<Tensor> = layout
            .numels
            .iter()
            .map(|&n| Tensor::zeros([n as i64], (Kind::Float, Device::Cpu)))
            .collect();
        point_grads(&ps, &buffers, &layout);
        let mut opt = Optimizer::new(kind, &ps, 0.1, 0.9, 0.01);
        let mut ref_opt = Optimizer::new(kind, &refs, 0.1, 0.9, 0.01);
        opt.use_flat_buckets(&layout);
        for step in 0..3 {
            let grads = gradients(&refs, false);
            set_grads(&refs, &grads);
            set_grads(&ps, &grads);
            ref_opt.step(&Gate::always(), &[]);
            opt.step(&Gate::always(), &buffers);
            assert_eq!(
                opt.updates_last_step(),
                3,
                "{kind:?}: bucket 0 whole, bucket 1's two parameters alone"
            );
            assert_eq!(everything(&opt, &ps), everything(&ref_opt, &refs), "{kind:?} step {step}");
        }
        // Parameter 1's data is a view of bucket 0's parameter buffer: read the gaps through it.
        let buffer = ps[1].as_strided([22], [1], 0);
        let gaps = Tensor::cat(&[buffer.narrow(0, 5, 3), buffer.narrow(0, 20, 2)], 0);
        assert_eq!(Vec::<f32>::try_from(gaps).unwrap(), [0.0; 5], "{kind:?}: the gaps stay 0");
        assert_eq!(ps[2].stride(), vec![3, 1], "{kind:?}: a parameter alone keeps its layout");
    }
}
