//! Optimizers: SGD, Adam and LARS, written here so that fp16 AMP can skip a step on
//! the device ([`update::Gate`]); SGD and Adam are libtorch's arithmetic, bit for bit.
//! Given the flat gradient buckets' layout, SGD and Adam update bucket by bucket over
//! flat buffers ([`flat`]); LARS, whose trust ratio takes each layer's norms, updates
//! parameter by parameter.

mod adam;
mod flat;
mod lars;
mod sgd;
mod update;

pub(crate) use adam::Adam;
pub(crate) use flat::{is_dense, FlatLayout, Slot};
pub(crate) use lars::Lars;
pub(crate) use sgd::Sgd;
pub(crate) use update::Gate;

use crate::amp::LossScaler;
use crate::record::OptimizerKind;
use tch::Tensor;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrScaling {
    /// Use --lr as given.
    None,
    /// Multiply --lr by ranks × --grad-accum (Goyal et al. 2017), relative to one rank's batch.
    Linear,
}

/// One optimizer, whichever kind.
pub(crate) enum Optimizer {
    Sgd(Sgd),
    Adam(Adam),
    Lars(Lars),
}

impl Optimizer {
    pub(crate) fn new(kind: OptimizerKind, params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Optimizer {
        match kind {
            OptimizerKind::Sgd => Optimizer::Sgd(Sgd::new(params, lr, momentum, weight_decay)),
            OptimizerKind::Adam => Optimizer::Adam(Adam::new(params, lr, weight_decay)),
            OptimizerKind::Lars => Optimizer::Lars(Lars::new(params, lr, momentum, weight_decay)),
        }
    }

    pub(crate) fn set_lr(&mut self, lr: f64) {
        match self {
            Optimizer::Sgd(o) => o.lr = lr,
            Optimizer::Adam(o) => o.lr = lr,
            Optimizer::Lars(o) => o.lr = lr,
        }
    }

    /// Lays the parameters and the state out as the flat gradient buckets of `layout`
    /// (each parameter's data becomes a view of its bucket's parameter buffer), so that
    /// each step updates a bucket at a time: a few kernels per bucket rather than per
    /// parameter. LARS stays per parameter (its trust ratio takes each layer's norms).
    pub(crate) fn use_flat_buckets(&mut self, layout: &FlatLayout) {
        match self {
            Optimizer::Sgd(o) => o.use_flat_buckets(layout),
            Optimizer::Adam(o) => o.use_flat_buckets(layout),
            Optimizer::Lars(_) => {}
        }
    }

    /// One step, or (on the device) none where `gate` says the step is skipped. `grads`:
    /// the flat gradient buffers, bucket b's at index b, which parameters laid out by
    /// [`Optimizer::use_flat_buckets`] are updated from (any slice otherwise: the
    /// others' gradients are their own `.grad`).
    pub(crate) fn step(&mut self, gate: &Gate, grads: &[Tensor]) {
        match self {
            Optimizer::Sgd(o) => o.step(gate, grads),
            Optimizer::Adam(o) => o.step(gate, grads),
            Optimizer::Lars(o) => o.step(gate),
        }
    }

    /// Flat buckets the step updates whole (0: every parameter alone).
    pub(crate) fn flat_buckets(&self) -> usize {
        match self {
            Optimizer::Sgd(o) => o.flat_buckets(),
            Optimizer::Adam(o) => o.flat_buckets(),
            Optimizer::Lars(_) => 0,
        }
    }

    /// Element-wise updates the last step issued, each a fixed few kernels over one
    /// piece of a flat bucket or of one parameter: per bucket once laid out flat, else
    /// per parameter.
    #[cfg(test)]
    pub(crate) fn updates_last_step(&self) -> usize {
        match self {
            Optimizer::Sgd(o) => o.updates,
            Optimizer::Adam(o) => o.updates,
            Optimizer::Lars(o) => o.updates,
        }
    }

    /// The optimizer step on the all-reduced gradients held in `reduced` (the flat
    /// buckets the parameters' gradients are views of). With fp16 AMP's `scaler`, the
    /// gradients are unscaled and checked for inf/NaN on the device, the step is taken
    /// or skipped there, and the scale updated there: nothing waits for the device.
    /// Returns the check's `found_inf` (a 0-d float on the device, 1 when the step was
    /// skipped), for the step's row to read once the device is past it.
    pub(crate) fn step_unscaled(&mut self, reduced: &[Tensor], scaler: Option<&mut LossScaler>) -> Option<Tensor> {
        match scaler {
            None => {
                self.step(&Gate::always(), reduced);
                None
            }
            Some(sc) => {
                let found_inf = sc.unscale(reduced);
                self.step(&Gate::skip_if(&found_inf), reduced);
                sc.update(&found_inf);
                Some(found_inf)
            }
        }
    }
}

/// Learning rate at `step` (counting optimizer steps from 0): the target lr, scaled
/// linearly with the global batch if asked, reached linearly over `warmup_steps`.
pub(crate) fn learning_rate(base: f64, scale: f64, step: usize, warmup_steps: usize) -> f64 {
    let target = base * scale;
    if warmup_steps == 0 || step >= warmup_steps {
        target
    } else {
        target * (step + 1) as f64 / warmup_steps as f64
    }
}

#[cfg(test)]
mod flat_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn;
    use tch::Kind;

