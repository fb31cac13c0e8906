//! The plots: speedup and efficiency against ranks, the efficiency waterfall, phases per
//! rank count (a panel per batch), bandwidth against message size, and each run's step time per rank
//! and own work per rank and step (the heatmap).

use super::{Report, RunReport, StepPhases};
use crate::files::StagedFiles;
use crate::plot::{self, LineChart, Point, Series, SeriesKind, XScale};
use crate::reduce::analysis::heatmap::{HeatmapLimits, StepHeatmap};
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use anyhow::Result;
use std::collections::BTreeMap;

/// One drawn plot: the file stem it is written under, and its SVG document.
#[derive(Debug, Clone)]
pub(crate) struct Picture {
    pub stem: String,
    pub svg: String,
}

/// Every plot of `report` (report.html shows them inline; with plots they are also
/// written as files), the heatmaps binned to at most `heatmap` cells.
pub(crate) fn pictures(report: &Report, heatmap: HeatmapLimits) -> Result<Vec<Picture>> {
    let mut out = Vec::new();
    scaling_plots(&mut out, &report.scaling)?;
    waterfall_plot(&mut out, &report.scaling)?;
    phases_plots(&mut out, &report.runs)?;
    phase_share_plots(&mut out, &report.runs)?;
    bandwidth_plot(&mut out, &report.runs, &report.summary)?;
    step_time_plots(&mut out, &report.runs)?;
    heatmap_plots(&mut out, &report.runs, heatmap)?;
    if let Some(p) = report.projection.as_ref().filter(|p| !p.rows.is_empty()) {
        out.push(picture("projection", super::projection::projection_svg(&p.rows)?));
    }
    Ok(out)
}

/// Each of `pictures` as SVG and PNG, staged into `out`.
pub(crate) fn plots(raster: &plot::Rasteriser, out: &mut StagedFiles, pictures: &[Picture]) -> Result<()> {
    for p in pictures {
        raster.stage(out, &p.stem, &p.svg)?;
    }
    Ok(())
}

fn picture(stem: &str, svg: String) -> Picture {
    Picture {
        stem: stem.to_string(),
        svg,
    }
}

/// Speedup and efficiency against ranks, one series per workload and batch per rank,
/// with the speedup's interval as error bars and the ideal line.
fn scaling_plots(out: &mut Vec<Picture>, scaling: &[ScalingRow]) -> Result<()> {
    // One series per workload, mode, batch and comparison (runs that differ in anything
    // else are never one curve); the baseline (speedup 1) starts each.
    let mut groups: BTreeMap<(String, &str), Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling.iter().filter(|r| r.speedup.is_finite()) {
        let modes: &[ScalingMode] = if r.scaling_mode == ScalingMode::Baseline {
            &[ScalingMode::Weak, ScalingMode::Strong]
        } else {
            std::slice::from_ref(&r.scaling_mode)
        };
        for &mode in modes {
            let batch = if mode == ScalingMode::Strong {
                format!("global {}", r.global_batch)
            } else {
                format!("b{}", r.batch_per_rank)
            };
            let name = format!("{} {mode} {batch}", r.model);
            groups.entry((name, r.comparison.as_str())).or_default().push(r);
        }
    }
    groups.retain(|_, rows| rows.len() > 1);
    let mut series: Vec<(String, Vec<&ScalingRow>)> = Vec::new();
    for ((name, _), rows) in groups {
        let twins = series.iter().filter(|s| s.0.starts_with(&name)).count();
        series.push((if twins == 0 { name } else { format!("{name} ({})", twins + 1) }, rows));
    }
    let max_ranks = scaling.iter().map(|r| r.ranks).max().unwrap_or(1).max(2) as f64;
    // Efficiency is speedup over the rank ratio, so its interval is the speedup's scaled
    // by the same factor.
    let mk = |f: &dyn Fn(&ScalingRow) -> f64| -> Vec<Series> {
        series
            .iter()
            .map(|(name, rows)| Series {
                name: name.clone(),
                points: rows
                    .iter()
                    .map(|r| {
                        let scale = f(r) / r.speedup;
                        Point::new(r.ranks as f64, f(r)).with_interval(r.speedup_low * scale, r.speedup_high * scale)
                    })
                    .collect(),
                kind: SeriesKind::Line,
                colour: None,
            })
            .collect()
    };
    let mut s = mk(&|r| r.speedup);
    s.push(Series::ideal("ideal (speedup = ranks)", max_ranks, |n| n));
    let speedup = LineChart {
        title: "Speedup vs ranks (bars: interval)".into(),
        x_label: "ranks".into(),
        y_label: "speedup (throughput / baseline)".into(),
        x_scale: XScale::Ranks,
        series: s,
        bands: Vec::new(),
    };
    out.push(picture("speedup", plot::line_chart(&speedup)?));
    let mut e = mk(&|r| r.efficiency);
    e.push(Series::ideal("ideal (efficiency 1)", max_ranks, |_| 1.0));
    let efficiency = LineChart {
        title: "Parallel efficiency vs ranks (bars: interval)".into(),
        y_label: "efficiency".into(),
        series: e,
        ..speedup
    };
    out.push(picture("efficiency", plot::line_chart(&efficiency)?));
    Ok(())
}

