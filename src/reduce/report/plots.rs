//! The plots: speedup and efficiency against ranks, phases per run, bandwidth against
//! message size, and each run's step time per rank.

use super::{Report, RunReport};
use crate::plot::{self, Series};
use crate::reduce::analysis::{ScalingMode, ScalingRow, TypeSummary};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// Every plot of `report`, as SVG and PNG, into `out`.
pub fn plots(out: &Path, report: &Report) -> Result<()> {
    let raster = plot::Rasteriser::new();
    scaling_plots(&raster, out, &report.scaling)?;
    phases_plot(&raster, out, &report.runs)?;
    bandwidth_plot(&raster, out, &report.runs, &report.summary)?;
    step_time_plots(&raster, out, &report.runs)
}

/// Speedup and efficiency against ranks, one series per workload and batch per rank.
fn scaling_plots(raster: &plot::Rasteriser, out: &Path, scaling: &[ScalingRow]) -> Result<()> {
    // One series per workload, mode and batch; the baseline (speedup 1) starts each.
    let mut series: BTreeMap<String, Vec<&ScalingRow>> = BTreeMap::new();
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
            series.entry(format!("{} {mode} {batch}", r.model)).or_default().push(r);
        }
    }
    series.retain(|_, rows| rows.len() > 1);
    let max_ranks = scaling.iter().map(|r| r.ranks).max().unwrap_or(1) as f64;
    let min_ranks = 1.0;
    let mk = |f: &dyn Fn(&ScalingRow) -> f64| -> Vec<Series> {
        series
            .iter()
            .map(|(name, rows)| Series {
                name: name.clone(),
                points: rows.iter().map(|r| (r.ranks as f64, f(r))).collect(),
                dashed: false,
                markers_only: false,
            })
            .collect()
    };
    let mut s = mk(&|r| r.speedup);
    let base_ranks = min_ranks;
    s.push(Series {
        name: "ideal".into(),
        points: vec![(min_ranks, min_ranks / base_ranks), (max_ranks, max_ranks / base_ranks)],
        dashed: true,
        markers_only: false,
    });
    raster.write(
        &plot::line_chart("Speedup vs ranks", "ranks", "speedup (throughput / baseline)", &s, false),
        &out.join("speedup"),
    )?;
    let mut e = mk(&|r| r.efficiency);
    e.push(Series {
        name: "ideal".into(),
        points: vec![(min_ranks, 1.0), (max_ranks, 1.0)],
        dashed: true,
        markers_only: false,
    });
    raster.write(
        &plot::line_chart("Parallel efficiency vs ranks", "ranks", "efficiency", &e, false),
        &out.join("efficiency"),
    )?;

    Ok(())
}

/// Mean time per step by phase, one bar per run.
fn phases_plot(raster: &plot::Rasteriser, out: &Path, runs: &[RunReport]) -> Result<()> {
    let names: Vec<String> = runs.iter().map(|r| format!("{}r b{}", r.ranks, r.batch_per_rank)).collect();
    let ms = |f: fn(&RunReport) -> f64| -> Vec<f64> { runs.iter().map(|r| f(r) * 1e3).collect() };
    let stacks = vec![
        ("data".to_string(), ms(|r| r.per_step.data_s)),
        ("forward".to_string(), ms(|r| r.per_step.forward_s)),
        ("backward".to_string(), ms(|r| r.per_step.backward_s)),
        ("comm: transfer".to_string(), ms(|r| r.per_step.comm_transfer_s)),
        ("comm: waiting".to_string(), ms(|r| r.per_step.comm_wait_s)),
        ("optimizer".to_string(), ms(|r| r.per_step.optimizer_s)),
        ("other".to_string(), ms(|r| r.per_step.other_s)),
    ];
    raster.write(
        &plot::stacked_bars("Mean time per step by phase", "ms per step", &names, &stacks),
        &out.join("phases"),
    )?;

    Ok(())
}

/// Bus bandwidth against message size: the raw probe and the all-reduce inside training.
fn bandwidth_plot(raster: &plot::Rasteriser, out: &Path, runs: &[RunReport], summaries: &[TypeSummary]) -> Result<()> {
    let mut probe = Vec::new();
    let mut train = Vec::new();
    for r in runs.iter().filter(|r| r.ranks > 1) {
        if let Some(p) = &r.probe {
            probe.push((p.bytes as f64, p.busbw_bytes_per_s / 1e9));
        }
        // The slowest node type's bus bandwidth, as summary.csv gives it.
        let busbw = summaries
            .iter()
            .filter(|s| s.run_id == r.run_id)
            .map(|s| s.busbw_bytes_per_s)
            .fold(f64::NAN, f64::min);
        train.push((r.bytes_per_step.unwrap_or(0) as f64, busbw / 1e9));
    }
    if !train.is_empty() {
        let s = vec![
            Series {
                name: "raw MPI_Allreduce".into(),
                points: probe,
                dashed: false,
                markers_only: true,
            },
            Series {
                name: "inside training".into(),
                points: train,
                dashed: false,
                markers_only: true,
            },
        ];
        raster.write(
            &plot::line_chart("All-reduce bus bandwidth vs message size", "bytes per step", "busbw GB/s", &s, true),
            &out.join("bandwidth"),
        )?;
    }

    Ok(())
}

/// Each run's step time distribution per rank.
fn step_time_plots(raster: &plot::Rasteriser, out: &Path, runs: &[RunReport]) -> Result<()> {
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
        );
        raster.write(&svg, &out.join(format!("step_time_per_rank-{}", r.run_id)))?;
    }
    Ok(())
}
