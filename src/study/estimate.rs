//! The dry run's time estimate: each workload's 1-rank point trained for a few steps on
//! rank 0 alone, scaled to every point's steps and batch. Compute only: communication,
//! waiting for other ranks and validation are not in it, so it is a lower bound for
//! points of several ranks.

use super::broadcast::wait_without_spinning;
use super::plan::{self, Plan, Point};
use super::point::run_point;
use crate::cleanup::ScratchDir;
use crate::job::watchdog::Watchdog;
use crate::record::{Manifest, RunWarning};
use crate::world::broadcast_string;
use crate::world::Group;
use mpi::topology::{Color, Communicator};
use std::collections::BTreeMap;
use std::path::Path;

/// Steps the timing run trains; the first is a warm-up and is left out.
pub(super) const TIMED_STEPS: usize = 6;

/// One workload's timing on one rank.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct WorkloadTiming {
    /// The point timed: its batch per rank and steps per epoch.
    pub batch_per_rank: usize,
    pub steps_per_epoch: usize,
    /// Median seconds per step after the warm-up step.
    pub step_s: f64,
    /// Seconds of the run outside its steps (data, model, set-up, writing).
    pub setup_s: f64,
    /// What the timing run warned of, which its points share (fp16 on CPU...).
    pub warnings: Vec<RunWarning>,
}

/// Drops `flags` (and their values) from a `train` command line.
fn without(args: &[String], flags: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        // `--flag=value` (how the plan writes values) is one argument.
        if args[i].split_once('=').is_some_and(|(name, _)| flags.contains(&name)) {
            i += 1;
            continue;
        }
        if flags.contains(&args[i].as_str()) {
            let takes_value = args.get(i + 1).is_some_and(|v| !v.starts_with("--"));
            i += if takes_value { 2 } else { 1 };
            continue;
        }
        out.push(args[i].clone());
        i += 1;
    }
    out
}

/// The timing run's command line: the point's, bounded and without extras.
pub(super) fn timing_args(point: &Point) -> Vec<String> {
    let mut args = without(
        &point.args,
        &[
            "--max-steps",
            "--epochs",
            "--warmup-steps",
            "--val-samples",
            "--probe-iters",
            "--save-model",
            "--min-measured-steps",
            // A timing run of a few steps never reaches a target; it times the step.
            "--target-loss",
            "--target-accuracy",
            "--val-every",
        ],
    );
    for (k, v) in [
        ("--max-steps", TIMED_STEPS.to_string()),
        ("--warmup-steps", "1".into()),
        ("--val-samples", "0".into()),
        ("--probe-iters", "0".into()),
        // Its few steps are not a point's: the points' own are warned of apart.
        ("--min-measured-steps", "0".into()),
    ] {
        args.extend([k.to_string(), v]);
    }
    args
}

/// Reads a timing run's folder.
fn read_timing(dir: &Path, point: &Point) -> Result<WorkloadTiming, String> {
    let m = Manifest::read(dir).map_err(|e| format!("{e:#}"))?;
    let mut r = csv::Reader::from_path(dir.join(crate::record::rank_file_name(0))).map_err(|e| e.to_string())?;
    let h = r.headers().map_err(|e| e.to_string())?.clone();
    let pos = |n: &str| h.iter().position(|c| c == n).ok_or_else(|| format!("no column {n}"));
    let (step, warm) = (pos("step_s")?, pos("warmup")?);
    let (mut all_s, mut timed) = (0.0, Vec::new());
    for rec in r.records().flatten() {
        let s: f64 = rec.get(step).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        all_s += s;
        if rec.get(warm) == Some("0") {
            timed.push(s);
        }
    }
    if timed.is_empty() {
        return Err("no timed steps".into());
    }
    Ok(WorkloadTiming {
        batch_per_rank: point.batch_per_rank,
        steps_per_epoch: m.steps_per_epoch,
        step_s: crate::stats::median(&timed),
        setup_s: (m.wall_s.unwrap_or(all_s) - all_s).max(0.0),
        warnings: m.warnings,
    })
}

