//! The gradient noise scale in the report: each run's B_simple epoch by epoch (from
//! its epochs.csv), and for each compared point the samples a bigger global batch is
//! predicted to need to reach the same loss, (1 + B/B_noise)/(1 + B0/B_noise), and
//! the time-to-accuracy speedup it leaves of the samples/s speedup. The prediction is
//! the noise-scale model's: these runs do not check it (that takes training to a
//! target loss at several global batches), and the report says so.

use super::RunReport;
use crate::noise_scale::samples_factor;
use crate::record::EpochRow;
use crate::reduce::analysis::noise_window::{drift, WindowKind};
use crate::reduce::analysis::samples_to_target::{ruled_out, Estimator, Trajectory, INTEGRATION_WINDOW_STEPS};
use crate::reduce::analysis::{ScalingMode, ScalingRow};
use serde::Serialize;
use std::fmt::Write;

/// One epoch's noise scale, as its epochs.csv row gives it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct EpochNoiseScale {
    pub epoch: usize,
    /// Measured steps averaged, and those left out (a norm not finite).
    pub steps: usize,
    pub skipped: usize,
    /// B_simple in samples; None when undetermined (the |G|² estimate not positive).
    pub b_simple: Option<f64>,
    /// Its 95 % interval; the upper end None when unbounded.
    pub b_simple_low: Option<f64>,
    pub b_simple_high: Option<f64>,
}

/// The epochs of `epochs` that measured the noise scale.
pub(crate) fn per_epoch(epochs: &[EpochRow]) -> Vec<EpochNoiseScale> {
    epochs
        .iter()
        .filter_map(|e| {
            Some(EpochNoiseScale {
                epoch: e.epoch,
                steps: e.noise_steps?,
                skipped: e.noise_skipped.unwrap_or(0),
                b_simple: e.b_simple,
                b_simple_low: e.b_simple_low,
                b_simple_high: e.b_simple_high,
            })
        })
        .collect()
}

/// A compared point's time to accuracy against its reference.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimeToAccuracyRow {
    pub run_ids: Vec<String>,
    pub scaling_mode: ScalingMode,
    pub global_batch: usize,
    /// The reference's global batch (B0).
    pub baseline_global_batch: usize,
    /// The noise scale used: B_simple of the run it came from, over the last 50 steps
    /// to its target when it reached a `--target-loss`, else over its last epoch.
    pub b_noise: f64,
    pub b_noise_low: Option<f64>,
    pub b_noise_high: Option<f64>,
    /// The run that measured it.
    pub b_noise_run: String,
    /// Which of its steps, in words (the target window's or the last epoch's).
    pub b_noise_window: String,
    /// Throughput speedup over the reference.
    pub samples_per_s_speedup: f64,
    /// Predicted samples to the same loss, relative to the reference's batch.
    pub samples_factor: f64,
    /// samples_per_s_speedup / samples_factor.
    pub time_to_accuracy_speedup: f64,
    /// Samples/s that buy no progress: samples_per_s × (1 − 1/samples_factor).
    pub statistical_loss_samples_per_s: f64,
    /// How the samples factor was predicted: integrated over the run's measured steps
    /// where its rank files hold them, else the noise-scale model at one window's B_simple.
    pub estimator: Estimator,
}

/// A compared point whose noise scale predicts nothing, and why.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NoTimeToAccuracy {
    pub run_ids: Vec<String>,
    pub global_batch: usize,
    pub baseline_global_batch: usize,
    /// The run whose noise scale was looked at.
    pub b_noise_run: String,
    /// Why, with the command that would give a prediction.
    pub reason: String,
}

/// A samples factor from one run's noise scale, and what it stands on.
struct NoiseFactor {
    factor: f64,
    /// B_simple over the steps used, with its interval.
    b_noise: f64,
    low: Option<f64>,
    high: Option<f64>,
    /// Which steps, in words.
    window: String,
    estimator: Estimator,
}