/// Mean time per step by phase, stacked, one panel per model and batch per rank (a
/// batch's step is never set beside another batch's), one bar per rank count: the mean
/// over the runs there.
fn phases_plots(out: &mut Vec<Picture>, runs: &[RunReport]) -> Result<()> {
    for ((model, batch), by_ranks) in panels(runs) {
        let names: Vec<String> = by_ranks.keys().map(|n| format!("{n} ranks")).collect();
        let ms = |part: usize| -> Vec<f64> {
            by_ranks
                .values()
                .map(|rs| rs.iter().map(|r| r.per_step.parts()[part].1).sum::<f64>() / rs.len() as f64 * 1e3)
                .collect()
        };
        let svg = plot::stacked_bars(
            &format!("Mean time per step by phase: {model}, batch {batch}/rank"),
            "ranks (mean over the runs)",
            "ms per step",
            &names,
            &phase_stacks(ms),
        )?;
        out.push(picture(&format!("phases-{model}-b{batch}"), svg));
    }
    Ok(())
}

/// The runs by model and batch per rank (a panel each), then by rank count (a bar each).
fn panels(runs: &[RunReport]) -> BTreeMap<(&str, usize), BTreeMap<usize, Vec<&RunReport>>> {
    let mut panels: BTreeMap<(&str, usize), BTreeMap<usize, Vec<&RunReport>>> = BTreeMap::new();
    for r in runs {
        panels
            .entry((r.model.as_str(), r.batch_per_rank))
            .or_default()
            .entry(r.ranks)
            .or_default()
            .push(r);
    }
    panels
}

/// Bus bandwidth against message size: the raw probe and the all-reduce inside training.
fn bandwidth_plot(out: &mut Vec<Picture>, runs: &[RunReport], summaries: &[TypeSummary]) -> Result<()> {
    let mut probe = Vec::new();
    // One series per batch per rank: each dot's batch is named by its colour's legend.
    let mut train: BTreeMap<usize, Vec<Point>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.ranks > 1) {
        if let Some(p) = &r.probe {
            probe.push(Point::new(p.bytes as f64, p.busbw_bytes_per_s / 1e9));
        }
        // The slowest node type's bus bandwidth, as summary.csv gives it.
        let busbw = summaries
            .iter()
            .filter(|s| s.run_id == r.run_id)
            .map(|s| s.busbw_bytes_per_s)
            .fold(f64::NAN, f64::min);
        train
            .entry(r.batch_per_rank)
            .or_default()
            .push(Point::new(r.bytes_per_step.unwrap_or(0) as f64, busbw / 1e9));
    }
    if !train.is_empty() {
        let markers = |name: String, points: Vec<Point>| Series {
            name,
            points,
            kind: SeriesKind::Markers,
            colour: None,
        };
        let mut series = vec![markers("raw MPI_Allreduce (probe)".into(), probe)];
        series.extend(
            train
                .into_iter()
                .map(|(b, points)| markers(format!("inside training, batch {b}/rank"), points)),
        );
        let chart = LineChart {
            title: "All-reduce bus bandwidth vs message size".into(),
            x_label: "bytes per step".into(),
            y_label: "busbw GB/s".into(),
            x_scale: XScale::Log10,
            series,
            bands: Vec::new(),
        };
        out.push(picture("bandwidth", plot::line_chart(&chart)?));
    }

    Ok(())
}

/// Each run's step time distribution per rank.
fn step_time_plots(out: &mut Vec<Picture>, runs: &[RunReport]) -> Result<()> {
    for r in runs {
        let labels: Vec<String> = r.rank_step_quantiles_s.iter().map(|x| x.rank.to_string()).collect();
        let boxes: Vec<[f64; 5]> = r.rank_step_quantiles_s.iter().map(|x| x.step_s.map(|s| s * 1e3)).collect();
        let groups: Vec<usize> = r
            .rank_step_quantiles_s
            .iter()
            .map(|x| r.node_types.iter().position(|t| *t == x.node_type).unwrap_or(0))
            .collect();
        let svg = plot::box_plot(
            &format!("Step time per rank: {}", r.run_id),
            "step ms",
            &labels,
            &boxes,
            &groups,
            &r.node_types,
        )?;
        // The stem is made a file name of its own when staged: a run id never makes it a path.
        out.push(picture(&format!("step_time_per_rank-{}", r.run_id), svg));
    }
    Ok(())
}

