//! Links by specification in the report, and the recommendation per workload: which
//! levels are measured and which nominal, the shape to run, and each shape's epoch,
//! GPU-hours and cost (report.md, report.json, the terminal).

use super::{ms, ProjectionReport};
use crate::link::model::LevelFit;
use crate::link::{spec as link_spec, LinkModelFile};
use crate::reduce::analysis::recommend::{recommend, Ask, Figures, Recommendation, Shape};
use crate::reduce::analysis::RunStats;
use crate::reduce::ReduceRequest;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// Where the link model came from, in words.
pub(crate) fn source_words(req: &ReduceRequest, sweep: Option<&Path>) -> String {
    let mut parts: Vec<String> = sweep.map(|s| s.display().to_string()).into_iter().collect();
    parts.extend(req.link.iter().map(|l| format!("--link {}", l.name)));
    parts.extend(req.link_intra.as_ref().map(|l| format!("--link-intra {}", l.name)));
    parts.join(" and ")
}

/// One level in words: nominal (its spec), from the runs' probe, or measured by the sweep.
fn level_words(fit: Option<&LevelFit>, sweep: Option<&Path>) -> String {
    match (fit, fit.and_then(|f| f.nominal.as_ref())) {
        (None, _) => "absent".into(),
        (Some(f), Some(spec)) => match &f.efficiency {
            Some(e) => format!(
                "nominal, from the specification {spec}, expected at {}",
                link_spec::efficiency_words(e)
            ),
            None => format!("nominal, from the specification {spec}"),
        },
        (Some(f), None) if f.probe.is_some() => format!("measured by {}", f.probe.as_deref().unwrap_or_default()),
        (Some(_), None) => format!(
            "measured by `ddpbench allreduce`{}",
            sweep.map(|s| format!(" in `{}`", s.display())).unwrap_or_default()
        ),
    }
}

/// The levels and the recommendation per weak-scaling workload, added to `p`.
pub(crate) fn attach(p: &mut ProjectionReport, req: &ReduceRequest, sweep: Option<&Path>, runs: &[&RunStats]) {
    let file = LinkModelFile {
        formula: String::new(),
        models: p.models.clone(),
    };
    for m in &file.models {
        p.levels.push(format!(
            "{}: intra-node {}; inter-node {}.",
            m.route().label(),
            level_words(m.model.intra.as_ref(), sweep),
            level_words(m.model.inter.as_ref(), sweep)
        ));
    }
    if file
        .models
        .iter()
        .any(|m| [&m.model.intra, &m.model.inter].into_iter().flatten().any(|f| f.nominal.is_some()))
    {
        p.levels.push(
            "A nominal level's line rate is an optimistic bound on the link term only: an all-reduce does not reach it, so the \
             projection expects the fraction of line rate stated for the level (published, given or assumed, as it says), and \
             the band's optimistic end is the line rate."
                .into(),
        );
    }
    let mut weak: BTreeMap<&str, Vec<&crate::reduce::analysis::projection::ProjectionRow>> = BTreeMap::new();
    for r in p.rows.iter().filter(|r| r.scaling == "weak") {
        weak.entry(r.from_runs.as_str()).or_default().push(r);
    }
    let mut recs = Vec::new();
    for (run_ids, rows) in weak {
        let first = run_ids.split(' ').next().unwrap_or_default();
        let Some(run) = runs.iter().find(|r| r.manifest.run_id == first) else {
            continue;
        };
        let Ok(bm) = file.for_manifest(&run.manifest) else { continue };
        let m = &run.manifest;
        let across_nodes = rows.iter().any(|r| r.nodes > 1);
        let used: Vec<&LevelFit> = if across_nodes {
            [&bm.model.intra, &bm.model.inter].into_iter().flatten().collect()
        } else {
            bm.model.intra.iter().collect()
        };
        let main = if across_nodes {
            bm.model.inter.as_ref()
        } else {
            bm.model.intra.as_ref()
        };
        let link = match main {
            Some(f) => match &f.nominal {
                Some(spec) => spec.clone(),
                None => format!("the {} link measured by `ddpbench allreduce`", f.level),
            },
            None => "the links of the model".into(),
        };
        let ask = Ask {
            epoch_samples: (m.steps_per_epoch.max(1) * m.global_batch_size.max(1)) as f64,
            target_efficiency: req.target_efficiency,
            price_per_gpu_hour: req.price_per_gpu_hour,
            link: &link,
            nominal: used.iter().any(|f| f.nominal.is_some()),
            epoch_time_target_s: req.epoch_time_target_s,
            gpu_hour_budget: req.gpu_hour_budget,
        };
        // A recommendation stands on a projection beyond 1 rank: without one (no level
        // for the shapes asked) there is nothing to choose between, and it says so.
        if rows.iter().all(|r| r.ranks == 1) {
            p.notes.push(format!(
                "warning: {}: no recommendation, since no shape beyond 1 rank could be projected (the reasons above); give \
                 --link-intra, or a sweep (`ddpbench allreduce`) on the node, or runs with the all-reduce probe on",
                rows[0].workload
            ));
            continue;
        }
        recs.extend(recommend(&rows, &ask));
    }
    p.recommendations = recs;
}

