//! The gradient noise scale over windows of one run's steps, from its rank files'
//! norms. B_simple drifts as training goes (|G|² shrinks as the loss falls, tr(Σ) much
//! less), so a figure is only read with the steps it comes from:
//!
//! - the **target window** of a run that reached its `--target-loss`: its last
//!   [`TARGET_WINDOW_STEPS`] steps up to and including the step that reached the
//!   target (global steps `steps_to_target − 50` to `steps_to_target − 1`, from 0; all
//!   of them when it reached it sooner): the training near that loss, which is what a
//!   prediction of the samples to that loss needs;
//! - the **thirds** of a run's measured steps (by count, in step order): how far
//!   B_simple drifted from the first third to the last.
//!
//! Each window's estimate averages numerator and denominator over its measured steps
//! before their ratio is taken ([`crate::noise_scale::estimate`]), never the ratio.

use crate::noise_scale::{estimate, NormPair};
use crate::record::TargetOutcome;
use crate::reduce::read::Row;
use serde::Serialize;

/// Steps of the target window: 2.5 times the 20 steps `--target-loss` smooths over, so
/// that the window's estimate rests on more than the smoothing's own steps.
pub(crate) const TARGET_WINDOW_STEPS: u64 = 50;

/// One step that measured the norms, over the ranks: each field of the ranks' norm
/// pairs averaged (a norm not finite on any rank leaves the step's not finite), and
/// the ranks' mean loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoiseStep {
    pub global_step: u64,
    pub loss: f64,
    pub pair: NormPair,
}

impl NoiseStep {
    /// The step of `rows` (one per rank), when its ranks measured the norms.
    pub(crate) fn of(rows: &[Row]) -> Option<NoiseStep> {
        let pairs: Vec<&NormPair> = rows.iter().filter_map(|r| r.noise.as_ref()).collect();
        if pairs.is_empty() {
            return None;
        }
        let n = pairs.len() as f64;
        let mean = |f: fn(&NormPair) -> f64| pairs.iter().map(|p| f(p)).sum::<f64>() / n;
        Some(NoiseStep {
            global_step: rows[0].global_step,
            loss: rows.iter().map(|r| r.loss).sum::<f64>() / rows.len() as f64,
            pair: NormPair {
                batch_small: mean(|p| p.batch_small),
                sq_small: mean(|p| p.sq_small),
                batch_big: mean(|p| p.batch_big),
                sq_big: mean(|p| p.sq_big),
            },
        })
    }
}

/// Which steps a window holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowKind {
    FirstThird,
    MiddleThird,
    LastThird,
    /// The last [`TARGET_WINDOW_STEPS`] steps up to the step that reached the target.
    Target,
}

impl WindowKind {
    /// In words, for report.md.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            WindowKind::FirstThird => "first third",
            WindowKind::MiddleThird => "middle third",
            WindowKind::LastThird => "last third",
            WindowKind::Target => "the last 50 steps to the target",
        }
    }
}

/// The noise scale of one window of a run's measured steps.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NoiseWindow {
    pub window: WindowKind,
    /// The global steps (from 0) of its first and last measured step.
    pub first_step: u64,
    pub last_step: u64,
    /// Measured steps averaged, and those left out (a norm not finite).
    pub steps: usize,
    pub skipped: usize,
    /// The mean over its steps of the ranks' mean training loss (None when not finite).
    pub mean_loss: Option<f64>,
    /// The means of the steps' |G|² and tr(Σ) estimates (None when no step was usable).
    pub grad_sq: Option<f64>,
    pub trace_sigma: Option<f64>,
    /// tr(Σ)/|G|² in samples; None (undetermined) when the mean |G|² is not positive.
    pub b_simple: Option<f64>,
    /// Its 95 % interval; the upper end None when unbounded.
    pub b_simple_low: Option<f64>,
    pub b_simple_high: Option<f64>,
    /// The steps' norm pairs, for estimates pooled over several runs' windows.
    #[serde(skip)]
    pub pairs: Vec<NormPair>,
}

impl NoiseWindow {
    /// The window of `steps` (in step order, not empty).
    fn of(window: WindowKind, steps: &[NoiseStep]) -> NoiseWindow {
        let pairs: Vec<NormPair> = steps.iter().map(|s| s.pair).collect();
        let mean_loss = steps.iter().map(|s| s.loss).sum::<f64>() / steps.len() as f64;
        let (first_step, last_step) = (steps[0].global_step, steps[steps.len() - 1].global_step);
        let mut w = pooled(window, &pairs);
        w.first_step = first_step;
        w.last_step = last_step;
        w.mean_loss = mean_loss.is_finite().then_some(mean_loss);
        w
    }
}