/// Times each workload's first point (its fewest ranks) on rank 0 while the other ranks
/// wait, until `budget_s` is spent (rank 0's clock decides, for every rank); every rank
/// calls it. The result is rank 0's (empty elsewhere): the workloads not reached say so.
///
/// The timing runs write into a scratch folder of rank 0's, `$TMPDIR/ddpbench-estimate-`
/// and 16 random hex digits, created exclusively (nothing planted ahead stands in for
/// it) and removed on every way out ([`ScratchDir`]): at the end, on a panic or an
/// aborted job, and on a stop signal, which ends the dry run at once.
pub(super) fn time_workloads(
    g: &Group,
    plan: &Plan,
    budget_s: f64,
    watchdog: &Watchdog,
) -> BTreeMap<String, Result<WorkloadTiming, String>> {
    let mut out = BTreeMap::new();
    let started = std::time::Instant::now();
    let scratch = if g.rank == 0 {
        Some(
            ScratchDir::create("ddpbench-estimate")
                .map_err(|e| format!("cannot create a scratch folder in {}: {e}", std::env::temp_dir().display())),
        )
    } else {
        None
    };
    for (k, (workload, points)) in plan::by_workload(&plan.points).into_iter().enumerate() {
        let Some(point) = points.iter().min_by_key(|p| p.ranks) else {
            continue;
        };
        let spent_s = started.elapsed().as_secs_f64();
        let spent = g.rank == 0 && spent_s >= budget_s;
        if broadcast_string(g, if spent { "spent" } else { "" }) == "spent" {
            out.insert(
                workload,
                Err(format!(
                    "--budget-s {budget_s} spent ({spent_s:.0} s timing the workloads before it)"
                )),
            );
            continue;
        }
        // Numbered apart from the study's points; the ranks that wait sit this part out.
        let base = (1u64 << 62) + ((k as u64) << 32);
        crate::flight::recorder().begin_part(base, g.rank != 0);
        let color = if g.rank == 0 { Color::with_value(0) } else { Color::undefined() };
        let sub = g.comm.split_by_color(color);
        if let (Some(comm), Some(scratch)) = (sub, scratch.as_ref()) {
            let pg = Group::new(comm, g.threading);
            let timing_point = Point {
                args: timing_args(point),
                ..(*point).clone()
            };
            let result = scratch.as_ref().map_err(Clone::clone).and_then(|s| {
                let dir = s.path().join(point.id.as_str());
                run_point(&pg, &timing_point, None, &dir, watchdog)
                    .map_err(|e| format!("{e:#}"))
                    .and_then(|()| read_timing(&dir, point))
            });
            out.insert(workload, result);
        }
        wait_without_spinning(g, "timing a workload");
        crate::flight::recorder().begin_part(base + (1 << 31), false);
    }
    drop(scratch);
    out
}

/// A point's steps per rank: epochs × steps per epoch (the timed workload's samples
/// per epoch over the point's global batch), at most --max-steps.
fn point_steps(point: &Point, t: &WorkloadTiming) -> Option<usize> {
    let cfg = plan::parse_train(&point.args).ok()?;
    let ref_global = (t.batch_per_rank * t.steps_per_epoch) as f64;
    let per_epoch = (ref_global / point.global_batch.max(1) as f64).ceil() as usize;
    let steps = cfg.schedule.epochs * per_epoch.max(1);
    Some(cfg.schedule.max_steps.map_or(steps, |max| steps.min(max)))
}

/// Seconds a point is expected to take, from its workload's timing: set-up plus its
/// steps at the 1-rank step time scaled by the batch per rank.
pub(super) fn point_seconds(point: &Point, t: &WorkloadTiming) -> Option<f64> {
    let steps = point_steps(point, t)?;
    let scale = point.batch_per_rank as f64 / t.batch_per_rank.max(1) as f64;
    Some(t.setup_s + steps as f64 * t.step_s * scale)
}

