//! The projection beyond the allocation: report.md's section, the terminal table and
//! the plot (projected efficiency as a line with its band, measured points as marks).

use super::{ms, pct, ProjectedWorkload, ProjectionReport};
use crate::link::model::MAX_FIT_REL_ERROR;
use crate::link::LinkModelFile;
use crate::plot::{self, Band, ChartLayout, LegendAt, LineChart, Point, Series, SeriesKind, XScale};
use crate::reduce::analysis::projection::{ProjectionRow, EXTRAPOLATION_FACTOR, FORECAST_CHECKED_ERROR};
use anyhow::Result;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// The efficiency the per-shape answers and the recommendation aim at unless
/// `--target-efficiency` says another.
pub(crate) const TARGET_EFFICIENCY: f64 = 0.8;

/// The rows of each projected workload (one per reference point and link, in the order
/// the links were given), keyed by that point, with a name that tells apart workloads
/// differing only in their configuration, and says the link where one was given.
fn by_workload(rows: &[ProjectionRow]) -> Vec<(String, Vec<&ProjectionRow>)> {
    let mut links: Vec<&str> = Vec::new();
    for r in rows {
        if !links.contains(&r.link.as_str()) {
            links.push(&r.link);
        }
    }
    let mut split: BTreeMap<(usize, String, String), Vec<&ProjectionRow>> = BTreeMap::new();
    for r in rows {
        let link = links.iter().position(|l| *l == r.link).unwrap_or(0);
        split.entry((link, r.from_runs.clone(), r.scaling.clone())).or_default().push(r);
    }
    let mut out: Vec<(String, Vec<&ProjectionRow>)> = split.into_values().map(|rs| (rs[0].workload.clone(), rs)).collect();
    for i in 0..out.len() {
        let same = |o: &(String, Vec<&ProjectionRow>)| o.0 == out[i].0 && o.1[0].link == out[i].1[0].link;
        if out.iter().filter(|o| same(o)).count() > 1 {
            out[i].0 = format!("{} ({})", out[i].0, out[i].1[0].from_runs);
        }
    }
    for o in &mut out {
        if !o.1[0].link.is_empty() {
            o.0 = format!("{} on {}", o.0, o.1[0].link);
        }
    }
    out
}

/// The projection when the link model in `sweep` was refused: why.
pub(crate) fn left_out(sweep: &Path, why: &str) -> ProjectionReport {
    ProjectionReport {
        sweep: sweep.to_path_buf(),
        left_out: Some(why.into()),
        models: Vec::new(),
        rows: Vec::new(),
        notes: Vec::new(),
        workloads: Vec::new(),
        levels: Vec::new(),
        recommendations: Vec::new(),
    }
}

/// The projection with the model in `sweep`: its `rows`, the `notes` on what could not be
/// projected, and per workload what the projection says (from its rows alone), the
/// batch for a target aiming at `target_efficiency` (the recommendation's target too).
pub(crate) fn section(
    rows: Vec<ProjectionRow>,
    notes: Vec<String>,
    models: &LinkModelFile,
    sweep: &Path,
    target_efficiency: f64,
) -> ProjectionReport {
    let workloads = by_workload(&rows)
        .into_iter()
        .map(|(name, rs)| {
            let checked = checked_sentence(&rs);
            let weak = rs[0].scaling == "weak";
            ProjectedWorkload {
                name,
                from_runs: rs[0].from_runs.clone(),
                scaling: rs[0].scaling.clone(),
                checked,
                answers: if weak { answers(&rs, target_efficiency) } else { Vec::new() },
                strong_note: (!weak && rs.iter().any(|r| r.compute_extrapolated)).then(|| {
                    format!(
                        "Strong scaling: the global batch {} split over the ranks; at the per-rank batches marked *, outside those measured \
                         on the reference's ranks, a rank's own work is the nearest measured batch's scaled by the batch (compute is not \
                         linear in the batch on a GPU: run those batches to replace the guess).",
                        rs[0].global_batch
                    )
                }),
            }
        })
        .collect();
    ProjectionReport {
        sweep: sweep.to_path_buf(),
        left_out: None,
        models: models.models.clone(),
        rows,
        notes,
        workloads,
        levels: Vec::new(),
        recommendations: Vec::new(),
    }
}

