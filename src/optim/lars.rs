//! LARS (You, Gitman, Ginsburg 2017): for each weight tensor, a local learning rate
//! `trust · ‖w‖ / (‖g‖ + wd · ‖w‖)` scales the update, so that layers with small
//! weights and large gradients do not diverge at large batch sizes. Biases and
//! normalisation parameters (1-D tensors) get plain SGD with momentum, as usual.
//! The trust ratios stay on the device, and a step can be skipped there ([`Gate`]).

use super::update::{pieces, widened, Gate, PerKind, PIECE_ELEMENTS};
use tch::Tensor;

pub(crate) struct Lars {
    params: Vec<Tensor>,
    velocity: Vec<Tensor>,
    pub lr: f64,
    momentum: f64,
    weight_decay: f64,
    trust: f64,
    /// Elements updated at once ([`pieces`]).
    pub(super) piece: usize,
    /// Element-wise updates the last step issued (each a fixed few kernels).
    pub(super) updates: usize,
}

/// One step's factors for the parameters of one dtype, as 0-d tensors of that dtype.
struct Factors {
    keep: Tensor,
    minus_one: Tensor,
    momentum: Tensor,
}

impl Lars {
    pub(crate) const TRUST: f64 = 0.001;

    pub(crate) fn new(params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Lars {
        Lars {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            velocity: params.iter().map(Tensor::zeros_like).collect(),
            lr,
            momentum,
            weight_decay,
            trust: Self::TRUST,
            piece: PIECE_ELEMENTS,
            updates: 0,
        }
    }

    /// The momentum buffers.
    #[cfg(test)]
    pub(crate) fn velocity(&self) -> &[Tensor] {
        &self.velocity
    }

    /// The local learning-rate multiplier of one tensor, read back (for tests and logs;
    /// the step keeps it on the device).
    #[cfg(test)]
    pub(crate) fn trust_ratio(&self, w: &Tensor, g: &Tensor) -> f64 {
        self.trust_ratio_on_device(w, g).map_or(1.0, |r| r.double_value(&[]))
    }

    /// The multiplier as a 0-d tensor on `w`'s device, so that no step waits for the
    /// device to read the norms; None for 1-d tensors (plain SGD). 1 where a norm is 0
    /// (as for the zeroed gradients of a skipped step).
    fn trust_ratio_on_device(&self, w: &Tensor, g: &Tensor) -> Option<Tensor> {
        if w.dim() <= 1 {
            return None;
        }
        let (wn, gn) = (w.norm(), g.norm());
        let ratio = (&wn * self.trust) / (&gn + &wn * self.weight_decay);
        let usable = wn.gt(0.0).logical_and(&gn.gt(0.0));
        Some(ratio.where_self(&usable, &ratio.ones_like()))
    }

    pub(crate) fn step(&mut self, gate: &Gate) {
        let mut factors = PerKind::default();
        let momentum = self.momentum;
        let mut updates = 0;
        tch::no_grad(|| {
            for i in 0..self.params.len() {
                let w = &self.params[i];
                let g = w.grad();
                if !g.defined() {
                    continue;
                }
                let make = |like: &Tensor| Factors {
                    keep: gate.update(1.0, like),
                    minus_one: gate.update(-1.0, like),
                    momentum: gate.decay(momentum, like),
                };
                // The trust ratio takes the whole tensor's norms; the update is element-wise.
                let local_lr = self.trust_ratio_on_device(w, &g).map(|local| local * self.lr);
                let (lr, weight_decay) = (self.lr, self.weight_decay);
                for piece in pieces([w, &g, &self.velocity[i]], self.piece) {
                    widened(piece, [true, false, true], |[w, g, v]| {
                        let f = factors.get(w, make);
                        let update = if weight_decay > 0.0 {
                            g + w * weight_decay
                        } else {
                            g.shallow_clone()
                        };
                        let scaled = match &local_lr {
                            Some(local_lr) => update * local_lr,
                            None => update * lr,
                        };
                        // v ← m·v + scaled; w ← w − v, each as one fused rounding (as `add_`/`sub_`).
                        let _ = v.shallow_clone().g_mul_(&f.momentum).addcmul_(&scaled, &f.keep);
                        let _ = w.shallow_clone().addcmul_(v, &f.minus_one);
                    });
                    updates += 1;
                }
            }
        });
        self.updates = updates;
    }
}