/// The warning the point's runs will carry for measuring fewer steps than
/// `--min-measured-steps`, said before they run.
pub(super) fn too_few_steps(point: &Point, t: &WorkloadTiming) -> Option<RunWarning> {
    let cfg = plan::parse_train(&point.args).ok()?;
    let s = &cfg.schedule;
    crate::train::guard::too_few_measured_steps(point_steps(point, t)?, s.warmup_steps, s.min_measured_steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(ranks: usize, per_rank: usize, args: &[&str]) -> Point {
        Point {
            id: "p".into(),
            workload: "w".into(),
            ranks,
            world_ranks: (0..ranks).collect(),
            batch_per_rank: per_rank,
            global_batch: per_rank * ranks,
            scaling: "weak".into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            peer: None,
        }
    }

    #[test]
    fn the_timing_run_replaces_the_points_length_and_extras() {
        let p = point(
            1,
            64,
            &[
                "--model",
                "mnist-cnn",
                "--max-steps",
                "500",
                "--save-model",
                "--lr",
                "-0.5",
                "--epochs",
                "3",
            ],
        );
        let a = timing_args(&p);
        assert_eq!(a.iter().filter(|x| *x == "--max-steps").count(), 1);
        assert!(!a.contains(&"--save-model".to_string()) && !a.contains(&"--epochs".to_string()));
        assert!(a.windows(2).any(|w| w == ["--lr", "-0.5"]), "{a:?}");
        assert!(a.windows(2).any(|w| w[0] == "--max-steps" && w[1] == TIMED_STEPS.to_string()));
        // The plan writes values as one argument: those are replaced too.
        let p = point(
            1,
            64,
            &[
                "--model",
                "mnist-cnn",
                "--max-steps=15",
                "--val-samples=256",
                "--lr=0.5",
                "--target-loss=0.6",
            ],
        );
        let a = timing_args(&p);
        assert!(
            !a.iter()
                .any(|x| x == "--max-steps=15" || x == "--val-samples=256" || x.starts_with("--target-loss")),
            "{a:?}"
        );
        assert!(a.contains(&"--lr=0.5".to_string()), "{a:?}");
        crate::study::plan::parse_train(&a).unwrap();
    }

    #[test]
    fn a_points_time_scales_with_its_steps_and_batch() {
        let t = WorkloadTiming {
            batch_per_rank: 64,
            steps_per_epoch: 100,
            step_s: 0.1,
            setup_s: 2.0,
            warnings: Vec::new(),
        };
        // One epoch of 6400 samples: 1 × 64 takes 100 steps of 0.1 s.
        let one = point(1, 64, &["--model", "mnist-cnn", "--batch-size", "64"]);
        assert!((point_seconds(&one, &t).unwrap() - 12.0).abs() < 1e-9);
        // 2 × 64: 50 steps, each as long as one rank's.
        let two = point(2, 64, &["--model", "mnist-cnn", "--batch-size", "64"]);
        assert!((point_seconds(&two, &t).unwrap() - 7.0).abs() < 1e-9);
        // Strong, 2 × 32: 100 steps of half the work; --max-steps bounds it.
        let strong = point(2, 32, &["--model", "mnist-cnn", "--batch-size", "32", "--max-steps", "10"]);
        assert!((point_seconds(&strong, &t).unwrap() - 2.5).abs() < 1e-9);
        // 10 steps with 5 of warm-up measure 5: fewer than the 20 asked by default.
        assert!(too_few_steps(&strong, &t).unwrap().message.starts_with("5 measured step(s)"));
        assert!(too_few_steps(&one, &t).is_none(), "100 steps");
        let lowered = point(2, 32, &["--model", "mnist-cnn", "--max-steps", "10", "--min-measured-steps", "5"]);
        assert!(too_few_steps(&lowered, &t).is_none());
    }
}
