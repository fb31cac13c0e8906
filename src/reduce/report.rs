//! report.md (the seeds' hand-made tables, each with a sentence saying what its
//! numbers say), the terminal tables, and the plots.

use super::analysis::{ScalingRow, StepBreakdown, TypeSummary};
use super::read::RunStats;
use crate::plot::{self, Series};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::Path;

fn gbs(bytes_per_s: f64) -> String {
    if bytes_per_s.is_finite() {
        format!("{:.2}", bytes_per_s / 1e9)
    } else {
        "–".into()
    }
}

fn ms(s: f64) -> String {
    if s.is_finite() {
        format!("{:.2}", s * 1e3)
    } else {
        "–".into()
    }
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0} %", x * 100.0)
    } else {
        "–".into()
    }
}

/// Epoch time: measured (epochs.csv) when a full epoch ran, else projected from the step time.
fn epoch_time(r: &RunStats) -> (f64, bool) {
    let full: Vec<f64> = r
        .epochs
        .iter()
        .filter(|e| e.steps == r.manifest.steps_per_epoch)
        .map(|e| e.epoch_s)
        .collect();
    if !full.is_empty() {
        (crate::stats::median(&full), true)
    } else {
        (r.job_step.mean() * r.manifest.steps_per_epoch as f64, false)
    }
}

