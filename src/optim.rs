//! Optimizers: libtorch's SGD and Adam, and LARS written here (libtorch has none).

use crate::amp::LossScaler;
use anyhow::Result;
use tch::nn::{self, OptimizerConfig};
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

/// LARS (You, Gitman, Ginsburg 2017): for each weight tensor, a local learning rate
/// `trust · ‖w‖ / (‖g‖ + wd · ‖w‖)` scales the update, so that layers with small
/// weights and large gradients do not diverge at large batch sizes. Biases and
/// normalisation parameters (1-D tensors) get plain SGD with momentum, as usual.
pub struct Lars {
    params: Vec<Tensor>,
    velocity: Vec<Tensor>,
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    trust: f64,
}

impl Lars {
    pub const TRUST: f64 = 0.001;

    pub fn new(params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Lars {
        Lars {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            velocity: params.iter().map(Tensor::zeros_like).collect(),
            lr,
            momentum,
            weight_decay,
            trust: Self::TRUST,
        }
    }

    /// The local learning-rate multiplier of one tensor, read back (for tests and logs;
    /// the step keeps it on the device).
    pub fn trust_ratio(&self, w: &Tensor, g: &Tensor) -> f64 {
        self.trust_ratio_on_device(w, g).map_or(1.0, |r| r.double_value(&[]))
    }

    /// The multiplier as a 0-d tensor on `w`'s device, so that no step waits for the
    /// device to read the norms; None for 1-d tensors (plain SGD).
    fn trust_ratio_on_device(&self, w: &Tensor, g: &Tensor) -> Option<Tensor> {
        if w.dim() <= 1 {
            return None;
        }
        let (wn, gn) = (w.norm(), g.norm());
        let ratio = (&wn * self.trust) / (&gn + &wn * self.weight_decay);
        let usable = wn.gt(0.0).logical_and(&gn.gt(0.0));
        Some(ratio.where_self(&usable, &ratio.ones_like()))
    }

    pub fn step(&mut self) {
        tch::no_grad(|| {
            for i in 0..self.params.len() {
                let w = &self.params[i];
                let g = w.grad();
                if !g.defined() {
                    continue;
                }
                let update = if self.weight_decay > 0.0 {
                    &g + w * self.weight_decay
                } else {
                    g.shallow_clone()
                };
                let scaled = match self.trust_ratio_on_device(w, &g) {
                    Some(local) => update * (local * self.lr),
                    None => update * self.lr,
                };
                let v = &mut self.velocity[i];
                let _ = v.g_mul_scalar_(self.momentum).g_add_(&scaled);
                let mut w = w.shallow_clone();
                let _ = w.g_sub_(v);
            }
        })
    }
}

/// One optimizer, whichever kind.
pub enum Optimizer {
    Torch(nn::Optimizer),
    Lars(Lars),
}

impl Optimizer {
    pub fn new(kind: OptimizerKind, vs: &nn::VarStore, params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Result<Optimizer> {
        Ok(match kind {
            OptimizerKind::Sgd => Optimizer::Torch(
                nn::Sgd {
                    momentum,
                    wd: weight_decay,
                    ..Default::default()
                }
                .build(vs, lr)?,
            ),
            OptimizerKind::Adam => Optimizer::Torch(
                nn::Adam {
                    wd: weight_decay,
                    ..Default::default()
                }
                .build(vs, lr)?,
            ),
            OptimizerKind::Lars => Optimizer::Lars(Lars::new(params, lr, momentum, weight_decay)),
        })
    }
    pub fn set_lr(&mut self, lr: f64) {
        match self {
            Optimizer::Torch(o) => o.set_lr(lr),
            Optimizer::Lars(l) => l.lr = lr,
        }
    }
    pub fn step(&mut self) {
        match self {
            Optimizer::Torch(o) => o.step(),
            Optimizer::Lars(l) => l.step(),
        }
    }

    /// The optimizer step on the all-reduced gradients held in `reduced` (the flat
    /// buckets the parameters' gradients are views of). With fp16 AMP's `scaler`, the
    /// gradients are first checked for inf/NaN (one device read for all buckets): then
    /// the step is skipped and the scale lowered; otherwise they are unscaled and the
    /// step taken. Returns whether the optimizer stepped.
    pub fn step_unscaled(&mut self, reduced: &[Tensor], scaler: Option<&mut LossScaler>) -> bool {
        let stepped = match scaler {
            None => true,
            Some(sc) => {
                let found_inf = tch::no_grad(|| {
                    let finite = reduced.iter().map(|b| b.isfinite().all()).reduce(|a, b| a.logical_and(&b));
                    finite.is_some_and(|f| f.int64_value(&[]) == 0)
                });
                if !found_inf {
                    tch::no_grad(|| {
                        for b in reduced {
                            let _ = b.shallow_clone().g_mul_scalar_(1.0 / sc.scale);
                        }
                    });
                }
                sc.update(found_inf)
            }
        };
        if stepped {
            self.step();
        }
        stepped
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
        lars.step();
        // w − lr · ratio · g = [3 − 2·0.005·0.6, 4 − 2·0.005·0.8] = [2.994, 3.992].
        let got = Vec::<f32>::try_from(w.detach().view([-1])).unwrap();
        assert!((got[0] - 2.994).abs() < 1e-6 && (got[1] - 3.992).abs() < 1e-6, "{got:?}");
        // Second step: velocity 0.9·0.006 + 0.006 = 0.0114 on the first element (ratio recomputed).
        let ratio2 = lars.trust_ratio(&w, &w.grad());
        lars.step();
        let got2 = Vec::<f32>::try_from(w.detach().view([-1])).unwrap();
        let expected = 2.994 - (0.9 * 0.006 + 2.0 * ratio2 * 0.6);
        assert!((got2[0] as f64 - expected).abs() < 1e-6, "{got2:?} vs {expected}");
    }
}
