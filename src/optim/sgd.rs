//! SGD with momentum and weight decay, written here rather than taken from libtorch so
//! that a step can be skipped on the device ([`Gate`]). Its arithmetic is libtorch's
//! `torch::optim::SGD` (no dampening, no Nesterov) operation for operation, so the
//! results are the same bits (checked against it in the tests).

use super::flat::{Flat, FlatLayout};
use super::update::{pieces, widened, Gate, PerKind, PIECE_ELEMENTS};
use tch::Tensor;

pub(crate) struct Sgd {
    params: Vec<Tensor>,
    /// Momentum buffers (none with momentum 0). They start at zero rather than at the
    /// first gradient as libtorch's do: `0 · m + d` is `d` bit for bit, and buffers that
    /// exist from the start need no host-side "first step" flag, which a step skipped
    /// on the device could not clear.
    velocity: Vec<Tensor>,
    /// Which parameters are updated over flat buckets, and the momentum buffers laid
    /// out alike (one per flat bucket; the per-parameter `velocity` are views of them).
    flat: Flat,
    flat_velocity: Vec<Tensor>,
    pub lr: f64,
    momentum: f64,
    weight_decay: f64,
    /// Elements updated at once ([`pieces`]).
    pub(super) piece: usize,
    /// Element-wise updates the last step issued (each a fixed few kernels).
    pub(super) updates: usize,
}

/// One step's factors for the parameters of one dtype, as 0-d tensors of that dtype.
struct Factors {
    wd: Option<Tensor>,
    keep: Tensor,
    neg_lr: Tensor,
    momentum: Tensor,
}

impl Sgd {
    pub(crate) fn new(params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Sgd {
        Sgd {
            params: params.iter().map(Tensor::shallow_clone).collect(),
            velocity: if momentum != 0.0 {
                params.iter().map(Tensor::zeros_like).collect()
            } else {
                Vec::new()
            },
            flat: Flat::none(params.len()),
            flat_velocity: Vec::new(),
            lr,
            momentum,
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
        self.flat_velocity = if self.velocity.is_empty() {
            Vec::new()
        } else {
            self.flat.lay_out(&mut self.velocity)
        };
    }

    /// The momentum buffers (empty with momentum 0).
    #[cfg(test)]
    pub(crate) fn velocity(&self) -> &[Tensor] {
        &self.velocity
    }

    /// One step from the gradients: the flat buckets' in `grads` (bucket b's buffer at
    /// index b), the other parameters' their own.
    pub(crate) fn step(&mut self, gate: &Gate, grads: &[Tensor]) {
        let mut factors = PerKind::default();
        let (lr, momentum, weight_decay) = (self.lr, self.momentum, self.weight_decay);
        let mut updates = 0;
        tch::no_grad(|| {
            let state: &[&[Tensor]] = if self.velocity.is_empty() { &[] } else { &[&self.velocity] };
            let flat_state: &[&[Tensor]] = if self.velocity.is_empty() { &[] } else { &[&self.flat_velocity] };
            for t in self.flat.targets(&self.params, grads, flat_state, state) {
                let make = |like: &Tensor| Factors {
                    wd: (weight_decay != 0.0).then(|| Tensor::full([], weight_decay, (like.kind(), like.device()))),
                    keep: gate.update(1.0, like),
                    neg_lr: gate.update(-lr, like),
                    momentum: gate.decay(momentum, like),
                };
                match t.state.first() {
                    Some(v) => {
                        for piece in pieces([&t.w, &t.g, v], self.piece) {
                            widened(piece, [true, false, true], |[w, g, v]| update(w, g, Some(v), factors.get(w, make)));
                            updates += 1;
                        }
                    }
                    None => {
                        for piece in pieces([&t.w, &t.g], self.piece) {
                            widened(piece, [true, false], |[w, g]| update(w, g, None, factors.get(w, make)));
                            updates += 1;
                        }
                    }
                }
            }
        });
        self.updates = updates;
    }
}

/// libtorch's update of `w` (or a piece of it): d = g.add(w, wd); buf.mul_(m).add_(d);
/// w.add_(buf, −lr).
fn update(w: &Tensor, g: &Tensor, velocity: Option<&Tensor>, f: &Factors) {
    let d = match &f.wd {
        Some(wd) => g.addcmul(w, wd),
        None => g.shallow_clone(),
    };
    let d = match velocity {
        Some(v) => {
            let mut v = v.shallow_clone();
            let _ = v.g_mul_(&f.momentum).addcmul_(&d, &f.keep);
            v
        }
        None => d,
    };
    let _ = w.shallow_clone().addcmul_(&d, &f.neg_lr);
}
