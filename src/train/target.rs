//! `train --target-loss`: the smoothed training loss every rank agrees on, and the
//! step it first reaches the target. Each measured step's loss is averaged over the
//! ranks (one all-reduce of one number), then over the last [`WINDOW_STEPS`] measured
//! steps; every rank holds the same window, so every rank stops after the same step.

use super::state::Schedule;
use super::TrainConfig;
use crate::optim::LrScaling;
use crate::record::TargetOutcome;
use crate::world::Group;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use std::collections::VecDeque;

/// Measured steps the training loss is averaged over before it is compared with the
/// target: enough to even out one batch's noise at small batches.
pub(super) const WINDOW_STEPS: usize = 20;

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
    pub(super) fn new(target_loss: f64, lr: LrFollowed) -> TargetWatch {
        TargetWatch {
            window: VecDeque::with_capacity(WINDOW_STEPS),
            outcome: TargetOutcome {
                target_loss,
                window_steps: WINDOW_STEPS,
                lr_rule: lr.rule,
                warmup_lr_steps: lr.warmup_steps,
                peak_lr: Some(lr.peak),
                ..Default::default()
            },
        }
    }

    /// Adds one measured step's loss on this rank: a collective, which every rank calls
    /// for the same steps. Returns whether the target is reached (at this step or before).
    pub(super) fn add(&mut self, g: &Group, local_loss: f64, at: StepDone) -> bool {
        let mut sum = 0.0;
        {
            let _f = crate::flight::enter("all-reduce", "target loss");
            g.comm.all_reduce_into(&local_loss, &mut sum, SystemOperation::sum());
        }
        self.add_mean(sum / g.size as f64, at)
    }

    /// Adds the mean over the ranks of one measured step's loss.
    pub(super) fn add_mean(&mut self, mean_loss: f64, at: StepDone) -> bool {
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
        if smoothed <= self.outcome.target_loss {
            self.outcome.reached = true;
            self.outcome.steps_to_target = Some(at.steps);
            self.outcome.samples_to_target = Some((at.steps * at.global_batch) as u64);
            self.outcome.seconds_to_target = Some(at.elapsed_s);
        }
        self.outcome.reached
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
        match (o.steps_to_target, o.samples_to_target, o.seconds_to_target) {
            (Some(n), Some(samples), Some(s)) if o.reached => format!(
                "reached --target-loss {} at step {n}: {samples} samples, {s:.2} s since the start of training \
                 (mean of the last {} steps' losses)",
                o.target_loss, o.window_steps
            ),
            _ => format!(
                "did not reach --target-loss {} within {steps} steps (smoothed loss at the end: {}); no samples or \
                 time to target are recorded",
                o.target_loss,
                o.smoothed_loss.map_or_else(
                    || format!("none, fewer than {} steps measured", o.window_steps),
                    |l| format!("{l:.4}")
                )
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
        let mut w = TargetWatch::new(1.0, lr());
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
        let mut w = TargetWatch::new(0.01, lr());
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
}