    #[test]
    fn schedule_scales_and_warms_up() {
        assert_eq!(learning_rate(0.1, 4.0, 0, 0), 0.4);
        assert!((learning_rate(0.1, 4.0, 0, 4) - 0.1).abs() < 1e-12);
        assert!((learning_rate(0.1, 4.0, 1, 4) - 0.2).abs() < 1e-12);
        assert!((learning_rate(0.1, 4.0, 3, 4) - 0.4).abs() < 1e-12);
        assert_eq!(learning_rate(0.1, 4.0, 10, 4), 0.4);
    }

    #[test]
    fn lars_step_matches_hand_computation() {
        // w = [3, 4] as a 1×2 matrix (‖w‖ = 5), g = [0.6, 0.8] (‖g‖ = 1): trust ratio 0.001·5/1.
        let w = Tensor::from_slice(&[3.0f32, 4.0]).view([1, 2]).set_requires_grad(true);
        let loss = (&w * Tensor::from_slice(&[0.6f32, 0.8]).view([1, 2])).sum(Kind::Float);
        loss.backward();
        let mut lars = Lars::new(&[w.shallow_clone()], 2.0, 0.9, 0.0);
        assert!((lars.trust_ratio(&w, &w.grad()) - 0.005).abs() < 1e-9);
        lars.step(&Gate::always());
        // w − lr · ratio · g = [3 − 2·0.005·0.6, 4 − 2·0.005·0.8] = [2.994, 3.992].
        let got = Vec::<f32>::try_from(w.detach().view([-1])).unwrap();
        assert!((got[0] - 2.994).abs() < 1e-6 && (got[1] - 3.992).abs() < 1e-6, "{got:?}");
        // Second step: velocity 0.9·0.006 + 0.006 = 0.0114 on the first element (ratio recomputed).
        let ratio2 = lars.trust_ratio(&w, &w.grad());
        lars.step(&Gate::always());
        let got2 = Vec::<f32>::try_from(w.detach().view([-1])).unwrap();
        let expected = 2.994 - (0.9 * 0.006 + 2.0 * ratio2 * 0.6);
        assert!((got2[0] as f64 - expected).abs() < 1e-6, "{got2:?} vs {expected}");
    }