/// The samples factor of `run`'s noise scale at `batch` against `batch0`: integrated over
/// its measured steps where its rank files hold them, else the noise-scale model at its
/// last epoch's B_simple. None when the run measured no noise scale; Err why it
/// predicts nothing.
fn noise_factor(run: &RunReport, batch: f64, batch0: f64) -> Option<Result<NoiseFactor, String>> {
    if run.noise_steps.is_empty() {
        let (b_noise, low, high, window) = run_noise(run)?;
        let steps = run.noise_scale.last().map_or(0, |e| e.steps);
        return Some(match ruled_out(&run.dataset, steps, high.is_some()) {
            Some(why) => Err(why),
            None => Ok(NoiseFactor {
                factor: samples_factor(batch, batch0, b_noise),
                b_noise,
                low,
                high,
                window,
                estimator: Estimator::TargetWindow,
            }),
        });
    }
    let t = Trajectory::of(&[run.noise_steps.as_slice()], INTEGRATION_WINDOW_STEPS);
    if let Some(why) = ruled_out(&run.dataset, t.measured_steps, t.bounded) {
        return Some(Err(why));
    }
    let (Some(factor), Some(b_noise)) = (t.factor(batch, batch0), t.pooled_b_simple) else {
        return Some(Err("no measured step had a usable norm pair".into()));
    };
    let caveats = t.caveats();
    let window = format!(
        "integrated over {} window(s) of {} measured steps ({} steps{}{}); B_noise over all of them",
        t.windows.len(),
        t.window_steps,
        t.measured_steps,
        if caveats.is_empty() { "" } else { "; " },
        caveats
    );
    Some(Ok(NoiseFactor {
        factor,
        b_noise,
        low: t.pooled_low,
        high: t.pooled_high,
        window,
        estimator: Estimator::Integrated,
    }))
}

/// The determined noise scale of `run`, with its interval and its window in words:
/// over the last 50 steps to its target when it reached one (the training near that
/// loss), else over its last epoch.
fn run_noise(run: &RunReport) -> Option<(f64, Option<f64>, Option<f64>, String)> {
    if let Some(w) = run.noise_windows.iter().find(|w| w.window == WindowKind::Target) {
        let words = format!("the last 50 steps to the target, steps {}–{}", w.first_step, w.last_step);
        return Some((w.b_simple?, w.b_simple_low, w.b_simple_high, words));
    }
    let last = run.noise_scale.last()?;
    let words = format!("the last epoch ({}), {} measured step(s)", last.epoch, last.steps);
    Some((last.b_simple?, last.b_simple_low, last.b_simple_high, words))
}

/// One row per compared point whose run or reference measured a noise scale: from
/// the point's own run when it has one (the training state its batch reached), else
/// from the reference's; and the points whose noise scale predicts nothing, with why.
pub(crate) fn time_to_accuracy(scaling: &[ScalingRow], runs: &[RunReport]) -> (Vec<TimeToAccuracyRow>, Vec<NoTimeToAccuracy>) {
    let run = |id: &String| runs.iter().find(|r| &r.run_id == id);
    let (mut rows, mut none) = (Vec::new(), Vec::new());
    for r in scaling
        .iter()
        .filter(|r| !matches!(r.scaling_mode, ScalingMode::Baseline | ScalingMode::None) && r.speedup.is_finite())
    {
        let (Some(own), Some(base)) = (r.run_ids.first().and_then(run), r.baseline_run_ids.first().and_then(run)) else {
            continue;
        };
        let (b, b0) = (r.global_batch as f64, base.global_batch as f64);
        let Some((from, found)) = [own, base].into_iter().find_map(|x| noise_factor(x, b, b0).map(|f| (x, f))) else {
            continue;
        };
        match found {
            Ok(f) => rows.push(TimeToAccuracyRow {
                run_ids: r.run_ids.clone(),
                scaling_mode: r.scaling_mode,
                global_batch: r.global_batch,
                baseline_global_batch: base.global_batch,
                b_noise: f.b_noise,
                b_noise_low: f.low,
                b_noise_high: f.high,
                b_noise_run: from.run_id.clone(),
                b_noise_window: f.window,
                samples_per_s_speedup: r.speedup,
                samples_factor: f.factor,
                time_to_accuracy_speedup: r.speedup / f.factor,
                statistical_loss_samples_per_s: r.samples_per_s * (1.0 - 1.0 / f.factor),
                estimator: f.estimator,
            }),
            Err(reason) => none.push(NoTimeToAccuracy {
                run_ids: r.run_ids.clone(),
                global_batch: r.global_batch,
                baseline_global_batch: base.global_batch,
                b_noise_run: from.run_id.clone(),
                reason,
            }),
        }
    }
    (rows, none)
}

