//! The points two reports share (one workload at one shape), each side's figures for
//! them, and their ratios B / A with intervals where both sides have repeats.

use super::read::{ReportFile, RunEntry};
use super::Refusal;
use crate::reduce::analysis::interval::{speedup_interval, Direction, Spread, Term};
use crate::stats;
use serde_json::{Map, Value};

/// Comparison-key fields that follow each machine's cores (threads bound per rank, data
/// workers): two clusters differ in them, so points are matched without them.
pub const MACHINE_FIELDS: &[&str] = &["threads", "workers"];

/// The figures compared, in the table's order: (column stem, what it is).
pub const METRICS: &[(&str, &str)] = &[
    ("step_s", "mean step time (s)"),
    ("data_s", "data per step (s)"),
    ("forward_s", "forward per step (s)"),
    ("backward_s", "backward per step (s)"),
    ("comm_transfer_s", "all-reduce transfer per step (s)"),
    ("comm_wait_s", "all-reduce wait per step (s)"),
    ("optimizer_s", "optimizer per step (s)"),
    ("other_s", "other per step (s)"),
    ("samples_per_s", "throughput (samples/s)"),
    ("speedup", "speedup"),
    ("busbw_bytes_per_s", "bus bandwidth (B/s)"),
];

/// The index of `samples_per_s` in [`METRICS`].
pub const THROUGHPUT: usize = 8;

/// One side's figures at a point, in [`METRICS`]' order.
#[derive(Debug, Clone)]
pub struct SideFigures {
    pub run_ids: Vec<String>,
    pub values: Vec<f64>,
    /// Each run's log throughput: the interval's input.
    pub log_throughputs: Vec<f64>,
}

/// A point both reports hold, compared.
#[derive(Debug, Clone)]
pub struct Compared {
    pub model: String,
    pub dataset: String,
    pub ranks: usize,
    pub batch_per_rank: usize,
    /// Each side's threads per rank and workers, as its key says them.
    pub machine_a: String,
    pub machine_b: String,
    pub a: SideFigures,
    pub b: SideFigures,
    /// The throughput ratio's 95 % interval (NaN without repeats on both sides), and
    /// the direction [`Direction::of`] gives it.
    pub throughput_low: f64,
    pub throughput_high: f64,
    pub direction: Direction,
}

impl Compared {
    /// B / A for metric `i`.
    pub fn ratio(&self, i: usize) -> f64 {
        self.b.values[i] / self.a.values[i]
    }
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
pub fn compare(a: &ReportFile, b: &ReportFile) -> Result<(Vec<Compared>, Vec<String>), Refusal> {
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
    let ratio = fb.values[THROUGHPUT] / fa.values[THROUGHPUT];
    let terms = [
        Term {
            runs: runs_b.len(),
            weight: 1.0,
            pool: 0,
            within_run_variance: f64::NAN,
        },
        Term {
            runs: runs_a.len(),
            weight: 1.0,
            pool: 1,
            within_run_variance: f64::NAN,
        },
    ];
    let pools = [
        Spread::pooled([fb.log_throughputs.as_slice()]),
        Spread::pooled([fa.log_throughputs.as_slice()]),
    ];
    let interval = speedup_interval(ratio, &terms, &pools);
    Compared {
        model: runs_a[0].model.clone(),
        dataset: runs_a[0].dataset.clone(),
        ranks: p.ranks,
        batch_per_rank: p.batch_per_rank,
        machine_a: machine(runs_a[0]),
        machine_b: machine(runs_b[0]),
        a: fa,
        b: fb,
        throughput_low: interval.low,
        throughput_high: interval.high,
        direction: Direction::of(interval.low, interval.high),
    }
}

/// One side's figures at a point: geometric means over its runs of throughput (the step
/// time is the global batch over it), arithmetic means of the phases, the speedup of
/// the scaling row holding its runs, the geometric mean of its runs' bus bandwidth.
fn figures(runs: &[&RunEntry], report: &ReportFile) -> SideFigures {
    let run_ids: Vec<String> = runs.iter().map(|r| r.run_id.clone()).collect();
    let throughput = stats::geometric_mean(&runs.iter().map(|r| r.samples_per_s).collect::<Vec<_>>());
    let mean = |f: fn(&RunEntry) -> f64| runs.iter().map(|r| f(r)).sum::<f64>() / runs.len() as f64;
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
    let values = vec![
        runs[0].global_batch as f64 / throughput,
        mean(|r| r.per_step.data_s),
        mean(|r| r.per_step.forward_s),
        mean(|r| r.per_step.backward_s),
        mean(|r| r.per_step.comm_transfer_s),
        mean(|r| r.per_step.comm_wait_s),
        mean(|r| r.per_step.optimizer_s),
        mean(|r| r.per_step.other_s),
        throughput,
        speedup,
        if busbw.is_empty() {
            f64::NAN
        } else {
            stats::geometric_mean(&busbw)
        },
    ];
    SideFigures {
        run_ids,
        values,
        log_throughputs: runs.iter().map(|r| r.samples_per_s.ln()).collect(),
    }
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
        assert!((shared[0].ratio(THROUGHPUT) - 1.5).abs() < 1e-12);
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
        assert!(c.throughput_low > 1.0 && c.throughput_low < c.ratio(THROUGHPUT) && c.ratio(THROUGHPUT) < c.throughput_high);
        assert_eq!(c.direction, Direction::Faster);
        let (shared, _) = compare(&report(&[(1, 16, 100.0)]), &report(&[(1, 16, 150.0), (1, 16, 151.0)])).unwrap();
        assert_eq!(shared[0].direction, Direction::NoInterval);
        assert!(shared[0].throughput_low.is_nan());
    }
}
