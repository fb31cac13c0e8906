//! Runs trained to a target loss (`train --target-loss`): per workload and target, the
//! samples each global batch needed, as a ratio to the smallest global batch that
//! reached the target, beside the noise-scale model's prediction of that ratio,
//! (1 + B/B_noise)/(1 + B0/B_noise), and the prediction's error.

use super::RunReport;
use crate::noise_scale::samples_factor;
use crate::record::{OptimizerKind, TargetGoal, TargetOutcome};
use crate::reduce::analysis::noise_window::{pooled, NoiseStep, NoiseWindow, WindowKind};
use crate::reduce::analysis::samples_to_target::{
    accuracy_checked_error_text, checked_error_text, fit_partner, ruled_out, Estimator, Prediction, TargetCurve, Trajectory, TwoBatchFit,
    CHOSEN, INTEGRATION_WINDOW_STEPS,
};
use serde::Serialize;
use std::fmt::Write;

/// One learning rate of one global batch: its runs and their median reach.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LrPoint {
    /// The learning rate the runs followed, in words (their `target.lr_rule`).
    pub lr_rule: String,
    /// The rate after the warm-up (`target.peak_lr`); None for runs recorded before it was.
    pub peak_lr: Option<f64>,
    pub run_ids: Vec<String>,
    /// How many of them reached the target.
    pub reached: usize,
    /// Of those, the runs that reached it within the learning rate's warm-up: they
    /// measure the warm-up, not samples to the target, and are counted as not reaching it.
    pub in_warmup: Vec<String>,
    /// The median over the runs, a run that did not reach the target counted as never
    /// reaching it: None unless more than half of them reached it (with two runs, both).
    pub samples_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
}

/// Where a batch's best learning rate sits in the grid of rates its runs tried, when it
/// sits at an end: the grid did not bracket it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GridEdge {
    Lowest,
    Highest,
}

impl GridEdge {
    fn words(self) -> (&'static str, &'static str) {
        match self {
            GridEdge::Lowest => ("lowest", "below"),
            GridEdge::Highest => ("highest", "above"),
        }
    }
}

/// Where the prediction's noise scale comes from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NoiseSource {
    /// In words, for report.md: which window of which runs.
    pub window: String,
    /// The runs, and per run the global steps (from 0) of its window's first and last
    /// measured step.
    pub run_ids: Vec<String>,
    pub steps: Vec<(u64, u64)>,
    /// Measured steps averaged over all of them, and those skipped.
    pub measured_steps: usize,
    pub skipped: usize,
    /// B_simple's 95 % interval; the upper end None when unbounded.
    pub b_simple_low: Option<f64>,
    pub b_simple_high: Option<f64>,
}

/// One global batch of one workload and target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TargetRow {
    pub model: String,
    pub dataset: String,
    /// The runs' optimizer (from their comparison key): which check's error applies.
    pub optimizer: Option<OptimizerKind>,
    /// The comparison key's text: the runs of a row share it.
    pub key: String,
    /// The target: `target_loss` or `target_accuracy` in report.json.
    #[serde(flatten)]
    pub goal: TargetGoal,
    pub global_batch: usize,
    /// The runs at this global batch, and how many reached the target.
    pub run_ids: Vec<String>,
    pub reached: usize,
    /// Each learning rate the runs at this batch followed (a grid), in the order met.
    pub learning_rates: Vec<LrPoint>,
    /// The best learning rate: the one of the fewest median samples to target (the
    /// first one's when none reached it).
    pub lr_rule: String,
    /// Set when the best learning rate is the lowest or highest of two or more rates
    /// tried at this batch (each with its `peak_lr`): the grid did not bracket it.
    pub best_lr_at_edge: Option<GridEdge>,
    /// The best learning rate's median samples and seconds to target; None when no
    /// learning rate's runs reached it.
    pub samples_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    /// The smallest global batch of the workload and target whose runs reached it (B0).
    pub baseline_global_batch: Option<usize>,
    /// samples_to_target / B0's.
    pub measured_ratio: Option<f64>,
    /// The smallest and largest ratio of one run's samples to one B0 run's, over the
    /// best learning rates' runs that reached the target: the spread of the repeats.
    pub measured_ratio_low: Option<f64>,
    pub measured_ratio_high: Option<f64>,
    /// The noise scale the prediction uses: B_simple pooled over the target windows
    /// (the last 50 steps to the target) of B0's best-learning-rate runs; a B0 run's
    /// last epoch only where no such window measured the norms.
    pub b_noise: Option<f64>,
    /// The first run it came from (all of them in `b_noise_from`).
    pub b_noise_run: Option<String>,
    pub b_noise_from: Option<NoiseSource>,
    /// The chosen prediction's ratio ([`CHOSEN`], the integrated one).
    pub predicted_ratio: Option<f64>,
    /// measured_ratio / predicted_ratio − 1.
    pub relative_error: Option<f64>,
    /// Every prediction, the chosen one first: integrated over B0's run, the target
    /// window's, and the two-batch fit's, each with its figure or why it has none.
    pub predictions: Vec<Prediction>,
    /// The integrated prediction's inputs, where it gave a figure: what the
    /// recommendation's time to target stands on (not in report.json: `predictions` has
    /// its figures).
    #[serde(skip)]
    pub(crate) curve: Option<TargetCurve>,
}

/// A run's optimizer, as its comparison key records it.
pub(crate) fn optimizer_of(r: &RunReport) -> Option<OptimizerKind> {
    r.comparison_key.as_ref().and_then(|k| k.optimizer)
}

/// The median of `v` (not empty), None when not finite.
fn median(v: &[f64]) -> Option<f64> {
    Some(crate::stats::median(v)).filter(|m| m.is_finite())
}

