//! How many samples a global batch B needs to reach a loss, relative to a smaller batch
//! B0, predicted three ways from what B0's training measured:
//!
//! - **target window**: the noise-scale model's (1 + B/B_noise)/(1 + B0/B_noise), with
//!   B_noise the B_simple of the last 50 steps to the target of B0's runs;
//! - **integrated**: the tradeoff (S/S_min − 1)(E/E_min − 1) = 1 holds at each point of
//!   training with the noise scale there, so per unit of progress a batch B spends
//!   samples in proportion to B + B_noise(t). B0's steps are equal in samples, so the
//!   ratio is the mean over B0's measured steps to the target of
//!   (B + B_noise(t))/(B0 + B_noise(t)), B_noise(t) the B_simple of consecutive windows
//!   of [`INTEGRATION_WINDOW_STEPS`] measured steps. B_simple drifts several-fold over a
//!   run, and the samples a large batch loses are spent early, where it is small;
//! - **two-batch fit**: E(B) = E_min + S_min·B (the tradeoff's samples at batch B) through
//!   the measured samples to target of B0 and one larger batch, predicting the others.
//!   Its inputs are two measured batches, not B0's runs alone.
//!
//! A prediction is absent, with its reason, where its inputs say nothing: synthetic
//! data (random labels), fewer than [`MIN_MEASURED_STEPS`] measured steps, or a noise
//! scale without an upper bound.

use super::noise_window::NoiseStep;
use crate::noise_scale::{estimate, NormPair};
use crate::record::{OptimizerKind, TargetGoal};
use serde::Serialize;

/// Measured steps per window of the integrated prediction: chosen on the learning-rate
/// grids of BENCHMARKS.md ("The prediction against training to a target loss"), where
/// windows of 1, 5, 10, 25, 50 and 100 measured steps and the whole run were compared;
/// 50 had the smallest largest error over the predicted batches of both grids.
pub(crate) const INTEGRATION_WINDOW_STEPS: usize = 50;

/// Fewer measured steps than this give no prediction: B_simple's interval then spans
/// more than an order of magnitude on the workloads measured here.
pub(crate) const MIN_MEASURED_STEPS: usize = 20;

/// The prediction whose figure the report leads with: the one that predicted the
/// held-out batches of the grid best.
pub(crate) const CHOSEN: Estimator = Estimator::Integrated;

/// The largest multiple of B0 at which [`CHOSEN`] was checked against training: a batch
/// beyond it is marked extrapolated.
pub(crate) const CHECKED_MULTIPLE: f64 = 16.0;

/// What the check of [`CHOSEN`] against training found for one optimizer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CheckedError {
    /// The largest |error| at 4 × and 16 × B0 on the held-out workload, as a fraction:
    /// the half-width the time to a target carries for the prediction.
    pub fraction: f64,
    /// False for an optimizer no check covers: `fraction` is then the largest of those
    /// that were checked.
    pub checked: bool,
    /// Which check, in a few words: "as checked for SGD", "not checked for this optimizer".
    pub covers: &'static str,
    /// In words, for report.md, naming the workload and the optimizer.
    pub sentence: &'static str,
}

const CHECKED_SGD: CheckedError = CheckedError {
    fraction: 0.363,
    checked: true,
    covers: "as checked for SGD on a held-out workload",
    sentence: "Checked for SGD with momentum (BENCHMARKS.md, \"The prediction held out\", 2026-11-29): on a workload \
               it was not tuned on, a TorchScript MLP (784-512-256-10) on Fashion-MNIST to training loss 0.45, the best \
               of a 5-value learning-rate grid per batch, 3 seeds, B0 = 64, the integrated prediction erred −11 % at \
               4 × B0 and −36 % at 16 × B0 (it predicted more samples than training needed); on mnist-cnn, where its \
               window of 50 measured steps was chosen, −13 % and +1 %. A time to a target from SGD runs carries ±36 %.",
};

