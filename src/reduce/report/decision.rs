//! The first screen of a report, per workload: one line of verdict (the headline point's
//! scaling with its interval and its largest loss by cause), what to run (shape, epoch,
//! GPU-hours, cost and time to a target, each with its band) or why nothing is
//! recommended, and the command to run next; the whole comparison key and the points
//! last, as details. report.md, report.html and the terminal show this same text.

use super::{speedup, verdict, ProjectionReport, RunReport};
use crate::record::{AmpMode, ComparisonKey, DeviceKind};
use crate::reduce::analysis::advice::quoted;
use crate::reduce::analysis::recommend::{Figures, Recommendation, ShapeCost};
use crate::reduce::analysis::{Direction, RunStats, ScalingMode, ScalingRow};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

/// What one workload's report says first.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadDecision {
    /// Model, data set, batch per rank, precision and device, in a few words.
    pub label: String,
    /// The whole comparison key (the details line).
    pub comparison: String,
    /// The headline point's scaling with its interval and its largest loss by cause.
    pub scaling: String,
    /// One line per recommendation (per link given): the shape and its figures.
    pub run: Vec<String>,
    /// Why nothing is recommended, where nothing is.
    pub no_run_because: Option<String>,
    /// The command to run next, and what it is for.
    pub next: String,
    /// The points compared, each with its repeats.
    pub points: String,
}

/// One decision per workload, in report.md's order of workloads.
pub(super) fn decisions(
    scaling: &[ScalingRow],
    runs: &[RunReport],
    complete: &[&RunStats],
    projection: Option<&ProjectionReport>,
) -> Vec<WorkloadDecision> {
    let mut out: Vec<WorkloadDecision> = speedup::by_workload(scaling)
        .into_iter()
        .map(|((model, dataset, comparison), rows)| {
            let compared: Vec<&ScalingRow> = rows
                .iter()
                .copied()
                .filter(|r| [ScalingMode::Weak, ScalingMode::Strong, ScalingMode::Explicit].contains(&r.scaling_mode))
                .collect();
            let head = speedup::headline(&compared);
            let ids: Vec<&str> = rows.iter().flat_map(|r| r.run_ids.iter().map(String::as_str)).collect();
            let recs: Vec<&Recommendation> = projection
                .iter()
                .flat_map(|p| &p.recommendations)
                .filter(|r| r.from_runs.split(' ').any(|id| ids.contains(&id)))
                .collect();
            let key = head
                .or(rows.first().copied())
                .and_then(|h| runs.iter().find(|r| h.run_ids.contains(&r.run_id)))
                .and_then(|r| r.comparison_key.as_ref());
            let mut batches: Vec<usize> = rows.iter().map(|r| r.batch_per_rank).collect();
            batches.sort_unstable();
            batches.dedup();
            let no_run_because = recs.is_empty().then(|| no_run_because(head, projection, model));
            WorkloadDecision {
                label: label(model, dataset, &batches, key),
                comparison: comparison.to_string(),
                scaling: head.map_or_else(|| no_reference(&rows), scaling_line),
                run: recs.iter().map(|r| run_line(r)).collect(),
                no_run_because,
                next: next(head, &rows, &recs, complete),
                points: points(&rows),
            }
        })
        .collect();
    tell_apart(&mut out);
    out
}

/// `mnist-cnn · fashion-mnist · batch 64 per rank · fp32 · cpu`.
fn label(model: &str, dataset: &str, batches: &[usize], key: Option<&ComparisonKey>) -> String {
    let precision = match key.and_then(|k| k.amp) {
        Some(AmpMode::Fp16) => "amp fp16",
        Some(AmpMode::Bf16) => "amp bf16",
        Some(AmpMode::Off) | None => "fp32",
    };
    let device = match key.map(|k| k.device) {
        Some(DeviceKind::Cuda) => "gpu",
        Some(DeviceKind::Cpu) => "cpu",
        None => "device not recorded",
    };
    let batch = batches.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    format!("{model} · {dataset} · batch {batch} per rank · {precision} · {device}")
}