/// The groups of runs that share model, data set, key and target, each sorted by batch.
fn groups(runs: &[RunReport]) -> Vec<Vec<(&RunReport, &TargetOutcome)>> {
    let mut groups: Vec<Vec<(&RunReport, &TargetOutcome)>> = Vec::new();
    let same = |a: &(&RunReport, &TargetOutcome), r: &RunReport, goal: TargetGoal| {
        a.0.model == r.model
            && a.0.dataset == r.dataset
            && a.0.comparison_key == r.comparison_key
            && a.1.goal().is_some_and(|g| g.same(goal))
    };
    for r in runs {
        // A manifest with neither target or both is judged when the run is read.
        let Some((t, goal)) = r.target.as_ref().and_then(|t| Some((t, t.goal()?))) else {
            continue;
        };
        match groups.iter_mut().find(|g| same(&g[0], r, goal)) {
            Some(g) => g.push((r, t)),
            None => groups.push(vec![(r, t)]),
        }
    }
    for g in &mut groups {
        g.sort_by_key(|(r, _)| r.global_batch);
    }
    groups
}

type Run<'a> = (&'a RunReport, &'a TargetOutcome);

/// The runs of one global batch grouped by learning rate, and the best of them.
struct Batch<'a> {
    points: Vec<(LrPoint, Vec<Run<'a>>)>,
    best: usize,
}