const CHECKED_ADAM: CheckedError = CheckedError {
    fraction: 0.50,
    checked: true,
    covers: "as checked for Adam on a held-out workload",
    sentence: "Checked for Adam (BENCHMARKS.md, \"The prediction held out\", 2026-11-29): on the same MLP and grid \
               (learning rates by the square-root rule), the integrated prediction erred −22 % at 4 × B0 and −50 % at \
               16 × B0, predicting more samples than training needed; on mnist-cnn to training loss 0.6, −21 % and \
               −15 %. Adam preconditions the gradient, which the noise \
               scale's derivation does not cover. A time to a target from Adam runs carries ±50 %.",
};

const UNCHECKED: CheckedError = CheckedError {
    fraction: 0.50,
    checked: false,
    covers: "not checked for this optimizer: the largest error checked",
    sentence: "Not checked for LARS, or for runs that do not record their optimizer: a time to a target from them \
               carries ±50 %, the largest error of the optimizers checked (Adam's).",
};

const CHECKED_ACCURACY_SGD: CheckedError = CheckedError {
    fraction: 0.571,
    checked: true,
    covers: "as checked for SGD to a validation accuracy",
    sentence: "For a target of validation accuracy, checked for SGD with momentum (BENCHMARKS.md, \"The prediction to \
               a target of validation accuracy\", 2026-11-29): the same MLP on Fashion-MNIST to 84 % validation \
               accuracy, validated every 1,024 samples, the best of a 6-value learning-rate grid per batch, 3 seeds, \
               B0 = 64: the integrated prediction erred −41 % at 4 × B0 and −57 % at 16 × B0 (it predicted more \
               than twice the samples training needed). A time to such a target from SGD runs carries ±57 %.",
};

const CHECKED_ACCURACY_ADAM: CheckedError = CheckedError {
    fraction: 0.694,
    checked: true,
    covers: "as checked for Adam to a validation accuracy",
    sentence: "For a target of validation accuracy, checked for Adam (BENCHMARKS.md, \"The prediction to a target \
               of validation accuracy\", 2026-11-29): on the same MLP and target (learning rates by the square-root \
               rule, a 6-value grid), the integrated prediction erred −52 % at 4 × B0 and −69 % at 16 × B0. A time \
               to such a target from Adam runs carries ±69 %.",
};

const UNCHECKED_ACCURACY: CheckedError = CheckedError {
    fraction: 0.694,
    checked: false,
    covers: "not checked for this optimizer to a validation accuracy: the largest error checked",
    sentence: "For a target of validation accuracy, not checked for LARS, or for runs that do not record their \
               optimizer: a time to such a target from them carries ±69 %, the largest error checked (Adam's).",
};

/// What the check found for `optimizer`'s runs to a training loss.
pub(crate) fn checked_error(optimizer: Option<OptimizerKind>) -> CheckedError {
    match optimizer {
        Some(OptimizerKind::Sgd) => CHECKED_SGD,
        Some(OptimizerKind::Adam) => CHECKED_ADAM,
        _ => UNCHECKED,
    }
}

/// What the check found for runs to `goal` of `optimizer`: targets of training loss and
/// of validation accuracy were checked apart.
pub(crate) fn checked_error_for(goal: TargetGoal, optimizer: Option<OptimizerKind>) -> CheckedError {
    match (goal, optimizer) {
        (TargetGoal::TrainingLoss(_), o) => checked_error(o),
        (TargetGoal::ValidationAccuracy(_), Some(OptimizerKind::Sgd)) => CHECKED_ACCURACY_SGD,
        (TargetGoal::ValidationAccuracy(_), Some(OptimizerKind::Adam)) => CHECKED_ACCURACY_ADAM,
        (TargetGoal::ValidationAccuracy(_), _) => UNCHECKED_ACCURACY,
    }
}

/// The sentences of the checks of targets of validation accuracy for runs of
/// `optimizers`, each once, in the order met.
pub(crate) fn accuracy_checked_error_text(optimizers: impl IntoIterator<Item = Option<OptimizerKind>>) -> String {
    sentences_once(
        optimizers
            .into_iter()
            .map(|o| checked_error_for(TargetGoal::ValidationAccuracy(0.0), o)),
    )
}