    /// Parameters of several shapes (a matrix, a vector), filled from a seed.
    pub(super) fn params(seed: i64) -> Vec<Tensor> {
        let _seeded = crate::torch_seed::seed(seed);
        [vec![64, 37], vec![37]]
            .into_iter()
            .map(|shape| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)).set_requires_grad(true))
            .collect()
    }

    /// Leaf copies of `params`: equal bits whatever other tests draw from libtorch's one
    /// random generator meanwhile (tests run in parallel threads).
    pub(super) fn copies(params: &[Tensor]) -> Vec<Tensor> {
        params.iter().map(|p| p.detach().copy().set_requires_grad(true)).collect()
    }

    /// Gives each of `params` the gradient `grads[i]` (made on first use by a backward).
    pub(super) fn set_grads(params: &[Tensor], grads: &[Tensor]) {
        for (p, g) in params.iter().zip(grads) {
            if !p.grad().defined() {
                (p * 0.0).sum(Kind::Float).backward();
            }
            p.grad().copy_(g);
        }
    }

    /// Every element's bits, as u32 (fp32, and fp16 and bf16 widened exactly to fp32) or
    /// split in two u32 (fp64).
    pub(super) fn bits(ts: &[Tensor]) -> Vec<u32> {
        ts.iter()
            .flat_map(|t| match t.kind() {
                Kind::Double => Vec::<f64>::try_from(t.detach().reshape([-1]))
                    .unwrap()
                    .into_iter()
                    .flat_map(|x| [x.to_bits() as u32, (x.to_bits() >> 32) as u32])
                    .collect::<Vec<_>>(),
                _ => Vec::<f32>::try_from(t.detach().to_kind(Kind::Float).reshape([-1]))
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect(),
            })
            .collect()
    }

    /// Sets the elements an optimizer updates at once.
    pub(super) fn set_piece(opt: &mut Optimizer, elements: usize) {
        match opt {
            Optimizer::Sgd(o) => o.piece = elements,
            Optimizer::Adam(o) => o.piece = elements,
            Optimizer::Lars(o) => o.piece = elements,
        }
    }

    /// What ours runs beside libtorch's in [`same_bits_as_libtorch`].
    #[derive(Clone, Copy, Debug)]
    enum Ours {
        /// The same parameters, whole.
        Alike,
        /// The same parameters, updated in pieces of this many elements (an odd count,
        /// so pieces end anywhere in a vector register).
        InPieces(usize),
        /// The same parameters after an fp16 one: the fp32 ones must not notice it.
        AfterAnFp16Parameter,
    }

    /// Five steps of random gradients through ours and libtorch's optimizer from the
    /// same parameters (of dtype `dtype`), ours ungated and gated on a clear `found_inf`:
    /// every parameter equal bit for bit after every step (as before ours replaced
    /// libtorch's).
    fn same_bits_as_libtorch(kind: OptimizerKind, momentum: f64, config: impl nn::OptimizerConfig, dtype: Kind, ours_are: Ours) {
        let (lr, wd) = (0.0123, 0.3);
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let theirs: Vec<Tensor> = params(3)
            .iter()
            .enumerate()
            .map(|(i, p)| vs.root().var_copy(&format!("p{i}"), p))
            .collect();
        vs.set_kind(dtype);
        let theirs: Vec<Tensor> = theirs.iter().map(|t| t.shallow_clone()).collect();
        assert!(theirs.iter().all(|t| t.kind() == dtype));
        let mut their_opt = config.build(&vs, lr).unwrap();
        let half = Tensor::ones([5], (Kind::Half, tch::Device::Cpu)).set_requires_grad(true);
        let with_half = |ps: Vec<Tensor>| match ours_are {
            Ours::AfterAnFp16Parameter => std::iter::once(half.detach().copy().set_requires_grad(true)).chain(ps).collect(),
            _ => ps,
        };
        let (ours, gated) = (with_half(copies(&theirs)), with_half(copies(&theirs)));
        let mut our_opt = Optimizer::new(kind, &ours, lr, momentum, wd);
        let mut gated_opt = Optimizer::new(kind, &gated, lr, momentum, wd);
        if let Ours::InPieces(n) = ours_are {
            set_piece(&mut our_opt, n);
            set_piece(&mut gated_opt, n);
        }
        let skip = ours.len() - theirs.len();
        let clear = Tensor::from(0.0f32);
        for step in 0..5 {
            let grads: Vec<Tensor> = ours.iter().map(|p| p.randn_like()).collect();
            set_grads(&theirs, &grads[skip..]);
            for ps in [&ours, &gated] {
                set_grads(ps, &grads);
            }
            their_opt.step();
            our_opt.step(&Gate::always(), &[]);
            gated_opt.step(&Gate::skip_if(&clear), &[]);
            let why = format!("{kind:?} on {dtype:?}, {ours_are:?}, step {step}");
            assert_eq!(bits(&ours[skip..]), bits(&theirs), "{why}: ours differs from libtorch's");
            assert_eq!(bits(&gated[skip..]), bits(&theirs), "{why}: gated differs from libtorch's");
        }
    }

    #[test]
    fn sgd_and_adam_are_libtorchs_bit_for_bit() {
        let sgd = |momentum| nn::Sgd {
            momentum,
            wd: 0.3,
            ..Default::default()
        };
        let adam = nn::Adam {
            wd: 0.3,
            ..Default::default()
        };
        for ours in [Ours::Alike, Ours::InPieces(1001), Ours::AfterAnFp16Parameter] {
            for dtype in [Kind::Float, Kind::Double] {
                same_bits_as_libtorch(OptimizerKind::Sgd, 0.9, sgd(0.9), dtype, ours);
                same_bits_as_libtorch(OptimizerKind::Sgd, 0.0, sgd(0.0), dtype, ours);
                same_bits_as_libtorch(OptimizerKind::Adam, 0.0, adam, dtype, ours);
            }
        }
    }

    /// LARS has no libtorch counterpart: in pieces, or beside an fp16 parameter, it moves
    /// its fp32 parameters exactly as whole and alone.
    #[test]
    fn lars_in_pieces_and_beside_fp16_moves_fp32_parameters_as_alone_and_whole() {
        let reference = params(4);
        let mut ref_opt = Optimizer::new(OptimizerKind::Lars, &reference, 0.5, 0.9, 1e-3);
        let pieced = copies(&reference);
        let mut pieced_opt = Optimizer::new(OptimizerKind::Lars, &pieced, 0.5, 0.9, 1e-3);
        set_piece(&mut pieced_opt, 999);
        let half = Tensor::ones([3, 3], (Kind::Half, tch::Device::Cpu)).set_requires_grad(true);
        let mixed: Vec<Tensor> = std::iter::once(half).chain(copies(&reference)).collect();
        let mut mixed_opt = Optimizer::new(OptimizerKind::Lars, &mixed, 0.5, 0.9, 1e-3);
        for step in 0..4 {
            let grads: Vec<Tensor> = mixed.iter().map(|p| p.randn_like()).collect();
            set_grads(&reference, &grads[1..]);
            set_grads(&pieced, &grads[1..]);
            set_grads(&mixed, &grads);
            for o in [&mut ref_opt, &mut pieced_opt, &mut mixed_opt] {
                o.step(&Gate::always(), &[]);
            }
            assert_eq!(bits(&pieced), bits(&reference), "step {step}: in pieces");
            assert_eq!(bits(&mixed[1..]), bits(&reference), "step {step}: beside fp16");
        }
        assert!(
            mixed[0].isfinite().all().int64_value(&[]) == 1,
            "the fp16 parameter moved and stayed finite"
        );
    }

    /// A 16-bit parameter is updated in fp32 and rounded once: in fp16 Adam's eps of 1e-8
    /// is 0, and a zero gradient would make 0/0 = NaN.
    #[test]
    fn a_16_bit_parameter_with_a_zero_gradient_stays_exact_under_every_optimizer() {
        for kind in [OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::Lars] {
            for dtype in [Kind::Half, Kind::BFloat16] {
                let p = Tensor::ones([3, 4], (dtype, tch::Device::Cpu)).set_requires_grad(true);
                let mut opt = Optimizer::new(kind, &[p.shallow_clone()], 0.01, 0.9, 0.0);
                for _ in 0..3 {
                    set_grads(&[p.shallow_clone()], &[p.zeros_like()]);
                    opt.step(&Gate::always(), &[]);
                }
                assert_eq!(p.kind(), dtype);
                let got = Vec::<f32>::try_from(p.detach().to_kind(Kind::Float).reshape([-1])).unwrap();
                assert_eq!(got, [1.0; 12], "{kind:?} on {dtype:?}");
            }
        }
        // A real gradient moves it as fp32 arithmetic rounded to fp16 would.
        let p = Tensor::ones([1], (Kind::Half, tch::Device::Cpu)).set_requires_grad(true);
        let mut opt = Optimizer::new(OptimizerKind::Sgd, &[p.shallow_clone()], 0.0123, 0.0, 0.0);
        set_grads(&[p.shallow_clone()], &[Tensor::from_slice(&[0.3f32]).to_kind(Kind::Half)]);
        opt.step(&Gate::always(), &[]);
        let g = half::f16::from_f32(0.3).to_f32();
        let want = half::f16::from_f32(1.0 + g * -0.0123f32).to_f32();
        assert_eq!(p.detach().to_kind(Kind::Float).double_value(&[0]) as f32, want);
    }

    /// Every tensor an optimizer holds: parameters, then its state.
    pub(super) fn everything(opt: &Optimizer, params: &[Tensor]) -> Vec<u32> {
        let mut all = bits(params);
        match opt {
            Optimizer::Sgd(o) => all.extend(bits(o.velocity())),
            Optimizer::Lars(o) => all.extend(bits(o.velocity())),
            Optimizer::Adam(o) => {
                let s = o.state();
                all.extend(bits(s.exp_avg));
                all.extend(bits(s.exp_avg_sq));
                all.push(s.steps.double_value(&[]) as u32);
            }
        }
        all
    }

    /// Through fp16 AMP's path (scaled gradients, unscaled and checked on the device): two
    /// clean steps, one whose gradients hold inf or NaN, one clean step. The poisoned step
    /// moves no parameter and no state bit, and the run ends where one that never saw it
    /// ends (Adam's step count did not advance: its bias corrections match).
    #[test]
    fn an_overflowing_step_moves_nothing_and_is_as_if_it_never_came() {
        for (kind, poison) in [
            (OptimizerKind::Sgd, f64::INFINITY),
            (OptimizerKind::Adam, f64::NAN),
            (OptimizerKind::Lars, f64::NEG_INFINITY),
        ] {
            let skipped = params(5);
            let reference = copies(&skipped);
            let mut opt = Optimizer::new(kind, &skipped, 0.05, 0.9, 1e-3);
            let mut ref_opt = Optimizer::new(kind, &reference, 0.05, 0.9, 1e-3);
            let mut scaler = LossScaler::new(tch::Device::Cpu);
            let mut ref_scaler = LossScaler::new(tch::Device::Cpu);
            let step = |opt: &mut Optimizer, sc: &mut LossScaler, ps: &[Tensor], grads: &[Tensor]| {
                let scaled: Vec<Tensor> = grads.iter().map(|g| g * sc.scale()).collect();
                set_grads(ps, &scaled);
                let grads: Vec<Tensor> = ps.iter().map(Tensor::grad).collect();
                opt.step_unscaled(&grads, Some(sc)).unwrap().double_value(&[])
            };
            let _seeded = crate::torch_seed::seed(7);
            let clean: Vec<Vec<Tensor>> = (0..3).map(|_| skipped.iter().map(|p| p.randn_like()).collect()).collect();
            for g in &clean[..2] {
                assert_eq!(step(&mut opt, &mut scaler, &skipped, g), 0.0);
                assert_eq!(step(&mut ref_opt, &mut ref_scaler, &reference, g), 0.0);
            }
            let before = everything(&opt, &skipped);
            let poisoned = clean[2].iter().map(|g| g.copy()).collect::<Vec<_>>();
            let _ = poisoned[0].get(3).get(4).fill_(poison);
            assert_eq!(step(&mut opt, &mut scaler, &skipped, &poisoned), 1.0, "{kind:?}: found_inf");
            assert_eq!(everything(&opt, &skipped), before, "{kind:?}: the skipped step moved something");
            assert_eq!(scaler.scale().double_value(&[]), 32768.0, "{kind:?}: the scale halves");
            // The same gradients at the new scale: the same unscaled values (powers of two).
            step(&mut opt, &mut scaler, &skipped, &clean[2]);
            step(&mut ref_opt, &mut ref_scaler, &reference, &clean[2]);
            assert_eq!(everything(&opt, &skipped), everything(&ref_opt, &reference), "{kind:?}");
        }
    }
}