/// What the measured shapes say of the projection: the held-out error apart from the
/// others, the reference's own (in-sample) error last, and what speedup is against.
fn checked_sentence(rs: &[&ProjectionRow]) -> String {
    let others: Vec<&&ProjectionRow> = rs
        .iter()
        .filter(|r| r.error_pct.is_some() && !r.is_reference && !r.held_out)
        .collect();
    let mut out = Vec::new();
    for r in rs.iter().filter(|r| r.held_out) {
        out.push(format!(
            "Held out: {} ranks, the largest rank count measured, was left out of the choice of the reference; the projection's error there is {:+.1} %{}.",
            r.ranks,
            r.error_pct.unwrap_or(f64::NAN),
            r.measured_speedup
                .map(|m| format!(" (speedup {:.2} projected against {:.2} measured)", r.speedup, m))
                .unwrap_or_default()
        ));
    }
    if others.is_empty() && out.is_empty() {
        out.push(if rs.iter().any(|r| r.step_basis == "measured") {
            "The 1-rank row is the measured 1-rank point itself (every speedup is against it), so it checks nothing, and no other \
             measured shape than the reference's is there to check the projection against."
                .into()
        } else {
            "No measured run of this workload at a shape other than the reference's to check the projection against.".into()
        });
    } else if !others.is_empty() {
        let worst = others.iter().map(|r| r.error_pct.unwrap_or(0.0).abs()).fold(0.0, f64::max);
        out.push(format!(
            "Checked against {} other measured shape(s) not used for the reference: the largest error is {worst:.1} %.",
            others.len()
        ));
    }
    if let Some(r) = rs.iter().find(|r| r.is_reference && r.error_pct.is_some()) {
        out.push(format!(
            "In sample: at the reference's own shape the error is {:+.1} % (it checks only how the link model reads that run).",
            r.error_pct.unwrap_or(f64::NAN)
        ));
    }
    out.push(format!("Speedup and efficiency are against the {}.", rs[0].speedup_against));
    if !rs[0].missing_reference.is_empty() {
        out.push(format!(
            "No 1-rank run of this workload was measured, so no measured speedup is given (one against a projection \
             would mix a measurement with a model): add {} to measure them.",
            rs[0].missing_reference
        ));
    }
    out.join(" ")
}

/// Every term of the projection beside its measured counterpart, at the measured shapes.
fn terms_table(md: &mut String, rs: &[&ProjectionRow]) {
    let measured: Vec<&&ProjectionRow> = rs.iter().filter(|r| r.measured_step_s.is_some()).collect();
    if measured.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nTerms at the measured shapes (ms per step): own work, per step the slowest rank's; the wait for a late rank, \
         what a rank waits on average for the last to enter the all-reduce (projected: the straggler term); the all-reduce after \
         the last rank entered, and of it what ran past backward's end (exposed). Neither all-reduce term holds the wait, on \
         either side.\n\n| shape | term | projected | measured |\n|---|---|---:|---:|"
    );
    for r in measured {
        let shape = format!("{} × {}", r.nodes, r.ranks_per_node);
        let terms = [
            ("own work (slowest rank)", r.own_work_s, r.measured_own_work_s),
            ("wait for a late rank", r.straggler_s, r.measured_wait_s),
            ("all-reduce", r.comm_s, r.measured_comm_s),
            ("exposed all-reduce", r.comm_exposed_s, r.measured_comm_exposed_s),
            ("step", r.step_s, r.measured_step_s),
        ];
        for (term, projected, m) in terms {
            let _ = writeln!(
                md,
                "| {shape} | {term} | {} | {} |",
                ms(projected),
                m.map(ms).unwrap_or_else(|| "–".into())
            );
        }
        if let Some(m) = r.measured_speedup {
            let _ = writeln!(md, "| {shape} | speedup | {:.3} | {:.3} |", r.speedup, m);
        }
    }
}