/// The efficiency waterfall as stacked bars, one per compared point: the measured
/// throughput at the bottom, each cause's loss above it, the whole bar the ideal.
fn waterfall_plot(out: &mut Vec<Picture>, scaling: &[ScalingRow]) -> Result<()> {
    let rows: Vec<&ScalingRow> = scaling.iter().filter(|r| r.loss_comm_samples_per_s.is_finite()).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let models: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    let names: Vec<String> = rows
        .iter()
        .map(|r| {
            let model = if models.len() > 1 { format!("{} ", r.model) } else { String::new() };
            format!("{model}{} r {} b{}", r.ranks, r.scaling_mode, r.batch_per_rank)
        })
        .collect();
    let of = |f: fn(&ScalingRow) -> f64| rows.iter().map(|r| f(r)).collect::<Vec<f64>>();
    let stacks = vec![
        ("measured".to_string(), of(|r| r.samples_per_s)),
        ("lost: transfer".to_string(), of(|r| r.loss_comm_samples_per_s)),
        ("lost: waiting for a late rank".to_string(), of(|r| r.loss_straggler_samples_per_s)),
        ("lost: data loading".to_string(), of(|r| r.loss_data_samples_per_s)),
        ("lost: other (contention)".to_string(), of(|r| r.loss_other_samples_per_s)),
    ];
    let svg = plot::stacked_bars(
        "Where the ideal throughput went (bar top: ideal)",
        "point: ranks, mode, batch per rank (a gain is not drawn)",
        "samples/s",
        &names,
        &stacks,
    )?;
    out.push(picture("waterfall", svg));
    Ok(())
}

/// Each phase's share of the step, one panel per model and batch per rank, one bar
/// per rank count (the mean over the runs there).
fn phase_share_plots(out: &mut Vec<Picture>, runs: &[RunReport]) -> Result<()> {
    for ((model, batch), by_ranks) in panels(runs) {
        let names: Vec<String> = by_ranks.keys().map(|n| format!("{n} ranks")).collect();
        let share = |part: usize| -> Vec<f64> {
            by_ranks
                .values()
                .map(|rs| {
                    let part: f64 = rs.iter().map(|r| r.per_step.parts()[part].1).sum();
                    let whole: f64 = rs.iter().map(|r| phase_total(&r.per_step)).sum();
                    100.0 * part / whole
                })
                .collect()
        };
        let svg = plot::stacked_bars(
            &format!("Share of the step by phase: {model}, batch {batch}/rank"),
            "ranks (mean over the runs)",
            "% of the step",
            &names,
            &phase_stacks(share),
        )?;
        out.push(picture(&format!("phase_shares-{model}-b{batch}"), svg));
    }
    Ok(())
}

/// The parts of the step ([`StepPhases::parts`]) in the order a step runs them, each
/// as `value` gives it from the part's position.
fn phase_stacks(value: impl Fn(usize) -> Vec<f64>) -> Vec<(String, Vec<f64>)> {
    StepPhases::layout()
        .into_iter()
        .enumerate()
        .map(|(i, part)| (part.label, value(i)))
        .collect()
}

/// The sum of the step's parts, in their order.
fn phase_total(p: &StepPhases) -> f64 {
    p.parts().iter().map(|(_, seconds)| seconds).sum()
}

/// Per run of several ranks, each rank's own work per step (step time less the exposed
/// all-reduce), binned as the run's heatmap holds it and then to `limits`: a late rank is
/// a dark row, a slow stretch of the run a dark column.
fn heatmap_plots(out: &mut Vec<Picture>, runs: &[RunReport], limits: HeatmapLimits) -> Result<()> {
    for r in runs.iter().filter(|r| r.ranks > 1) {
        out.push(heatmap_picture(&r.run_id, &r.heatmap.coarsened(limits))?);
    }
    Ok(())
}

/// The heatmap of run `run_id` drawn from `h` (`heatmap-RUN`), its x axis saying how
/// many ranks and steps a cell holds when it holds more than one.
pub(crate) fn heatmap_picture(run_id: &str, h: &StepHeatmap) -> Result<Picture> {
    let rows: Vec<String> = (0..h.cells_s.len()).map(|i| h.row_label(i)).collect();
    let columns: Vec<String> = (0..h.columns()).map(|c| h.column_step(c).to_string()).collect();
    let cells: Vec<Vec<f64>> = h.cells_s.iter().map(|row| row.iter().map(|v| v * 1e3).collect()).collect();
    let binned = if h.ranks_per_row > 1 || h.steps_per_column > 1 {
        format!(
            " ({} rank(s) × {} step(s) a cell, its largest)",
            h.ranks_per_row, h.steps_per_column
        )
    } else {
        String::new()
    };
    let svg = plot::heatmap(
        (
            &format!("Own work per rank and step: {run_id}"),
            &format!("global step{binned}"),
            "rank",
        ),
        "own work ms",
        &rows,
        &columns,
        &cells,
    )?;
    Ok(picture(&format!("{HEATMAP_STEM}{run_id}"), svg))
}

/// What every heatmap's stem starts with; the run id follows.
pub(crate) const HEATMAP_STEM: &str = "heatmap-";