/// The checks' sentences, each once, in the order met.
fn sentences_once(checks: impl IntoIterator<Item = CheckedError>) -> String {
    let mut said: Vec<&str> = Vec::new();
    for c in checks {
        if !said.contains(&c.sentence) {
            said.push(c.sentence);
        }
    }
    said.join(" ")
}

/// The checks' sentences for runs of `optimizers`, each once, in the order met; the
/// SGD one when there are none.
pub(crate) fn checked_error_text(optimizers: impl IntoIterator<Item = Option<OptimizerKind>>) -> String {
    let text = sentences_once(optimizers.into_iter().map(checked_error));
    if text.is_empty() {
        CHECKED_SGD.sentence.to_string()
    } else {
        text
    }
}

/// What a time to a target at another batch stands on: B0's median samples to the
/// target and the integrated prediction from B0's training.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TargetCurve {
    pub goal: TargetGoal,
    pub batch0: usize,
    pub samples0: f64,
    pub trajectory: Trajectory,
    /// The runs' optimizer: which check's error the time to a target carries.
    pub optimizer: Option<OptimizerKind>,
}

impl TargetCurve {
    /// Predicted samples to the target at global batch `batch`.
    pub(crate) fn samples_at(&self, batch: f64) -> Option<f64> {
        self.trajectory.factor(batch, self.batch0 as f64).map(|f| f * self.samples0)
    }
}

/// Which way a samples ratio was predicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    TargetWindow,
    Integrated,
    TwoBatchFit,
}

impl Estimator {
    pub const ALL: [Estimator; 3] = [Estimator::Integrated, Estimator::TargetWindow, Estimator::TwoBatchFit];

    /// In words, for report.md.
    pub fn describe(self) -> &'static str {
        match self {
            Estimator::TargetWindow => "target window",
            Estimator::Integrated => "integrated over the run",
            Estimator::TwoBatchFit => "two-batch fit",
        }
    }
}

/// One prediction of a batch's samples ratio, or why there is none.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Prediction {
    pub estimator: Estimator,
    /// Predicted samples at this batch over B0's.
    pub ratio: Option<f64>,
    /// Measured ratio ÷ predicted − 1, where both exist.
    pub relative_error: Option<f64>,
    /// The smallest and largest ratio predicted from each of B0's runs alone: the spread
    /// its repeats give the prediction. None with fewer than 2 runs (`range_none_because`
    /// says so) and for the predictions other than the integrated one.
    pub ratio_low: Option<f64>,
    pub ratio_high: Option<f64>,
    pub range_none_because: Option<String>,
    /// What it stands on, in words.
    pub basis: String,
    /// Why there is no figure (None when there is one).
    pub none_because: Option<String>,
}

impl Prediction {
    pub(crate) fn none(estimator: Estimator, basis: String, why: String) -> Prediction {
        Prediction {
            estimator,
            ratio: None,
            relative_error: None,
            ratio_low: None,
            ratio_high: None,
            range_none_because: None,
            basis,
            none_because: Some(why),
        }
    }

    pub(crate) fn of(estimator: Estimator, basis: String, ratio: f64, measured: Option<f64>) -> Prediction {
        Prediction {
            estimator,
            ratio: Some(ratio),
            relative_error: measured.map(|m| m / ratio - 1.0),
            ratio_low: None,
            ratio_high: None,
            range_none_because: None,
            basis,
            none_because: None,
        }
    }

    /// With the range of `per_run` (each B0 run's own prediction), or the reason there
    /// is none when fewer than 2 runs predicted.
    pub(crate) fn with_range(mut self, per_run: &[f64]) -> Prediction {
        if per_run.len() < 2 {
            self.range_none_because = Some(format!(
                "{} run(s) at B0 reached the target after the warm-up with the norms measured: a range needs 2 \
                 (train B0 again with another --seed)",
                per_run.len()
            ));
        } else {
            self.ratio_low = per_run.iter().copied().reduce(f64::min);
            self.ratio_high = per_run.iter().copied().reduce(f64::max);
        }
        self
    }
}

