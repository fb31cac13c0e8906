//! The study's own summary, made from `reduce`'s report of its runs: one row per point
//! (its repeats together) with throughput, speedup and efficiency against the point's
//! reference, validation loss and accuracy, and R; one verdict sentence per workload; a
//! speedup curve per workload with the ideal line. Every figure comes from the typed
//! [`Report`] (its runs, summary and scaling rows), so it says what `reduce` says.

use super::plan::{self, Plan};
use super::state::State;
use crate::files::StagedFiles;
use crate::plot::{self, LineChart, Point, Rasteriser, Series, SeriesKind, XScale};
use crate::record::{PointId, RunStatus, StudyRun};
use crate::reduce::analysis::{ScalingMode, ScalingRow};
use crate::reduce::report::{html, verdict, RunReport};
use crate::reduce::Report;
use crate::stats::median;
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One row of `report/study.csv`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct PointSummary {
    pub point: PointId,
    pub workload: String,
    pub scaling: String,
    pub ranks: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    pub repeats_completed: usize,
    pub repeats_planned: usize,
    /// The geometric mean over the completed repeats of each run's throughput (samples
    /// per step over its mean step, as `reduce` gives it): the estimator the speedups are
    /// ratios of.
    pub samples_per_s: Option<f64>,
    pub weak_speedup: Option<f64>,
    pub weak_speedup_low: Option<f64>,
    pub weak_speedup_high: Option<f64>,
    /// How the weak interval was found, with its df (scaling.csv's `interval_method`).
    pub weak_interval_method: Option<String>,
    pub weak_efficiency: Option<f64>,
    pub strong_speedup: Option<f64>,
    pub strong_speedup_low: Option<f64>,
    pub strong_speedup_high: Option<f64>,
    pub strong_interval_method: Option<String>,
    pub strong_efficiency: Option<f64>,
    /// R = (forward + backward) / all-reduce transfer, geometric mean over repeats
    /// (lowest node type).
    pub compute_comm_ratio: Option<f64>,
    /// Last epoch's validation loss and accuracy, medians over repeats (not throughputs:
    /// the one figure of this table that is no geometric mean).
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
    /// The first failed repeat's error.
    pub error: Option<String>,
    /// The completed repeats' run ids: where the point's rows in `reduce`'s report are.
    #[serde(skip)]
    pub run_ids: Vec<String>,
    /// Samples trained on (all ranks, warm-up included), median over repeats.
    #[serde(skip)]
    pub samples_trained: Option<f64>,
}

fn med(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

fn geo(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| crate::stats::geometric_mean(v)).filter(|g| g.is_finite())
}

