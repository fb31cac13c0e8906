//! The points two reports share (one workload at one shape), each side's figures for
//! them, and their ratios B / A with intervals where both sides have repeats: throughput,
//! the step and each phase, each Welch's on the logs of its runs' values.

use super::read::{ReportFile, RunEntry};
use super::Refusal;
use crate::reduce::analysis::interval::{speedup_interval, Direction, Spread, Term};
use crate::reduce::report::StepPhases;
use crate::stats;
use serde_json::{Map, Value};
use std::sync::LazyLock;

/// Comparison-key fields that follow each machine's cores (threads bound per rank, data
/// workers): two clusters differ in them, so points are matched without them.
pub(crate) const MACHINE_FIELDS: &[&str] = &["threads", "workers"];

/// The figures compared, in the table's order: (column stem, what it is). The step,
/// then its parts as report.json's `per_step` holds them ([`StepPhases::layout`]), then
/// throughput, speedup and bus bandwidth.
pub(crate) static METRICS: LazyLock<Vec<(&'static str, String)>> = LazyLock::new(|| {
    let mut metrics = vec![("step_s", "mean step time (s)".to_string())];
    metrics.extend(
        StepPhases::layout()
            .into_iter()
            .map(|p| (p.key, format!("{} per step (s)", p.what))),
    );
    metrics.extend([
        ("samples_per_s", "throughput (samples/s)".to_string()),
        ("speedup", "speedup".to_string()),
        ("busbw_bytes_per_s", "bus bandwidth (GB/s)".to_string()),
    ]);
    metrics
});

/// Metric `i`'s value as compare.md and the terminal show it: bus bandwidth in GB/s (10⁹
/// bytes/s, as its label says), every other figure as compare.csv holds it.
pub(crate) fn shown(i: usize, v: f64) -> f64 {
    if METRICS[i].0 == "busbw_bytes_per_s" {
        v / 1e9
    } else {
        v
    }
}

/// The index of `samples_per_s` in [`METRICS`]: after the step and its parts.
pub(super) static THROUGHPUT: LazyLock<usize> = LazyLock::new(|| 1 + StepPhases::layout().len());

/// The metrics that are parts of a step (between `step_s` and `samples_per_s` in [`METRICS`]).
pub(super) fn step_parts() -> std::ops::Range<usize> {
    1..*THROUGHPUT
}

/// One side's figures at a point, in [`METRICS`]' order.
#[derive(Debug, Clone)]
pub(crate) struct SideFigures {
    pub run_ids: Vec<String>,
    pub values: Vec<f64>,
    /// Per metric, each run's log value: an interval's input. Empty where a metric has
    /// no value per run (speedup, bus bandwidth) or a run's value is not above 0.
    pub logs: Vec<Vec<f64>>,
}

/// A ratio B / A's 95 % interval (NaN without repeats on both sides) and the direction
/// [`Direction::of`] gives B: for a time (the step, a phase), B is faster where the
/// time's interval lies below 1.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RatioInterval {
    pub low: f64,
    pub high: f64,
    pub direction: Direction,
}

/// A point both reports hold, compared.
#[derive(Debug, Clone)]
pub(crate) struct Compared {
    pub model: String,
    pub dataset: String,
    pub ranks: usize,
    pub batch_per_rank: usize,
    /// Each side's threads per rank and workers, as its key says them.
    pub machine_a: String,
    pub machine_b: String,
    pub a: SideFigures,
    pub b: SideFigures,
    /// Per metric of [`METRICS`], its ratio's interval.
    pub intervals: Vec<RatioInterval>,
}

impl Compared {
    /// B / A for metric `i`.
    pub(crate) fn ratio(&self, i: usize) -> f64 {
        self.b.values[i] / self.a.values[i]
    }

    /// The throughput ratio's interval.
    pub(crate) fn throughput(&self) -> RatioInterval {
        self.intervals[*THROUGHPUT]
    }
}

/// Whether metric `i` is a time (the step or a phase, before throughput in
/// [`METRICS`]): a ratio above 1 is B slower.
pub(super) fn is_time(i: usize) -> bool {
    i < *THROUGHPUT
}

/// A run's point: its key without [`MACHINE_FIELDS`], its rank count and per-rank batch.
#[derive(Debug, Clone, PartialEq)]
struct PointKey {
    key: Map<String, Value>,
    ranks: usize,
    batch_per_rank: usize,
}