/// Labels that two workloads share, each followed by what its key has that the other
/// keys of that label lack (`· threads=2`).
fn tell_apart(decisions: &mut [WorkloadDecision]) {
    let keys: Vec<(String, String)> = decisions.iter().map(|d| (d.label.clone(), d.comparison.clone())).collect();
    for d in decisions.iter_mut() {
        let others: Vec<&String> = keys
            .iter()
            .filter(|(l, c)| *l == d.label && *c != d.comparison)
            .map(|(_, c)| c)
            .collect();
        if others.is_empty() {
            continue;
        }
        let own: Vec<&str> = d
            .comparison
            .split(' ')
            .filter(|t| others.iter().any(|o| !o.split(' ').any(|x| x == *t)))
            .collect();
        if !own.is_empty() {
            d.label = format!("{} · {}", d.label, own.join(" "));
        }
    }
}

/// The headline point in one line: its ranks and mode, direction with interval, and
/// the largest measured loss with its share of what was lost.
fn scaling_line(h: &ScalingRow) -> String {
    let mut s = format!(
        "At {} ranks ({}, global batch {}) it {}",
        h.ranks,
        h.scaling_mode,
        h.global_batch,
        verdict::direction(h)
    );
    let lost = h.ideal_samples_per_s - h.samples_per_s;
    let losses = verdict::losses(h);
    let largest = losses.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
    match largest {
        Some((name, v)) if lost > 0.0 && v.is_finite() && v > 0.0 => {
            let _ = write!(s, "; the largest loss is {name}, {} of what was lost.", super::pct(v / lost));
        }
        _ if lost.is_finite() && lost <= 0.0 => s.push_str("; it loses nothing against ideal."),
        _ => s.push('.'),
    }
    s
}