/// report.md's projection section.
/// report.md's projection section; the plot linked only where it was drawn (`with_plot`).
pub(super) fn markdown(p: &ProjectionReport, with_plot: bool) -> String {
    if let Some(why) = &p.left_out {
        return format!(
            "\n## Projection beyond the allocation\n\nLeft out: {why}. Run `ddpbench allreduce` again to write the link model, \
             or name another with --interconnect.\n"
        );
    }
    let mut md = String::new();
    let _ = writeln!(md, "\n## Projection beyond the allocation\n");
    let _ = writeln!(
        md,
        "From the link model{} and, per workload, every repeat of one measured point (its reference): \
step(N) = the slowest rank's own work + the all-reduce past backward's end. Weak scaling keeps the \
measured per-rank batch; strong scaling (\"strong G…\") splits the reference's global batch G over the ranks. A rank's \
own work is the step's common part (the mean over ranks, which noise hitting every rank moves together; the geometric \
mean over the repeats) plus the straggler term, E[max over N ranks] of a rank's deviation from that common part. The \
step given is the expected one: a nominal level (a link's specification) at the fraction of its line rate an all-reduce \
reaches on it, a measured level as its sweep timed it, plus the seconds per step that contention added to the \
all-reduce at the reference (training against the run's own probe of it alone). Its band is that step ± the own \
work's run-to-run interval and the link's uncertainty (the efficiency's range, the contention's interval, the sweep's \
spread) in quadrature, doubled beyond {}× the largest measured rank count (marked extrapolated); its optimistic end \
never passes the bound: the link at line rate, or as its sweep timed it alone. Speedup and efficiency are against \
the measured 1-rank point where there is one (that row is the point itself), else the projection at 1 rank. Assumed: \
homogeneous nodes, the ring all-reduce (the tree where faster, as the algorithm column says), no congestion from other \
jobs, the ranks of a node sharing its link as one hierarchical all-reduce (not measured on one node), a rank's own work \
independent of N. {FORECAST_CHECKED_ERROR}\n",
        if p.sweep.as_os_str().is_empty() {
            String::new()
        } else {
            format!(" in `{}` (fitted by `ddpbench allreduce`)", p.sweep.display())
        },
        EXTRAPOLATION_FACTOR
    );
    levels_list(&mut md, &p.models);
    for ((name, rs), w) in by_workload(&p.rows).into_iter().zip(&p.workloads) {
        let _ = writeln!(md, "\n### {name} (from {})\n\n{}\n", repeats_words(rs[0]), rs[0].comparison);
        let _ = writeln!(
            md,
            "{}\n\nThe band: {}.\n",
            crate::escape::markdown(&inputs_line(&p.models, rs[0])),
            crate::escape::markdown(&rs[0].band_sources)
        );
        let _ = writeln!(md, "| ranks | nodes × per node | batch per rank | step (ms) | band (ms) | samples/s | speedup | efficiency | efficiency, 2-byte gradients | efficiency, one bucket | all-reduce (ms), bound | exposed comm (ms) | algorithm | measured (ms) | error |");
        let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|");
        for r in &rs {
            let _ = writeln!(
                md,
                "| {}{}{}{}{}{} | {} × {} | {}{} | {} | {}–{}{} | {:.1} | {:.2} | {} | {} | {} | {} ({}) | {} | {} | {} | {} |",
                r.ranks,
                if r.extrapolated { " (extrapolated)" } else { "" },
                if r.is_reference { " (reference)" } else { "" },
                if r.unreliable { " (unreliable)" } else { "" },
                if r.step_basis == "measured" { " (measured)" } else { "" },
                if r.beyond_measured.is_empty() {
                    ""
                } else {
                    " (beyond measured†)"
                },
                r.nodes,
                r.ranks_per_node,
                r.batch_per_rank,
                if r.compute_extrapolated { "*" } else { "" },
                ms(r.step_s),
                ms(r.step_low_s),
                ms(r.step_high_s),
                if r.band_low_clamped { "‡" } else { "" },
                r.samples_per_s,
                r.speedup,
                pct(r.efficiency),
                r.efficiency_half_wire_bytes.map_or("already 2 bytes".into(), pct),
                pct(r.efficiency_one_bucket),
                ms(r.comm_s),
                ms(r.comm_bound_s),
                ms(r.comm_exposed_s),
                r.algorithm,
                r.measured_step_s.map(ms).unwrap_or_else(|| "–".into()),
                r.error_pct.map(|e| format!("{e:+.1} %")).unwrap_or_else(|| "–".into())
            );
        }
        let beyond: Vec<String> = rs
            .iter()
            .filter(|r| !r.beyond_measured.is_empty())
            .map(|r| format!("{} × {}: {}", r.nodes, r.ranks_per_node, r.beyond_measured))
            .collect();
        if !beyond.is_empty() {
            let _ = writeln!(
                md,
                "\n† Outside what was measured ({}): read these rows to 2 digits, and their order rather than their amounts.",
                crate::escape::markdown(&beyond.join("; "))
            );
        }
        terms_table(&mut md, &rs);
        let _ = writeln!(md, "\n{}", crate::escape::markdown(&w.checked));
        for q in fit_quality_sentences(&rs) {
            let _ = writeln!(md, "\n{}", crate::escape::markdown(&q));
        }
        if !w.answers.is_empty() {
            let _ = writeln!(md);
        }
        for a in &w.answers {
            let _ = writeln!(md, "- {a}");
        }
        if let Some(n) = &w.strong_note {
            let _ = writeln!(md, "\n{}", crate::escape::markdown(n));
        }
    }
    for n in &p.notes {
        if n.starts_with("warning: ") || n.contains(": warning: ") {
            let _ = writeln!(md, "\n- {}", crate::escape::markdown(n));
        } else {
            let _ = writeln!(md, "\n- not projected: {}", crate::escape::markdown(n));
        }
    }
    md.push_str(&super::recommendation::markdown(p));
    if with_plot {
        let _ = writeln!(md, "\n![projection](projection.svg)");
    }
    md
}

