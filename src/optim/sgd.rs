//! SGD with momentum and weight decay, written here rather than taken from libtorch so
//! that a step can be skipped on the device ([`Gate`]). Its arithmetic is libtorch's
//! `torch::optim::SGD` (no dampening, no Nesterov) operation for operation, so the
//! results are the same bits (checked against it in the tests).

use super::update::Gate;
use tch::Tensor;

pub struct Sgd {
    params: Vec<Tensor>,
    /// Momentum buffers (none with momentum 0). They start at zero rather than at the
    /// first gradient as libtorch's do: `0 · m + d` is `d` bit for bit, and buffers that
    /// exist from the start need no host-side "first step" flag, which a step skipped
    /// on the device could not clear.
    velocity: Vec<Tensor>,
    pub lr: f64,
    momentum: f64,
    weight_decay: f64,
}

impl Sgd {
    pub fn new(params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Sgd {
        Sgd {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            velocity: if momentum != 0.0 {
                params.iter().map(Tensor::zeros_like).collect()
            } else {
                Vec::new()
            },
            lr,
            momentum,
            weight_decay,
        }
    }

    /// The momentum buffers (empty with momentum 0).
    pub fn velocity(&self) -> &[Tensor] {
        &self.velocity
    }

    pub fn step(&mut self, gate: &Gate) {
        let Some(like) = self.params.first() else { return };
        let wd = (self.weight_decay != 0.0).then(|| Tensor::full([], self.weight_decay, (like.kind(), like.device())));
        let keep = gate.update(1.0, like);
        let neg_lr = gate.update(-self.lr, like);
        let momentum = gate.decay(self.momentum, like);
        tch::no_grad(|| {
            for (i, w) in self.params.iter().enumerate() {
                let g = w.grad();
                if !g.defined() {
                    continue;
                }
                // libtorch: d = g.add(w, wd); buf.mul_(m).add_(d); w.add_(buf, −lr).
                let d = match &wd {
                    Some(wd) => g.addcmul(w, wd),
                    None => g,
                };
                let d = match self.velocity.get(i) {
                    Some(v) => {
                        let mut v = v.shallow_clone();
                        let _ = v.g_mul_(&momentum).addcmul_(&d, &keep);
                        v
                    }
                    None => d,
                };
                let _ = w.shallow_clone().addcmul_(&d, &neg_lr);
            }
        })
    }
}
