//! `train --target-loss` and `--target-accuracy`: the step a run first reaches its
//! target, which every rank agrees on.
//!
//! - A target loss is checked after each measured step: each step's loss is averaged
//!   over the ranks (one all-reduce of one number), then over the last [`WINDOW_STEPS`]
//!   measured steps; every rank holds the same window, so every rank stops after the
//!   same step.
//! - A target accuracy is checked at a validation every `--val-every` optimizer steps,
//!   outside the timed steps; validation all-reduces its counts, so every rank holds
//!   the same accuracy.

use super::state::Schedule;
use super::TrainConfig;
use crate::optim::LrScaling;
use crate::record::{TargetGoal, TargetOutcome};
use crate::world::Group;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use std::collections::VecDeque;

/// Measured steps the training loss is averaged over before it is compared with the
/// target: enough to even out one batch's noise at small batches.
pub(super) const WINDOW_STEPS: usize = 20;

/// Validations per epoch of a target accuracy without `--val-every`: the steps to the
/// target are then known to a tenth of an epoch's samples at every batch.
pub(super) const VALIDATIONS_PER_EPOCH: usize = 10;

/// Optimizer steps between a target accuracy's validations: `--val-every`, else a
/// tenth of an epoch's steps. Err, with what to change, when the run has a target
/// accuracy and no validation would fall within its steps: the target would never be
/// checked.
pub(super) fn validate_every_steps(cfg: &TrainConfig, schedule: &Schedule) -> anyhow::Result<usize> {
    let (every, how) = match cfg.schedule.val_every {
        Some(every) => (every.max(1), format!("--val-every {every}")),
        None => (
            (schedule.steps_per_epoch / VALIDATIONS_PER_EPOCH).max(1),
            format!("a tenth of an epoch's {} steps, without --val-every", schedule.steps_per_epoch),
        ),
    };
    if let Some(accuracy) = cfg.schedule.target_accuracy.filter(|_| every > schedule.total_steps) {
        anyhow::bail!(
            "--target-accuracy {accuracy}: a validation every {every} optimizer steps ({how}) never falls within \
             this run's {} steps, so the target would never be checked; give --val-every {} or less, or train \
             longer (--epochs, --max-steps)",
            schedule.total_steps,
            schedule.total_steps
        );
    }
    Ok(every)
}

/// The target, the window of the last measured steps' losses (mean over ranks), and
/// the outcome so far.
#[derive(Debug)]
pub(super) struct TargetWatch {
    window: VecDeque<f64>,
    outcome: TargetOutcome,
}

/// Where a measured step sits, for the figures of the reach.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepDone {
    /// Optimizer steps done, this one included.
    pub steps: usize,
    /// Samples over all ranks per optimizer step.
    pub global_batch: usize,
    /// Seconds since the start of training when the loss was read.
    pub elapsed_s: f64,
}

impl TargetWatch {
    /// Watches `goal`; a target accuracy is checked every `validate_every_steps`
    /// optimizer steps (ignored for a target loss).
    pub(super) fn new(goal: TargetGoal, validate_every_steps: usize, lr: LrFollowed) -> TargetWatch {
        let (target_loss, target_accuracy, window_steps, every) = match goal {
            TargetGoal::TrainingLoss(l) => (Some(l), None, WINDOW_STEPS, None),
            TargetGoal::ValidationAccuracy(a) => (None, Some(a), 0, Some(validate_every_steps.max(1))),
        };
        TargetWatch {
            window: VecDeque::with_capacity(WINDOW_STEPS),
            outcome: TargetOutcome {
                target_loss,
                target_accuracy,
                window_steps,
                validate_every_steps: every,
                lr_rule: lr.rule,
                warmup_lr_steps: lr.warmup_steps,
                peak_lr: Some(lr.peak),
                ..Default::default()
            },
        }
    }

    /// Whether a validation for the target is due after `steps` optimizer steps: a
    /// target accuracy not yet reached, at a multiple of `--val-every`.
    pub(super) fn validates_after(&self, steps: usize) -> bool {
        match self.outcome.validate_every_steps {
            Some(every) => !self.outcome.reached && steps > 0 && steps % every == 0,
            None => false,
        }
    }