/// Which inputs of a workload's projection are measured, which published, which nominal
/// and which assumed, in one line.
fn inputs_line(models: &[crate::link::RouteLinkModel], r: &ProjectionRow) -> String {
    let mut measured = vec![format!("own work and buckets ({} repeat(s) of the reference)", r.from_repeats)];
    let (mut published, mut nominal, mut assumed) = (Vec::new(), Vec::new(), Vec::new());
    match r.contention_factor {
        Some(c) => measured.push(format!("contention ({c:.2}× the probe at the reference)")),
        None => assumed.push("no contention (not measured)".to_string()),
    }
    for f in models.iter().flat_map(|m| [&m.model.intra, &m.model.inter]).flatten() {
        match (&f.nominal, &f.probe, &f.efficiency) {
            (Some(spec), _, e) => {
                nominal.push(format!("the {} line rate ({spec})", f.level));
                if let Some(e) = e {
                    let words = format!("the {} efficiency, {}", f.level, crate::link::spec::efficiency_words(e));
                    match e.basis {
                        crate::link::model::EfficiencyBasis::Published => published.push(words),
                        crate::link::model::EfficiencyBasis::Assumed => assumed.push(words),
                        crate::link::model::EfficiencyBasis::Given => nominal.push(words),
                    }
                }
            }
            (None, Some(_), _) => {
                measured.push(format!("the {} link (the runs' probe, one size)", f.level));
                assumed.push(format!("the {} latency", f.level));
            }
            (None, None, _) => measured.push(format!("the {} link (a sweep)", f.level)),
        }
    }
    let part = |name: &str, v: &[String]| (!v.is_empty()).then(|| format!("{name}: {}", v.join(", ")));
    let parts: Vec<String> = [
        part("measured", &measured),
        part("published", &published),
        part("nominal (given)", &nominal),
        part("assumed", &assumed),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!("Inputs, {}.", parts.join("; "))
}

/// The levels of every link model, one line each: nominal (its spec and expected
/// efficiency), set from the runs' probe, or a sweep's fit with its errors.
fn levels_list(md: &mut String, models: &[crate::link::RouteLinkModel]) {
    for bm in models {
        for f in [&bm.model.intra, &bm.model.inter].into_iter().flatten() {
            if let Some(spec) = &f.nominal {
                let _ = writeln!(
                    md,
                    "- {}, {}: nominal, {spec}: no sweep behind it; its line rate is the bound, an all-reduce expected at {}",
                    bm.route().label(),
                    f.level,
                    f.efficiency
                        .as_ref()
                        .map_or("line rate".into(), crate::link::spec::efficiency_words)
                );
                continue;
            }
            if let Some(probe) = &f.probe {
                let _ = writeln!(
                    md,
                    "- {}, {}: 1/β = {:.3} GB/s over {} ranks from {probe}",
                    bm.route().label(),
                    f.level,
                    1e-9 / f.beta_s_per_byte,
                    f.ranks
                );
                continue;
            }
            let _ = writeln!(
                md,
                "- {}, {}: α = {:.2} µs, 1/β = {} over {} ranks, sizes {}–{} B, |relative error| max {:.1} %, rms {:.1} %{}",
                bm.route().label(),
                f.level,
                f.alpha_s * 1e6,
                if f.beta_s_per_byte > 0.0 {
                    format!("{:.3} GB/s", 1e-9 / f.beta_s_per_byte)
                } else {
                    "unbounded (β fitted as 0)".into()
                },
                f.ranks,
                f.min_bytes,
                f.max_bytes,
                f.max_abs_rel_error * 100.0,
                f.rms_rel_error * 100.0,
                clamped_words(&f.clamped())
            );
        }
    }
}

/// ", α clamped to 0" and the like, or nothing.
fn clamped_words(clamped: &[&str]) -> String {
    if clamped.is_empty() {
        return String::new();
    }
    format!(
        "; {} clamped to 0 (a free fit made it negative: the line does not follow the sweep)",
        clamped.join(" and ")
    )
}

/// What the fit's quality means for one workload's rows: unreliable rows, a clamped
/// parameter, a band whose low end is the own work alone.
fn fit_quality_sentences(rs: &[&ProjectionRow]) -> Vec<String> {
    let mut out = Vec::new();
    let worst = rs.iter().map(|r| r.fit_error_pct).fold(0.0, f64::max);
    if rs.iter().any(|r| r.unreliable) {
        out.push(format!(
            "Unreliable: the interconnect fit is off by up to {worst:.1} % at the sizes this workload all-reduces, beyond {:.0} %: the rows marked (unreliable) rest on a line that does not follow the sweep there. Sweep those sizes again with more iterations, or on a quieter machine.",
            MAX_FIT_REL_ERROR * 100.0
        ));
    }
    if rs.iter().any(|r| r.fit_clamped) {
        out.push("A fit used has a parameter clamped to 0 (see the fits above): its all-reduce times are those of a line forced through the sweep, not a free fit.".into());
    }
    if rs.iter().any(|r| r.band_low_clamped) {
        out.push("‡ The band is 100 % or more of the all-reduce there: its low end is the own work alone (a free all-reduce), not a measured best case.".into());
    }
    out
}

/// What the projection says of a weak workload at full nodes (1, 2, 16 and 128 of them,
/// where the table has them), made from its table's rows alone, so every efficiency said
/// is the table's: the efficiency against the same 1-rank step, the per-rank batch that
/// reaches `target` (`--target-efficiency`), and the what-if efficiencies (half the wire
/// bytes, one bucket).
fn answers(rs: &[&ProjectionRow], target: f64) -> Vec<String> {
    let full = rs.iter().map(|r| r.ranks_per_node).max().unwrap_or(1);
    rs.iter()
        .filter(|r| r.ranks > 1 && r.ranks_per_node == full && [1, 2, 16, 128].contains(&r.nodes))
        .map(|r| {
            let half = match r.efficiency_half_wire_bytes {
                Some(e) => format!("with 2-byte (fp16/bf16) gradients, efficiency {}", pct(e)),
                None => "the gradients already travel at 2 bytes".into(),
            };
            format!(
                "At {} node(s) × {} ({} ranks): efficiency {}; {}. What if: {half}; with one bucket, efficiency {}.",
                r.nodes,
                r.ranks_per_node,
                r.ranks,
                pct(r.efficiency),
                batch_for_target(r, target),
                pct(r.efficiency_one_bucket)
            )
        })
        .collect()
}

/// The per-rank batch that reaches efficiency `tau` at a weak row's shape, from the row:
/// a rank's own work and the 1-rank step taken as proportional to the batch, the exposed
/// all-reduce as it is. Efficiency at k times the batch is
/// k·T1 / (k·own + exposed), with T1 = batch / (samples/s ÷ speedup); it reaches τ from
/// k = τ·exposed / (T1 − τ·own) when T1 > τ·own, and never otherwise.
fn batch_for_target(r: &ProjectionRow, tau: f64) -> String {
    if r.efficiency >= tau {
        return format!("it is at or above {:.0} % at this batch", tau * 100.0);
    }
    let t1 = r.batch_per_rank / (r.samples_per_s / r.speedup);
    let exposed = r.step_s - r.own_work_s;
    if !(t1 > tau * r.own_work_s) || !(exposed > 0.0) {
        return format!(
            "no larger batch reaches {:.0} % (the slowest rank's own work alone is over {:.0} % of the 1-rank step's)",
            tau * 100.0,
            100.0 / tau
        );
    }
    let k = tau * exposed / (t1 - tau * r.own_work_s);
    format!(
        "{:.0} % needs a per-rank batch of about {:.0} (own work taken as proportional to the batch; measured at {})",
        tau * 100.0,
        (k * r.batch_per_rank).ceil(),
        r.batch_per_rank
    )
}

pub(super) fn print_projection(rows: &[ProjectionRow]) {
    println!("\nProjection (weak and strong scaling, link model; see report.md):");
    println!(
        "{:<34} {:>6} {:>9} {:>11} {:>19} {:>8} {:>10} {:>8} {:>10} {:>8}",
        "workload", "ranks", "nodes×pn", "step ms", "band ms", "speedup", "efficiency", "algo", "measured", "error"
    );
    for r in rows {
        println!(
            "{:<34} {:>6} {:>9} {:>11} {:>19} {:>8.2} {:>10} {:>8} {:>10} {:>8}",
            crate::escape::terminal(&r.workload),
            format!(
                "{}{}{}",
                r.ranks,
                if r.extrapolated { "*" } else { "" },
                if r.beyond_measured.is_empty() { "" } else { "†" }
            ),
            format!("{}×{}", r.nodes, r.ranks_per_node),
            ms(r.step_s),
            format!("{}–{}", ms(r.step_low_s), ms(r.step_high_s)),
            r.speedup,
            pct(r.efficiency),
            r.algorithm,
            r.measured_step_s.map(ms).unwrap_or_else(|| "–".into()),
            r.error_pct.map(|e| format!("{e:+.1}%")).unwrap_or_else(|| "–".into())
        );
    }
    println!(
        "(* extrapolated: beyond {EXTRAPOLATION_FACTOR}× the largest measured rank count; † beyond what was measured, see \
         report.md; the step is the expected one, the band its range with the bound as its optimistic end)"
    );
    println!("{FORECAST_CHECKED_ERROR}");
}

/// The projection plot's SVG: efficiency against ranks (powers of two, each tick written
/// as the shapes projected there, nodes × ranks per node), every workload's projection
/// as a line with an open circle at each projected point and its band filled, then the
/// measured points as filled dots over the lines in the line's colour, and under the x
/// axis the legend: one entry per workload, named by its line, and what each mark means.
/// At 1 rank efficiency is 1 by definition (the
/// rows say so); a measured point is its measured speedup over its ranks where that is
/// against a measured 1-rank run.
pub(super) fn projection_svg(rows: &[ProjectionRow]) -> Result<String> {
    let mut lines = Vec::new();
    let mut marks = Vec::new();
    let mut bands = Vec::new();
    for (i, (workload, rs)) in by_workload(rows).into_iter().enumerate() {
        lines.push(Series {
            name: workload.clone(),
            points: rs.iter().map(|r| Point::new(r.ranks as f64, r.efficiency)).collect(),
            kind: SeriesKind::Projected,
            colour: Some(i),
        });
        // Efficiency is inversely proportional to the step time at a given rank count
        // (weak and strong alike), so a step time maps to efficiency × step_s / it.
        let eff_at = |step: f64, r: &ProjectionRow| r.efficiency * r.step_s / step;
        bands.push(Band {
            name: String::new(),
            points: rs
                .iter()
                .map(|r| (r.ranks as f64, eff_at(r.step_high_s, r), eff_at(r.step_low_s, r)))
                .collect(),
            colour: i,
        });
        let measured: Vec<Point> = rs
            .iter()
            .filter_map(|r| {
                let e = r
                    .measured_speedup
                    .map(|s| s / r.ranks as f64)
                    .unwrap_or(eff_at(r.measured_step_s?, r));
                Some(Point::new(r.ranks as f64, e))
            })
            .collect();
        if !measured.is_empty() {
            marks.push(Series {
                name: String::new(),
                points: measured,
                kind: SeriesKind::Markers,
                colour: Some(i),
            });
        }
    }
    let mut shapes: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for r in rows {
        let at = shapes.entry(r.ranks).or_default();
        if !at.contains(&(r.nodes, r.ranks_per_node)) {
            at.push((r.nodes, r.ranks_per_node));
        }
    }
    let x_tick_text = shapes
        .into_iter()
        .map(|(ranks, mut at)| {
            at.sort_unstable();
            let words: Vec<String> = at.iter().map(|(m, p)| format!("{m} × {p}")).collect();
            (ranks as f64, words.join(", "))
        })
        .collect();
    let chart = LineChart {
        title: "Parallel efficiency: projected (open circles, bands) and measured (dots)".into(),
        x_label: "nodes × ranks per node (log2 of the ranks; homogeneous nodes, ring/tree all-reduce, no congestion)".into(),
        y_label: "efficiency".into(),
        x_scale: XScale::Ranks,
        series: lines.into_iter().chain(marks).collect(),
        bands,
    };
    let layout = ChartLayout {
        legend: LegendAt::Below,
        x_tick_text,
        key: vec![
            (
                SeriesKind::Projected,
                "projected: open circles on the line, the band its uncertainty".into(),
            ),
            (SeriesKind::Markers, "measured: filled dots, in their workload's colour".into()),
        ],
    };
    plot::line_chart_laid_out(&chart, &layout)
}

/// The runs a projection stands on, in words: "run ID", or "the N repeats of ID …".
fn repeats_words(r: &ProjectionRow) -> String {
    match r.from_repeats {
        1 => format!("run {}", r.from_runs),
        n => format!("the {n} repeats {}", r.from_runs),
    }
}
