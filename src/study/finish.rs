//! The end of a study on rank 0: failures named, `reduce` run over every point, and
//! the study's report written next to `reduce`'s.

use super::plan::Plan;
use super::report;
use super::spec::StudySpec;
use super::state::{PointOutcome, State};
use crate::record::RunStatus;
use crate::reduce::ReduceRequest;
use anyhow::Context;
use std::path::Path;

/// The end of a study on rank 0: failures named, then the report over every point.
/// Returns why the study must exit non-zero: no run of it completed, or its report
/// could not be written.
pub(super) fn finish(out: &Path, state: &State, plan: &Plan, spec: &StudySpec, stopped: bool) -> Option<String> {
    let repeat = spec.repeats;
    let failed: Vec<(&String, &PointOutcome)> = state.iter().filter(|(_, o)| o.status == RunStatus::Failed).collect();
    for (name, o) in &failed {
        eprintln!("failed point {name}: {}", o.error.as_deref().unwrap_or(""));
    }
    if stopped {
        eprintln!(
            "study interrupted: every finished point is in {}; run the same command again to resume",
            out.display()
        );
    }
    let completed = state.values().filter(|o| o.status == RunStatus::Completed).count();
    if completed == 0 {
        return Some(format!(
            "no run of the study completed ({} failed): see points.csv in {}",
            failed.len(),
            out.display()
        ));
    }
    let request = ReduceRequest {
        runs: vec![out.join("runs")],
        baseline: None,
        // A sweep the user ran into the study's folder (`ddpbench allreduce --out <study>/allreduce`).
        interconnect: crate::link::link_model_path(&out.join("allreduce")).map(|_| out.join("allreduce")),
        project_to: 1024,
        link: spec.report.link.iter().cloned().collect(),
        link_intra: spec.report.link_intra.clone(),
        project_shape: spec.report.project_shape.clone(),
        target_efficiency: spec.report.target_efficiency.unwrap_or(crate::reduce::report::TARGET_EFFICIENCY),
        price_per_gpu_hour: spec.report.price_per_gpu_hour,
        ..crate::reduce::ReduceRequest::default()
    };
    let report_dir = out.join("report");
    let reduced = match crate::reduce::run(&request) {
        Ok(r) => r,
        Err(e) => return Some(format!("the study's report could not be made: {e:#}")),
    };
    // reduce's files and the study's summary replace the previous ones together.
    let written = crate::files::StagedFiles::new(&report_dir)
        .map_err(anyhow::Error::from)
        .and_then(|mut files| {
            for n in crate::reduce::stage(&reduced, &mut files, true)? {
                eprintln!("report.html: {n}");
            }
            let verdicts = report::write(&mut files, plan, repeat, state, &reduced, true)?;
            files.commit()?;
            Ok(verdicts)
        })
        .with_context(|| crate::reduce::report::not_written(&report_dir));
    match written {
        Ok(verdicts) => {
            crate::reduce::report::print(&reduced, &report_dir, true);
            println!();
            for v in verdicts {
                println!("{v}");
            }
        }
        Err(e) => return Some(format!("the study's report could not be written: {e:#}")),
    }
    let not_run = plan.points.len() * repeat - state.len().min(plan.points.len() * repeat);
    println!(
        "study: {} point(s) × {repeat}: {completed} run(s) completed, {} failed, {not_run} not run; {} skipped by plan; report in {}",
        plan.points.len(),
        failed.len(),
        plan.skipped.len(),
        out.join("report").display()
    );
    None
}