impl<'a> Batch<'a> {
    fn of(runs: &[Run<'a>]) -> Batch<'a> {
        let mut by_lr: Vec<Vec<Run<'a>>> = Vec::new();
        for &run in runs {
            match by_lr.iter_mut().find(|g| g[0].1.lr_rule == run.1.lr_rule) {
                Some(g) => g.push(run),
                None => by_lr.push(vec![run]),
            }
        }
        let figure = |g: &[Run], f: fn(&TargetOutcome) -> Option<f64>| {
            let v: Vec<f64> = g
                .iter()
                .map(|(_, t)| f(t).filter(|_| t.measures_samples()).unwrap_or(f64::INFINITY))
                .collect();
            median(&v)
        };
        let points: Vec<(LrPoint, Vec<Run>)> = by_lr
            .into_iter()
            .map(|g| {
                let point = LrPoint {
                    lr_rule: g[0].1.lr_rule.clone(),
                    peak_lr: g[0].1.peak_lr,
                    run_ids: g.iter().map(|(r, _)| r.run_id.clone()).collect(),
                    reached: g.iter().filter(|(_, t)| t.reached).count(),
                    in_warmup: g
                        .iter()
                        .filter(|(_, t)| t.reached_in_warmup())
                        .map(|(r, _)| r.run_id.clone())
                        .collect(),
                    samples_to_target: figure(&g, |t| t.samples_to_target.map(|s| s as f64)),
                    seconds_to_target: figure(&g, |t| t.seconds_to_target),
                };
                (point, g)
            })
            .collect();
        let best = (0..points.len())
            .filter(|&i| points[i].0.samples_to_target.is_some())
            .min_by(|&a, &b| {
                points[a]
                    .0
                    .samples_to_target
                    .unwrap()
                    .total_cmp(&points[b].0.samples_to_target.unwrap())
            })
            .unwrap_or(0);
        Batch { points, best }
    }

    fn best(&self) -> &LrPoint {
        &self.points[self.best].0
    }

    /// Where the best rate sits when it is an end of two or more rates that all say
    /// their value; None when it is inside, or nothing reached the target.
    fn edge(&self) -> Option<GridEdge> {
        let lrs: Vec<f64> = self.points.iter().map(|(p, _)| p.peak_lr).collect::<Option<_>>()?;
        let best = self.best().samples_to_target.and(lrs.get(self.best).copied())?;
        if lrs.len() < 2 {
            None
        } else if lrs.iter().all(|&l| l >= best) {
            Some(GridEdge::Lowest)
        } else if lrs.iter().all(|&l| l <= best) {
            Some(GridEdge::Highest)
        } else {
            None
        }
    }

    /// Samples to target of the best learning rate's runs that reached it.
    fn best_samples(&self) -> Vec<f64> {
        self.points[self.best]
            .1
            .iter()
            .filter(|(_, t)| t.measures_samples())
            .filter_map(|(_, t)| t.samples_to_target.map(|s| s as f64))
            .collect()
    }

    /// The measured steps before the reach of each of the best learning rate's runs
    /// that reached the target (runs without such steps left out).
    fn steps_before_reach(&self) -> Vec<Vec<NoiseStep>> {
        self.points[self.best]
            .1
            .iter()
            .filter(|(_, t)| t.measures_samples())
            .filter_map(|(r, t)| {
                let end = t.steps_to_target? as u64;
                let s: Vec<NoiseStep> = r.noise_steps.iter().filter(|s| s.global_step < end).copied().collect();
                (!s.is_empty()).then_some(s)
            })
            .collect()
    }

    /// Each of those runs' own trajectory, one run at a time.
    fn run_trajectories(steps: &[Vec<NoiseStep>]) -> Vec<Trajectory> {
        steps.iter().map(|s| Trajectory::of(&[s], INTEGRATION_WINDOW_STEPS)).collect()
    }

    /// B_simple over windows of those runs' steps together; None when none measured the
    /// norms.
    fn trajectory(steps: &[Vec<NoiseStep>]) -> Option<Trajectory> {
        let runs: Vec<&[NoiseStep]> = steps.iter().map(Vec::as_slice).collect();
        (!runs.is_empty()).then(|| Trajectory::of(&runs, INTEGRATION_WINDOW_STEPS))
    }

    /// The noise scale of the best learning rate's runs: their target windows pooled,
    /// else the first one's last epoch.
    fn noise(&self) -> Option<(f64, NoiseSource)> {
        let runs: Vec<&RunReport> = self.points[self.best].1.iter().map(|(r, _)| *r).collect();
        let windows: Vec<(&RunReport, &NoiseWindow)> = runs
            .iter()
            .filter_map(|r| Some((*r, r.noise_windows.iter().find(|w| w.window == WindowKind::Target)?)))
            .collect();
        if !windows.is_empty() {
            let pairs: Vec<_> = windows.iter().flat_map(|(_, w)| w.pairs.iter().copied()).collect();
            let pooled = pooled(WindowKind::Target, &pairs);
            let spans: Vec<String> = windows
                .iter()
                .map(|(r, w)| format!("`{}` steps {}–{}", r.run_id, w.first_step, w.last_step))
                .collect();
            return Some((
                pooled.b_simple?,
                NoiseSource {
                    window: format!("the last 50 steps to the target of {}", spans.join(", ")),
                    run_ids: windows.iter().map(|(r, _)| r.run_id.clone()).collect(),
                    steps: windows.iter().map(|(_, w)| (w.first_step, w.last_step)).collect(),
                    measured_steps: pooled.steps,
                    skipped: pooled.skipped,
                    b_simple_low: pooled.b_simple_low,
                    b_simple_high: pooled.b_simple_high,
                },
            ));
        }
        runs.iter().find_map(|r| {
            let e = r.noise_scale.last()?;
            Some((
                e.b_simple?,
                NoiseSource {
                    window: format!(
                        "the last epoch ({}) of `{}`: its rank files hold no norms of the steps to the target",
                        e.epoch, r.run_id
                    ),
                    run_ids: vec![r.run_id.clone()],
                    steps: Vec::new(),
                    measured_steps: e.steps,
                    skipped: e.skipped,
                    b_simple_low: e.b_simple_low,
                    b_simple_high: e.b_simple_high,
                },
            ))
        })
    }
}

/// The smallest and largest ratio of a sample count of `runs` to one of `base`.
fn ratio_range(runs: &[f64], base: &[f64]) -> Option<(f64, f64)> {
    if runs.is_empty() || base.is_empty() {
        return None;
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    Some((min(runs) / max(base), max(runs) / min(base)))
}

/// What B0's runs (and, for the fit, one larger batch) give the three predictions.
struct Predictors {
    dataset: String,
    optimizer: Option<OptimizerKind>,
    batch0: usize,
    /// B0's median samples to target.
    e0: f64,
    trajectory: Option<Trajectory>,
    /// Each B0 run's own trajectory, for the integrated prediction's range.
    per_run: Vec<Trajectory>,
    noise: Option<(f64, NoiseSource)>,
    /// The two-batch fit, or why there is none; None without a second batch.
    fit: Option<Result<TwoBatchFit, String>>,
}

impl Predictors {
    /// The integrated prediction's inputs, when it may predict.
    fn curve(&self, goal: TargetGoal) -> Option<TargetCurve> {
        let t = self.trajectory.as_ref()?;
        ruled_out(&self.dataset, t.measured_steps, t.bounded)
            .is_none()
            .then(|| TargetCurve {
                goal,
                batch0: self.batch0,
                samples0: self.e0,
                trajectory: t.clone(),
                optimizer: self.optimizer,
            })
    }

    /// The three predictions at global batch `batch`, the chosen one first, with their
    /// errors against the `measured` ratio.
    fn at(&self, batch: usize, measured: Option<f64>) -> Vec<Prediction> {
        let (b, b0) = (batch as f64, self.batch0 as f64);
        let integrated = match &self.trajectory {
            None => Prediction::none(
                Estimator::Integrated,
                "B0's runs' measured steps to the target".into(),
                "no run at B0 measured the norms before it reached the target (--noise-scale on)".into(),
            ),
            Some(t) => {
                let caveats = t.caveats();
                let basis = format!(
                    "B_simple over {} window(s) of {} measured steps of B0's runs before the target ({} steps{}{})",
                    t.windows.len(),
                    t.window_steps,
                    t.measured_steps,
                    if caveats.is_empty() { "" } else { "; " },
                    caveats
                );
                match (ruled_out(&self.dataset, t.measured_steps, t.bounded), t.factor(b, b0)) {
                    (None, Some(f)) => {
                        let per_run: Vec<f64> = self.per_run.iter().filter_map(|r| r.factor(b, b0)).collect();
                        Prediction::of(Estimator::Integrated, basis, f, measured).with_range(&per_run)
                    }
                    (why, _) => Prediction::none(Estimator::Integrated, basis, why.unwrap_or_else(|| "no measured step".into())),
                }
            }
        };
        let window = match &self.noise {
            None => Prediction::none(
                Estimator::TargetWindow,
                "B0's runs' last 50 steps to the target".into(),
                "no B_simple measured at B0 (--noise-scale on)".into(),
            ),
            Some((n, from)) => {
                let basis = format!("B_noise {n:.0}: {}", from.window);
                match ruled_out(&self.dataset, from.measured_steps, from.b_simple_high.is_some()) {
                    None => Prediction::of(Estimator::TargetWindow, basis, samples_factor(b, b0, *n), measured),
                    Some(why) => Prediction::none(Estimator::TargetWindow, basis, why),
                }
            }
        };
        let fit = match &self.fit {
            None => Prediction::none(
                Estimator::TwoBatchFit,
                "B0 and a larger batch's samples to target".into(),
                "only one batch reached the target: the fit needs two (B0 and about 4 × B0)".into(),
            ),
            Some(Err(why)) => Prediction::none(Estimator::TwoBatchFit, "B0 and a larger batch".into(), why.clone()),
            Some(Ok(f)) => {
                let basis = format!(
                    "E(B) = {:.0} + {:.1}·B through the measured B {} and {}",
                    f.e_min, f.s_min, f.batch0, f.batch1
                );
                if batch == f.batch1 {
                    Prediction::none(Estimator::TwoBatchFit, basis, "an input of the fit".into())
                } else {
                    Prediction::of(Estimator::TwoBatchFit, basis, f.factor(b, self.e0), measured)
                }
            }
        };
        let mut all = vec![integrated, window, fit];
        all.sort_by_key(|p| p.estimator != CHOSEN);
        all
    }
}

/// One row per global batch of every workload and target the runs were trained to.
pub(crate) fn rows(runs: &[RunReport]) -> Vec<TargetRow> {
    let mut out = Vec::new();
    for group in groups(runs) {
        let mut batches: Vec<usize> = group.iter().map(|(r, _)| r.global_batch).collect();
        batches.dedup();
        // Each global batch's runs and their learning rates, grouped once.
        let per: Vec<(usize, Vec<Run>, Batch)> = batches
            .iter()
            .map(|&b| {
                let at: Vec<Run> = group.iter().filter(|(r, _)| r.global_batch == b).copied().collect();
                let batch = Batch::of(&at);
                (b, at, batch)
            })
            .collect();
        let samples = |b: usize| per.iter().find(|p| p.0 == b).and_then(|p| p.2.best().samples_to_target);
        let reached: Vec<usize> = batches.iter().copied().filter(|&b| samples(b).is_some()).collect();
        let base = reached.first().copied();
        let base_batch = base.and_then(|b0| per.iter().find(|p| p.0 == b0)).map(|p| &p.2);
        let noise = base_batch.and_then(Batch::noise);
        // B0's steps before the reach, read once for both trajectories.
        let base_steps = base_batch.map(Batch::steps_before_reach).unwrap_or_default();
        let predictors = base.zip(base.and_then(samples)).map(|(b0, e0)| {
            let fit = fit_partner(b0, &reached).map(|b1| TwoBatchFit::through(b0, e0, b1, samples(b1).unwrap_or(f64::NAN)));
            Predictors {
                dataset: group[0].0.dataset.clone(),
                optimizer: optimizer_of(group[0].0),
                batch0: b0,
                e0,
                trajectory: Batch::trajectory(&base_steps),
                per_run: Batch::run_trajectories(&base_steps),
                noise: noise.clone(),
                fit,
            }
        });
        for (b, at, batch) in &per {
            let b = *b;
            let best = batch.best();
            let (first, t) = at[0];
            let goal = t.goal().expect("grouped runs have a goal");
            let s0 = base_batch.and_then(|x| x.best().samples_to_target);
            let measured = best.samples_to_target.zip(s0).map(|(s, s0)| s / s0);
            let range = base_batch.and_then(|x| ratio_range(&batch.best_samples(), &x.best_samples()));
            let predictions = predictors.as_ref().map_or_else(Vec::new, |p| p.at(b, measured));
            let chosen = predictions.iter().find(|p| p.estimator == CHOSEN);
            let predicted = chosen.and_then(|p| p.ratio);
            out.push(TargetRow {
                model: first.model.clone(),
                dataset: first.dataset.clone(),
                optimizer: optimizer_of(first),
                key: first.comparison_key.as_ref().map(|k| k.describe()).unwrap_or_default(),
                goal,
                global_batch: b,
                run_ids: at.iter().map(|(r, _)| r.run_id.clone()).collect(),
                reached: at.iter().filter(|(_, t)| t.reached).count(),
                lr_rule: best.lr_rule.clone(),
                best_lr_at_edge: batch.edge(),
                samples_to_target: best.samples_to_target,
                seconds_to_target: best.seconds_to_target,
                learning_rates: batch.points.iter().map(|(p, _)| p.clone()).collect(),
                baseline_global_batch: base,
                measured_ratio: measured,
                measured_ratio_low: range.filter(|_| measured.is_some()).map(|r| r.0),
                measured_ratio_high: range.filter(|_| measured.is_some()).map(|r| r.1),
                b_noise: noise.as_ref().map(|(n, _)| *n),
                b_noise_run: noise.as_ref().map(|(_, from)| from.run_ids[0].clone()),
                b_noise_from: noise.as_ref().map(|(_, from)| from.clone()),
                predicted_ratio: predicted,
                relative_error: measured.zip(predicted).map(|(m, p)| m / p - 1.0),
                predictions,
                curve: predictors.as_ref().and_then(|p| p.curve(goal)),
            });
        }
    }
    out
}

/// What `reduce` prints of runs trained to a target: one line per global batch.
pub(crate) fn terminal_lines(rows: &[TargetRow]) -> Vec<String> {
    let mut out = Vec::new();
    for t in rows {
        let figures = match (t.samples_to_target, t.measured_ratio) {
            (Some(s), Some(m)) => format!(
                "{s:.0} samples to target, {m:.2}× B0's; predicted {} ({}), error {}",
                cell(t.predicted_ratio, 2),
                CHOSEN.describe(),
                t.relative_error.map_or_else(|| "–".into(), |e| format!("{:+.0} %", e * 100.0))
            ),
            _ => "target not reached: no samples to target".into(),
        };
        let edge = t.best_lr_at_edge.map_or_else(String::new, |e| {
            let (end, side) = e.words();
            format!("; its best learning rate is the grid's {end}: add rates {side} it")
        });
        out.push(format!(
            "target {} {} on {} (B {}, B0 {}): {} of {} run(s) reached it; {figures}{edge}",
            t.goal,
            t.model,
            t.dataset,
            t.global_batch,
            t.baseline_global_batch.map_or_else(|| "–".into(), |b| b.to_string()),
            t.reached,
            t.run_ids.len()
        ));
    }
    if !out.is_empty() {
        out.insert(0, String::new());
    }
    out
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

/// report.md's section; nothing when no run was trained to a target.
pub(crate) fn section(md: &mut String, rows: &[TargetRow]) {
    if rows.is_empty() {
        return;
    }
    let losses: Vec<_> = rows
        .iter()
        .filter(|t| matches!(t.goal, TargetGoal::TrainingLoss(_)))
        .map(|t| t.optimizer)
        .collect();
    let loss_check = if losses.is_empty() {
        String::new()
    } else {
        checked_error_text(losses)
    };
    let _ = writeln!(
        md,
        "\n## Samples to a target: measured against predicted\n\nRuns trained with `--target-loss` stop when the training loss, averaged over the ranks and over the last 20 measured steps, is at or below the target.{} Per global batch B and learning rate: the median samples to the target over its runs (a run that did not reach it counts as never reaching it, so a median needs more than half of them). A batch's figure is its best learning rate's (the fewest median samples); its ratio to the smallest global batch B0 that reached the target, with the range over pairs of single runs; the prediction integrated over B0's training: the mean over the measured steps before the target of B0's best-learning-rate runs of (B + B_noise(t))/(B0 + B_noise(t)), B_noise(t) the B_simple of windows of {INTEGRATION_WINDOW_STEPS} measured steps (numerator and denominator averaged over each), since B_simple drifts several-fold as training goes; and the prediction's error (measured ÷ predicted − 1). The two others, the noise-scale model at the target window's B_simple and a fit of the tradeoff through two measured batches, follow in their own table. A batch whose runs did not reach the target has no figure. {}\n\n| model | data | target | B | runs (reached) | samples to target | seconds to target | measured ratio (range) | predicted ratio (range over B0's runs) | error | best learning rate |\n|---|---|---:|---:|---:|---:|---:|---|---|---:|---|",
        accuracy_rule(rows),
        loss_check
    );
    for t in rows {
        let predicted = match t.predictions.first() {
            Some(Prediction {
                ratio: Some(r),
                ratio_low: Some(lo),
                ratio_high: Some(hi),
                ..
            }) => format!("{r:.2} ({lo:.2} – {hi:.2})"),
            Some(Prediction { ratio: Some(r), .. }) => format!("{r:.2}"),
            Some(Prediction {
                none_because: Some(why), ..
            }) => format!("– ({})", why.replace('|', "\\|")),
            _ => "– (no B_simple measured at B0)".into(),
        };
        let error = t.relative_error.map_or_else(|| "–".into(), |e| format!("{:+.0} %", e * 100.0));
        let measured = match (t.measured_ratio, t.measured_ratio_low, t.measured_ratio_high) {
            (Some(m), Some(l), Some(h)) => format!("{m:.2} ({l:.2} – {h:.2})"),
            (m, _, _) => cell(m, 2),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) | {} | {} | {measured} | {predicted} | {error} | {} |",
            t.model,
            t.dataset,
            t.goal,
            t.global_batch,
            t.run_ids.len(),
            t.reached,
            cell(t.samples_to_target, 0),
            cell(t.seconds_to_target, 1),
            t.lr_rule.replace('|', "/"),
        );
    }
    batch_notes(md, rows);
    predictions_table(md, rows);
    let mut sources: Vec<&NoiseSource> = Vec::new();
    for t in rows {
        if let (Some(n), Some(from)) = (t.b_noise, t.b_noise_from.as_ref()) {
            if !sources.contains(&from) {
                sources.push(from);
                let high = from.b_simple_high.map_or_else(|| "unbounded".into(), |h| format!("{h:.0}"));
                let _ = writeln!(
                    md,
                    "\nB_noise {n:.0} (95 % {} – {high}) for {} of {}: from {}, {} measured step(s), {} skipped.",
                    cell(from.b_simple_low, 0),
                    t.goal,
                    t.model,
                    from.window,
                    from.measured_steps,
                    from.skipped
                );
            }
        }
    }
    if rows.iter().any(|t| t.learning_rates.len() > 1) {
        let _ = writeln!(
            md,
            "\nEvery learning rate tried (median over its runs):\n\n| model | target | B | learning rate | runs (reached) | samples to target | seconds to target |\n|---|---:|---:|---|---:|---:|---:|"
        );
        for t in rows {
            for p in &t.learning_rates {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} ({}) | {} | {} |",
                    t.model,
                    t.goal,
                    t.global_batch,
                    p.lr_rule.replace('|', "/"),
                    p.run_ids.len(),
                    p.reached,
                    cell(p.samples_to_target, 0),
                    cell(p.seconds_to_target, 1)
                );
            }
        }
    }
}

/// The section's sentence on targets of validation accuracy, when a row has one: how
/// they are checked, and the prediction's error as checked for such targets.
fn accuracy_rule(rows: &[TargetRow]) -> String {
    let accuracy: Vec<&TargetRow> = rows
        .iter()
        .filter(|t| matches!(t.goal, TargetGoal::ValidationAccuracy(_)))
        .collect();
    if accuracy.is_empty() {
        return String::new();
    }
    format!(
        " Runs trained with `--target-accuracy` stop at the first validation (every `--val-every` optimizer steps, \
         outside the timed steps) whose accuracy is at or above the target: their samples to the target are known to \
         within that many steps, and their seconds include the validations. {}",
        accuracy_checked_error_text(accuracy.iter().map(|t| t.optimizer))
    )
}

/// report.md's sentences per batch below the table: a prediction without a range, a
/// best learning rate at the grid's edge, runs that reached the target in the warm-up.
fn batch_notes(md: &mut String, rows: &[TargetRow]) {
    let mut no_range: Vec<String> = Vec::new();
    for t in rows {
        let why = t
            .predictions
            .first()
            .filter(|p| p.ratio.is_some() && t.global_batch != t.baseline_global_batch.unwrap_or(0));
        if let Some(why) = why.and_then(|p| p.range_none_because.clone()) {
            let line = format!(
                "\nThe prediction for {} of {} carries no range over B0's runs: {why}.",
                t.goal, t.model
            );
            if !no_range.contains(&line) {
                let _ = writeln!(md, "{line}");
                no_range.push(line);
            }
        }
        if let Some(edge) = t.best_lr_at_edge {
            let (end, side) = edge.words();
            let _ = writeln!(
                md,
                "\nAt B {}, the best learning rate ({}) is the {end} of the {} rates whose runs finished: the grid did not \
                 bracket it, so a rate {side} it may need fewer samples and the batch's figure (and every ratio to it) \
                 may change; add rates {side} it (a study's `[lr_grid]` factors, or --lr). A rate whose runs diverged is \
                 not among them: such runs are listed as incomplete.",
                t.global_batch,
                t.learning_rates
                    .iter()
                    .find(|p| p.lr_rule == t.lr_rule)
                    .and_then(|p| p.peak_lr)
                    .map_or_else(|| t.lr_rule.replace('|', "/"), |l| format!("{l}")),
                t.learning_rates.len()
            );
        }
        for p in t.learning_rates.iter().filter(|p| !p.in_warmup.is_empty()) {
            let _ = writeln!(
                md,
                "\nAt B {} ({}), {} reached the target within the learning rate's warm-up: such a run measures the warm-up, \
                 not samples to the target, and counts as not reaching it; lower the target or shorten --warmup-epochs.",
                t.global_batch,
                p.lr_rule.replace('|', "/"),
                p.in_warmup.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ")
            );
        }
    }
}

/// report.md's table of the three predictions per batch, and what each stands on.
fn predictions_table(md: &mut String, rows: &[TargetRow]) {
    if rows.iter().all(|t| t.predictions.is_empty()) {
        return;
    }
    let _ = writeln!(
        md,
        "\nThe three predictions of each batch's samples ratio (error: measured ÷ predicted − 1). Integrated: over B0's training, as above. Target window: (1 + B/B_noise)/(1 + B0/B_noise) with B_noise the B_simple of the last 50 steps to the target of B0's best-learning-rate runs. Two-batch fit: E(B) = E_min + S_min·B through the measured samples of B0 and the batch nearest 4 × B0, so it needs two measured batches, not B0's runs alone. Each is absent where its inputs say nothing, with the reason.\n\n| model | target | B | {} | {} | {} |\n|---|---:|---:|---|---|---|",
        Estimator::ALL[0].describe(),
        Estimator::ALL[1].describe(),
        Estimator::ALL[2].describe()
    );
    for t in rows.iter().filter(|t| !t.predictions.is_empty()) {
        let cells: Vec<String> = Estimator::ALL
            .iter()
            .map(|e| match t.predictions.iter().find(|p| p.estimator == *e) {
                Some(Prediction {
                    ratio: Some(r),
                    relative_error,
                    ..
                }) => format!(
                    "{r:.2} ({})",
                    relative_error.map_or_else(|| "–".into(), |x| format!("{:+.0} %", x * 100.0))
                ),
                Some(Prediction {
                    none_because: Some(why), ..
                }) => format!("– ({})", why.replace('|', "\\|")),
                _ => "–".into(),
            })
            .collect();
        let _ = writeln!(md, "| {} | {} | {} | {} |", t.model, t.goal, t.global_batch, cells.join(" | "));
    }
    let mut said: Vec<String> = Vec::new();
    for t in rows {
        for p in &t.predictions {
            let line = format!("{} for {} of {}: {}.", p.estimator.describe(), t.goal, t.model, p.basis);
            if !said.contains(&line) {
                let _ = writeln!(md, "\n{}{}", line[..1].to_uppercase(), &line[1..]);
                said.push(line);
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::noise_scale::NormPair;
    use crate::reduce::analysis::noise_window::{pooled, NoiseWindow};

    /// A window whose every step's norms are their expectations for |G|² = `grad_sq`
    /// and tr(Σ) = 64 at batches 32 and 64: B_simple 64/grad_sq.
    fn window(kind: WindowKind, grad_sq: f64, steps: usize) -> NoiseWindow {
        let pair = NormPair {
            batch_small: 32.0,
            sq_small: grad_sq + 2.0,
            batch_big: 64.0,
            sq_big: grad_sq + 1.0,
        };
        NoiseWindow {
            first_step: 100,
            last_step: 100 + steps as u64 - 1,
            ..pooled(kind, &vec![pair; steps])
        }
    }

    /// A run at global batch `batch` with learning rate `lr` that reached the target
    /// after `samples` (None: never), its target window's B_simple 64/`grad_sq`, and a
    /// last epoch whose B_simple is 10 (the whole epoch's, which the prediction must
    /// not use).
    pub(in crate::reduce::report) fn run(id: &str, batch: usize, lr: &str, samples: Option<u64>, grad_sq: f64) -> RunReport {
        RunReport {
            run_id: id.into(),
            model: "mnist-cnn".into(),
            dataset: "fashion-mnist".into(),
            global_batch: batch,
            noise_scale: vec![super::super::noise::EpochNoiseScale {
                epoch: 0,
                steps: 300,
                skipped: 0,
                b_simple: Some(10.0),
                b_simple_low: Some(9.0),
                b_simple_high: Some(11.0),
            }],
            noise_windows: samples.map(|_| window(WindowKind::Target, grad_sq, 50)).into_iter().collect(),
            // Every step before the reach measured the norms, at B_simple 64/grad_sq.
            noise_steps: (0..samples.map_or(0, |s| s / batch as u64))
                .map(|g| NoiseStep {
                    global_step: g,
                    loss: 1.0,
                    pair: NormPair {
                        batch_small: 32.0,
                        sq_small: grad_sq + 2.0,
                        batch_big: 64.0,
                        sq_big: grad_sq + 1.0,
                    },
                })
                .collect(),
            target: Some(TargetOutcome {
                target_loss: Some(0.6),
                window_steps: 20,
                reached: samples.is_some(),
                steps_to_target: samples.map(|s| s as usize / batch),
                samples_to_target: samples,
                seconds_to_target: samples.map(|s| s as f64 / 1000.0),
                smoothed_loss: Some(0.6),
                lr_rule: lr.into(),
                warmup_lr_steps: 0,
                peak_lr: lr.chars().next().map(|c| f64::from(c as u8 - b'a' + 1) / 100.0),
                ..TargetOutcome::default()
            }),
            ..RunReport::default()
        }
    }

    /// A best rate at an end of the rates tried is said, with the side to extend; one
    /// inside, a single rate, or runs that never reached the target say nothing.
    #[test]
    fn a_best_learning_rate_at_the_grids_edge_is_said() {
        let runs = [
            // 64: a (0.01) best, the lowest of a, b.
            run("64a", 64, "a", Some(10_000), 1.0),
            run("64b", 64, "b", Some(12_000), 1.0),
            // 256: c (0.03) best, the highest of a, b, c.
            run("256a", 256, "a", Some(40_000), 1.0),
            run("256b", 256, "b", Some(30_000), 1.0),
            run("256c", 256, "c", Some(20_000), 1.0),
            // 1024: b inside a, c.
            run("1024a", 1024, "a", Some(90_000), 1.0),
            run("1024b", 1024, "b", Some(60_000), 1.0),
            run("1024c", 1024, "c", Some(70_000), 1.0),
            // 4096: one rate.
            run("4096a", 4096, "a", Some(200_000), 1.0),
        ];
        let rows = rows(&runs);
        let edges: Vec<(usize, Option<GridEdge>)> = rows.iter().map(|t| (t.global_batch, t.best_lr_at_edge)).collect();
        assert_eq!(
            edges,
            [
                (64, Some(GridEdge::Lowest)),
                (256, Some(GridEdge::Highest)),
                (1024, None),
                (4096, None)
            ]
        );
        let mut md = String::new();
        section(&mut md, &rows);
        assert!(
            md.contains("At B 64, the best learning rate (0.01) is the lowest of the 2 rates whose runs finished"),
            "{md}"
        );
        assert!(md.contains("add rates below it"), "{md}");
        assert!(
            md.contains("At B 256, the best learning rate (0.03) is the highest of the 3 rates"),
            "{md}"
        );
        assert!(!md.contains("At B 1024, the best") && !md.contains("At B 4096, the best"), "{md}");
        // Runs recorded before peak_lr say nothing of the edge.
        let mut old = runs.to_vec();
        for r in &mut old {
            r.target.as_mut().unwrap().peak_lr = None;
        }
        assert!(super::rows(&old).iter().all(|t| t.best_lr_at_edge.is_none()));
    }

    #[test]
    fn the_best_learning_rate_of_each_batch_by_median_and_b_noise_from_its_target_windows() {
        let runs = [
            // B0 = 64: lr a's median 20,000 (two runs), lr b's 15,000 (best), lr c's
            // runs did not all reach the target: no median.
            run("64a1", 64, "a", Some(19_000), 1.0),
            run("64a2", 64, "a", Some(21_000), 1.0),
            run("64b1", 64, "b", Some(14_000), 0.25),
            run("64b2", 64, "b", Some(16_000), 0.5),
            run("64c1", 64, "c", Some(1_000), 1.0),
            run("64c2", 64, "c", None, 1.0),
            // 256: one learning rate, two runs.
            run("256a1", 256, "a", Some(30_000), 1.0),
            run("256a2", 256, "a", Some(36_000), 1.0),
        ];
        let rows = rows(&runs);
        assert_eq!(rows.len(), 2);
        let (r64, r256) = (&rows[0], &rows[1]);
        let medians: Vec<(&str, Option<f64>, usize)> = r64
            .learning_rates
            .iter()
            .map(|p| (p.lr_rule.as_str(), p.samples_to_target, p.reached))
            .collect();
        assert_eq!(medians, [("a", Some(20_000.0), 2), ("b", Some(15_000.0), 2), ("c", None, 1)]);
        assert_eq!((r64.lr_rule.as_str(), r64.samples_to_target), ("b", Some(15_000.0)));
        assert_eq!((r64.run_ids.len(), r64.reached), (6, 5));
        assert_eq!(r256.baseline_global_batch, Some(64));
        assert_eq!(r256.measured_ratio, Some(33_000.0 / 15_000.0));
        // The spread: the smallest and largest ratio of one run to one B0 run (of the
        // best learning rate at each batch).
        assert_eq!(
            (r256.measured_ratio_low, r256.measured_ratio_high),
            (Some(30_000.0 / 16_000.0), Some(36_000.0 / 14_000.0))
        );
        // B_noise: the two best-learning-rate B0 runs' target windows pooled, numerator
        // and denominator averaged over their 100 steps: tr(Σ) 64, |G|² (0.25 + 0.5)/2.
        let b = r256.b_noise.unwrap();
        assert!((b - 64.0 / 0.375).abs() < 1e-9, "{b}");
        let from = r256.b_noise_from.as_ref().unwrap();
        assert_eq!(from.run_ids, ["64b1", "64b2"]);
        assert_eq!((from.measured_steps, from.steps[0]), (100, (100, 149)));
        assert!(
            from.window.starts_with("the last 50 steps to the target of `64b1` steps 100–149"),
            "{}",
            from.window
        );
        let window = r256.predictions.iter().find(|p| p.estimator == Estimator::TargetWindow).unwrap();
        assert_eq!(window.ratio, Some(samples_factor(256.0, 64.0, b)));
        // The chosen prediction is integrated over the B0 runs' steps before the reach:
        // 218 steps of 64b1 at B_simple 256, 250 of 64b2 at 128.
        let f = |n: f64| (256.0 + n) / (64.0 + n);
        let integrated = (218.0 * f(256.0) + 250.0 * f(128.0)) / 468.0;
        assert_eq!(r256.predictions[0].estimator, Estimator::Integrated);
        let predicted = r256.predicted_ratio.unwrap();
        assert!((predicted - integrated).abs() < 1e-9, "{predicted} against {integrated}");
        assert!((r256.relative_error.unwrap() - (33_000.0 / 15_000.0 / predicted - 1.0)).abs() < 1e-12);
        // Its range: each B0 run predicting alone, 64b1 at B_simple 256 and 64b2 at 128.
        let p0 = &r256.predictions[0];
        assert_eq!((p0.ratio_low, p0.ratio_high), (Some(f(256.0)), Some(f(128.0))));
        assert!(p0.range_none_because.is_none());
        // The fit's second batch is 256 itself: no prediction there.
        let fit = r256.predictions.iter().find(|p| p.estimator == Estimator::TwoBatchFit).unwrap();
        assert_eq!(fit.none_because.as_deref(), Some("an input of the fit"));
        let mut md = String::new();
        section(&mut md, &rows);
        assert!(md.contains("| 2.20 (1.88 – 2.57) |"), "{md}");
        assert!(md.contains("B_noise 171 (95 % "), "{md}");
        assert!(md.contains("Every learning rate tried"), "{md}");
        // These runs record no comparison key, so no optimizer: the unchecked sentence.
        assert!(md.contains(&checked_error_text([None])), "{md}");
        assert!(
            md.contains("Not checked for LARS, or for runs that do not record their optimizer"),
            "{md}"
        );
        assert!(md.contains("| mnist-cnn | training loss 0.6 | 256 | 1.81 (+21 %) |"), "{md}");
        assert!(
            md.contains(&format!("{:.2} ({:.2} – {:.2})", predicted, f(256.0), f(128.0))),
            "{md}"
        );
        assert!(!md.contains("carries no range"), "{md}");
        // One B0 run: no range, and report.md says why.
        let one = [runs[2].clone(), runs[7].clone()];
        let rows1 = super::rows(&one);
        let p1 = &rows1[1].predictions[0];
        assert!(p1.ratio.is_some() && p1.ratio_low.is_none(), "{p1:?}");
        assert!(p1.range_none_because.as_deref().unwrap().starts_with("1 run(s) at B0"), "{p1:?}");
        let mut md1 = String::new();
        section(&mut md1, &rows1);
        assert!(md1.contains("carries no range over B0's runs: 1 run(s) at B0"), "{md1}");
    }

    #[test]
    fn a_target_reached_in_the_warm_up_measures_no_samples_and_is_said() {
        let mut runs = [
            run("64a", 64, "a", Some(10_000), 1.0),
            run("64b", 64, "a", Some(12_000), 1.0),
            run("256", 256, "a", Some(15_000), 1.0),
        ];
        // 64a reached at step 156, within a warm-up of 200 steps.
        runs[0].target.as_mut().unwrap().warmup_lr_steps = 200;
        let rows = rows(&runs);
        let p = &rows[0].learning_rates[0];
        assert_eq!((p.reached, p.in_warmup.clone()), (2, vec!["64a".to_string()]));
        // The median of 12,000 and "never": none, so B0 is the next batch that reached it.
        assert_eq!(p.samples_to_target, None);
        assert_eq!(rows[1].baseline_global_batch, Some(256));
        let mut md = String::new();
        section(&mut md, &rows);
        assert!(md.contains("`64a` reached the target within the learning rate's warm-up"), "{md}");
    }

    #[test]
    fn synthetic_data_predicts_nothing_and_says_why_in_its_place() {
        let mut runs = [run("64", 64, "a", Some(10_000), 1.0), run("256", 256, "a", Some(15_000), 1.0)];
        for r in &mut runs {
            r.dataset = "synthetic".into();
        }
        let rows = rows(&runs);
        assert_eq!(rows[1].predicted_ratio, None);
        for p in rows[1].predictions.iter().filter(|p| p.estimator != Estimator::TwoBatchFit) {
            assert!(p.none_because.as_deref().unwrap().contains("random labels"), "{p:?}");
        }
        let mut md = String::new();
        section(&mut md, &rows);
        assert!(md.contains("– (synthetic data has random labels"), "{md}");
    }

    #[test]
    fn three_batches_give_the_fit_through_two_and_its_prediction_at_the_third() {
        let runs = [
            run("64", 64, "a", Some(15_040), 1.0),
            run("256", 256, "a", Some(19_456), 1.0),
            run("1024", 1024, "a", Some(54_272), 1.0),
        ];
        let rows = rows(&runs);
        let fit = rows[2].predictions.iter().find(|p| p.estimator == Estimator::TwoBatchFit).unwrap();
        assert!((fit.ratio.unwrap() - 37_120.0 / 15_040.0).abs() < 1e-12, "{fit:?}");
        assert!(fit.basis.contains("through the measured B 64 and 256"), "{fit:?}");
    }

    #[test]
    fn without_a_target_window_the_last_epoch_is_used_and_named() {
        let mut runs = [run("64", 64, "a", Some(10_000), 1.0), run("128", 128, "a", Some(15_000), 1.0)];
        runs[0].noise_windows.clear();
        let rows = rows(&runs);
        assert_eq!(rows[1].b_noise, Some(10.0));
        let from = rows[1].b_noise_from.as_ref().unwrap();
        assert!(from.window.starts_with("the last epoch (0) of `64`"), "{}", from.window);
    }
}