pub fn markdown(
    runs: &[&RunStats],
    incomplete: &[&RunStats],
    summaries: &[TypeSummary],
    scaling: &[ScalingRow],
    with_plots: bool,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# ddpbench report\n");
    let _ = writeln!(
        md,
        "{} complete run(s), {} incomplete. Steps flagged as warm-up are excluded; times are per step unless said otherwise.\n",
        runs.len(),
        incomplete.len()
    );

    let _ = writeln!(md, "## Runs\n\n| run | model | data | ranks | nodes | batch/rank | global batch | steps | step ms (median) | samples/s | all-reduce |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in scaling {
        let med = summaries
            .iter()
            .filter(|s| s.run_id == r.run_id)
            .map(|s| s.step_s_median)
            .fold(f64::NAN, f64::max);
        let comm = runs
            .iter()
            .find(|x| x.manifest.run_id == r.run_id)
            .map(|x| comm_setup(&x.manifest))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            r.run_id,
            r.model,
            r.dataset,
            r.ranks,
            r.nodes,
            r.batch_per_rank,
            r.global_batch,
            r.steps,
            ms(med),
            r.samples_per_s,
            comm
        );
    }

    // Speedup and efficiency, per workload.
    let mut workloads: BTreeMap<(String, String), Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling {
        workloads.entry((r.model.clone(), r.dataset.clone())).or_default().push(r);
    }
    for ((model, dataset), rows) in &workloads {
        let mut rows = rows.clone();
        rows.sort_by_key(|r| (r.batch_per_rank, r.ranks));
        let base = rows.iter().find(|r| r.scaling_mode == "baseline").copied();
        let _ = writeln!(md, "\n## Speedup and efficiency: {model} on {dataset}\n");
        if let Some(b) = base {
            let _ = writeln!(
                md,
                "Baseline: `{}` ({} rank(s), batch {} per rank, {:.1} samples/s).\n",
                b.run_id, b.ranks, b.batch_per_rank, b.samples_per_s
            );
        }
        let _ = writeln!(md, "| run | mode | ranks | batch/rank | samples/s | speedup | 95 % interval | efficiency | Karp–Flatt | Amdahl fit |\n|---|---|---:|---:|---:|---:|---|---:|---:|---:|");
        for r in &rows {
            let ci = if r.speedup_ci_low.is_finite() {
                format!(
                    "{:.3}–{:.3}{}",
                    r.speedup_ci_low,
                    r.speedup_ci_high,
                    if r.within_noise == 1 { " (inside the noise)" } else { "" }
                )
            } else {
                "–".into()
            };
            let kf = if r.karp_flatt.is_finite() {
                format!("{:.3}", r.karp_flatt)
            } else {
                "–".into()
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.1} | {:.3} | {} | {} | {} | {:.3} |",
                r.run_id,
                r.scaling_mode,
                r.ranks,
                r.batch_per_rank,
                r.samples_per_s,
                r.speedup,
                ci,
                pct(r.efficiency),
                kf,
                r.amdahl_speedup
            );
        }
        let others: Vec<&&ScalingRow> = rows.iter().filter(|r| r.scaling_mode != "baseline").collect();
        if let Some(best) = others.iter().max_by(|a, b| a.speedup.total_cmp(&b.speedup)) {
            let _ = write!(
                md,
                "\nThe best speedup is {:.2} on {} ranks ({} scaling, efficiency {}).",
                best.speedup,
                best.ranks,
                best.scaling_mode,
                pct(best.efficiency)
            );
            let noisy: Vec<String> = others.iter().filter(|r| r.within_noise == 1).map(|r| r.run_id.clone()).collect();
            if !noisy.is_empty() {
                let _ = write!(
                    md,
                    " The difference from the baseline of {} is inside the noise (its 95 % interval contains 1).",
                    noisy.join(", ")
                );
            }
            let slower: Vec<String> = others
                .iter()
                .filter(|r| r.speedup_ci_high < 1.0)
                .map(|r| format!("{} ({:.2}×)", r.run_id, r.speedup))
                .collect();
            if !slower.is_empty() {
                let _ = write!(md, " Negative scaling: {} ran slower than the baseline.", slower.join(", "));
            }
            let serial = others[0].amdahl_serial_fraction;
            if serial.is_finite() {
                let _ = write!(
                    md,
                    " An Amdahl fit through these points puts the serial fraction at {:.3}, which caps the speedup at {:.1}.",
                    serial,
                    if serial > 0.0 { 1.0 / serial } else { f64::INFINITY }
                );
            }
            let _ = writeln!(md);
        } else {
            let _ = writeln!(
                md,
                "\nOnly the baseline ran for this workload: run more rank counts to see scaling."
            );
        }

        // The seed's grid: per-rank batch × ranks → speedup.
        let batches: BTreeSet<usize> = rows.iter().map(|r| r.batch_per_rank).collect();
        let rank_counts: BTreeSet<usize> = rows.iter().map(|r| r.ranks).collect();
        if batches.len() > 1 || rank_counts.len() > 1 {
            let _ = writeln!(md, "\n### Speedup by batch per rank × ranks\n");
            let _ = write!(md, "| batch/rank |");
            for n in &rank_counts {
                let _ = write!(md, " {n} rank(s) |");
            }
            let _ = write!(md, "\n|---:|");
            for _ in &rank_counts {
                let _ = write!(md, "---:|");
            }
            let _ = writeln!(md);
            for b in &batches {
                let _ = write!(md, "| {b} |");
                for n in &rank_counts {
                    match rows.iter().find(|r| r.batch_per_rank == *b && r.ranks == *n) {
                        Some(r) => {
                            let _ = write!(md, " {:.2} |", r.speedup);
                        }
                        None => {
                            let _ = write!(md, " |");
                        }
                    }
                }
                let _ = writeln!(md);
            }
            let _ = writeln!(md, "\nEach cell is throughput relative to the baseline; rows with a larger batch per rank do more compute per all-reduce, so they usually scale better.");
        }
    }

    // Compute vs communication per epoch.
    let _ = writeln!(md, "\n## Compute vs communication\n\nSeconds per epoch (per-step means × steps per epoch), all ranks averaged. The all-reduce work is every bucket's all-reduce; with `--overlap on` part of it runs behind backward (hidden) and only the rest holds the step up. R = (forward + backward) / all-reduce work.\n\n| run | ranks | batch/rank | compute s/epoch | all-reduce s/epoch | hidden s/epoch | exposed s/epoch | of which waiting s/epoch | R |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut low_r = Vec::new();
    for r in runs {
        let b = StepBreakdown::of(r);
        let spe = r.manifest.steps_per_epoch as f64;
        let n = r.ranks.iter().map(|x| x.steps).sum::<u64>().max(1) as f64;
        let fb: f64 = r.ranks.iter().map(|x| x.phase_sum[1] + x.phase_sum[2]).sum::<f64>() / n;
        let comm = b.transfer_s + b.wait_s;
        let (work_sum, work_n) = r
            .types
            .iter()
            .fold((0.0, 0u64), |a, t| (a.0 + t.comm_total.sum(), a.1 + t.comm_total.count()));
        let work = if work_n > 0 { work_sum / work_n as f64 } else { comm };
        let ratio = if work > 0.0 { fb / work } else { f64::NAN };
        if ratio < 3.0 && r.manifest.world_size > 1 {
            low_r.push(format!("{} (R = {:.2})", r.manifest.run_id, ratio));
        }
        let rs = if ratio.is_finite() { format!("{ratio:.2}") } else { "–".into() };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            r.manifest.run_id,
            r.manifest.world_size,
            r.manifest.batch_size_per_rank,
            fb * spe,
            work * spe,
            (work - comm).max(0.0) * spe,
            comm * spe,
            b.wait_s * spe,
            rs
        );
    }
    if low_r.is_empty() {
        let _ = writeln!(
            md,
            "\nEvery multi-rank run computes at least 3× longer than it communicates, so communication is not what limits scaling here."
        );
    } else {
        let _ = writeln!(
            md,
            "\nBelow R ≈ 3 communication takes a large share of each step and scaling suffers: {}.",
            low_r.join(", ")
        );
    }

    // Bandwidth.
    let _ = writeln!(md, "\n## All-reduce bandwidth\n\nBus bandwidth as nccl-tests define it: 2(n−1)/n · bytes / time, with time the all-reduce after the last rank entered it. The probe is a raw MPI_Allreduce of the same buckets timed in the same run with caches flushed between iterations, since gradients come from memory after backward; the warm-cache probe is the best case.\n\n| run | node type | ranks | bytes/step | transfer ms | busbw GB/s | algbw GB/s | probe busbw GB/s | warm probe GB/s | training / probe |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in summaries.iter().filter(|s| s.busbw_bytes_per_s.is_finite()) {
        let bytes = runs
            .iter()
            .find(|r| r.manifest.run_id == s.run_id)
            .map(|r| r.bytes_per_step)
            .unwrap_or(0);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            s.node_type,
            s.ranks,
            bytes,
            ms(s.transfer_s_median),
            gbs(s.busbw_bytes_per_s),
            gbs(s.algbw_bytes_per_s),
            gbs(s.probe_busbw_bytes_per_s),
            gbs(s.probe_warm_busbw_bytes_per_s),
            if s.busbw_vs_probe.is_finite() {
                format!("{:.2}", s.busbw_vs_probe)
            } else {
                "–".into()
            }
        );
    }
    let ratios: Vec<f64> = summaries.iter().map(|s| s.busbw_vs_probe).filter(|v| v.is_finite()).collect();
    if ratios.is_empty() {
        let _ = writeln!(md, "\nNo multi-rank run: nothing was all-reduced.");
    } else {
        let (lo, hi) = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        );
        let range = if (hi - lo) * 100.0 < 0.5 {
            format!("{:.0} %", lo * 100.0)
        } else {
            format!("{:.0}–{:.0} %", lo * 100.0, hi * 100.0)
        };
        let verdict = if lo >= 0.9 {
            "the training loop adds nothing measurable around the transfer"
        } else {
            "below 90 % the training loop adds cost around the transfer (staging copies, contention with compute, arrival skew)"
        };
        let _ = writeln!(
            md,
            "\nInside training the all-reduce reaches {range} of the raw MPI_Allreduce's bus bandwidth: {verdict}."
        );
    }

    // 1-rank vs N-rank epoch time.
    let _ = writeln!(
        md,
        "\n## Epoch time: baseline vs N ranks\n\n| run | ranks | epoch s | speedup | efficiency |\n|---|---:|---:|---:|---:|"
    );
    for r in scaling {
        if let Some(run) = runs.iter().find(|x| x.manifest.run_id == r.run_id) {
            let (t, measured) = epoch_time(run);
            let _ = writeln!(
                md,
                "| {} | {} | {:.2}{} | {:.2} | {} |",
                r.run_id,
                r.ranks,
                t,
                if measured { "" } else { " (projected)" },
                r.speedup,
                pct(r.efficiency)
            );
        }
    }
    let _ = writeln!(md, "\nEpoch times marked projected are steps per epoch × the mean step time, for runs stopped before a full epoch. Speedup and efficiency come from throughput, which equals the ratio of epoch times for the same data set.");

    // Waterfall.
    let multi: Vec<&ScalingRow> = scaling.iter().filter(|r| r.scaling_mode != "baseline").collect();
    if !multi.is_empty() {
        let _ = writeln!(md, "\n## Where the efficiency goes\n\nFrom ideal throughput (baseline × rank ratio) to measured: each cause's share of the extra time per step over the ideal step time. The losses add up to ideal − measured; a negative loss is a gain.\n\n| run | ideal samples/s | − comm | − data loading | − stragglers | − other | = measured |\n|---|---:|---:|---:|---:|---:|---:|");
        for r in &multi {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                r.run_id,
                r.ideal_samples_per_s,
                r.loss_comm_samples_per_s,
                r.loss_data_samples_per_s,
                r.loss_straggler_samples_per_s,
                r.loss_other_samples_per_s,
                r.samples_per_s
            );
        }
        for r in &multi {
            let causes = [
                ("communication", r.loss_comm_samples_per_s),
                ("data loading", r.loss_data_samples_per_s),
                ("waiting for stragglers", r.loss_straggler_samples_per_s),
                ("other (compute slower than alone, contention)", r.loss_other_samples_per_s),
            ];
            let (name, v) = causes.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            let lost = r.ideal_samples_per_s - r.samples_per_s;
            if lost > 0.0 && v > 0.0 {
                let _ = writeln!(
                    md,
                    "\n`{}` loses {:.1} samples/s ({} of ideal); the largest cause is {name} ({:.1} samples/s).",
                    r.run_id,
                    lost,
                    pct(lost / r.ideal_samples_per_s),
                    v
                );
            }
        }
    }

    // Stragglers and node types.
    let _ = writeln!(md, "\n## Node types and stragglers\n\n| run | node type | ranks | nodes | step ms (median) | p95 ms | waits for others ms (mean) | last into all-reduce | gates the job |\n|---|---|---:|---:|---:|---:|---:|---:|---|");
    for s in summaries {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.run_id,
            s.node_type,
            s.ranks,
            s.nodes,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            ms(s.wait_s_mean),
            pct(s.last_arrival_share),
            if s.gating == 1 { "yes" } else { "" }
        );
    }
    let hetero: Vec<&&RunStats> = runs.iter().filter(|r| r.types.len() > 1).collect();
    for r in hetero {
        let g = summaries.iter().find(|s| s.run_id == r.manifest.run_id && s.gating == 1);
        if let Some(g) = g {
            let _ = writeln!(md, "\nIn `{}`, ranks of type \"{}\" arrive last at {} of all-reduces: the other types wait for them, so that type sets the job's pace.", r.manifest.run_id, g.node_type, pct(g.last_arrival_share));
        }
    }

    if !incomplete.is_empty() {
        let _ = writeln!(md, "\n## Incomplete runs (left out of every figure)\n");
        for r in incomplete {
            let _ = writeln!(md, "- `{}`: {}", r.dir.display(), r.problems.join("; "));
        }
    }
    if with_plots {
        let _ = writeln!(md, "\n## Plots\n\n![speedup](speedup.svg) ![efficiency](efficiency.svg) ![phases](phases.svg) ![bandwidth](bandwidth.svg)\n\nStep time per rank: `step_time_per_rank-<run>.svg`.");
    }
    md
}