/// The estimate of `pairs` as a window of kind `window` (steps and loss not set).
pub(crate) fn pooled(window: WindowKind, pairs: &[NormPair]) -> NoiseWindow {
    let e = estimate(pairs);
    NoiseWindow {
        window,
        first_step: 0,
        last_step: 0,
        steps: e.map_or(0, |e| e.steps),
        skipped: e.map_or(pairs.len(), |e| e.skipped),
        mean_loss: None,
        grad_sq: e.map(|e| e.grad_sq),
        trace_sigma: e.map(|e| e.trace_sigma),
        b_simple: e.and_then(|e| e.b_simple),
        b_simple_low: e.and_then(|e| e.interval).map(|i| i.0),
        b_simple_high: e.and_then(|e| e.interval).and_then(|i| i.1),
        pairs: pairs.to_vec(),
    }
}

/// The thirds of `steps` by count (boundaries at n/3 and 2n/3); none with fewer than 3.
pub(crate) fn thirds(steps: &[NoiseStep]) -> Vec<NoiseWindow> {
    let n = steps.len();
    if n < 3 {
        return Vec::new();
    }
    let kinds = [WindowKind::FirstThird, WindowKind::MiddleThird, WindowKind::LastThird];
    (0..3)
        .map(|k| NoiseWindow::of(kinds[k], &steps[k * n / 3..(k + 1) * n / 3]))
        .collect()
}

/// The target window of a run that reached its target after `steps_to_target` steps;
/// None when no step in it measured the norms.
pub(crate) fn target_window(steps: &[NoiseStep], steps_to_target: u64) -> Option<NoiseWindow> {
    let from = steps_to_target.saturating_sub(TARGET_WINDOW_STEPS);
    let inside: Vec<NoiseStep> = steps
        .iter()
        .filter(|s| (from..steps_to_target).contains(&s.global_step))
        .copied()
        .collect();
    (!inside.is_empty()).then(|| NoiseWindow::of(WindowKind::Target, &inside))
}

/// A run's windows: its thirds, then its target window when it reached its target.
pub(crate) fn windows(steps: &[NoiseStep], target: Option<&TargetOutcome>) -> Vec<NoiseWindow> {
    let mut out = thirds(steps);
    let reached = target.filter(|t| t.reached).and_then(|t| t.steps_to_target);
    out.extend(reached.and_then(|n| target_window(steps, n as u64)));
    out
}