/// Whether a point planned for `scaling` ("weak", "strong" or "weak+strong") is
/// compared in `mode`.
fn in_mode(scaling: &str, mode: &str) -> bool {
    scaling.split('+').any(|m| m == mode)
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Which of `runs` (each a run id and the study run its manifest names) is repeat `rep`
/// of `point`: the run whose manifest names them, or else one from before manifests
/// named them (none) in the folder named for them ([`plan::run_name`]). A run whose
/// manifest names another point or repeat is never taken by its folder's name.
fn joined(runs: &[(&str, Option<&StudyRun>)], point: &PointId, rep: usize, run_name: &str) -> Option<usize> {
    let by_id = |(_, s): &(&str, Option<&StudyRun>)| s.is_some_and(|s| s.point == *point && s.repeat == rep);
    let by_name = |(id, s): &(&str, Option<&StudyRun>)| s.is_none() && *id == run_name;
    runs.iter().position(by_id).or_else(|| runs.iter().position(by_name))
}

/// Summarises every point of `plan` from `report`, `reduce`'s report of the study's runs.
pub(super) fn summarise(report: &Report, plan: &Plan, repeat: usize, state: &State) -> Vec<PointSummary> {
    let keys: Vec<(&str, Option<&StudyRun>)> = report.runs.iter().map(|r| (r.run_id.as_str(), r.study_run.as_ref())).collect();
    plan.points
        .iter()
        .map(|p| {
            let names: Vec<String> = (0..repeat).map(|r| plan::run_name(p, r)).collect();
            // The repeats the study recorded as completed, each joined to its run in the report.
            let done = names
                .iter()
                .filter(|n| state.get(*n).is_some_and(|o| o.status == RunStatus::Completed))
                .count();
            let runs: Vec<&RunReport> = names
                .iter()
                .enumerate()
                .filter(|(_, n)| state.get(*n).is_some_and(|o| o.status == RunStatus::Completed))
                .filter_map(|(rep, n)| joined(&keys, &p.id, rep, n).map(|i| &report.runs[i]))
                .collect();
            let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
            let error = names
                .iter()
                .find_map(|n| state.get(n).filter(|o| o.status == RunStatus::Failed).and_then(|o| o.error.clone()));
            let row_of = |mode: ScalingMode| -> Option<&ScalingRow> {
                report
                    .scaling
                    .iter()
                    .find(|row| row.scaling_mode == mode && row.run_ids.iter().any(|id| ids.contains(&id.as_str())))
            };
            let get = |mode: ScalingMode, f: fn(&ScalingRow) -> f64| row_of(mode).and_then(|r| finite(f(r)));
            let method = |mode: ScalingMode| row_of(mode).map(|r| r.interval_method.clone()).filter(|m| !m.is_empty());
            let of_runs = |f: fn(&RunReport) -> Option<f64>| -> Vec<f64> { runs.iter().filter_map(|r| f(r)).collect() };
            // R of a run: its lowest over node types.
            let r: Vec<f64> = ids
                .iter()
                .filter_map(|id| {
                    report
                        .summary
                        .iter()
                        .filter(|row| row.run_id == *id)
                        .filter_map(|row| finite(row.compute_comm_ratio))
                        .reduce(f64::min)
                })
                .collect();
            let baseline = p.ranks == 1 && row_of(ScalingMode::Baseline).is_some();
            // A baseline's speedup and efficiency are 1 in the modes its study compares
            // in, and nothing in the others (a weak-only study has no strong ideal).
            let one = |mode: &str, v: Option<f64>| match baseline {
                true => in_mode(&p.scaling, mode).then_some(1.0),
                false => v,
            };
            PointSummary {
                point: p.id.clone(),
                workload: p.workload.clone(),
                scaling: p.scaling.clone(),
                ranks: p.ranks,
                batch_per_rank: p.batch_per_rank,
                global_batch: p.global_batch,
                repeats_completed: done,
                repeats_planned: repeat,
                samples_per_s: geo(&of_runs(|r| finite(r.samples_per_s))),
                weak_speedup: one("weak", get(ScalingMode::Weak, |r| r.speedup)),
                weak_speedup_low: get(ScalingMode::Weak, |r| r.speedup_low),
                weak_speedup_high: get(ScalingMode::Weak, |r| r.speedup_high),
                weak_interval_method: method(ScalingMode::Weak),
                weak_efficiency: one("weak", get(ScalingMode::Weak, |r| r.efficiency)),
                strong_speedup: one("strong", get(ScalingMode::Strong, |r| r.speedup)),
                strong_speedup_low: get(ScalingMode::Strong, |r| r.speedup_low),
                strong_speedup_high: get(ScalingMode::Strong, |r| r.speedup_high),
                strong_interval_method: method(ScalingMode::Strong),
                strong_efficiency: one("strong", get(ScalingMode::Strong, |r| r.efficiency)),
                compute_comm_ratio: geo(&r),
                val_loss: med(&of_runs(|r| r.final_val_loss)),
                val_accuracy: med(&of_runs(|r| r.final_val_accuracy)),
                error,
                run_ids: ids.iter().map(|id| id.to_string()).collect(),
                samples_trained: med(&of_runs(|r| Some(r.samples_trained as f64))),
            }
        })
        .collect()
}

/// One sentence on how a workload scales, from its points and `reduce`'s report of
/// them (`rows`, `runs`): the point with the most ranks said as report.md says it
/// ([`verdict::point_verdict`]), then accuracy at the global batches run.
pub(super) fn verdict(workload: &str, points: &[&PointSummary], rows: &[ScalingRow], runs: &[RunReport]) -> String {
    // A point with no completed repeat failed (it has an error) or was not run (a
    // study stopped before it).
    let failed = points.iter().filter(|p| p.repeats_completed == 0 && p.error.is_some()).count();
    let not_run = points.iter().filter(|p| p.repeats_completed == 0 && p.error.is_none()).count();
    let tail = match (failed, not_run) {
        (0, 0) => String::new(),
        (f, 0) => format!(" ({f} point(s) failed: see points.csv)"),
        (0, n) => format!(" ({n} point(s) not run yet: run the study again to resume)"),
        (f, n) => format!(" ({f} point(s) failed, {n} not run yet: see points.csv)"),
    };
    // The largest rank count with a speedup; weak before strong at equal counts.
    let best = points
        .iter()
        .filter(|p| p.ranks > 1)
        .flat_map(|p| {
            [
                p.weak_speedup.map(|s| (p, ScalingMode::Weak, s)),
                p.strong_speedup.map(|s| (p, ScalingMode::Strong, s)),
            ]
        })
        .flatten()
        .max_by_key(|(p, mode, _)| (p.ranks, *mode == ScalingMode::Weak));
    let Some((p, mode, s)) = best else {
        let ran = points.iter().any(|p| p.ranks > 1 && p.repeats_completed > 0);
        let single_ran = points.iter().any(|p| p.ranks == 1 && p.repeats_completed > 0);
        let single_planned = points.iter().any(|p| p.ranks == 1);
        let mut counts: Vec<usize> = points.iter().map(|p| p.ranks).collect();
        counts.sort_unstable();
        counts.dedup();
        return if ran && !single_planned && counts.len() == 1 {
            format!(
                "{workload}: no speedup: the study planned no 1-rank point and one rank count ({}), so no point has a \
                 reference to be compared with (add 1 to `ranks` for a speedup; the figures per point stand){tail}.",
                counts[0]
            )
        } else if ran && single_ran {
            // Ran, but not comparable: e.g. NCCL at 1 rank and CPU-staged MPI where ranks share a GPU.
            format!(
                "{workload}: no speedup: its 1-rank point ran with a different configuration (see missing_reference \
                 in report/scaling.csv; pass the same --allreduce to every point){tail}."
            )
        } else if ran {
            format!("{workload}: no speedup: its 1-rank reference did not complete{tail}.")
        } else {
            format!("{workload}: no point beyond 1 rank completed, so there is no speedup{tail}.")
        };
    };
    let row = rows
        .iter()
        .find(|r| r.scaling_mode == mode && r.run_ids.iter().any(|id| p.run_ids.contains(id)));
    let mut v = match row {
        Some(row) => format!("{workload}: {}", verdict::point_verdict(row, runs)),
        None => format!(
            "{workload}: at {} ranks ({mode}) speedup {s:.2}, with no row in the report to say more.",
            p.ranks
        ),
    };
    let smallest = points.iter().map(|p| p.ranks).min().unwrap_or(1);
    if smallest > 1 {
        let _ = write!(
            v,
            " The study planned no 1-rank point: each point is judged against the runs of its smallest planned point \
             ({smallest} ranks), as `reduce` takes the run with the fewest ranks for its reference."
        );
    }
    if let Some(a) = accuracy(points) {
        let _ = write!(v, " {a}");
    }
    if !tail.is_empty() {
        let _ = write!(v, "{tail}.");
    }
    v
}

/// Validation accuracy at the smallest and the largest global batch, when the points
/// differ in it: compared at equal samples trained, or with what differs said.
fn accuracy(points: &[&PointSummary]) -> Option<String> {
    let with_acc: Vec<&&PointSummary> = points.iter().filter(|p| p.val_accuracy.is_some()).collect();
    let lo = with_acc.iter().min_by_key(|p| p.global_batch)?;
    let hi = with_acc.iter().max_by_key(|p| p.global_batch)?;
    if hi.global_batch <= lo.global_batch {
        return None;
    }
    let acc = |p: &PointSummary| p.val_accuracy.unwrap_or(f64::NAN) * 100.0;
    let (a, b) = (lo.samples_trained.unwrap_or(f64::NAN), hi.samples_trained.unwrap_or(f64::NAN));
    // Equal within 1 %: the same amount of training.
    let same = (a - b).abs() <= 0.01 * a.max(b);
    Some(if same {
        format!(
            "Validation accuracy {:.1} % at global batch {} vs {:.1} % at {}, both after {a:.0} samples.",
            acc(lo),
            lo.global_batch,
            acc(hi),
            hi.global_batch
        )
    } else {
        format!(
            "Validation accuracy {:.1} % at global batch {} ({a:.0} samples trained) vs {:.1} % at {} ({b:.0} samples): \
             they trained on different numbers of samples, so the gap is no effect of the batch alone; \
             compare at equal samples (steps × global batch) or whole epochs.",
            acc(lo),
            lo.global_batch,
            acc(hi),
            hi.global_batch
        )
    })
}

fn cell(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map(|x| format!("{:.*}", digits, x * scale)).unwrap_or_default()
}

fn interval(low: Option<f64>, high: Option<f64>) -> String {
    match (low, high) {
        (Some(l), Some(h)) => format!(" ({l:.2}–{h:.2})"),
        _ => String::new(),
    }
}

/// Stages `study.csv`, `study.md` and a speedup curve per workload from `reduced`,
/// `reduce`'s report of the study's runs, into `files` (the study's `report/` folder);
/// returns the verdict sentences.
pub(super) fn write(
    files: &mut StagedFiles,
    plan: &Plan,
    repeat: usize,
    state: &State,
    reduced: &Report,
    plots: bool,
) -> Result<Vec<String>> {
    let rows = summarise(reduced, plan, repeat, state);
    files.write("study.csv", &crate::reduce::report::csv_bytes(&rows)?)?;
    let mut by: BTreeMap<&str, Vec<&PointSummary>> = BTreeMap::new();
    for r in &rows {
        by.entry(r.workload.as_str()).or_default().push(r);
    }
    let verdicts: Vec<String> = by.iter().map(|(w, ps)| verdict(w, ps, &reduced.scaling, &reduced.runs)).collect();
    let mut md = String::from("# Study summary\n\n");
    let _ = writeln!(
        md,
        "Each point's repeats together: throughput and R are geometric means over completed repeats, \
         speedups are `reduce`'s ratios of those geometric means (weak: against the 1-rank point of the same batch per rank; \
         strong: against the 1-rank point of the same global batch; in brackets the 95 % \
         t-interval on log throughput over repeats, whose method and degrees of freedom \
         study.csv gives; a direction is claimed only where it excludes 1), \
         R = (forward + backward) / all-reduce transfer, and \
         validation figures are the last epoch's, medians over repeats.\n"
    );
    // The decision first, as report.md opens with it; then each workload's verdict.
    md.push_str(&crate::reduce::report::decisions_markdown(reduced));
    let _ = writeln!(md, "\n## Verdicts\n");
    for v in &verdicts {
        let _ = writeln!(md, "- {v}");
    }
    for (workload, ps) in &by {
        let _ = writeln!(md, "\n## {workload}\n");
        md.push_str(
            "| point | scaling | ranks | batch/rank | global batch | repeats | samples/s | weak speedup | weak eff. | strong speedup | strong eff. | R | val loss | val acc. | error |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for p in ps {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {}/{} | {} | {}{} | {} | {}{} | {} | {} | {} | {} | {} |",
                p.point,
                p.scaling,
                p.ranks,
                p.batch_per_rank,
                p.global_batch,
                p.repeats_completed,
                p.repeats_planned,
                cell(p.samples_per_s, 1.0, 1),
                cell(p.weak_speedup, 1.0, 2),
                interval(p.weak_speedup_low, p.weak_speedup_high),
                cell(p.weak_efficiency, 100.0, 0),
                cell(p.strong_speedup, 1.0, 2),
                interval(p.strong_speedup_low, p.strong_speedup_high),
                cell(p.strong_efficiency, 100.0, 0),
                cell(p.compute_comm_ratio, 1.0, 2),
                cell(p.val_loss, 1.0, 4),
                cell(p.val_accuracy, 100.0, 1),
                p.error.as_deref().unwrap_or("").replace('|', "/").replace('\n', " ")
            );
        }
        if plots {
            let _ = writeln!(md, "\n![speedup of {workload}]({}.png)", plot_stem(workload));
        }
    }
    crate::reduce::report::noise::section(&mut md, &reduced.runs, &reduced.time_to_accuracy, &reduced.time_to_accuracy_none);
    crate::reduce::report::target::section(&mut md, &reduced.targets);
    // The recommendations in full, as report.md says them: the levels and each
    // workload's sentence and table.
    if let Some(p) = reduced.projection.as_ref().filter(|p| !p.recommendations.is_empty()) {
        let _ = write!(
            md,
            "\n## The recommendations in full\n{}",
            crate::reduce::report::recommendation::markdown(p)
        );
    }
    files.write("study.md", md.as_bytes())?;
    let mut curves = Vec::new();
    for (workload, ps) in &by {
        curves.push((plot_stem(workload), speedup_chart(workload, ps)?));
    }
    let page = html::study_page(&md, &curves, plots, html::PAGE_BYTES_MAX);
    for n in &page.notes {
        eprintln!("study.html: {n}");
    }
    files.write("study.html", page.html.as_bytes())?;
    if plots {
        let r = Rasteriser::new();
        for (stem, svg) in &curves {
            r.stage(files, stem, svg)?;
        }
    }
    Ok(verdicts)
}

