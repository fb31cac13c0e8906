//! The plots: speedup and efficiency against ranks, phases per run, bandwidth against
//! message size, and each run's step time per rank.

use super::{Report, RunReport, StepPhases};
use crate::files::StagedFiles;
use crate::plot::{self, LineChart, Point, Series, SeriesKind, XScale};
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use anyhow::Result;
use std::collections::BTreeMap;

/// Every plot of `report`, as SVG and PNG, staged into `out`.
pub fn plots(raster: &plot::Rasteriser, out: &mut StagedFiles, report: &Report) -> Result<()> {
    scaling_plots(raster, out, &report.scaling)?;
    phases_plot(raster, out, &report.runs)?;
    bandwidth_plot(raster, out, &report.runs, &report.summary)?;
    step_time_plots(raster, out, &report.runs)
}

/// Speedup and efficiency against ranks, one series per workload and batch per rank,
/// with the speedup's interval as error bars and the ideal line.
fn scaling_plots(raster: &plot::Rasteriser, out: &mut StagedFiles, scaling: &[ScalingRow]) -> Result<()> {
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
    raster.stage(out, "speedup", &plot::line_chart(&speedup)?)?;
    let mut e = mk(&|r| r.efficiency);
    e.push(Series::ideal("ideal (efficiency 1)", max_ranks, |_| 1.0));
    let efficiency = LineChart {
        title: "Parallel efficiency vs ranks (bars: interval)".into(),
        y_label: "efficiency".into(),
        series: e,
        ..speedup
    };
    raster.stage(out, "efficiency", &plot::line_chart(&efficiency)?)
}

/// Mean time per step by phase, stacked, one bar per rank count (and batch, and model
/// where there are several): the mean over the runs there.
fn phases_plot(raster: &plot::Rasteriser, out: &mut StagedFiles, runs: &[RunReport]) -> Result<()> {
    let models: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.model.as_str()).collect();
    let mut groups: BTreeMap<(usize, &str, usize), Vec<&RunReport>> = BTreeMap::new();
    for r in runs {
        groups.entry((r.ranks, r.model.as_str(), r.batch_per_rank)).or_default().push(r);
    }
    let names: Vec<String> = groups
        .keys()
        .map(|(ranks, model, batch)| match models.len() {
            1 => format!("{ranks} r · b{batch}"),
            _ => format!("{model} {ranks} r · b{batch}"),
        })
        .collect();
    let ms = |f: fn(&StepPhases) -> f64| -> Vec<f64> {
        groups
            .values()
            .map(|rs| rs.iter().map(|r| f(&r.per_step)).sum::<f64>() / rs.len() as f64 * 1e3)
            .collect()
    };
    let stacks = vec![
        ("data".to_string(), ms(|p| p.data_s)),
        ("forward".to_string(), ms(|p| p.forward_s)),
        ("backward".to_string(), ms(|p| p.backward_s)),
        ("comm: transfer".to_string(), ms(|p| p.comm_transfer_s)),
        ("comm: waiting".to_string(), ms(|p| p.comm_wait_s)),
        ("optimizer".to_string(), ms(|p| p.optimizer_s)),
        ("other".to_string(), ms(|p| p.other_s)),
    ];
    let svg = plot::stacked_bars(
        "Mean time per step by phase",
        "ranks · batch per rank (mean over the runs)",
        "ms per step",
        &names,
        &stacks,
    )?;
    raster.stage(out, "phases", &svg)
}

/// Bus bandwidth against message size: the raw probe and the all-reduce inside training.
fn bandwidth_plot(raster: &plot::Rasteriser, out: &mut StagedFiles, runs: &[RunReport], summaries: &[TypeSummary]) -> Result<()> {
    let mut probe = Vec::new();
    let mut train = Vec::new();
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
        train.push(Point::new(r.bytes_per_step.unwrap_or(0) as f64, busbw / 1e9));
    }
    if !train.is_empty() {
        let markers = |name: &str, points: Vec<Point>| Series {
            name: name.into(),
            points,
            kind: SeriesKind::Markers,
            colour: None,
        };
        let chart = LineChart {
            title: "All-reduce bus bandwidth vs message size".into(),
            x_label: "bytes per step".into(),
            y_label: "busbw GB/s".into(),
            x_scale: XScale::Log10,
            series: vec![markers("raw MPI_Allreduce", probe), markers("inside training", train)],
            bands: Vec::new(),
        };
        raster.stage(out, "bandwidth", &plot::line_chart(&chart)?)?;
    }

    Ok(())
}

/// Each run's step time distribution per rank.
fn step_time_plots(raster: &plot::Rasteriser, out: &mut StagedFiles, runs: &[RunReport]) -> Result<()> {
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
        // The stem is made a file name of its own: a run id never makes it a path.
        raster.stage(out, &format!("step_time_per_rank-{}", r.run_id), &svg)?;
    }
    Ok(())
}