    /// Adds one measured step's loss on this rank: for a target loss, a collective,
    /// which every rank calls for the same steps; nothing for a target accuracy.
    /// Returns whether the target is reached (at this step or before).
    pub(super) fn add(&mut self, g: &Group, local_loss: f64, at: StepDone) -> bool {
        if !matches!(self.goal(), TargetGoal::TrainingLoss(_)) {
            return self.outcome.reached;
        }
        let mut sum = 0.0;
        {
            let _f = crate::flight::enter("all-reduce", "target loss");
            g.comm.all_reduce_into(&local_loss, &mut sum, SystemOperation::sum());
        }
        self.add_mean(sum / g.size as f64, at)
    }

    /// Adds the mean over the ranks of one measured step's loss (a target loss).
    pub(super) fn add_mean(&mut self, mean_loss: f64, at: StepDone) -> bool {
        let TargetGoal::TrainingLoss(target) = self.goal() else {
            return self.outcome.reached;
        };
        if self.outcome.reached {
            return true;
        }
        if self.window.len() == WINDOW_STEPS {
            self.window.pop_front();
        }
        self.window.push_back(mean_loss);
        if self.window.len() < WINDOW_STEPS {
            return false;
        }
        let smoothed = self.window.iter().sum::<f64>() / WINDOW_STEPS as f64;
        self.outcome.smoothed_loss = Some(smoothed);
        if smoothed <= target {
            self.reach(at);
        }
        self.outcome.reached
    }

    /// Adds a validation's accuracy (the same on every rank) after `at` (a target
    /// accuracy). An accuracy that is not a number means the model gives no
    /// predictions: an error, since the target could never be reached.
    pub(super) fn add_accuracy(&mut self, accuracy: f64, at: StepDone) -> anyhow::Result<bool> {
        let TargetGoal::ValidationAccuracy(target) = self.goal() else {
            return Ok(self.outcome.reached);
        };
        anyhow::ensure!(
            accuracy.is_finite(),
            "--target-accuracy {target}: validation gave no accuracy (a TorchScript model with its own loss \
             gives no predictions, or no test sample was validated): train to --target-loss instead"
        );
        if self.outcome.reached {
            return Ok(true);
        }
        self.outcome.val_accuracy = Some(self.outcome.val_accuracy.map_or(accuracy, |b| b.max(accuracy)));
        if accuracy >= target {
            self.outcome.val_accuracy = Some(accuracy);
            self.reach(at);
        }
        Ok(self.outcome.reached)
    }

    /// The target is met after `at`: the figures of the reach.
    fn reach(&mut self, at: StepDone) {
        self.outcome.reached = true;
        self.outcome.steps_to_target = Some(at.steps);
        self.outcome.samples_to_target = Some((at.steps * at.global_batch) as u64);
        self.outcome.seconds_to_target = Some(at.elapsed_s);
    }

    /// What is watched: the outcome's target, set once by [`TargetWatch::new`].
    fn goal(&self) -> TargetGoal {
        self.outcome.goal().expect("a watch's outcome holds exactly one target")
    }

    pub(super) fn reached(&self) -> bool {
        self.outcome.reached
    }

    pub(super) fn outcome(&self) -> &TargetOutcome {
        &self.outcome
    }

    /// The log line of the outcome after `steps` steps.
    pub(super) fn line(&self, steps: usize) -> String {
        let o = &self.outcome;
        let how = match (self.goal(), o.validate_every_steps) {
            (TargetGoal::ValidationAccuracy(_), Some(every)) => {
                format!("validation every {every} steps; seconds include the validations")
            }
            _ => format!("mean of the last {} steps' losses", o.window_steps),
        };
        let flag = match self.goal() {
            TargetGoal::TrainingLoss(v) => format!("--target-loss {v}"),
            TargetGoal::ValidationAccuracy(v) => format!("--target-accuracy {v}"),
        };
        match (o.steps_to_target, o.samples_to_target, o.seconds_to_target) {
            (Some(n), Some(samples), Some(s)) if o.reached => {
                format!("reached {flag} at step {n}: {samples} samples, {s:.2} s since the start of training ({how})")
            }
            _ => format!(
                "did not reach {flag} within {steps} steps ({}); no samples or time to target are recorded",
                self.end_figure()
            ),
        }
    }