/// Why a noise scale measured on `dataset` over `measured_steps` steps, with an upper end
/// of its interval `bounded`, predicts nothing; None when it may predict.
pub(crate) fn ruled_out(dataset: &str, measured_steps: usize, bounded: bool) -> Option<String> {
    if dataset == "synthetic" {
        return Some(
            "synthetic data has random labels, where the noise scale says nothing about training: train on a real \
             data set (e.g. --dataset fashion-mnist) with --noise-scale on"
                .into(),
        );
    }
    if measured_steps < MIN_MEASURED_STEPS {
        return Some(format!(
            "{measured_steps} measured step(s), fewer than {MIN_MEASURED_STEPS}: run longer (--max-steps, --epochs) \
             with --noise-scale on"
        ));
    }
    (!bounded).then(|| {
        "B_simple's interval has no upper bound (|G|² not told apart from 0): measure more steps (--noise-scale on, \
         a longer run)"
            .into()
    })
}

/// One window of a trajectory: its measured steps and B_simple (None: undetermined).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TrajectoryWindow {
    pub first_step: u64,
    pub last_step: u64,
    pub steps: usize,
    pub b_simple: Option<f64>,
}

/// B_simple over consecutive windows of runs' measured steps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Trajectory {
    pub window_steps: usize,
    pub windows: Vec<TrajectoryWindow>,
    /// Measured steps over all windows.
    pub measured_steps: usize,
    /// Windows whose mean |G|² was not positive: counted as B_noise past every batch
    /// (the ratio 1 there), the noise-dominated limit.
    pub undetermined: usize,
    /// Windows whose mean tr(Σ) was negative: counted as B_noise 0.
    pub clamped: usize,
    /// B_simple over every step at once, its 95 % interval, and whether that has an
    /// upper end.
    pub pooled_b_simple: Option<f64>,
    pub pooled_low: Option<f64>,
    pub pooled_high: Option<f64>,
    pub bounded: bool,
}

impl Trajectory {
    /// The windows of `window` measured steps of each run's `steps` (in step order); a
    /// run's last window shorter than half of `window` joins the one before it.
    pub(crate) fn of(runs: &[&[NoiseStep]], window: usize) -> Trajectory {
        let window = window.max(1);
        let mut windows = Vec::new();
        let mut all: Vec<NormPair> = Vec::new();
        for steps in runs {
            all.extend(steps.iter().map(|s| s.pair));
            let mut bounds: Vec<(usize, usize)> = (0..steps.len())
                .step_by(window)
                .map(|a| (a, (a + window).min(steps.len())))
                .collect();
            if bounds.len() > 1 && bounds[bounds.len() - 1].1 - bounds[bounds.len() - 1].0 < window.div_ceil(2) {
                let tail = bounds.pop().unwrap();
                bounds.last_mut().unwrap().1 = tail.1;
            }
            for (a, b) in bounds {
                let pairs: Vec<NormPair> = steps[a..b].iter().map(|s| s.pair).collect();
                let e = estimate(&pairs);
                windows.push(TrajectoryWindow {
                    first_step: steps[a].global_step,
                    last_step: steps[b - 1].global_step,
                    steps: e.map_or(0, |e| e.steps),
                    b_simple: e.and_then(|e| e.b_simple),
                });
            }
        }
        let pooled = estimate(&all);
        Trajectory {
            window_steps: window,
            measured_steps: windows.iter().map(|w| w.steps).sum(),
            undetermined: windows.iter().filter(|w| w.steps > 0 && w.b_simple.is_none()).count(),
            clamped: windows.iter().filter(|w| w.b_simple.is_some_and(|b| b < 0.0)).count(),
            windows,
            pooled_b_simple: pooled.and_then(|e| e.b_simple),
            pooled_low: pooled.and_then(|e| e.interval).map(|i| i.0),
            pooled_high: pooled.and_then(|e| e.interval).and_then(|i| i.1),
            bounded: pooled.and_then(|e| e.interval).is_some_and(|i| i.1.is_some()),
        }
    }

