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
pub struct Gate {
    /// `found_inf > 0` (0-d bool) and `1 − found_inf` (0-d float), or None: always.
    skip: Option<(Tensor, Tensor)>,
}

impl Gate {
    pub fn always() -> Gate {
        Gate { skip: None }
    }

    /// Skips the step where `found_inf` (a 0-d float on the device) is above 0.
    pub fn skip_if(found_inf: &Tensor) -> Gate {
        let skip = found_inf.gt(0.0);
        let keep = 1.0 - found_inf;
        Gate { skip: Some((skip, keep)) }
    }

    /// The multiplier `s` of an update, 0 on a skipped step: a 0-d tensor of `like`'s
    /// dtype on its device. Used as `addcmul`'s second factor, so that `a + b · s`
    /// rounds as libtorch's `a.add(b, alpha=s)` does (once: `addcmul` and `add` with
    /// alpha share the fused rounding).
    pub fn update(&self, s: f64, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::full([], s, (like.kind(), like.device())),
            Some((_, keep)) => (keep * s).to_kind(like.kind()),
        }
    }

    /// A decay factor `beta`, 1 on a skipped step, as a 0-d tensor like `like`.
    pub fn decay(&self, beta: f64, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::full([], beta, (like.kind(), like.device())),
            Some((skip, _)) => Tensor::where_scalar(skip, 1.0, beta).to_kind(like.kind()),
        }
    }

    /// 1, or 0 on a skipped step, in double precision (a step counter's increment).
    pub fn count(&self, like: &Tensor) -> Tensor {
        match &self.skip {
            None => Tensor::ones([], (Kind::Double, like.device())),
            Some((_, keep)) => keep.to_kind(Kind::Double),
        }
    }
}