    /// Where a run that did not reach its target ended, in words.
    fn end_figure(&self) -> String {
        let o = &self.outcome;
        match self.goal() {
            TargetGoal::TrainingLoss(_) => format!(
                "smoothed loss at the end: {}",
                o.smoothed_loss.map_or_else(
                    || format!("none, fewer than {} steps measured", o.window_steps),
                    |l| format!("{l:.4}")
                )
            ),
            TargetGoal::ValidationAccuracy(_) => format!(
                "best validation accuracy: {}",
                o.val_accuracy
                    .map_or_else(|| "none, no validation ran".to_string(), |a| format!("{a:.4}"))
            ),
        }
    }
}

/// The learning rate a run follows, as its target outcome records it.
#[derive(Debug, Clone)]
pub(super) struct LrFollowed {
    /// In words ([`lr_rule`]).
    pub rule: String,
    /// Optimizer steps of the linear warm-up.
    pub warmup_steps: usize,
    /// The rate after the warm-up ([`peak_lr`]).
    pub peak: f64,
}

/// The learning rate after the warm-up: `--lr`, scaled under `--lr-scaling linear`.
pub(super) fn peak_lr(cfg: &TrainConfig, schedule: &Schedule) -> f64 {
    match cfg.optim.lr_scaling {
        LrScaling::None => cfg.learning_rate(),
        LrScaling::Linear => cfg.learning_rate() * schedule.lr_scale,
    }
}

/// The learning rate a run follows, in words.
pub(super) fn lr_rule(cfg: &TrainConfig, schedule: &Schedule) -> String {
    let base = cfg.learning_rate();
    let scaled = match cfg.optim.lr_scaling {
        LrScaling::None => format!("{base} (--lr-scaling none)"),
        LrScaling::Linear => format!(
            "{base} × {} = {} (--lr-scaling linear: ranks × --grad-accum)",
            schedule.lr_scale,
            peak_lr(cfg, schedule)
        ),
    };
    let warmup = match schedule.warmup_lr_steps {
        0 => "no warm-up".to_string(),
        n => format!("linear warm-up from 0 over {n} steps (--warmup-epochs {})", cfg.optim.warmup_epochs),
    };
    format!("{:?} learning rate {scaled}, {warmup}", cfg.optim.optimizer).to_lowercase()
}

/// `--target-accuracy`'s value: a fraction above 0, at most 1.
pub(super) fn accuracy_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        Ok(v) if v > 1.0 && v <= 100.0 => Err(format!(
            "{v} is not a fraction: give the accuracy as a fraction from 0 to 1 (e.g. {} for {v} %)",
            v / 100.0
        )),
        Ok(v) => Err(format!(
            "{v} is not an accuracy a run can reach: give a fraction above 0, at most 1 (e.g. 0.85)"
        )),
        Err(e) => Err(format!(
            "{s:?} is not a number ({e}): give a fraction above 0, at most 1 (e.g. 0.85)"
        )),
    }
}