    /// Samples at `batch` over samples at `batch0`: the mean over the measured steps of
    /// (B + B_noise)/(B0 + B_noise), each window's steps at its B_simple; None without a
    /// measured step.
    pub(crate) fn factor(&self, batch: f64, batch0: f64) -> Option<f64> {
        let (mut sum, mut n) = (0.0, 0usize);
        for w in self.windows.iter().filter(|w| w.steps > 0) {
            let f = match w.b_simple {
                None => 1.0,
                Some(b) => (batch + b.max(0.0)) / (batch0 + b.max(0.0)),
            };
            sum += f * w.steps as f64;
            n += w.steps;
        }
        (n > 0).then(|| sum / n as f64)
    }

    /// The caveats of its windows in words, empty when none.
    pub(crate) fn caveats(&self) -> String {
        let mut out = Vec::new();
        if self.undetermined > 0 {
            out.push(format!(
                "{} window(s) undetermined (mean |G|² not positive), counted as ratio 1",
                self.undetermined
            ));
        }
        if self.clamped > 0 {
            out.push(format!("{} window(s) with a negative tr(Σ) counted as B_noise 0", self.clamped));
        }
        out.join("; ")
    }
}

/// The empirical tradeoff E(B) = E_min + S_min·B through two measured batches' samples
/// to target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TwoBatchFit {
    pub batch0: usize,
    pub batch1: usize,
    /// Samples at an unbounded step count (the smallest batch's limit), and steps at an
    /// unbounded batch.
    pub e_min: f64,
    pub s_min: f64,
}

impl TwoBatchFit {
    /// The fit through (B0, E0) and (B1, E1), B1 > B0; an error in words when the two
    /// batches do not describe the tradeoff (samples that fall with the batch).
    pub(crate) fn through(batch0: usize, e0: f64, batch1: usize, e1: f64) -> Result<TwoBatchFit, String> {
        if batch1 <= batch0 || !(e0 > 0.0 && e1 > 0.0) {
            return Err(format!("no fit through B {batch0} and {batch1}"));
        }
        let s_min = (e1 - e0) / (batch1 - batch0) as f64;
        let e_min = e0 - batch0 as f64 * s_min;
        if s_min <= 0.0 || e_min <= 0.0 {
            return Err(format!(
                "the samples to target at B {batch0} ({e0:.0}) and {batch1} ({e1:.0}) do not follow the tradeoff \
                 (S_min {s_min:.1}, E_min {e_min:.0} not both positive): no fit"
            ));
        }
        Ok(TwoBatchFit {
            batch0,
            batch1,
            e_min,
            s_min,
        })
    }

    /// Samples at `batch` over the measured samples at B0.
    pub(crate) fn factor(&self, batch: f64, e0: f64) -> f64 {
        (self.e_min + self.s_min * batch) / e0
    }
}