/// Where no point of the workload has a reference.
fn no_reference(rows: &[&ScalingRow]) -> String {
    let missing: Vec<&str> = rows
        .iter()
        .map(|r| r.missing_reference.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    match missing.first() {
        Some(m) => format!("No point has a reference to be compared with: add {m}."),
        None => "No point has a reference to be compared with: run more rank counts to see scaling.".into(),
    }
}

/// The shape a recommendation names first: the one meeting the epoch-time target most
/// cheaply, else the fastest within the GPU-hour budget, else the largest keeping the
/// target efficiency; with why. None where no shape beyond 1 rank qualifies.
fn chosen(r: &Recommendation) -> Option<(&ShapeCost, String)> {
    let at = |shape| r.shapes.iter().find(|s| s.shape == shape).filter(|s| s.ranks > 1);
    if let Some(s) = r.cheapest_meeting_epoch_target.and_then(at) {
        return Some((s, "the cheapest shape whose expected epoch meets the epoch-time target".into()));
    }
    if let Some(s) = r.fastest_within_budget.and_then(at) {
        return Some((s, "the fastest shape within the GPU-hour budget".into()));
    }
    let target = format!("{:.0} %", r.target_efficiency * 100.0);
    r.keeps_target
        .and_then(at)
        .map(|s| (s, format!("the largest shape keeping ≥ {target} efficiency")))
}

/// A shape's figures: epoch, GPU-hours, cost, and time to the target where trained to one.
fn figures(r: &Recommendation, f: &Figures, s: &ShapeCost) -> String {
    let mut out = format!(
        "epoch {}, {} GPU-hours per epoch, {}",
        f.epoch_band(s),
        f.gpu_hours_band(s),
        match s.cost_per_epoch {
            Some(c) => format!("cost {} per epoch", f.money(c)),
            None => "cost not stated (give --price-per-gpu-hour)".into(),
        },
    );
    if let Some(t) = &r.time_to_target {
        let _ = write!(out, ", {}", to_target(f, s, t.goal, t.checked_error));
    }
    if s.ranks > 1 {
        let _ = write!(out, "; efficiency {}", f.efficiency_band(s));
    }
    out
}

/// The recommendation in one line: the shape it names first, why, and its figures; or,
/// where no shape beyond 1 rank keeps the target, 1 rank's figures and what the
/// shortest epoch would cost.
fn run_line(r: &Recommendation) -> String {
    let f = Figures { rough: r.rough };
    let mut s = match chosen(r) {
        Some((c, why)) => format!(
            "**Run {} ({} ranks)** at batch {} per rank on {}, {why}: {}.",
            c.shape.label(),
            c.ranks,
            r.batch_per_rank,
            r.link,
            figures(r, &f, c)
        ),
        None => {
            let one = r.shapes.first();
            let fast = r.shapes.iter().find(|s| s.shape == r.shortest_epoch);
            let mut s = format!(
                "**No shape beyond 1 rank keeps ≥ {:.0} % efficiency** at batch {} per rank on {}",
                r.target_efficiency * 100.0,
                r.batch_per_rank,
                r.link
            );
            if let Some(one) = one {
                let _ = write!(s, "; 1 rank: {}", figures(r, &f, one));
            }
            if let Some(fast) = fast.filter(|x| x.ranks > 1) {
                let _ = write!(
                    s,
                    ". The shortest epoch would be at {}: {}",
                    fast.shape.label(),
                    figures(r, &f, fast)
                );
            }
            s + "."
        }
    };
    if r.rough {
        s.push_str(" Rough: extrapolated, beyond what was measured or on an unreliable fit (2 digits).");
    }
    if r.nominal {
        s.push_str(" A link is nominal: the band's optimistic end is its line rate.");
    }
    if let Some(c) = r.loss_cause.filter(|c| c.own_work_s > c.link_s) {
        let _ = write!(
            s,
            " At {} most of the loss is own work, not the link: a faster link would not change this.",
            c.shape.label()
        );
    }
    s
}

/// The time to the target at `s`, with its band and the prediction's checked error.
fn to_target(f: &Figures, s: &ShapeCost, goal: crate::record::TargetGoal, checked_error: f64) -> String {
    match (s.hours_to_target, s.hours_to_target_low, s.hours_to_target_high) {
        (Some(h), Some(l), Some(u)) => format!(
            "to {goal} {} (±{:.0} % as checked)",
            f.banded(|h| f.epoch(h * 3600.0), h, l, u),
            checked_error * 100.0
        ),
        _ => format!("no time to {goal} at this shape"),
    }
}

/// Why the workload has no recommendation: the projection's own reason where it gave
/// one, else what a projection needs.
fn no_run_because(head: Option<&ScalingRow>, projection: Option<&ProjectionReport>, model: &str) -> String {
    let Some(p) = projection else {
        return "No recommendation: nothing was projected beyond the runs, since no link model was given (--link, or a \
                sweep with --interconnect)."
            .into();
    };
    if let Some(why) = &p.left_out {
        return format!("No recommendation: the link model was refused ({why}).");
    }
    if let Some(note) = p.notes.iter().find(|n| n.contains("no recommendation") && n.contains(model)) {
        let why = note.split_once("no recommendation, ").map_or(note.as_str(), |(_, why)| why);
        return format!(
            "No recommendation, {}",
            why.replace("(the reasons above)", "(the projection's notes say why)")
        );
    }
    if head.is_some_and(|h| h.scaling_mode == ScalingMode::Strong) {
        return "No recommendation: recommendations are made for weak scaling (a fixed batch per rank), and this \
                workload's points are strong scaling."
            .into();
    }
    "No recommendation: the projection made no row for this workload (the projection's notes say why).".into()
}

/// The command to run next: the reference where none is, repeats where no direction
/// is claimed, a link model where nothing is projected, else the recommended shape
/// itself, which checks the forecast.
fn next(head: Option<&ScalingRow>, rows: &[&ScalingRow], recs: &[&Recommendation], complete: &[&RunStats]) -> String {
    // The point's settings as `train` arguments (every setting of its comparison key,
    // spelled out, so the new run has the same key at its own rank count), and the
    // folder its run now lies in (where it was written may be another machine's path).
    let train_of = |ids: &[String]| {
        let run = complete.iter().find(|r| ids.contains(&r.manifest.run_id))?;
        if run.manifest.command_line.get(1).is_none_or(|c| c != "train") {
            return None;
        }
        let key = run.key.as_ref()?;
        let reference = crate::reduce::analysis::advice::reference_command(run, key, run.manifest.batch_size_per_rank);
        let env: Vec<String> = reference.env.iter().map(|e| quoted(e)).collect();
        // A 1-rank reference shares a node's cores as the point's ranks did (--node-slots);
        // a run at its own rank count has its own slots.
        let mut words = vec!["train".to_string()];
        for (flag, value) in reference.flags.into_iter().filter(|(f, _)| f != "--node-slots") {
            words.push(flag);
            if !value.is_empty() {
                words.push(value);
            }
        }
        Some((env.join(" "), words, run.dir.parent().map(Path::to_path_buf)))
    };
    let Some(h) = head else {
        if let Some(m) = rows.iter().map(|r| r.missing_reference.as_str()).find(|m| !m.is_empty()) {
            return format!("Run the reference: {m}.");
        }
        return match rows.first().and_then(|r| train_of(&r.run_ids)) {
            Some((env, argv, home)) => format!(
                "Measure it at 2 ranks: `{}mpirun -n 2 ddpbench {}`.",
                env_prefix(&env),
                train_args(&argv, home.as_deref(), "at-2-ranks")
            ),
            None => "Measure it at 2 ranks or more: scaling needs two rank counts.".into(),
        };
    };
    if matches!(h.direction, Some(Direction::WithinNoise | Direction::NoInterval)) {
        let needs = crate::reduce::analysis::interval::what_a_direction_needs(
            h.direction.unwrap_or(Direction::NoInterval),
            h.repeats,
            h.baseline_repeats,
            h.repeats_needed,
        );
        return format!("Repeat the point at {} ranks and its reference: {needs}.", h.ranks);
    }
    if recs.is_empty() {
        return format!(
            "Project it onto a fabric: `ddpbench reduce {} --link NAME` (NAME: {}), or measure the link with `ddpbench \
             allreduce` on the nodes and give its folder with --interconnect.",
            inputs(complete),
            crate::link::spec::preset_names()
        );
    }
    let Some((r, c)) = recs.iter().find_map(|r| chosen(r).map(|(c, _)| (r, c))) else {
        return "Nothing beyond 1 rank keeps the target efficiency: a larger batch per rank does more work per \
                all-reduce; measure one at 1 and 2 ranks."
            .into();
    };
    let shape = c.shape;
    let check = format!("Check the forecast at {} by running it", shape.label());
    let at_batch = |row: &&&ScalingRow| row.batch_per_rank as f64 == r.batch_per_rank;
    match rows.iter().find(at_batch).and_then(|row| train_of(&row.run_ids)) {
        Some((env, argv, home)) => format!(
            "{check}: `{}srun -N {} --ntasks-per-node {} ddpbench {}`.",
            env_prefix(&env),
            shape.nodes,
            shape.ranks_per_node,
            train_args(&argv, home.as_deref(), &format!("at-{}x{}", shape.nodes, shape.ranks_per_node))
        ),
        None => format!(
            "{check}: add a point of {} ranks to the study file and run it under `srun -N {} --ntasks-per-node {}`.",
            shape.nodes * shape.ranks_per_node,
            shape.nodes,
            shape.ranks_per_node
        ),
    }
}

/// The `train` words (`train` and its flags, unquoted, no `--out`: the reference
/// command writes none) with a new output folder `name` in `home`, the folder the run
/// lies in now (a run never writes into another's folder), quoted for a shell.
fn train_args(words: &[String], home: Option<&Path>, name: &str) -> String {
    let folder = home.unwrap_or(Path::new("runs")).join(name).display().to_string();
    words
        .iter()
        .chain(["--out".to_string(), folder].iter())
        .map(|a| quoted(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `env ` before a launcher, where the point ran with environment settings.
fn env_prefix(env: &str) -> String {
    if env.is_empty() {
        String::new()
    } else {
        format!("{env} ")
    }
}

/// The runs' folders as `reduce` takes them: their common parent, else each.
fn inputs(complete: &[&RunStats]) -> String {
    let parents: Vec<&Path> = complete.iter().filter_map(|r| r.dir.parent()).collect();
    match parents.first() {
        Some(p) if parents.iter().all(|q| q == p) => quoted(&p.display().to_string()),
        _ => complete
            .iter()
            .map(|r| quoted(&r.dir.display().to_string()))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The points compared: `1 rank × 3 repeats, 2 ranks × 3 repeats`.
fn points(rows: &[&ScalingRow]) -> String {
    let mut out: Vec<String> = Vec::new();
    for r in rows {
        let p = format!(
            "{} rank{} at batch {} per rank × {} run{}",
            r.ranks,
            if r.ranks == 1 { "" } else { "s" },
            r.batch_per_rank,
            r.repeats,
            if r.repeats == 1 { "" } else { "s" }
        );
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out.join("; ")
}

/// report.md's first section: every workload's decision.
pub(super) fn markdown(md: &mut String, decisions: &[WorkloadDecision]) {
    let _ = writeln!(md, "\n## What to run\n");
    if decisions.is_empty() {
        let _ = writeln!(
            md,
            "No point was compared with a reference: scaling needs runs of the same workload at two or more rank counts (a \
             1-rank run is the reference)."
        );
        return;
    }
    for d in decisions {
        workload_markdown(md, d);
    }
}

/// One workload's decision in markdown.
pub(super) fn workload_markdown(md: &mut String, d: &WorkloadDecision) {
    let esc = crate::escape::markdown;
    let _ = writeln!(md, "### {}\n", esc(&d.label));
    let _ = writeln!(md, "- **Scaling:** {}", esc(&d.scaling));
    for r in &d.run {
        let _ = writeln!(md, "- {}", esc(r));
    }
    if let Some(why) = &d.no_run_because {
        let _ = writeln!(md, "- {}", esc(why));
    }
    let _ = writeln!(md, "- **Next:** {}", esc(&d.next));
    let _ = writeln!(
        md,
        "- Details: points {}; key `{}`.\n",
        esc(&d.points),
        d.comparison.replace('`', "'")
    );
}

/// The decisions on the terminal, as report.md says them (its last screen is what a
/// person sees when `reduce` returns, so the terminal prints them last).
pub(super) fn terminal_lines(decisions: &[WorkloadDecision]) -> Vec<String> {
    let mut out = Vec::new();
    for d in decisions {
        out.push(format!("\nWhat to run: {}", d.label));
        out.push(format!("  scaling: {}", d.scaling));
        for r in &d.run {
            out.push(format!("  {}", r.replace("**", "")));
        }
        if let Some(why) = &d.no_run_because {
            out.push(format!("  {why}"));
        }
        out.push(format!("  next: {}", d.next));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The new run's words are quoted for a shell where they need it, and its folder
    /// goes where the run lies now.
    #[test]
    fn the_next_commands_words_are_quoted_and_write_a_new_folder() {
        let words: Vec<String> = ["train", "--threads", "2", "--x", "a b", "--y", "it's"].map(String::from).to_vec();
        assert_eq!(
            train_args(&words, Some(Path::new("/here/runs")), "at-2x4"),
            r"train --threads 2 --x 'a b' --y 'it'\''s' --out /here/runs/at-2x4"
        );
        assert_eq!(
            train_args(&words, None, "at-2x4"),
            r"train --threads 2 --x 'a b' --y 'it'\''s' --out runs/at-2x4"
        );
    }
}