pub fn plots(out: &Path, runs: &[&RunStats], scaling: &[ScalingRow]) -> Result<()> {
    let raster = plot::Rasteriser::new();
    // Speedup and efficiency vs ranks, one series per workload and batch per rank.
    let mut series: BTreeMap<String, Vec<&ScalingRow>> = BTreeMap::new();
    for r in scaling {
        series.entry(format!("{} b{}", r.model, r.batch_per_rank)).or_default().push(r);
    }
    let max_ranks = scaling.iter().map(|r| r.ranks).max().unwrap_or(1) as f64;
    let min_ranks = scaling.iter().map(|r| r.ranks).min().unwrap_or(1) as f64;
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

    // Stacked phases per run.
    let names: Vec<String> = runs
        .iter()
        .map(|r| format!("{}r b{}", r.manifest.world_size, r.manifest.batch_size_per_rank))
        .collect();
    let n_of = |r: &RunStats| r.ranks.iter().map(|x| x.steps).sum::<u64>().max(1) as f64;
    let phase = |k: usize| -> Vec<f64> {
        runs.iter()
            .map(|r| r.ranks.iter().map(|x| x.phase_sum[k]).sum::<f64>() / n_of(r) * 1e3)
            .collect()
    };
    let b: Vec<StepBreakdown> = runs.iter().map(|r| StepBreakdown::of(r)).collect();
    let stacks = vec![
        ("data".to_string(), phase(0)),
        ("forward".to_string(), phase(1)),
        ("backward".to_string(), phase(2)),
        ("comm: transfer".to_string(), b.iter().map(|x| x.transfer_s * 1e3).collect()),
        ("comm: waiting".to_string(), b.iter().map(|x| x.wait_s * 1e3).collect()),
        ("optimizer".to_string(), phase(4)),
        ("other".to_string(), phase(5)),
    ];
    raster.write(
        &plot::stacked_bars("Mean time per step by phase", "ms per step", &names, &stacks),
        &out.join("phases"),
    )?;

    // Bandwidth vs message size: the probe and the all-reduce inside training.
    let mut probe = Vec::new();
    let mut train = Vec::new();
    for r in runs.iter().filter(|r| r.manifest.world_size > 1) {
        if let Some(p) = &r.manifest.allreduce_probe {
            probe.push((p.bytes as f64, p.busbw_bytes_per_s / 1e9));
        }
        let t = r.types.iter().map(|t| t.transfer.median()).fold(f64::NAN, f64::max);
        train.push((
            r.bytes_per_step as f64,
            crate::comm::allreduce_busbw(r.bytes_per_step as f64, r.manifest.world_size, t) / 1e9,
        ));
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

    // Step time distribution per rank, one plot per run.
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

pub fn print_tables(summaries: &[TypeSummary], scaling: &[ScalingRow]) {
    println!(
        "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9}",
        "run", "node type", "ranks", "steps", "step ms", "p95 ms", "samples/s", "fwd%", "bwd%", "comm%", "busbw GB/s"
    );
    for s in summaries {
        let nt: String = s.node_type.chars().take(28).collect();
        let run: String = s.run_id.chars().take(34).collect();
        println!(
            "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11.1} {:>6.0} {:>6.0} {:>7.0} {:>9}",
            run,
            nt,
            s.ranks,
            s.steps,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            s.samples_per_s,
            s.forward_share * 100.0,
            s.backward_share * 100.0,
            s.comm_share * 100.0,
            gbs(s.busbw_bytes_per_s)
        );
    }
    if scaling.iter().any(|r| r.scaling_mode != "baseline") {
        println!(
            "\n{:<34} {:>5} {:>10} {:>8} {:>17} {:>10}",
            "run", "ranks", "mode", "speedup", "95% interval", "efficiency"
        );
        for r in scaling {
            let run: String = r.run_id.chars().take(34).collect();
            let ci = if r.speedup_ci_low.is_finite() {
                format!("{:.3}-{:.3}", r.speedup_ci_low, r.speedup_ci_high)
            } else {
                "-".into()
            };
            println!(
                "{:<34} {:>5} {:>10} {:>8.3} {:>17} {:>10}",
                run,
                r.ranks,
                r.scaling_mode,
                r.speedup,
                ci,
                pct(r.efficiency)
            );
        }
    }
}

/// How a run communicated, in a few words: backend, overlap, wire dtype, AMP.
fn comm_setup(m: &crate::record::Manifest) -> String {
    let mut parts = vec![m.comm_backend.clone()];
    if m.comm.overlap {
        parts.push(format!("overlap ({} segments)", m.comm.backward_stages));
    }
    if !m.comm.grad_dtype.is_empty() && m.comm.grad_dtype != "fp32" {
        parts.push(format!("{} gradients", m.comm.grad_dtype));
    }
    if !m.comm.amp.is_empty() && m.comm.amp != "off" {
        parts.push(format!("amp {}", m.comm.amp));
    }
    parts.join(", ")
}
