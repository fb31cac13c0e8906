//! The times a person plans by: per run, the epoch's training, its validation, the two
//! together and the whole run's wall time (times.csv and report.md's "Time per epoch and
//! per run"); the 1-rank time by batch per rank; the epoch time by data workers.

use super::RunReport;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One row of times.csv: a run's times in seconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunTimes {
    pub run_id: String,
    pub model: String,
    pub dataset: String,
    pub ranks: usize,
    pub batch_per_rank: usize,
    /// Data-loading workers per rank (empty for a run that does not record them).
    pub workers: Option<usize>,
    /// An epoch's training steps (summary.csv's `epoch_s`).
    pub epoch_s: f64,
    /// 1 when `epoch_s` is projected (steps per epoch × the mean step).
    pub epoch_s_projected: u8,
    /// Validation after an epoch (the median over the epochs that validated); empty
    /// without validation.
    pub val_s_per_epoch: Option<f64>,
    /// `epoch_s` + `val_s_per_epoch`: an epoch as a user waits for it.
    pub epoch_with_val_s: f64,
    /// The whole run as the manifest timed it: setup, every epoch's training and
    /// validation, teardown (empty for a run that did not record it).
    pub run_wall_s: Option<f64>,
}

/// times.csv's rows, one per run in the report's order.
pub(crate) fn rows(runs: &[RunReport]) -> Vec<RunTimes> {
    runs.iter()
        .map(|r| RunTimes {
            run_id: r.run_id.clone(),
            model: r.model.clone(),
            dataset: r.dataset.clone(),
            ranks: r.ranks,
            batch_per_rank: r.batch_per_rank,
            workers: r.comparison_key.as_ref().and_then(|k| k.workers),
            epoch_s: r.epoch_s,
            epoch_s_projected: r.epoch_s_projected as u8,
            val_s_per_epoch: r.val_s_per_epoch,
            epoch_with_val_s: r.epoch_s + r.val_s_per_epoch.unwrap_or(0.0),
            run_wall_s: r.wall_s,
        })
        .collect()
}

fn opt(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite()).map_or("–".into(), |v| format!("{v:.2}"))
}

/// report.md's time tables: per run, then 1 rank by batch, then by data workers.
pub(crate) fn markdown(md: &mut String, runs: &[RunReport]) {
    let rows = rows(runs);
    let _ = writeln!(md, "\n## Time per epoch and per run\n\n| run | ranks | batch/rank | training s/epoch | validation s/epoch | epoch with validation s | whole run s |\n|---|---:|---:|---:|---:|---:|---:|");
    for t in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2}{} | {} | {:.2} | {} |",
            t.run_id,
            t.ranks,
            t.batch_per_rank,
            t.epoch_s,
            if t.epoch_s_projected == 1 { " (projected)" } else { "" },
            opt(t.val_s_per_epoch),
            t.epoch_with_val_s,
            opt(t.run_wall_s)
        );
    }
    let _ = writeln!(md, "\nAn epoch as a user waits for it is its training plus its validation; the whole run adds setup and teardown. A run that validates every epoch on one rank can take longer than its training time suggests.");
    one_rank_by_batch(md, &rows);
    by_workers(md, &rows);
}

/// 1-rank runs: epoch time and throughput per model, data set and batch per rank (the
/// mean over repeats).
fn one_rank_by_batch(md: &mut String, rows: &[RunTimes]) {
    let mut groups: BTreeMap<(&str, &str, usize), Vec<&RunTimes>> = BTreeMap::new();
    for t in rows.iter().filter(|t| t.ranks == 1) {
        groups.entry((&t.model, &t.dataset, t.batch_per_rank)).or_default().push(t);
    }
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## 1-rank time by batch size\n\n| model | data set | batch | runs | training s/epoch | epoch with validation s |\n|---|---|---:|---:|---:|---:|");
    for ((model, dataset, batch), ts) in &groups {
        let mean = |f: fn(&RunTimes) -> f64| ts.iter().map(|t| f(t)).sum::<f64>() / ts.len() as f64;
        let _ = writeln!(
            md,
            "| {model} | {dataset} | {batch} | {} | {:.2} | {:.2} |",
            ts.len(),
            mean(|t| t.epoch_s),
            mean(|t| t.epoch_with_val_s)
        );
    }
    let _ = writeln!(
        md,
        "\nOne rank alone: what each batch size costs before any communication (the mean over its runs)."
    );
}

/// Epoch time by data workers, per model, data set, ranks and batch, where runs differ
/// in their workers.
fn by_workers(md: &mut String, rows: &[RunTimes]) {
    let mut groups: BTreeMap<(&str, &str, usize, usize), BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for t in rows {
        if let Some(w) = t.workers {
            let g = groups.entry((&t.model, &t.dataset, t.ranks, t.batch_per_rank)).or_default();
            g.entry(w).or_default().push(t.epoch_s);
        }
    }
    groups.retain(|_, by| by.len() > 1);
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Epoch time by data workers\n\n| model | data set | ranks | batch/rank | workers | runs | training s/epoch |\n|---|---|---:|---:|---:|---:|---:|");
    for ((model, dataset, ranks, batch), by) in &groups {
        for (w, es) in by {
            let mean = es.iter().sum::<f64>() / es.len() as f64;
            let _ = writeln!(md, "| {model} | {dataset} | {ranks} | {batch} | {w} | {} | {mean:.2} |", es.len());
        }
    }
    let _ = writeln!(md, "\nThe same training with more or fewer data-loading workers per rank: where the epoch stops shrinking, loading no longer limits it.");
}