/// The batch the two-batch fit pairs with B0: the measured one nearest 4 × B0 in ratio
/// (the smaller on a tie), among `reached` (the batches that reached the target).
pub(crate) fn fit_partner(batch0: usize, reached: &[usize]) -> Option<usize> {
    let far = |b: usize| ((b as f64 / (4.0 * batch0 as f64)).ln()).abs();
    reached
        .iter()
        .copied()
        .filter(|&b| b > batch0)
        .min_by(|&a, &b| far(a).total_cmp(&far(b)).then(a.cmp(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each optimizer's runs carry their own check's error and sentence; one no check
    /// covers carries the largest checked error and says it was not checked; a sentence
    /// is said once however many runs share it.
    #[test]
    fn the_checked_error_is_the_optimizers_own() {
        let sgd = checked_error(Some(OptimizerKind::Sgd));
        let adam = checked_error(Some(OptimizerKind::Adam));
        let lars = checked_error(Some(OptimizerKind::Lars));
        assert!(sgd.checked && adam.checked && !lars.checked);
        assert!(sgd.sentence.starts_with("Checked for SGD") && adam.sentence.starts_with("Checked for Adam"));
        assert!(
            sgd.sentence.contains(&format!("±{:.0} %", sgd.fraction * 100.0)),
            "{}",
            sgd.sentence
        );
        assert!(
            adam.sentence.contains(&format!("±{:.0} %", adam.fraction * 100.0)),
            "{}",
            adam.sentence
        );
        assert_eq!(lars.fraction, sgd.fraction.max(adam.fraction));
        assert_eq!(checked_error(None), lars);
        let text = checked_error_text([Some(OptimizerKind::Adam), Some(OptimizerKind::Adam), Some(OptimizerKind::Sgd)]);
        assert_eq!(text, format!("{} {}", adam.sentence, sgd.sentence));
        assert_eq!(checked_error_text([]), sgd.sentence);
    }

    /// Targets of validation accuracy have their own check, per optimizer: a time to one
    /// carries that check's error, not the training loss's.
    #[test]
    fn an_accuracy_target_carries_its_own_checked_error() {
        let accuracy = TargetGoal::ValidationAccuracy(0.84);
        let loss = TargetGoal::TrainingLoss(0.45);
        for o in [Some(OptimizerKind::Sgd), Some(OptimizerKind::Adam), Some(OptimizerKind::Lars), None] {
            assert_eq!(checked_error_for(loss, o), checked_error(o));
            let a = checked_error_for(accuracy, o);
            assert_ne!(a, checked_error(o), "{o:?}");
            assert!(a.sentence.starts_with("For a target of validation accuracy"), "{}", a.sentence);
            assert!(a.sentence.contains(&format!("±{:.0} %", a.fraction * 100.0)), "{}", a.sentence);
        }
        let (sgd, adam) = (
            checked_error_for(accuracy, Some(OptimizerKind::Sgd)),
            checked_error_for(accuracy, Some(OptimizerKind::Adam)),
        );
        let lars = checked_error_for(accuracy, Some(OptimizerKind::Lars));
        assert!(sgd.checked && adam.checked && !lars.checked);
        assert_eq!(lars.fraction, sgd.fraction.max(adam.fraction));
        let text = accuracy_checked_error_text([Some(OptimizerKind::Sgd), Some(OptimizerKind::Sgd)]);
        assert_eq!(text, sgd.sentence);
    }
    use crate::noise_scale::samples_factor;

    /// Step `g` whose true |G|² and tr(Σ) give B_simple `b(g)`, the norms their
    /// expectations E|G_B|² = |G|² + tr(Σ)/B at batches 32 and 64, with |G|² = 1.
    fn step(g: u64, b: f64) -> NoiseStep {
        let (grad_sq, trace) = (1.0, b);
        NoiseStep {
            global_step: g,
            loss: 1.0,
            pair: NormPair {
                batch_small: 32.0,
                sq_small: grad_sq + trace / 32.0,
                batch_big: 64.0,
                sq_big: grad_sq + trace / 64.0,
            },
        }
    }

    #[test]
    fn a_constant_noise_scale_integrates_to_the_target_window_figure() {
        let steps: Vec<NoiseStep> = (0..100).map(|g| step(g, 500.0)).collect();
        let t = Trajectory::of(&[&steps], 10);
        assert_eq!((t.windows.len(), t.measured_steps, t.undetermined), (10, 100, 0));
        let f = t.factor(1024.0, 64.0).unwrap();
        assert!((f - samples_factor(1024.0, 64.0, 500.0)).abs() < 1e-12, "{f}");
        assert!(t.bounded && (t.pooled_b_simple.unwrap() - 500.0).abs() < 1e-9);
    }

    #[test]
    fn a_linear_drift_integrates_to_its_closed_form() {
        // B_noise(t) = a + c·t over T steps: the mean of (B + a + c·t)/(B0 + a + c·t) is
        // 1 + (B − B0)/(c·T)·ln((B0 + a + c·T)/(B0 + a)) in the continuum; windows of one
        // step are the midpoint rule on steps t + ½, whose error is O(1/T²).
        let (a, c, n) = (50.0, 0.5, 2000u64);
        let steps: Vec<NoiseStep> = (0..n).map(|g| step(g, a + c * (g as f64 + 0.5))).collect();
        let (b, b0) = (1024.0, 64.0);
        let closed = 1.0 + (b - b0) / (c * n as f64) * ((b0 + a + c * n as f64) / (b0 + a)).ln();
        let fine = Trajectory::of(&[&steps], 1).factor(b, b0).unwrap();
        assert!((fine / closed - 1.0).abs() < 1e-6, "{fine} against {closed}");
        // Windows of 25 steps average the drift within each: within 0.1 % here, and far
        // from the constant noise scale of the last steps (the target window's figure).
        let coarse = Trajectory::of(&[&steps], 25).factor(b, b0).unwrap();
        assert!((coarse / closed - 1.0).abs() < 1e-3, "{coarse} against {closed}");
        let last = samples_factor(b, b0, a + c * n as f64);
        assert!(closed / last > 1.5, "the drift matters: {closed} against {last}");
    }

    #[test]
    fn undetermined_and_negative_windows_take_their_limits_and_are_said() {
        let mut steps: Vec<NoiseStep> = (0..20).map(|g| step(g, 100.0)).collect();
        // Ten steps whose |G|² estimate is negative (undetermined), ten with tr(Σ) < 0.
        for s in &mut steps[..10] {
            (s.pair.sq_small, s.pair.sq_big) = (10.0, 1.0);
        }
        for s in &mut steps[10..] {
            s.pair.sq_big = s.pair.sq_small + 0.5;
        }
        let t = Trajectory::of(&[&steps], 10);
        assert_eq!((t.undetermined, t.clamped), (1, 1), "{t:?}");
        // Ratio 1 for the first window, B/B0 for the second.
        assert!((t.factor(256.0, 64.0).unwrap() - (1.0 + 4.0) / 2.0).abs() < 1e-12);
        assert!(t.caveats().contains("1 window(s) undetermined") && t.caveats().contains("negative tr(Σ)"));
    }

    #[test]
    fn a_short_last_window_joins_the_one_before() {
        let steps: Vec<NoiseStep> = (0..23).map(|g| step(g * 10, 100.0)).collect();
        let t = Trajectory::of(&[&steps], 10);
        let spans: Vec<(u64, u64, usize)> = t.windows.iter().map(|w| (w.first_step, w.last_step, w.steps)).collect();
        assert_eq!(spans, [(0, 90, 10), (100, 220, 13)]);
    }

    #[test]
    fn the_two_batch_fit_passes_through_its_inputs_and_refuses_a_falling_tradeoff() {
        let fit = TwoBatchFit::through(64, 15_040.0, 256, 19_456.0).unwrap();
        assert!((fit.s_min - 23.0).abs() < 1e-9 && (fit.e_min - 13_568.0).abs() < 1e-9, "{fit:?}");
        assert!((fit.factor(64.0, 15_040.0) - 1.0).abs() < 1e-12);
        assert!((fit.factor(256.0, 15_040.0) - 19_456.0 / 15_040.0).abs() < 1e-12);
        assert!((fit.factor(1024.0, 15_040.0) - 37_120.0 / 15_040.0).abs() < 1e-12);
        let e = TwoBatchFit::through(64, 15_000.0, 256, 14_000.0).unwrap_err();
        assert!(e.contains("do not follow the tradeoff"), "{e}");
        assert!(TwoBatchFit::through(256, 1.0, 64, 2.0).is_err());
    }

    #[test]
    fn the_fit_pairs_b0_with_the_batch_nearest_four_times_it() {
        assert_eq!(fit_partner(64, &[64, 128, 256, 1024]), Some(256));
        assert_eq!(fit_partner(64, &[64, 128, 1024]), Some(128));
        assert_eq!(fit_partner(64, &[64]), None);
    }

    #[test]
    fn predictions_are_ruled_out_on_synthetic_data_few_steps_or_no_upper_bound() {
        assert!(ruled_out("synthetic", 500, true).unwrap().contains("random labels"));
        assert!(ruled_out("fashion-mnist", 3, true).unwrap().contains("3 measured step(s)"));
        assert!(ruled_out("fashion-mnist", 500, false).unwrap().contains("no upper bound"));
        assert_eq!(ruled_out("fashion-mnist", 500, true), None);
    }
}