/// What `reduce` prints of the noise scale: each measuring run's last epoch, then each
/// compared point's predicted time to accuracy.
pub(crate) fn terminal_lines(runs: &[RunReport], rows: &[TimeToAccuracyRow], none: &[NoTimeToAccuracy]) -> Vec<String> {
    let mut out = Vec::new();
    for r in runs {
        let Some(e) = r.noise_scale.last() else { continue };
        let b = e.b_simple.map_or_else(|| "undetermined".into(), |b| format!("{b:.0}"));
        out.push(format!(
            "noise scale {} (global batch {}): B_simple {b} (95 % {} – {}) in epoch {}, {} step(s) measured, {} skipped",
            r.run_id,
            r.global_batch,
            cell(e.b_simple_low),
            e.b_simple_high.map_or_else(|| "unbounded".into(), |h| format!("{h:.0}")),
            e.epoch,
            e.steps,
            e.skipped
        ));
    }
    for t in rows {
        out.push(format!(
            "time to accuracy {} (B {} against B0 {}, B_noise {:.0}): samples/s speedup {:.2}, predicted samples factor {:.2}, \
             time-to-accuracy speedup {:.2} (a prediction of the noise-scale model)",
            t.run_ids.join(" "),
            t.global_batch,
            t.baseline_global_batch,
            t.b_noise,
            t.samples_per_s_speedup,
            t.samples_factor,
            t.time_to_accuracy_speedup
        ));
    }
    for n in none {
        out.push(format!(
            "time to accuracy {} (B {} against B0 {}): no prediction from `{}`'s noise scale: {}",
            n.run_ids.join(" "),
            n.global_batch,
            n.baseline_global_batch,
            n.b_noise_run,
            n.reason
        ));
    }
    if !out.is_empty() {
        out.insert(0, String::new());
    }
    out
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.0}"))
}

/// report.md's section: B_simple per run and epoch, then the time-to-accuracy table.
pub(crate) fn section(md: &mut String, runs: &[RunReport], rows: &[TimeToAccuracyRow], none: &[NoTimeToAccuracy]) {
    let measured: Vec<&RunReport> = runs.iter().filter(|r| !r.noise_scale.is_empty()).collect();
    if measured.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Gradient noise scale and time to accuracy\n\nB_simple = tr(Σ)/|G|² in samples, from two squared gradient norms per measured step (a rank's before the all-reduce and the mean after it, or one micro-batch's and the step's), numerator and denominator averaged over the epoch's steps; the interval is the delta method's at 95 %. Past B_simple, a bigger global batch needs proportionally more samples to reach the same loss.\n\n| run | global batch | epoch | steps (skipped) | B_simple | 95 % interval |\n|---|---:|---:|---:|---:|---|"
    );
    for r in &measured {
        for e in &r.noise_scale {
            let interval = interval(e.b_simple_low, e.b_simple_high);
            let b = e.b_simple.map_or_else(|| "undetermined".into(), |b| format!("{b:.0}"));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} ({}) | {b} | {interval} |",
                r.run_id, r.global_batch, e.epoch, e.steps, e.skipped
            );
        }
    }
    windows_table(md, &measured);
    for n in none {
        let _ = writeln!(
            md,
            "\nNo time-to-accuracy prediction for `{}` (B {} against B0 {}) from `{}`'s noise scale: {}.",
            super::verdict::point_label(&n.run_ids),
            n.global_batch,
            n.baseline_global_batch,
            n.b_noise_run,
            n.reason
        );
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nPredicted time to accuracy: samples to the same loss relative to the reference's batch B0, and the time-to-accuracy speedup = samples/s speedup ÷ that factor. The factor is integrated over the run's measured steps: the mean of (B + B_noise(t))/(B0 + B_noise(t)) with B_noise(t) the B_simple of windows of {INTEGRATION_WINDOW_STEPS} measured steps, since B_simple drifts several-fold as training goes ((1 + B/B_noise)/(1 + B0/B_noise) at one window's B_simple where the rank files hold no norms). The statistical loss (samples/s that buy no progress) sits beside the efficiency waterfall above, not inside it. These are predictions of the noise-scale model, not checked against training to a target loss in these runs; the B_noise column is the B_simple over the steps named beside it. {}\n\n| point | mode | B | B0 | B_noise (interval) | samples/s speedup | samples factor | time-to-accuracy speedup | statistical loss samples/s |\n|---|---|---:|---:|---|---:|---:|---:|---:|",
        crate::reduce::analysis::samples_to_target::checked_error_text(runs.iter().map(super::target::optimizer_of))
    );
    for t in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} ({} – {}) from `{}`, {} | {:.2} | {:.2} | {:.2} | {:.1} |",
            super::verdict::point_label(&t.run_ids),
            t.scaling_mode,
            t.global_batch,
            t.baseline_global_batch,
            t.b_noise,
            cell(t.b_noise_low),
            t.b_noise_high.map_or_else(|| "unbounded".into(), |v| format!("{v:.0}")),
            t.b_noise_run,
            t.b_noise_window,
            t.samples_per_s_speedup,
            t.samples_factor,
            t.time_to_accuracy_speedup,
            t.statistical_loss_samples_per_s
        );
    }
}