/// The file name (without extension) of a workload's speedup plot, the same in study.md's
/// link and on disk.
fn plot_stem(workload: &str) -> String {
    crate::files::safe_component(&format!("speedup-{}", workload.replace(['.', '/', ' '], "_")))
}

/// Speedup against ranks: a line per scaling mode with its interval as error bars, and
/// the ideal line.
fn speedup_chart(workload: &str, points: &[&PointSummary]) -> Result<String> {
    type Field = fn(&PointSummary) -> Option<f64>;
    let curve = |f: Field, low: Field, high: Field| -> Vec<Point> {
        let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
        points
            .iter()
            .filter_map(|p| Some(Point::new(p.ranks as f64, f(p)?).with_interval(nan(low(p)), nan(high(p)))))
            .collect()
    };
    let max_ranks = points.iter().map(|p| p.ranks).max().unwrap_or(1).max(2) as f64;
    let mut series = Vec::new();
    for (name, pts) in [
        ("weak", curve(|p| p.weak_speedup, |p| p.weak_speedup_low, |p| p.weak_speedup_high)),
        (
            "strong",
            curve(|p| p.strong_speedup, |p| p.strong_speedup_low, |p| p.strong_speedup_high),
        ),
    ] {
        if pts.len() > 1 {
            series.push(Series {
                name: name.into(),
                points: pts,
                kind: SeriesKind::Line,
                colour: None,
            });
        }
    }
    series.push(Series::ideal("ideal (speedup = ranks)", max_ranks, |n| n));
    plot::line_chart(&LineChart {
        title: format!("Speedup: {workload} (bars: interval)"),
        x_label: "ranks".into(),
        y_label: "speedup".into(),
        x_scale: XScale::Ranks,
        series,
        bands: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ranks: usize, global: usize, weak: Option<f64>, acc: Option<f64>, samples: f64) -> PointSummary {
        PointSummary {
            point: PointId(format!("p{ranks}")),
            workload: "w".into(),
            scaling: "weak".into(),
            ranks,
            batch_per_rank: global / ranks,
            global_batch: global,
            repeats_completed: 1,
            repeats_planned: 1,
            samples_per_s: Some(100.0),
            weak_speedup: weak,
            weak_speedup_low: None,
            weak_speedup_high: None,
            weak_interval_method: None,
            weak_efficiency: weak.map(|s| s / ranks as f64),
            strong_speedup: None,
            strong_speedup_low: None,
            strong_speedup_high: None,
            strong_interval_method: None,
            strong_efficiency: None,
            compute_comm_ratio: None,
            val_loss: None,
            val_accuracy: acc,
            error: None,
            run_ids: vec![format!("run{ranks}")],
            samples_trained: Some(samples),
        }
    }

    #[test]
    fn a_run_joins_the_point_and_repeat_its_manifest_names_and_an_old_run_its_folders() {
        let p = PointId::from("000-w-r1");
        let at = |point: &str, repeat| StudyRun {
            point: point.into(),
            repeat,
        };
        let (mine, other) = (at("000-w-r1", 1), at("001-w-r2", 0));
        // A run's id is its folder's name, whatever it is: its manifest says which run it is.
        let runs = [("elsewhere", Some(&mine)), ("000-w-r1-rep0", Some(&other)), ("000-w-r1-rep2", None)];
        assert_eq!(joined(&runs, &p, 1, "000-w-r1-rep1"), Some(0));
        // A folder named for repeat 0 whose manifest names another point is that point's run.
        assert_eq!(joined(&runs, &p, 0, "000-w-r1-rep0"), None);
        assert_eq!(joined(&runs, &PointId::from("001-w-r2"), 0, "001-w-r2-rep0"), Some(1));
        // A run from before manifests named their point joins by its folder's name.
        assert_eq!(joined(&runs, &p, 2, "000-w-r1-rep2"), Some(2));
        assert_eq!(joined(&runs, &p, 3, "000-w-r1-rep3"), None);
    }

    #[test]
    fn a_baseline_is_its_own_ideal_only_in_the_modes_its_study_compares() {
        assert!(in_mode("weak", "weak") && !in_mode("weak", "strong"));
        assert!(in_mode("weak+strong", "strong") && in_mode("weak+strong", "weak"));
        assert!(!in_mode("strong", "weak"));
    }

    #[test]
    fn verdicts_say_what_is_missing_and_compare_accuracy_at_equal_samples() {
        let a = point(1, 32, Some(1.0), Some(0.8), 3200.0);
        let b = point(2, 64, Some(1.8), Some(0.78), 6400.0);
        // Without the report's row no direction is claimed.
        let v = verdict("t", &[&a, &b], &[], &[]);
        assert!(v.contains("at 2 ranks (weak) speedup 1.80, with no row"), "{v}");
        // Same steps, twice the global batch: twice the samples, and the sentence says so.
        assert!(v.contains("different numbers of samples"), "{v}");
        let c = point(2, 64, Some(1.8), Some(0.78), 3200.0);
        let v = verdict("t", &[&a, &c], &[], &[]);
        assert!(
            v.contains("80.0 % at global batch 32 vs 78.0 % at 64, both after 3200 samples"),
            "{v}"
        );
        let mut lone = point(2, 64, None, None, 0.0);
        lone.repeats_completed = 1;
        // A lone 2-rank point of a study that planned no 1-rank point: said as planned.
        let v = verdict("t", &[&lone], &[], &[]);
        assert!(v.contains("the study planned no 1-rank point and one rank count (2)"), "{v}");
        let mut planned_single = point(1, 64, None, None, 0.0);
        (planned_single.repeats_completed, planned_single.error) = (0, Some("failed".into()));
        assert!(verdict("t", &[&planned_single, &lone], &[], &[]).contains("1-rank reference did not complete"));
        // Points of 2 and 4 ranks, no 1-rank one planned: judged against the 2-rank one, and said.
        let mut four = point(4, 128, Some(1.8), None, 0.0);
        four.repeats_completed = 1;
        let v = verdict("t", &[&lone, &four], &[], &[]);
        assert!(v.contains("judged against the runs of its smallest planned point (2 ranks)"), "{v}");
        // A 1-rank point that ran but is not comparable is not called incomplete.
        let mut single = point(1, 64, None, None, 0.0);
        single.repeats_completed = 1;
        assert!(verdict("t", &[&single, &lone], &[], &[]).contains("ran with a different configuration"));
        let mut failed = point(2, 64, None, None, 0.0);
        failed.repeats_completed = 0;
        failed.error = Some("boom".into());
        let v = verdict("t", &[&failed], &[], &[]);
        assert!(
            v.contains("no point beyond 1 rank completed") && v.contains("1 point(s) failed"),
            "{v}"
        );
        // A point a stopped study never reached has not failed.
        let mut later = point(4, 64, None, None, 0.0);
        later.repeats_completed = 0;
        let v = verdict("t", &[&failed, &later], &[], &[]);
        assert!(v.contains("1 point(s) failed, 1 not run yet"), "{v}");
    }
}