/// The drift of B_simple over a run: the last third's over the first third's; None
/// when either is undetermined.
pub(crate) fn drift(windows: &[NoiseWindow]) -> Option<f64> {
    let b = |k: WindowKind| windows.iter().find(|w| w.window == k)?.b_simple;
    Some(b(WindowKind::LastThird)? / b(WindowKind::FirstThird)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step `g` of a run whose true |G|² falls as 1/(1 + g/10) while tr(Σ) stays 64:
    /// B_simple grows linearly, 64·(1 + g/10). The norms are their expectations,
    /// E|G_B|² = |G|² + tr(Σ)/B, at batches 32 (one rank) and 64 (the mean).
    fn drifting(g: u64) -> NoiseStep {
        let (grad_sq, trace) = (1.0 / (1.0 + g as f64 / 10.0), 64.0);
        NoiseStep {
            global_step: g,
            loss: 2.0 / (1.0 + g as f64 / 10.0),
            pair: NormPair {
                batch_small: 32.0,
                sq_small: grad_sq + trace / 32.0,
                batch_big: 64.0,
                sq_big: grad_sq + trace / 64.0,
            },
        }
    }

    /// Numerator and denominator averaged over the steps, then divided.
    fn ratio_of_means(from: u64, to: u64) -> f64 {
        let n = (to - from + 1) as f64;
        let g: f64 = (from..=to).map(|g| 1.0 / (1.0 + g as f64 / 10.0)).sum::<f64>() / n;
        64.0 / g
    }

    #[test]
    fn the_target_window_is_the_last_50_steps_to_the_reach_not_the_run() {
        // 300 steps; the target reached after step 240 (steps_to_target 241); the rows
        // go on to 299 (a step late on a GPU, or a later flush): they are left out.
        let steps: Vec<NoiseStep> = (0..300).map(drifting).collect();
        let w = target_window(&steps, 241).unwrap();
        assert_eq!(
            (w.window, w.first_step, w.last_step, w.steps, w.skipped),
            (WindowKind::Target, 191, 240, 50, 0)
        );
        let b = w.b_simple.unwrap();
        assert!((b - ratio_of_means(191, 240)).abs() < 1e-6 * b, "{b}");
        // Not the mean of the per-step ratios, and far from the whole run's figure.
        let mean_of_ratios = (191..=240).map(|g| 64.0 * (1.0 + g as f64 / 10.0)).sum::<f64>() / 50.0;
        assert!((b - mean_of_ratios).abs() > 1.0, "{b} {mean_of_ratios}");
        let whole = estimate(&steps[..241].iter().map(|s| s.pair).collect::<Vec<_>>()).unwrap();
        assert!(whole.b_simple.unwrap() < b / 2.0, "{whole:?} against {b}");
        // Exact expectations: every step gives the same ratio structure, so the
        // interval is narrow and holds the figure.
        assert!(w.b_simple_low.unwrap() <= b && b <= w.b_simple_high.unwrap());
        let loss = w.mean_loss.unwrap();
        assert!(loss < 2.0 / (1.0 + 19.1) && loss > 2.0 / (1.0 + 24.0), "{loss}");
        // Reached sooner than 50 steps: every step up to the reach.
        let early = target_window(&steps, 20).unwrap();
        assert_eq!((early.first_step, early.last_step, early.steps), (0, 19, 20));
    }

    #[test]
    fn the_window_holds_only_the_measured_steps_and_counts_the_skipped() {
        // Every 10th step measured, one of them overflowed.
        let mut steps: Vec<NoiseStep> = (0..300).step_by(10).map(drifting).collect();
        steps.iter_mut().find(|s| s.global_step == 220).unwrap().pair.sq_big = f64::NAN;
        let w = target_window(&steps, 241).unwrap();
        assert_eq!((w.first_step, w.last_step, w.steps, w.skipped), (200, 240, 4, 1));
        assert_eq!(target_window(&steps[..3], 241), None, "no measured step in the window");
    }

    #[test]
    fn thirds_show_the_drift_and_a_reached_target_adds_its_window() {
        let steps: Vec<NoiseStep> = (0..293).map(drifting).collect();
        let target = TargetOutcome {
            reached: true,
            steps_to_target: Some(293),
            ..TargetOutcome::default()
        };
        let w = windows(&steps, Some(&target));
        let spans: Vec<(WindowKind, u64, u64)> = w.iter().map(|w| (w.window, w.first_step, w.last_step)).collect();
        assert_eq!(
            spans,
            [
                (WindowKind::FirstThird, 0, 96),
                (WindowKind::MiddleThird, 97, 194),
                (WindowKind::LastThird, 195, 292),
                (WindowKind::Target, 243, 292)
            ]
        );
        let d = drift(&w).unwrap();
        let expected = ratio_of_means(195, 292) / ratio_of_means(0, 96);
        assert!((d - expected).abs() < 1e-6 * expected && d > 3.0, "{d} {expected}");
        // Not reached, or no target: the thirds alone.
        let missed = TargetOutcome { reached: false, ..target };
        assert_eq!(windows(&steps, Some(&missed)).len(), 3);
        assert_eq!(windows(&steps, None).len(), 3);
        assert!(windows(&steps[..2], None).is_empty());
    }

    #[test]
    fn a_step_is_the_mean_of_its_ranks_and_unmeasured_steps_are_none() {
        let row = |sq_small: f64, loss: f64, measured: bool| Row {
            global_step: 7,
            loss,
            noise: measured.then_some(NormPair {
                batch_small: 8.0,
                sq_small,
                batch_big: 16.0,
                sq_big: 1.0,
            }),
            ..Row::default()
        };
        let s = NoiseStep::of(&[row(2.0, 1.0, true), row(4.0, 3.0, true)]).unwrap();
        assert_eq!((s.global_step, s.loss, s.pair.sq_small, s.pair.sq_big), (7, 2.0, 3.0, 1.0));
        assert_eq!(NoiseStep::of(&[row(2.0, 1.0, false), row(4.0, 3.0, false)]), None);
        let nan = NoiseStep::of(&[row(f64::NAN, 1.0, true), row(4.0, 3.0, true)]).unwrap();
        assert!(!nan.pair.is_usable(), "a norm not finite on one rank: the step is skipped");
    }
}