fn point_of(run: &RunEntry) -> Option<PointKey> {
    let mut key = run.comparison_key.clone()?;
    for f in MACHINE_FIELDS {
        key.remove(*f);
    }
    Some(PointKey {
        key,
        ranks: run.ranks,
        batch_per_rank: run.batch_per_rank,
    })
}

fn points(report: &ReportFile) -> Vec<(PointKey, Vec<&RunEntry>)> {
    let mut out: Vec<(PointKey, Vec<&RunEntry>)> = Vec::new();
    for run in &report.runs {
        let Some(p) = point_of(run) else { continue };
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, runs)) => runs.push(run),
            None => out.push((p, vec![run])),
        }
    }
    out
}

/// The points both reports hold, compared; or the refusal naming what differs when they
/// share none.
pub(super) fn compare(a: &ReportFile, b: &ReportFile) -> Result<(Vec<Compared>, Vec<String>), Refusal> {
    let (pa, pb) = (points(a), points(b));
    if pa.is_empty() || pb.is_empty() {
        let which = if pa.is_empty() { "A" } else { "B" };
        return Err(Refusal(format!(
            "{which} holds no complete run with a comparison key: nothing to compare"
        )));
    }
    let mut shared = Vec::new();
    let mut only = Vec::new();
    for (p, runs_a) in &pa {
        match pb.iter().find(|(q, _)| q == p) {
            Some((_, runs_b)) => shared.push(compared(p, runs_a, runs_b, a, b)),
            None => only.push(format!("only in A: {}", shape(runs_a[0]))),
        }
    }
    for (p, runs_b) in &pb {
        if !pa.iter().any(|(q, _)| q == p) {
            only.push(format!("only in B: {}", shape(runs_b[0])));
        }
    }
    if shared.is_empty() {
        return Err(Refusal(not_comparable(&pa, &pb)));
    }
    Ok((shared, only))
}

fn shape(run: &RunEntry) -> String {
    format!(
        "{} on {}, {} ranks × {} per rank",
        run.model, run.dataset, run.ranks, run.batch_per_rank
    )
}

/// What differs between the closest pair of points (fewest differing fields).
fn not_comparable(pa: &[(PointKey, Vec<&RunEntry>)], pb: &[(PointKey, Vec<&RunEntry>)]) -> String {
    let mut best: Option<Vec<String>> = None;
    for (p, _) in pa {
        for (q, _) in pb {
            let d = differences(p, q);
            if best.as_ref().is_none_or(|b| d.len() < b.len()) {
                best = Some(d);
            }
        }
    }
    format!(
        "A and B are not comparable: no workload and shape is in both; the closest differ in {}. Compare reports of the same model, data set, batch, precision and settings",
        best.unwrap_or_default().join(", ")
    )
}

fn differences(p: &PointKey, q: &PointKey) -> Vec<String> {
    let mut out = Vec::new();
    let mut names: Vec<&String> = p.key.keys().chain(q.key.keys()).collect();
    names.sort();
    names.dedup();
    for n in names {
        let (x, y) = (p.key.get(n).unwrap_or(&Value::Null), q.key.get(n).unwrap_or(&Value::Null));
        if x != y {
            out.push(format!("{n} ({x} in A, {y} in B)"));
        }
    }
    if p.batch_per_rank != q.batch_per_rank {
        out.push(format!("batch per rank ({} in A, {} in B)", p.batch_per_rank, q.batch_per_rank));
    }
    if p.ranks != q.ranks {
        out.push(format!("ranks ({} in A, {} in B)", p.ranks, q.ranks));
    }
    out
}

fn machine(run: &RunEntry) -> String {
    let key = run.comparison_key.as_ref();
    let field = |f: &str| key.and_then(|k| k.get(f)).map_or("?".to_string(), Value::to_string);
    format!("threads {}, workers {}", field("threads"), field("workers"))
}

fn compared(p: &PointKey, runs_a: &[&RunEntry], runs_b: &[&RunEntry], a: &ReportFile, b: &ReportFile) -> Compared {
    let (fa, fb) = (figures(runs_a, a), figures(runs_b, b));
    let intervals = (0..METRICS.len())
        .map(|i| ratio_interval(fb.values[i] / fa.values[i], &fa.logs[i], &fb.logs[i], is_time(i)))
        .collect();
    Compared {
        model: runs_a[0].model.clone(),
        dataset: runs_a[0].dataset.clone(),
        ranks: p.ranks,
        batch_per_rank: p.batch_per_rank,
        machine_a: machine(runs_a[0]),
        machine_b: machine(runs_b[0]),
        a: fa,
        b: fb,
        intervals,
    }
}