/// The recommendation's table rows, in the figures its sentence uses.
fn table_rows(r: &Recommendation) -> Vec<Vec<String>> {
    let f = Figures { rough: r.rough };
    r.shapes
        .iter()
        .map(|s| {
            let mut note = Vec::new();
            if Some(s.shape) == r.keeps_target {
                note.push("largest keeping the target");
            }
            if s.shape == r.shortest_epoch {
                note.push("shortest epoch");
            }
            if s.extrapolated {
                note.push("extrapolated");
            }
            if s.unreliable {
                note.push("unreliable");
            }
            if s.beyond_measured {
                note.push("beyond measured");
            }
            if Some(s.shape) == r.cheapest_meeting_epoch_target {
                note.push("cheapest meeting the epoch target");
            }
            if Some(s.shape) == r.fastest_within_budget {
                note.push("fastest within the budget");
            }
            if s.target_batch_extrapolated {
                note.push("batch outside the checked B0 – 16 × B0");
            }
            if r.time_to_target.as_ref().is_some_and(|t| t.soonest == s.shape) {
                note.push("soonest to the target");
            }
            if r.time_to_target.as_ref().is_some_and(|t| t.cheapest == s.shape) {
                note.push("cheapest to the target");
            }
            let mut row = vec![
                s.shape.label(),
                s.ranks.to_string(),
                ms(s.step_s),
                f.efficiency_band(s),
                f.epoch_band(s),
                f.gpu_hours_band(s),
                s.cost_per_epoch.map(|c| f.money(c)).unwrap_or_else(|| "–".into()),
                s.epoch_saved_fraction.map(|x| f.fraction(x)).unwrap_or_else(|| "–".into()),
                s.gpu_hours_ratio.map(|x| f.ratio(x)).unwrap_or_else(|| "–".into()),
            ];
            if r.time_to_target.is_some() {
                let none = || "–".to_string();
                row.push(s.samples_to_target_ratio.map_or_else(none, |x| f.ratio(x)));
                row.push(match (s.hours_to_target, s.hours_to_target_low, s.hours_to_target_high) {
                    (Some(h), Some(l), Some(u)) => f.banded(|h| f.epoch(h * 3600.0), h, l, u),
                    _ => none(),
                });
                row.push(s.gpu_hours_to_target.map_or_else(none, |g| f.gpu_hours(g)));
            }
            row.push(note.join(", "));
            row
        })
        .collect()
}

/// The table's headers: [`HEADERS`], with the time-to-target columns before the note
/// where the recommendation has them.
fn headers(r: &Recommendation) -> Vec<&'static str> {
    let mut h: Vec<&str> = HEADERS[..HEADERS.len() - 1].to_vec();
    if r.time_to_target.is_some() {
        h.extend(TARGET_HEADERS);
    }
    h.push(HEADERS[HEADERS.len() - 1]);
    h
}

const TARGET_HEADERS: [&str; 3] = ["samples to target vs 1 rank", "time to target (band)", "GPU-hours to target"];

const HEADERS: [&str; 10] = [
    "nodes × per node",
    "ranks",
    "step (ms)",
    "efficiency (band)",
    "epoch (band)",
    "GPU-hours per epoch (band)",
    "cost per epoch",
    "epoch saved vs the row above",
    "GPU-hours vs the row above",
    "note",
];

