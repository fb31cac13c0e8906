//! Runs trained to a target loss (`train --target-loss`): per workload and target, the
//! samples each global batch needed, as a ratio to the smallest global batch that
//! reached the target, beside the noise-scale model's prediction of that ratio,
//! (1 + B/B_noise)/(1 + B0/B_noise), and the prediction's error.

use super::RunReport;
use crate::noise_scale::samples_factor;
use crate::record::TargetOutcome;
use serde::Serialize;
use std::fmt::Write;

/// One global batch of one workload and target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TargetRow {
    pub model: String,
    pub dataset: String,
    /// The comparison key's text: the runs of a row share it.
    pub key: String,
    pub target_loss: f64,
    pub global_batch: usize,
    /// The runs at this global batch, and how many reached the target.
    pub run_ids: Vec<String>,
    pub reached: usize,
    /// The learning rate the first of them followed.
    pub lr_rule: String,
    /// Geometric mean over the runs that reached the target; None when none did.
    pub samples_to_target: Option<f64>,
    pub seconds_to_target: Option<f64>,
    /// The smallest global batch of the workload and target whose runs reached it (B0).
    pub baseline_global_batch: Option<usize>,
    /// samples_to_target / B0's.
    pub measured_ratio: Option<f64>,
    /// The noise scale the prediction uses: the last epoch's B_simple of a B0 run
    /// (that run ended near the target loss), and that run.
    pub b_noise: Option<f64>,
    pub b_noise_run: Option<String>,
    /// (1 + B/B_noise)/(1 + B0/B_noise).
    pub predicted_ratio: Option<f64>,
    /// measured_ratio / predicted_ratio − 1.
    pub relative_error: Option<f64>,
}

fn geometric_mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// The groups of runs that share model, data set, key and target, each sorted by batch.
fn groups(runs: &[RunReport]) -> Vec<Vec<(&RunReport, &TargetOutcome)>> {
    let mut groups: Vec<Vec<(&RunReport, &TargetOutcome)>> = Vec::new();
    let same = |a: &(&RunReport, &TargetOutcome), r: &RunReport, t: &TargetOutcome| {
        a.0.model == r.model
            && a.0.dataset == r.dataset
            && a.0.comparison_key == r.comparison_key
            && a.1.target_loss.to_bits() == t.target_loss.to_bits()
    };
    for r in runs {
        let Some(t) = r.target.as_ref() else { continue };
        match groups.iter_mut().find(|g| same(&g[0], r, t)) {
            Some(g) => g.push((r, t)),
            None => groups.push(vec![(r, t)]),
        }
    }
    for g in &mut groups {
        g.sort_by_key(|(r, _)| r.global_batch);
    }
    groups
}

/// One row per global batch of every workload and target the runs were trained to.
pub fn rows(runs: &[RunReport]) -> Vec<TargetRow> {
    let mut out = Vec::new();
    for group in groups(runs) {
        let mut batches: Vec<usize> = group.iter().map(|(r, _)| r.global_batch).collect();
        batches.dedup();
        let at = |b: usize| group.iter().filter(move |(r, _)| r.global_batch == b);
        let samples = |b: usize| {
            let v: Vec<f64> = at(b)
                .filter_map(|(_, t)| t.samples_to_target.filter(|_| t.reached))
                .map(|s| s as f64)
                .collect();
            geometric_mean(&v)
        };
        let base = batches.iter().copied().find(|&b| samples(b).is_some());
        let noise = base.and_then(|b0| at(b0).find_map(|(r, _)| Some((r.noise_scale.last()?.b_simple?, r.run_id.clone()))));
        for &b in &batches {
            let (first, t) = at(b).next().map(|(r, t)| (*r, *t)).unwrap();
            let measured = samples(b).zip(base.and_then(|b0| samples(b0))).map(|(s, s0)| s / s0);
            let predicted = base.zip(noise.as_ref()).map(|(b0, (n, _))| samples_factor(b as f64, b0 as f64, *n));
            let seconds: Vec<f64> = at(b).filter_map(|(_, t)| t.seconds_to_target.filter(|_| t.reached)).collect();
            out.push(TargetRow {
                model: first.model.clone(),
                dataset: first.dataset.clone(),
                key: first.comparison_key.as_ref().map(|k| k.describe()).unwrap_or_default(),
                target_loss: t.target_loss,
                global_batch: b,
                run_ids: at(b).map(|(r, _)| r.run_id.clone()).collect(),
                reached: at(b).filter(|(_, t)| t.reached).count(),
                lr_rule: t.lr_rule.clone(),
                samples_to_target: samples(b),
                seconds_to_target: geometric_mean(&seconds),
                baseline_global_batch: base,
                measured_ratio: measured,
                b_noise: noise.as_ref().map(|(n, _)| *n),
                b_noise_run: noise.as_ref().map(|(_, id)| id.clone()),
                predicted_ratio: predicted,
                relative_error: measured.zip(predicted).map(|(m, p)| m / p - 1.0),
            });
        }
    }
    out
}

/// What `reduce` prints of runs trained to a target loss: one line per global batch.
pub fn terminal_lines(rows: &[TargetRow]) -> Vec<String> {
    let mut out = Vec::new();
    for t in rows {
        let figures = match (t.samples_to_target, t.measured_ratio) {
            (Some(s), Some(m)) => format!(
                "{s:.0} samples to target, {m:.2}× B0's; predicted {}, error {}",
                cell(t.predicted_ratio, 2),
                t.relative_error.map_or_else(|| "–".into(), |e| format!("{:+.0} %", e * 100.0))
            ),
            _ => "target not reached: no samples to target".into(),
        };
        out.push(format!(
            "target loss {} {} on {} (B {}, B0 {}): {} of {} run(s) reached it; {figures}",
            t.target_loss,
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
pub fn section(md: &mut String, rows: &[TargetRow]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Samples to a target loss: measured against predicted\n\nRuns trained with `--target-loss` stop when the training loss, averaged over the ranks and over the last 20 measured steps, is at or below the target. Per global batch B: the samples to the target (geometric mean of the runs that reached it), their ratio to the smallest global batch B0 that reached it, the noise-scale model's prediction (1 + B/B_noise)/(1 + B0/B_noise) with B_noise the last epoch's B_simple of a B0 run, and the prediction's error (measured ÷ predicted − 1). A batch whose runs did not reach the target has no figure.\n\n| model | data | target loss | B | runs (reached) | samples to target | seconds to target | measured ratio | predicted ratio (B_noise) | error | learning rate |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
    );
    for t in rows {
        let predicted = match (t.predicted_ratio, t.b_noise, t.b_noise_run.as_deref()) {
            (Some(p), Some(n), Some(run)) => format!("{p:.2} ({n:.0} from `{run}`)"),
            _ => "– (no B_simple measured at B0)".into(),
        };
        let error = t.relative_error.map_or_else(|| "–".into(), |e| format!("{:+.0} %", e * 100.0));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) | {} | {} | {} | {predicted} | {error} | {} |",
            t.model,
            t.dataset,
            t.target_loss,
            t.global_batch,
            t.run_ids.len(),
            t.reached,
            cell(t.samples_to_target, 0),
            cell(t.seconds_to_target, 1),
            cell(t.measured_ratio, 2),
            t.lr_rule.replace('|', "/"),
        );
    }
}