/// The interval of `ratio` (B / A) from each side's per-run logs, Welch's as a speedup's
/// ([`speedup_interval`]); none unless both sides have 2 or more runs with a log each.
/// For a time the direction is B's speed's: its interval is the time's inverted.
fn ratio_interval(ratio: f64, logs_a: &[f64], logs_b: &[f64], time: bool) -> RatioInterval {
    let none = RatioInterval {
        low: f64::NAN,
        high: f64::NAN,
        direction: Direction::NoInterval,
    };
    if logs_a.len() < 2 || logs_b.len() < 2 || !ratio.is_finite() || ratio <= 0.0 {
        return none;
    }
    let term = |runs: usize, pool: usize| Term {
        runs,
        weight: 1.0,
        pool,
        within_run_variance: f64::NAN,
    };
    let pools = [Spread::pooled([logs_b]), Spread::pooled([logs_a])];
    let i = speedup_interval(ratio, &[term(logs_b.len(), 0), term(logs_a.len(), 1)], &pools);
    let direction = if time {
        Direction::of(1.0 / i.high, 1.0 / i.low)
    } else {
        Direction::of(i.low, i.high)
    };
    RatioInterval {
        low: i.low,
        high: i.high,
        direction,
    }
}

/// `values`' geometric mean and each one's log where every value is above 0 (finite);
/// else their arithmetic mean and no logs.
fn mean_and_logs(values: &[f64]) -> (f64, Vec<f64>) {
    if values.iter().all(|v| v.is_finite() && *v > 0.0) {
        (stats::geometric_mean(values), values.iter().map(|v| v.ln()).collect())
    } else {
        (values.iter().sum::<f64>() / values.len() as f64, Vec::new())
    }
}