/// A B_simple interval in words: `low – high`, `low – unbounded`, or `–`.
fn interval(low: Option<f64>, high: Option<f64>) -> String {
    match (low, high) {
        (Some(l), Some(h)) => format!("{l:.0} – {h:.0}"),
        (Some(l), None) => format!("{l:.0} – unbounded"),
        _ => "–".into(),
    }
}

/// report.md's table of B_simple over windows of each run's steps, with its drift from
/// the first third to the last.
fn windows_table(md: &mut String, runs: &[&RunReport]) {
    let with: Vec<&&RunReport> = runs.iter().filter(|r| !r.noise_windows.is_empty()).collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nB_simple drifts as training goes (|G|² falls with the loss, tr(Σ) much less), so each figure is read with its steps. Over windows of each run's measured steps, from its rank files, numerator and denominator averaged over the window: its thirds (by count of measured steps), and for a run that reached its `--target-loss`, the last 50 steps to the target (steps from 0), the window the predictions of samples to that loss use.\n\n| run | window | steps | measured (skipped) | mean loss | B_simple | 95 % interval |\n|---|---|---|---:|---:|---:|---|"
    );
    for r in &with {
        for w in &r.noise_windows {
            let b = w.b_simple.map_or_else(|| "undetermined".into(), |b| format!("{b:.0}"));
            let loss = w.mean_loss.map_or_else(|| "–".into(), |l| format!("{l:.3}"));
            let _ = writeln!(
                md,
                "| {} | {} | {}–{} | {} ({}) | {loss} | {b} | {} |",
                r.run_id,
                w.window.describe(),
                w.first_step,
                w.last_step,
                w.steps,
                w.skipped,
                interval(w.b_simple_low, w.b_simple_high)
            );
        }
    }
    for r in &with {
        if let Some(d) = drift(&r.noise_windows) {
            let _ = writeln!(
                md,
                "\n`{}`: B_simple drifted ×{d:.2} from its first third of measured steps to its last.",
                r.run_id
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_without_a_measurement_are_left_out_and_undetermined_kept() {
        let row = |epoch, steps: Option<usize>, b: Option<f64>| EpochRow {
            epoch,
            noise_steps: steps,
            noise_skipped: steps.map(|_| 1),
            b_simple: b,
            b_simple_low: b.map(|b| b / 2.0),
            ..crate::record::epoch_row_example()
        };
        let got = per_epoch(&[row(0, None, None), row(1, Some(9), None), row(2, Some(9), Some(100.0))]);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].epoch, got[0].b_simple, got[0].skipped), (1, None, 1));
        assert_eq!(
            (got[1].b_simple, got[1].b_simple_low, got[1].b_simple_high),
            (Some(100.0), Some(50.0), None)
        );
    }
}
