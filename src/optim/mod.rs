//! Optimizers: SGD, Adam and LARS, written here so that fp16 AMP can skip a step on
//! the device ([`update::Gate`]); SGD and Adam are libtorch's arithmetic, bit for bit.

mod adam;
mod lars;
mod sgd;
mod update;

pub use adam::{Adam, AdamState};
pub use lars::Lars;
pub use sgd::Sgd;
pub use update::Gate;

use crate::amp::LossScaler;
use tch::Tensor;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// SGD with --momentum and --weight-decay.
    Sgd,
    Adam,
    /// LARS (You et al. 2017): SGD with momentum and a per-layer trust ratio, for large batches.
    Lars,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrScaling {
    /// Use --lr as given.
    None,
    /// Multiply --lr by ranks × --grad-accum (Goyal et al. 2017), relative to one rank's batch.
    Linear,
}

/// One optimizer, whichever kind.
pub enum Optimizer {
    Sgd(Sgd),
    Adam(Adam),
    Lars(Lars),
}

impl Optimizer {
    pub fn new(kind: OptimizerKind, params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Optimizer {
        match kind {
            OptimizerKind::Sgd => Optimizer::Sgd(Sgd::new(params, lr, momentum, weight_decay)),
            OptimizerKind::Adam => Optimizer::Adam(Adam::new(params, lr, weight_decay)),
            OptimizerKind::Lars => Optimizer::Lars(Lars::new(params, lr, momentum, weight_decay)),
        }
    }

    pub fn set_lr(&mut self, lr: f64) {
        match self {
            Optimizer::Sgd(o) => o.lr = lr,
            Optimizer::Adam(o) => o.lr = lr,
            Optimizer::Lars(o) => o.lr = lr,
        }
    }

    /// One step, or (on the device) none where `gate` says the step is skipped.
    pub fn step(&mut self, gate: &Gate) {
        match self {
            Optimizer::Sgd(o) => o.step(gate),
            Optimizer::Adam(o) => o.step(gate),
            Optimizer::Lars(o) => o.step(gate),
        }
    }

    /// The optimizer step on the all-reduced gradients held in `reduced` (the flat
    /// buckets the parameters' gradients are views of). With fp16 AMP's `scaler`, the
    /// gradients are unscaled and checked for inf/NaN on the device, the step is taken
    /// or skipped there, and the scale updated there: nothing waits for the device.
    /// Returns the check's `found_inf` (a 0-d float on the device, 1 when the step was
    /// skipped), for the step's row to read once the device is past it.
    pub fn step_unscaled(&mut self, reduced: &[Tensor], scaler: Option<&mut LossScaler>) -> Option<Tensor> {
        match scaler {
            None => {
                self.step(&Gate::always());
                None
            }
            Some(sc) => {
                let found_inf = sc.unscale(reduced);
                self.step(&Gate::skip_if(&found_inf));
                sc.update(&found_inf);
                Some(found_inf)
            }
        }
    }
}

/// Learning rate at `step` (counting optimizer steps from 0): the target lr, scaled
/// linearly with the global batch if asked, reached linearly over `warmup_steps`.
pub fn learning_rate(base: f64, scale: f64, step: usize, warmup_steps: usize) -> f64 {
    let target = base * scale;
    if warmup_steps == 0 || step >= warmup_steps {
        target
    } else {
        target * (step + 1) as f64 / warmup_steps as f64
    }
}

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
    fn params(seed: i64) -> Vec<Tensor> {
        tch::manual_seed(seed);
        [vec![64, 37], vec![37]]
            .into_iter()
            .map(|shape| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)).set_requires_grad(true))
            .collect()
    }

    /// Leaf copies of `params`: equal bits whatever other tests draw from libtorch's one
    /// random generator meanwhile (tests run in parallel threads).
    fn copies(params: &[Tensor]) -> Vec<Tensor> {
        params.iter().map(|p| p.detach().copy().set_requires_grad(true)).collect()
    }

    /// Gives each of `params` the gradient `grads[i]` (made on first use by a backward).
    fn set_grads(params: &[Tensor], grads: &[Tensor]) {
        for (p, g) in params.iter().zip(grads) {
            if !p.grad().defined() {
                (p * 0.0).sum(Kind::Float).backward();
            }
            p.grad().copy_(g);
        }
    }

    fn bits(ts: &[Tensor]) -> Vec<u32> {
        ts.iter()
            .flat_map(|t| Vec::<f32>::try_from(t.detach().reshape([-1])).unwrap())
            .map(f32::to_bits)
            .collect()
    }

    /// Five steps of random gradients through ours and libtorch's optimizer from the
    /// same parameters, ours ungated and gated on a clear `found_inf`: every parameter
    /// equal bit for bit after every step (as before ours replaced libtorch's).
    fn same_bits_as_libtorch(kind: OptimizerKind, momentum: f64, config: impl nn::OptimizerConfig) {
        let (lr, wd) = (0.0123, 0.3);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let theirs: Vec<Tensor> = params(3)
            .iter()
            .enumerate()
            .map(|(i, p)| vs.root().var_copy(&format!("p{i}"), p))
            .collect();
        let mut their_opt = config.build(&vs, lr).unwrap();
        let ours = copies(&theirs);
        let gated = copies(&theirs);
        let mut our_opt = Optimizer::new(kind, &ours, lr, momentum, wd);
        let mut gated_opt = Optimizer::new(kind, &gated, lr, momentum, wd);
        let clear = Tensor::from(0.0f32);
        for step in 0..5 {
            let grads: Vec<Tensor> = ours.iter().map(|p| p.randn_like()).collect();
            for ps in [&theirs, &ours, &gated] {
                set_grads(ps, &grads);
            }
            their_opt.step();
            our_opt.step(&Gate::always());
            gated_opt.step(&Gate::skip_if(&clear));
            assert_eq!(bits(&ours), bits(&theirs), "{kind:?} step {step}: ours differs from libtorch's");
            assert_eq!(bits(&gated), bits(&theirs), "{kind:?} step {step}: gated differs from libtorch's");
        }
    }

    #[test]
    fn sgd_and_adam_are_libtorchs_bit_for_bit() {
        let sgd = |momentum| nn::Sgd {
            momentum,
            wd: 0.3,
            ..Default::default()
        };
        same_bits_as_libtorch(OptimizerKind::Sgd, 0.9, sgd(0.9));
        same_bits_as_libtorch(OptimizerKind::Sgd, 0.0, sgd(0.0));
        let adam = nn::Adam {
            wd: 0.3,
            ..Default::default()
        };
        same_bits_as_libtorch(OptimizerKind::Adam, 0.0, adam);
    }

    /// Every tensor an optimizer holds: parameters, then its state.
    fn everything(opt: &Optimizer, params: &[Tensor]) -> Vec<u32> {
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
            tch::manual_seed(7);
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
