//! The plots: speedup and efficiency against ranks, phases per run, bandwidth against
//! message size, and each run's step time per rank.

use crate::plot::{self, Series};
use crate::record::Phase;
use crate::reduce::analysis::{RunStats, ScalingRow, StepBreakdown, TypeSummary};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// Every plot, as SVG and PNG, into `out`.
pub fn plots(out: &Path, runs: &[&RunStats], summaries: &[TypeSummary], scaling: &[ScalingRow]) -> Result<()> {
    let raster = plot::Rasteriser::new();
    scaling_plots(&raster, out, scaling)?;
    phases_plot(&raster, out, runs)?;
    bandwidth_plot(&raster, out, runs, summaries)?;
    step_time_plots(&raster, out, runs)
}

/// Speedup and efficiency against ranks, one series per workload and batch per rank.
fn scaling_plots(raster: &plot::Rasteriser, out: &Path, scaling: &[ScalingRow]) -> Result<()> {
    // One series per workload, mode and batch; the baseline (speedup 1) starts each.
    let mut series: BTreeMap<String, Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling.iter().filter(|r| r.speedup.is_finite()) {
        let modes: &[&str] = if r.scaling_mode == "baseline" { &["weak", "strong"] } else { &[""] };
        for m in modes {
            let mode = if m.is_empty() { r.scaling_mode.as_str() } else { m };
            let batch = if mode == "strong" {
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
fn phases_plot(raster: &plot::Rasteriser, out: &Path, runs: &[&RunStats]) -> Result<()> {
    let names: Vec<String> = runs
        .iter()
        .map(|r| format!("{}r b{}", r.manifest.world_size, r.manifest.batch_size_per_rank))
        .collect();
    let phase = |p: Phase| -> Vec<f64> { runs.iter().map(|r| r.phase_mean(p) * 1e3).collect() };
    let b: Vec<StepBreakdown> = runs.iter().map(|r| StepBreakdown::of(r)).collect();
    let stacks = vec![
        ("data".to_string(), b.iter().map(|x| x.data_s * 1e3).collect()),
        ("forward".to_string(), phase(Phase::Forward)),
        ("backward".to_string(), phase(Phase::Backward)),
        ("comm: transfer".to_string(), b.iter().map(|x| x.transfer_s * 1e3).collect()),
        ("comm: waiting".to_string(), b.iter().map(|x| x.wait_s * 1e3).collect()),
        ("optimizer".to_string(), phase(Phase::Optimizer)),
        ("other".to_string(), phase(Phase::Other)),
    ];
    raster.write(
        &plot::stacked_bars("Mean time per step by phase", "ms per step", &names, &stacks),
        &out.join("phases"),
    )?;

    Ok(())
}

/// Bus bandwidth against message size: the raw probe and the all-reduce inside training.
fn bandwidth_plot(raster: &plot::Rasteriser, out: &Path, runs: &[&RunStats], summaries: &[TypeSummary]) -> Result<()> {
    let mut probe = Vec::new();
    let mut train = Vec::new();
    for r in runs.iter().filter(|r| r.manifest.world_size > 1) {
        if let Some(p) = &r.manifest.allreduce_probe {
            probe.push((p.bytes as f64, p.busbw_bytes_per_s / 1e9));
        }
        // The slowest node type's bus bandwidth, as summary.csv gives it.
        let busbw = summaries
            .iter()
            .filter(|s| s.run_id == r.manifest.run_id)
            .map(|s| s.busbw_bytes_per_s)
            .fold(f64::NAN, f64::min);
        train.push((r.bytes_per_step as f64, busbw / 1e9));
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
fn step_time_plots(raster: &plot::Rasteriser, out: &Path, runs: &[&RunStats]) -> Result<()> {
    for r in runs {
        let labels: Vec<String> = r.ranks.iter().map(|x| x.rank.to_string()).collect();
        let boxes: Vec<[f64; 5]> = r
            .ranks
            .iter()
            .map(|x| [0.05, 0.25, 0.5, 0.75, 0.95].map(|q| x.step.quantile(q) * 1e3))
            .collect();
        let types: Vec<String> = r.types.iter().map(|t| t.node_type.clone()).collect();
        let groups: Vec<usize> = r
            .ranks
            .iter()
            .map(|x| types.iter().position(|t| *t == x.node_type).unwrap_or(0))
            .collect();
        let svg = plot::box_plot(
            &format!("Step time per rank: {}", r.manifest.run_id),
            "step ms",
            &labels,
            &boxes,
            &groups,
            &types,
        );
        raster.write(&svg, &out.join(format!("step_time_per_rank-{}", r.manifest.run_id)))?;
    }
    Ok(())
}
