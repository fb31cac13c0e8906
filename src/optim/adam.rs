//! Adam with L2 weight decay, written here rather than taken from libtorch so that a
//! step can be skipped on the device ([`Gate`]). Its arithmetic is libtorch's
//! `torch::optim::Adam` (no amsgrad) operation for operation, so the results are the
//! same bits (checked against it in the tests). The step count is a device tensor, as
//! PyTorch's fused Adam keeps it, so a skipped step leaves the bias corrections as
//! they were without the host reading anything.

use super::flat::{Flat, FlatLayout};
use super::update::{pieces, widened, Gate, PerKind, PIECE_ELEMENTS};
use tch::{Device, Kind, Tensor};

pub(crate) struct Adam {
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Which parameters are updated over flat buckets, and the moments laid out alike
    /// (one buffer per flat bucket; the per-parameter moments are views of them).
    flat: Flat,
    flat_exp_avg: Vec<Tensor>,
    flat_exp_avg_sq: Vec<Tensor>,
    /// Steps taken, a 0-d double on the device.
    steps: Tensor,
    pub lr: f64,
    weight_decay: f64,
    /// Elements updated at once ([`pieces`]).
    pub(super) piece: usize,
    /// Element-wise updates the last step issued (each a fixed few kernels).
    pub(super) updates: usize,
}

/// Adam's state: the first and second moments and the steps taken.
#[cfg(test)]
pub(crate) struct AdamState<'a> {
    pub exp_avg: &'a [Tensor],
    pub exp_avg_sq: &'a [Tensor],
    pub steps: &'a Tensor,
}

/// One step's factors for the parameters of one dtype, as 0-d tensors of that dtype.
struct Factors {
    wd: Option<Tensor>,
    beta1: Tensor,
    beta2: Tensor,
    c1: Tensor,
    c2: Tensor,
}

/// One step's bias corrections, in double on the device, for every dtype.
struct Corrections {
    bc2_sqrt: Tensor,
    neg_step_size: Tensor,
}

impl Adam {
    pub(crate) const BETA1: f64 = 0.9;
    pub(crate) const BETA2: f64 = 0.999;
    pub(crate) const EPS: f64 = 1e-8;

    pub(crate) fn new(params: &[Tensor], lr: f64, weight_decay: f64) -> Adam {
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        Adam {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            exp_avg: params.iter().map(Tensor::zeros_like).collect(),
            exp_avg_sq: params.iter().map(Tensor::zeros_like).collect(),
            flat: Flat::none(params.len()),
            flat_exp_avg: Vec::new(),
            flat_exp_avg_sq: Vec::new(),
            steps: Tensor::zeros([], (Kind::Double, device)),
            lr,
            weight_decay,
            piece: PIECE_ELEMENTS,
            updates: 0,
        }
    }

    /// Flat buckets updated whole.
    pub(crate) fn flat_buckets(&self) -> usize {
        self.flat.count()
    }

    /// Updates bucket by bucket from now on ([`Flat::adopt`]).
    pub(crate) fn use_flat_buckets(&mut self, layout: &FlatLayout) {
        self.flat = Flat::adopt(&self.params, layout);
        self.flat_exp_avg = self.flat.lay_out(&mut self.exp_avg);
        self.flat_exp_avg_sq = self.flat.lay_out(&mut self.exp_avg_sq);
    }

    #[cfg(test)]
    pub(crate) fn state(&self) -> AdamState<'_> {
        AdamState {
            exp_avg: &self.exp_avg,
            exp_avg_sq: &self.exp_avg_sq,
            steps: &self.steps,
        }
    }

    /// One step from the gradients: the flat buckets' in `grads` (bucket b's buffer at
    /// index b), the other parameters' their own.
    pub(crate) fn step(&mut self, gate: &Gate, grads: &[Tensor]) {
        let Some(like) = self.params.first() else { return };
        let count = gate.count(like);
        let mut factors = PerKind::default();
        let weight_decay = self.weight_decay;
        let mut updates = 0;
        tch::no_grad(|| {
            // libtorch, in double: bc = 1 − β^step, step_size = lr / bc1, sqrt(bc2). A
            // skipped step is timed as the next one (finite even before the first step)
            // and its size multiplied by 0.
            let next = &self.steps + 1.0;
            let bias_correction = |beta: f64| -> Tensor { 1.0 - next.full_like(beta).pow(&next) };
            let bc1 = bias_correction(Self::BETA1);
            let corrections = Corrections {
                bc2_sqrt: bias_correction(Self::BETA2).sqrt(),
                neg_step_size: -(bc1.full_like(self.lr) / &bc1) * &count,
            };
            let flat_state: [&[Tensor]; 2] = [&self.flat_exp_avg, &self.flat_exp_avg_sq];
            let state: [&[Tensor]; 2] = [&self.exp_avg, &self.exp_avg_sq];
            for t in self.flat.targets(&self.params, grads, &flat_state, &state) {
                let make = |like: &Tensor| Factors {
                    wd: (weight_decay != 0.0).then(|| Tensor::full([], weight_decay, (like.kind(), like.device()))),
                    beta1: gate.decay(Self::BETA1, like),
                    beta2: gate.decay(Self::BETA2, like),
                    c1: gate.update(1.0 - Self::BETA1, like),
                    c2: gate.update(1.0 - Self::BETA2, like),
                };
                for piece in pieces([&t.w, &t.g, &t.state[0], &t.state[1]], self.piece) {
                    widened(piece, [true, false, true, true], |[w, g, m, v]| {
                        update(w, g, m, v, factors.get(w, make), &corrections)
                    });
                    updates += 1;
                }
            }
            let _ = self.steps.g_add_(&count);
        });
        self.updates = updates;
    }
}

/// libtorch's Adam update of `w` (or a piece of it) with moments `m` and `v`.
fn update(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, f: &Factors, c: &Corrections) {
    let g = match &f.wd {
        Some(wd) => g.addcmul(w, wd),
        None => g.shallow_clone(),
    };
    let (mut m, mut v) = (m.shallow_clone(), v.shallow_clone());
    // exp_avg.mul_(β1).add_(g, 1 − β1); exp_avg_sq.mul_(β2).addcmul_(g, g, 1 − β2),
    // whose kernel rounds (1 − β2)·g before multiplying by g, as here.
    let _ = m.g_mul_(&f.beta1).addcmul_(&g, &f.c1);
    let _ = v.g_mul_(&f.beta2).addcmul_(&(&g * &f.c2), &g);
    // w.addcdiv_(exp_avg, sqrt(exp_avg_sq) / sqrt(bc2) + eps, −step_size).
    let mut denom = v.sqrt() / &c.bc2_sqrt;
    denom += Adam::EPS;
    let _ = w.shallow_clone().addcdiv_(&(&m * &c.neg_step_size), &denom);
}