/// One side's figures at a point: geometric means over its runs of throughput (the step
/// time is the global batch over it) and of each phase (arithmetic where a run has a
/// phase at 0), the speedup of the scaling row holding its runs, the geometric mean of
/// its runs' bus bandwidth.
fn figures(runs: &[&RunEntry], report: &ReportFile) -> SideFigures {
    let run_ids: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
    let per_run = |f: &dyn Fn(&RunEntry) -> f64| mean_and_logs(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
    let (throughput, throughput_logs) = per_run(&|r| r.samples_per_s);
    let speedup = report
        .scaling
        .iter()
        .find(|s| run_ids.iter().all(|id| s.run_ids.contains(id)))
        .map_or(f64::NAN, |s| s.speedup);
    let busbw: Vec<f64> = report
        .summary
        .iter()
        .filter(|s| run_ids.contains(&s.run_id) && s.busbw_bytes_per_s > 0.0)
        .map(|s| s.busbw_bytes_per_s)
        .collect();
    let phases: Vec<(f64, Vec<f64>)> = METRICS[step_parts()]
        .iter()
        .map(|(key, _)| per_run(&|r| r.per_step.seconds(key)))
        .collect();
    // A step is the global batch over a run's throughput: its logs are the throughput's negated.
    let step_logs = throughput_logs.iter().map(|l| (runs[0].global_batch as f64).ln() - l).collect();
    let mut values = vec![runs[0].global_batch as f64 / throughput];
    let mut logs = vec![step_logs];
    for (v, l) in phases {
        values.push(v);
        logs.push(l);
    }
    values.extend([
        throughput,
        speedup,
        if busbw.is_empty() {
            f64::NAN
        } else {
            stats::geometric_mean(&busbw)
        },
    ]);
    logs.extend([throughput_logs, Vec::new(), Vec::new()]);
    SideFigures { run_ids, values, logs }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of one run per (threads, batch) given, each at 2 ranks.
    fn report(runs: &[(usize, usize, f64)]) -> ReportFile {
        let runs: Vec<Value> = runs
            .iter()
            .enumerate()
            .map(|(i, (threads, batch, thr))| {
                serde_json::json!({
                    "run_id": format!("r{i}"), "model": "m", "dataset": "d", "ranks": 2,
                    "batch_per_rank": batch, "global_batch": 2 * batch, "samples_per_s": thr,
                    "comparison_key": {"model": "m", "amp": "off", "threads": [threads], "workers": 0},
                    "per_step": {"data_s": 0.0, "forward_s": 0.1, "backward_s": 0.2, "comm_transfer_s": null,
                                 "comm_wait_s": 0.0, "optimizer_s": 0.0, "other_s": 0.0}
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({"runs": runs, "summary": [], "scaling": []})).unwrap()
    }

    #[test]
    fn threads_may_differ_and_a_batch_that_differs_is_named() {
        let (shared, only) = compare(&report(&[(1, 16, 100.0)]), &report(&[(4, 16, 150.0), (4, 32, 1.0)])).unwrap();
        assert_eq!(shared.len(), 1);
        assert!((shared[0].ratio(*THROUGHPUT) - 1.5).abs() < 1e-12);
        assert_eq!(
            (shared[0].machine_a.as_str(), shared[0].machine_b.as_str()),
            ("threads [1], workers 0", "threads [4], workers 0")
        );
        assert_eq!(only, vec!["only in B: m on d, 2 ranks × 32 per rank"]);
        let refused = compare(&report(&[(1, 16, 100.0)]), &report(&[(1, 32, 100.0)])).unwrap_err();
        assert!(refused.0.contains("batch per rank (16 in A, 32 in B)"), "{refused}");
    }

    #[test]
    fn repeats_on_both_sides_give_an_interval_and_one_run_none() {
        let (shared, _) = compare(
            &report(&[(1, 16, 100.0), (1, 16, 102.0)]),
            &report(&[(1, 16, 150.0), (1, 16, 151.0)]),
        )
        .unwrap();
        let c = &shared[0];
        let t = c.throughput();
        assert!(t.low > 1.0 && t.low < c.ratio(*THROUGHPUT) && c.ratio(*THROUGHPUT) < t.high);
        assert_eq!(t.direction, Direction::Faster);
        // The step is the global batch over throughput: its interval is the inverse, and
        // a shorter step is B faster.
        let step = c.intervals[0];
        assert!((step.low * t.high - 1.0).abs() < 1e-12 && (step.high * t.low - 1.0).abs() < 1e-12);
        assert_eq!(step.direction, Direction::Faster);
        let (shared, _) = compare(&report(&[(1, 16, 100.0)]), &report(&[(1, 16, 150.0), (1, 16, 151.0)])).unwrap();
        assert!(shared[0]
            .intervals
            .iter()
            .all(|i| i.direction == Direction::NoInterval && i.low.is_nan()));
    }

    /// A report of 2-rank runs at batch 16 with the given (throughput, backward_s) each.
    fn report_phases(runs: &[(f64, f64)]) -> ReportFile {
        let runs: Vec<Value> = runs
            .iter()
            .enumerate()
            .map(|(i, (thr, backward))| {
                serde_json::json!({
                    "run_id": format!("r{i}"), "model": "m", "dataset": "d", "ranks": 2,
                    "batch_per_rank": 16, "global_batch": 32, "samples_per_s": thr,
                    "comparison_key": {"model": "m", "threads": [1], "workers": 0},
                    "per_step": {"data_s": 0.0, "forward_s": 0.1, "backward_s": backward, "comm_transfer_s": 0.01,
                                 "comm_wait_s": 0.0, "optimizer_s": 0.02, "other_s": 0.001}
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({"runs": runs, "summary": [], "scaling": []})).unwrap()
    }

    #[test]
    fn phases_with_repeats_get_intervals_and_a_direction_only_outside_1() {
        let backward = METRICS.iter().position(|m| m.0 == "backward_s").unwrap();
        let data = METRICS.iter().position(|m| m.0 == "data_s").unwrap();
        // Backward twice as long in B, tightly: B slower there; the ratio is the
        // geometric means'.
        let (shared, _) = compare(
            &report_phases(&[(100.0, 0.20), (101.0, 0.21)]),
            &report_phases(&[(100.0, 0.40), (101.0, 0.41)]),
        )
        .unwrap();
        let c = &shared[0];
        let geo = ((0.40f64 * 0.41).sqrt()) / ((0.20f64 * 0.21).sqrt());
        assert!((c.ratio(backward) - geo).abs() < 1e-12);
        let b = c.intervals[backward];
        assert!(b.low < geo && geo < b.high && b.low > 1.0, "{b:?}");
        assert_eq!(b.direction, Direction::Slower);
        // A phase at 0 has no logs: no interval, its mean arithmetic.
        assert_eq!(c.intervals[data].direction, Direction::NoInterval);
        // Throughput alike within their spread: an interval holding 1, no direction.
        let t = c.throughput();
        assert!(t.low < 1.0 && t.high > 1.0);
        assert_eq!(t.direction, Direction::WithinNoise);
        assert_eq!(c.intervals[0].direction, Direction::WithinNoise);
    }
}
