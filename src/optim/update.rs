//! Whether a step moves anything, decided on the device. With fp16 AMP the gradients'
//! inf/NaN check stays on the device (as in PyTorch's fused optimizers), so no step
//! waits for the host to read it: every update runs, multiplied by `keep` (1, or 0 on
//! a skipped step), and every decay factor becomes 1 on a skipped step. The gradients
//! of a skipped step are zeroed first ([`crate::amp::LossScaler::unscale`]), so each
//! update is finite and `keep · update` is an exact 0: parameters and optimizer state
//! keep their bits.
//!
//! Every factor is a 0-d tensor made on the device from the host's number (a fill, not
//! a copy: a host-to-device copy of a number would wait for the device), once per step.

use tch::{Kind, Tensor};

/// Whether the step is taken: always, or as a 0-d flag on the device says.
pub(crate) struct Gate {
    /// `found_inf > 0` (0-d bool) and `1 − found_inf` (0-d float), or None: always.
    skip: Option<(Tensor, Tensor)>,
}

impl Gate {
    pub(crate) fn always() -> Gate {
        Gate { skip: None }
    }

    /// Skips the step where `found_inf` (a 0-d float on the device) is above 0.
    pub(crate) fn skip_if(found_inf: &Tensor) -> Gate {
        let skip = found_inf.gt(0.0);
        let keep = 1.0 - found_inf;
        Gate { skip: Some((skip, keep)) }
    }

    /// The multiplier `s` of an update, 0 on a skipped step: a 0-d tensor of `like`'s
    /// dtype on its device. Used as `addcmul`'s second factor, so that `a + b · s`
    /// rounds as libtorch's `a.add(b, alpha=s)` does (once: `addcmul` and `add` with
    /// alpha share the fused rounding).
    pub(crate) fn update(&self, s: f64, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::full([], s, (like.kind(), like.device())),
            // In `like`'s dtype before `s` joins: an fp64 parameter's factor is not
            // rounded through fp32.
            Some((_, keep)) => keep.to_kind(like.kind()) * s,
        }
    }

    /// A decay factor `beta`, 1 on a skipped step, as a 0-d tensor like `like`.
    pub(crate) fn decay(&self, beta: f64, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::full([], beta, (like.kind(), like.device())),
            Some((skip, _)) => Tensor::full([], beta, (like.kind(), like.device())).masked_fill(skip, 1.0),
        }
    }

    /// 1, or 0 on a skipped step, in double precision (a step counter's increment).
    pub(crate) fn count(&self, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::ones([], (Kind::Double, like.device())),
            Some((_, keep)) => keep.to_kind(Kind::Double),
        }
    }
}

/// A step's factors for the parameters of each dtype, made on first use: a factor made
/// in one parameter's dtype would round another's (an fp16 learning rate applied to an
/// fp32 parameter).
pub(super) struct PerKind<T> {
    made: Vec<(Kind, T)>,
}

impl<T> Default for PerKind<T> {
    fn default() -> Self {
        PerKind { made: Vec::new() }
    }
}

impl<T> PerKind<T> {
    /// The factors for parameters of `like`'s dtype (made from `like` the first time).
    pub(super) fn get(&mut self, like: &Tensor, make: impl FnOnce(&Tensor) -> T) -> &T {
        let kind = like.kind();
        let at = match self.made.iter().position(|(k, _)| *k == kind) {
            Some(at) => at,
            None => {
                self.made.push((kind, make(like)));
                self.made.len() - 1
            }
        };
        &self.made[at].1
    }
}

/// Elements of one parameter updated at once: a larger parameter is updated piece by
/// piece, so the update's temporaries hold a piece (64 MiB of fp32) rather than copies
/// of the whole parameter.
pub(super) const PIECE_ELEMENTS: usize = 1 << 24;

/// A parameter and its state (`ts`: alike in shape and layout) as the pieces an
/// element-wise update runs over one after another: flat runs of at most `piece`
/// elements when every tensor is contiguous and larger than one piece, else the tensors
/// whole. Each piece is a view: updating it updates the tensor.
pub(super) fn pieces<const N: usize>(ts: [&Tensor; N], piece: usize) -> Vec<[Tensor; N]> {
    let numel = ts[0].numel();
    if numel <= piece || !ts.iter().all(|t| t.is_contiguous() && t.numel() == numel) {
        return vec![ts.map(Tensor::shallow_clone)];
    }
    let flat = ts.map(|t| t.view([-1]));
    (0..numel)
        .step_by(piece.max(1))
        .map(|start| {
            let len = piece.min(numel - start) as i64;
            std::array::from_fn(|i| flat[i].narrow(0, start as i64, len))
        })
        .collect()
}

/// Runs an element-wise `update` on `piece` (a parameter's piece and its state's) in the
/// dtype it computes in: float16 and bfloat16 widened to float32, then written back
/// (rounded once) where `written` says, as PyTorch's fused optimizers compute 16-bit
/// parameters in float32. In float16 Adam's eps of 1e-8 is 0, so a zero gradient would
/// make 0/0; and a learning rate would be rounded to 3 digits. Other dtypes run as they are.
pub(super) fn widened<const N: usize>(piece: [Tensor; N], written: [bool; N], update: impl FnOnce(&[Tensor; N])) {
    if !matches!(piece[0].kind(), Kind::Half | Kind::BFloat16) {
        update(&piece);
        return;
    }
    let wide = piece.each_ref().map(|t| t.to_kind(Kind::Float));
    update(&wide);
    for ((t, w), write) in piece.iter().zip(&wide).zip(written) {
        if write {
            t.shallow_clone().copy_(w);
        }
    }
}
