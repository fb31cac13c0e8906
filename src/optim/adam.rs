//! Adam with L2 weight decay, written here rather than taken from libtorch so that a
//! step can be skipped on the device ([`Gate`]). Its arithmetic is libtorch's
//! `torch::optim::Adam` (no amsgrad) operation for operation, so the results are the
//! same bits (checked against it in the tests). The step count is a device tensor, as
//! PyTorch's fused Adam keeps it, so a skipped step leaves the bias corrections as
//! they were without the host reading anything.

use super::update::Gate;
use tch::{Device, Kind, Tensor};

pub struct Adam {
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Steps taken, a 0-d double on the device.
    steps: Tensor,
    pub lr: f64,
    weight_decay: f64,
}

/// Adam's state: the first and second moments and the steps taken.
pub struct AdamState<'a> {
    pub exp_avg: &'a [Tensor],
    pub exp_avg_sq: &'a [Tensor],
    pub steps: &'a Tensor,
}

impl Adam {
    pub const BETA1: f64 = 0.9;
    pub const BETA2: f64 = 0.999;
    pub const EPS: f64 = 1e-8;

    pub fn new(params: &[Tensor], lr: f64, weight_decay: f64) -> Adam {
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        Adam {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            exp_avg: params.iter().map(Tensor::zeros_like).collect(),
            exp_avg_sq: params.iter().map(Tensor::zeros_like).collect(),
            steps: Tensor::zeros([], (Kind::Double, device)),
            lr,
            weight_decay,
        }
    }

    pub fn state(&self) -> AdamState<'_> {
        AdamState {
            exp_avg: &self.exp_avg,
            exp_avg_sq: &self.exp_avg_sq,
            steps: &self.steps,
        }
    }

    pub fn step(&mut self, gate: &Gate) {
        let Some(like) = self.params.first() else { return };
        let wd = (self.weight_decay != 0.0).then(|| Tensor::full([], self.weight_decay, (like.kind(), like.device())));
        let count = gate.count(like);
        let (beta1, beta2) = (gate.decay(Self::BETA1, like), gate.decay(Self::BETA2, like));
        let (c1, c2) = (gate.update(1.0 - Self::BETA1, like), gate.update(1.0 - Self::BETA2, like));
        tch::no_grad(|| {
            // libtorch, in double: bc = 1 − β^step, step_size = lr / bc1, sqrt(bc2). A
            // skipped step is timed as the next one (finite even before the first step)
            // and its size multiplied by 0.
            let next = &self.steps + 1.0;
            let bias_correction = |beta: f64| -> Tensor { 1.0 - next.full_like(beta).pow(&next) };
            let bc1 = bias_correction(Self::BETA1);
            let bc2_sqrt = bias_correction(Self::BETA2).sqrt();
            let neg_step_size = -(bc1.full_like(self.lr) / &bc1) * &count;
            for i in 0..self.params.len() {
                let w = &self.params[i];
                let g = w.grad();
                if !g.defined() {
                    continue;
                }
                let g = match &wd {
                    Some(wd) => g.addcmul(w, wd),
                    None => g,
                };
                let (mut m, mut v) = (self.exp_avg[i].shallow_clone(), self.exp_avg_sq[i].shallow_clone());
                // exp_avg.mul_(β1).add_(g, 1 − β1); exp_avg_sq.mul_(β2).addcmul_(g, g, 1 − β2),
                // whose kernel rounds (1 − β2)·g before multiplying by g, as here.
                let _ = m.g_mul_(&beta1).addcmul_(&g, &c1);
                let _ = v.g_mul_(&beta2).addcmul_(&(&g * &c2), &g);
                // w.addcdiv_(exp_avg, sqrt(exp_avg_sq) / sqrt(bc2) + eps, −step_size).
                let mut denom = v.sqrt() / &bc2_sqrt;
                denom += Self::EPS;
                let _ = w.shallow_clone().addcdiv_(&(&m * &neg_step_size), &denom);
            }
            let _ = self.steps.g_add_(&count);
        })
    }
}
