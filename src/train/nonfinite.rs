//! Why a step's loss was not finite, said from what the run shows rather than
//! guessed: a loss that is already inf/NaN at the first step, before any update, comes
//! from the model itself (its forward on its initial parameters), never from `--lr`; a
//! 16-bit parameter that holds inf while the wider ones are finite overflowed its
//! dtype; a loss that was finite for some steps and then was not, with every kind of
//! parameter gone non-finite alike, is the divergence a too-high learning rate makes.
//! The parameters are read only once the loss has failed, so a step pays nothing.

use super::state::StepAt;
use crate::record::AmpMode;
use anyhow::{bail, Result};
use tch::{Kind, Tensor};

/// The losses seen so far, for the explanation of the first that is not finite.
#[derive(Debug, Default)]
pub(super) struct LossWatch {
    /// Steps whose loss was finite, and the first and last of those losses.
    finite_steps: usize,
    first: Option<f64>,
    last: Option<f64>,
}

/// A parameter holding inf or NaN when the loss failed.
#[derive(Debug, Clone, PartialEq)]
struct Broken {
    name: String,
    kind: Kind,
    /// True when it holds NaN, false when only ±inf.
    nan: bool,
}

impl LossWatch {
    /// Ok for a finite `loss`; else the error that stops the run, saying what the
    /// evidence shows: `params` (named, as trained) are read for inf/NaN, and `amp` says
    /// whether the forward ran under autocast.
    pub(super) fn check(&mut self, at: StepAt, loss: f64, params: &[(String, Tensor)], amp: AmpMode) -> Result<()> {
        if loss.is_finite() {
            self.finite_steps += 1;
            self.first.get_or_insert(loss);
            self.last = Some(loss);
            return Ok(());
        }
        let broken = broken_parameters(params);
        bail!(
            "loss became {loss} at epoch {} step {}: {}",
            at.epoch,
            at.step,
            self.explain(at.global_step, &broken, params.len(), amp)
        )
    }

    /// The cause the evidence points to, and what to do.
    fn explain(&self, global_step: usize, broken: &[Broken], params: usize, amp: AmpMode) -> String {
        let autocast = match amp {
            AmpMode::Off => "",
            AmpMode::Fp16 => " (under --amp fp16 autocast, where a value past 65504 overflows)",
            AmpMode::Bf16 => " (under --amp bf16 autocast)",
        };
        if global_step == 0 || self.finite_steps == 0 {
            return format!(
                "it was not finite at the first step, before any update, so the model's own forward{autocast} gives it on \
                 its initial parameters and --lr is not the cause: look for a value that overflows its dtype or is \
                 undefined (log of 0, 0/0) in the module, or parameters saved non-finite"
            );
        }
        let narrow = |b: &Broken| matches!(b.kind, Kind::Half | Kind::BFloat16);
        if !broken.is_empty() && broken.iter().all(|b| narrow(b) && !b.nan) {
            let names: Vec<String> = broken
                .iter()
                .take(5)
                .map(|b| format!("`{}` ({})", b.name, crate::model::dtype_name(b.kind)))
                .collect();
            return format!(
                "after {}, parameter {} holds inf while every wider parameter is finite: an update pushed it past its \
                 dtype's largest value (65504 for float16); keep such a parameter in float32",
                self.finite_text(),
                names.join(", ")
            );
        }
        let held = match broken.len() {
            0 => "every parameter is still finite".to_string(),
            n => format!("{n} of {params} parameters hold inf/NaN"),
        };
        format!(
            "after {} (loss {:.4} at the first, {:.4} at the last), {held}: the updates diverged{autocast}; \
             lower --lr (or warm it up with --warmup-epochs)",
            self.finite_text(),
            self.first.unwrap_or(f64::NAN),
            self.last.unwrap_or(f64::NAN)
        )
    }

    /// "1 step with a finite loss", "3 steps with a finite loss".
    fn finite_text(&self) -> String {
        let s = if self.finite_steps == 1 { "" } else { "s" };
        format!("{} step{s} with a finite loss", self.finite_steps)
    }
}

/// The parameters of `params` holding inf or NaN, in order.
fn broken_parameters(params: &[(String, Tensor)]) -> Vec<Broken> {
    tch::no_grad(|| {
        params
            .iter()
            .filter(|(_, p)| p.is_floating_point() && p.isfinite().all().int64_value(&[]) == 0)
            .map(|(name, p)| Broken {
                name: name.clone(),
                kind: p.kind(),
                nan: p.isnan().any().int64_value(&[]) != 0,
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(global_step: usize) -> StepAt {
        StepAt {
            epoch: 0,
            step: global_step,
            global_step,
            warmup: false,
        }
    }

    fn param(name: &str, values: &[f32], kind: Kind) -> (String, Tensor) {
        (name.to_string(), Tensor::from_slice(values).to_kind(kind))
    }

    #[test]
    fn a_loss_not_finite_at_the_first_step_is_the_models_not_the_learning_rates() {
        let mut watch = LossWatch::default();
        let params = [param("w", &[f32::NAN], Kind::Float)];
        let e = watch.check(at(0), f64::NAN, &params, AmpMode::Fp16).unwrap_err().to_string();
        assert!(
            e.starts_with("loss became NaN at epoch 0 step 0: it was not finite at the first step, before any update"),
            "{e}"
        );
        assert!(e.contains("--lr is not the cause") && e.contains("--amp fp16 autocast"), "{e}");
        assert!(!e.contains("lower --lr"), "{e}");
    }

    #[test]
    fn a_16_bit_parameter_at_inf_beside_finite_wider_ones_overflowed_its_dtype() {
        let mut watch = LossWatch::default();
        let params = [
            param("fc.weight", &[0.5, -1.0], Kind::Float),
            param("scale", &[f32::INFINITY, 1.0], Kind::Half),
        ];
        watch.check(at(0), 2.3, &params, AmpMode::Off).unwrap();
        let e = watch
            .check(at(1), f64::NEG_INFINITY, &params, AmpMode::Off)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("after 1 step with a finite loss, parameter `scale` (float16) holds inf while every wider parameter is finite"),
            "{e}"
        );
        assert!(!e.contains("lower --lr"), "{e}");
    }

    #[test]
    fn a_loss_finite_for_steps_then_not_with_every_parameter_gone_is_divergence() {
        let mut watch = LossWatch::default();
        let ok = [param("w", &[1.0], Kind::Float), param("h", &[1.0], Kind::Half)];
        for s in 0..3 {
            watch.check(at(s), 2.0 + s as f64, &ok, AmpMode::Off).unwrap();
        }
        let gone = [param("w", &[f32::NAN], Kind::Float), param("h", &[f32::NAN], Kind::Half)];
        let e = watch.check(at(3), f64::NAN, &gone, AmpMode::Off).unwrap_err().to_string();
        assert!(
            e.contains("after 3 steps with a finite loss (loss 2.0000 at the first, 4.0000 at the last), 2 of 2 parameters hold inf/NaN"),
            "{e}"
        );
        assert!(e.ends_with("lower --lr (or warm it up with --warmup-epochs)"), "{e}");
    }
}
