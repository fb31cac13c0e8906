//! What a study prints: the plan and the dry run's estimate on stdout, the start in the log.

use super::estimate;
use super::layout::Layout;
use super::plan::{self, Plan};
use super::spec::StudySpec;
use clap::ValueEnum;
use std::collections::BTreeMap;
use std::path::Path;
use tracing::{info, warn};

pub(super) fn announce(spec: &StudySpec, plan: &Plan, layout: &Layout, world: usize, out: &Path) {
    info!(
        "study {}: {} points × {} repeat(s) on {} ranks ({} node(s)), {} thread(s) per rank \
         (a node's cores shared by up to {} rank(s) of a point), into {}",
        spec.name,
        plan.points.len(),
        spec.repeats,
        world,
        layout.nodes.len(),
        plan.threads_per_rank,
        plan.node_slots,
        out.display()
    );
    for s in &plan.skipped {
        warn!("skipped: {} at {} ranks: {}", s.workload, s.ranks, s.why);
    }
}

pub(super) fn print_plan(spec: &StudySpec, plan: &Plan, layout: &Layout, out: &Path) {
    println!(
        "study {}: {} point(s) × {} repeat(s) = {} runs, ladder {:?}, {} thread(s) per rank, node fill {}, into {}",
        spec.name,
        plan.points.len(),
        spec.repeats,
        plan.points.len() * spec.repeats,
        plan.ladder,
        plan.threads_per_rank,
        spec.node_fill
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default(),
        out.display()
    );
    for (workload, points) in plan::by_workload(&plan.points) {
        println!("{workload}");
        for p in points {
            let hosts: Vec<&str> = layout
                .nodes
                .iter()
                .zip(&layout.hosts)
                .filter(|(ranks, _)| ranks.iter().any(|r| p.world_ranks.contains(r)))
                .map(|(_, h)| h.as_str())
                .collect();
            println!(
                "  {:<48} {:>3} ranks {:<12} batch {:>5}/rank {:>6} global  {:<12} on {}",
                p.id,
                p.ranks,
                crate::topology::compact_list(&p.world_ranks.iter().map(|&r| r as u32).collect::<Vec<_>>()),
                p.batch_per_rank,
                p.global_batch,
                p.scaling,
                hosts.join(",")
            );
        }
    }
    for s in &plan.skipped {
        println!("skipped: {} at {} ranks: {}", s.workload, s.ranks, s.why);
    }
}

/// The dry run's estimate per point and in all, from each workload's timing.
pub(super) fn print_estimate(plan: &Plan, repeat: usize, timings: &BTreeMap<String, Result<estimate::WorkloadTiming, String>>) {
    let mut total = 0.0;
    let (mut unknown, mut timed) = (0, 0);
    for (workload, points) in plan::by_workload(&plan.points) {
        match timings.get(&workload) {
            Some(Ok(t)) => {
                println!(
                    "{workload}: {:.1} ms per step at batch {} on 1 rank, {:.1} s set-up",
                    t.step_s * 1e3,
                    t.batch_per_rank,
                    t.setup_s
                );
                for w in &t.warnings {
                    println!("  warning: {}", w.message);
                }
                for p in points {
                    match estimate::point_seconds(p, t) {
                        Some(s) => {
                            println!("  {:<48} ~{} per run", p.id, human_seconds(s));
                            total += s * repeat as f64;
                            timed += 1;
                        }
                        None => {
                            println!("  {:<48} not estimated: its steps per run are not known before it runs", p.id);
                            unknown += 1;
                        }
                    }
                    if let Some(w) = estimate::too_few_steps(p, t) {
                        println!("    warning: {}", w.message);
                    }
                }
            }
            Some(Err(e)) => {
                println!("{workload}: not timed: {e}");
                for p in &points {
                    println!("  {:<48} not estimated", p.id);
                }
                unknown += points.len();
            }
            None => unknown += points.len(),
        }
    }
    println!("{}", total_line(total, timed * repeat, unknown));
}

/// The estimate in all: what the timed points' runs take, and how many points were not
/// estimated. No figure where nothing was timed: a sum over no point is no estimate.
fn total_line(total_s: f64, timed_runs: usize, unknown: usize) -> String {
    let not = if unknown > 0 {
        format!(", {unknown} point(s) not estimated (named above)")
    } else {
        String::new()
    };
    if timed_runs == 0 {
        return format!("estimate: none, no point could be timed{not}");
    }
    format!(
        "estimate: about {} for the {timed_runs} run(s) of the points timed{not}; compute only (communication, waiting \
         and validation come on top)",
        human_seconds(total_s)
    )
}

fn human_seconds(s: f64) -> String {
    if s < 1.0 {
        "under 1 s".into()
    } else if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_estimate_reads_as_zero_seconds() {
        assert_eq!(human_seconds(0.3), "under 1 s");
        assert_eq!(human_seconds(2.25), "2.2 s");
        assert_eq!(human_seconds(600.0), "10 min");
        assert_eq!(
            total_line(0.0, 0, 17),
            "estimate: none, no point could be timed, 17 point(s) not estimated (named above)"
        );
        let some = total_line(0.4, 3, 2);
        assert!(
            some.starts_with("estimate: about under 1 s for the 3 run(s) of the points timed, 2 point(s) not estimated"),
            "{some}"
        );
        assert!(!total_line(30.0, 4, 0).contains("not estimated"));
    }
}