/// `--target-loss`'s value: a finite loss above 0.
pub(super) fn positive_loss(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(v) => Err(format!(
            "{v} is not a training loss a run can reach: give a finite value above 0 (e.g. 0.5)"
        )),
        Err(e) => Err(format!("{s:?} is not a number ({e}): give a finite value above 0 (e.g. 0.5)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lr() -> LrFollowed {
        LrFollowed {
            rule: "rule".into(),
            warmup_steps: 0,
            peak: 0.1,
        }
    }

    fn at(steps: usize) -> StepDone {
        StepDone {
            steps,
            global_batch: 64,
            elapsed_s: steps as f64 * 0.5,
        }
    }

    /// The window needs all its steps; the first full window at or below the target is
    /// the reach, with that step's figures; later steps change nothing.
    #[test]
    fn the_target_is_reached_by_the_mean_of_a_full_window() {
        let mut w = TargetWatch::new(TargetGoal::TrainingLoss(1.0), 0, lr());
        // A single low loss in a short window is not a reach.
        assert!(!w.add_mean(0.1, at(1)));
        for s in 2..=WINDOW_STEPS {
            assert!(!w.add_mean(2.0, at(s)), "step {s}");
        }
        // Mean of 0.1 and 19 × 2.0 is 1.905: above 1.0.
        assert!((w.outcome().smoothed_loss.unwrap() - (0.1 + 19.0 * 2.0) / 20.0).abs() < 1e-12);
        let mut s = WINDOW_STEPS;
        while !w.add_mean(0.5, at(s + 1)) {
            s += 1;
            assert!(s < 100);
        }
        // 2.0 × k + 0.5 × (20 − k) ≤ 20 first at k = 6: 14 steps of 0.5 after the 20th.
        let o = w.outcome().clone();
        assert_eq!((o.reached, o.steps_to_target), (true, Some(WINDOW_STEPS + 14)));
        assert_eq!(o.samples_to_target, Some(64 * (WINDOW_STEPS as u64 + 14)));
        assert_eq!(o.seconds_to_target, Some((WINDOW_STEPS + 14) as f64 * 0.5));
        assert!(w.add_mean(9.0, at(99)));
        assert_eq!(w.outcome(), &o, "a reach is not moved by later steps");
        assert!(
            w.line(99).starts_with("reached --target-loss 1 at step 34: 2176 samples"),
            "{}",
            w.line(99)
        );
    }

    /// Never reached: no figures of the reach, and the line says so.
    #[test]
    fn a_target_never_reached_has_no_figures() {
        let mut w = TargetWatch::new(TargetGoal::TrainingLoss(0.01), 0, lr());
        for s in 1..=3 {
            assert!(!w.add_mean(0.001, at(s)));
        }
        let o = w.outcome();
        assert_eq!(
            (o.reached, o.steps_to_target, o.samples_to_target, o.seconds_to_target),
            (false, None, None, None)
        );
        assert_eq!(o.smoothed_loss, None, "fewer steps than the window");
        assert!(
            w.line(3).contains("did not reach --target-loss 0.01 within 3 steps"),
            "{}",
            w.line(3)
        );
        for bad in ["0", "-1", "nan", "inf", "x"] {
            assert!(positive_loss(bad).is_err(), "{bad}");
        }
        assert_eq!(positive_loss("0.5"), Ok(0.5));
    }

    /// A target accuracy is checked at validations only, at multiples of `--val-every`:
    /// the first validation at or above it is the reach; losses change nothing; the best
    /// accuracy of a run that missed is kept.
    #[test]
    fn a_target_accuracy_is_reached_at_a_validation() {
        let mut w = TargetWatch::new(TargetGoal::ValidationAccuracy(0.8), 25, lr());
        assert_eq!(w.outcome().window_steps, 0);
        assert_eq!(w.outcome().validate_every_steps, Some(25));
        let due: Vec<usize> = (0..=100).filter(|&s| w.validates_after(s)).collect();
        assert_eq!(due, [25, 50, 75, 100]);
        assert!(!w.add_mean(0.0, at(1)), "a loss does not reach an accuracy");
        assert!(!w.add_accuracy(0.7, at(25)).unwrap());
        assert!(!w.add_accuracy(0.6, at(50)).unwrap());
        assert_eq!(w.outcome().val_accuracy, Some(0.7), "the best so far");
        assert!(w
            .line(50)
            .contains("did not reach --target-accuracy 0.8 within 50 steps (best validation accuracy: 0.7000)"));
        assert!(w.add_accuracy(0.8, at(75)).unwrap());
        let o = w.outcome().clone();
        assert_eq!(
            (o.steps_to_target, o.samples_to_target, o.val_accuracy),
            (Some(75), Some(75 * 64), Some(0.8))
        );
        assert!(!w.validates_after(100), "no validation for the target after the reach");
        assert!(w.add_accuracy(0.1, at(100)).unwrap());
        assert_eq!(w.outcome(), &o);
        assert!(
            w.line(100).starts_with("reached --target-accuracy 0.8 at step 75: 4800 samples"),
            "{}",
            w.line(100)
        );
        let err = TargetWatch::new(TargetGoal::ValidationAccuracy(0.8), 25, lr())
            .add_accuracy(f64::NAN, at(25))
            .unwrap_err();
        assert!(err.to_string().contains("train to --target-loss instead"), "{err}");
        // A target loss never asks for a validation.
        assert!(!TargetWatch::new(TargetGoal::TrainingLoss(1.0), 25, lr()).validates_after(25));
        for bad in ["0", "-0.5", "1.5e3", "nan", "x"] {
            assert!(accuracy_fraction(bad).is_err(), "{bad}");
        }
        assert!(accuracy_fraction("85").unwrap_err().contains("0.85 for 85 %"));
        assert_eq!(accuracy_fraction("1"), Ok(1.0));
    }
}