/// report.md's levels and recommendations (empty when there are none).
pub(crate) fn markdown(p: &ProjectionReport) -> String {
    let mut md = String::new();
    if !p.levels.is_empty() {
        let _ = writeln!(md, "\nLevels of the link model:\n");
        for l in &p.levels {
            let _ = writeln!(md, "- {l}");
        }
    }
    side_by_side(&mut md, &p.recommendations);
    for r in &p.recommendations {
        let _ = writeln!(
            md,
            "\n### Recommendation: {} on {} (weak scaling, batch {} per rank)\n\n{}\n\nEvery column is against one reference, the {} \
             (so the epoch saved against the row above is 1 − its speedup over this one's); an epoch is {} samples; GPU-hours \
             are ranks × the epoch's hours; each figure is the expected one with its band, whose optimistic end is the bound. \
             {}\n",
            r.workload,
            r.link,
            r.batch_per_rank,
            r.sentence,
            r.against,
            r.epoch_samples,
            crate::reduce::analysis::projection::FORECAST_CHECKED_ERROR
        );
        let h = headers(r);
        let _ = writeln!(md, "| {} |", h.join(" | "));
        let _ = writeln!(md, "|---|{}---|", "---:|".repeat(h.len() - 2));
        for row in table_rows(r) {
            let _ = writeln!(md, "| {} |", row.join(" | "));
        }
    }
    md
}

/// Where one workload was projected through several links (`--link` repeated): the
/// links side by side at the shape each recommends, in one table.
fn side_by_side(md: &mut String, recs: &[Recommendation]) {
    let mut by: BTreeMap<(&str, &str), Vec<&Recommendation>> = BTreeMap::new();
    for r in recs {
        by.entry((r.workload.as_str(), r.from_runs.as_str())).or_default().push(r);
    }
    let names = |w: &str| by.keys().filter(|k| k.0 == w).count();
    let named: Vec<(String, &Vec<&Recommendation>)> = by
        .iter()
        .map(|(k, rs)| {
            (
                if names(k.0) > 1 {
                    format!("{} (from {})", k.0, k.1)
                } else {
                    k.0.to_string()
                },
                rs,
            )
        })
        .collect();
    for (workload, rs) in named.into_iter().filter(|(_, rs)| rs.len() > 1) {
        let _ = writeln!(
            md,
            "\n### Fabrics side by side: {workload}\n\nPer link, the largest shape keeping the target efficiency (else 1 × 1) \
             and the shortest epoch, each with its band.\n\n| link | keeps the target up to | efficiency | epoch | GPU-hours per epoch | \
             shortest epoch at | epoch | GPU-hours per epoch |\n|---|---|---:|---:|---:|---|---:|---:|"
        );
        for r in rs {
            let f = Figures { rough: r.rough };
            let at = |shape: Shape| r.shapes.iter().find(|s| s.shape == shape);
            let keep = r.keeps_target.and_then(at).or(r.shapes.first());
            let fast = at(r.shortest_epoch);
            let cells = |s: Option<&crate::reduce::analysis::recommend::ShapeCost>, with_eff: bool| match s {
                Some(s) if with_eff => format!(
                    "{} | {} | {} | {}",
                    s.shape.label(),
                    f.efficiency_band(s),
                    f.epoch_band(s),
                    f.gpu_hours_band(s)
                ),
                Some(s) => format!("{} | {} | {}", s.shape.label(), f.epoch_band(s), f.gpu_hours_band(s)),
                None => "– | – | –".into(),
            };
            let _ = writeln!(md, "| {} | {} | {} |", r.link, cells(keep, true), cells(fast, false));
        }
    }
}

/// The recommendations on the terminal.
pub(crate) fn print(p: &ProjectionReport) {
    for l in &p.levels {
        println!("{l}");
    }
    for r in &p.recommendations {
        println!(
            "\nRecommendation for {}: {}",
            crate::escape::terminal(&r.workload),
            crate::escape::terminal(&r.sentence)
        );
        let target_heads = if r.time_to_target.is_some() {
            ["samples×", "to target", "GPU-h tgt"].map(|h| format!(" {h:>11}")).concat()
        } else {
            String::new()
        };
        println!(
            "{:>10} {:>6} {:>11} {:>10} {:>11} {:>10} {:>10} {:>8} {:>8}{target_heads}  note",
            "shape", "ranks", "step ms", "efficiency", "epoch", "GPU-h", "cost", "saved", "GPU-h×"
        );
        for row in table_rows(r) {
            let target = &row[9..row.len() - 1];
            println!(
                "{:>10} {:>6} {:>11} {:>10} {:>11} {:>10} {:>10} {:>8} {:>8}{}  {}",
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                row[5],
                row[6],
                row[7],
                row[8],
                target.iter().map(|c| format!(" {c:>11}")).collect::<String>(),
                row[row.len() - 1]
            );
        }
    }
}
