//! From the runs read to the [`Report`]: the tables, each complete run's own figures,
//! and the sentences said about them.

use super::{
    communication, decision, efficiency, nodes, noise, speedup, target, Duplicate, EpochBreakdown, Findings, LeftOut, ProbeReading,
    ProjectionReport, RankQuantiles, Report, RunReport, StepPhases, REPORT_VERSION,
};
use crate::record::{Phase, PhaseArray, SCHEMA_VERSION};
use crate::reduce::analysis::{self, scaling::samples_per_s, RunStats, StepBreakdown, TypeStats};
use crate::reduce::metrics;
use crate::stats::Sketch;
use std::path::PathBuf;

/// The report of `complete` runs (the figures), `incomplete` ones (named, left out),
/// `skipped` folders and `duplicates` (runs counted from another folder), every point compared with `explicit` where given (`--baseline`).
pub(crate) fn build(
    folders: &[PathBuf],
    complete: &[&RunStats],
    incomplete: &[&RunStats],
    skipped: Vec<LeftOut>,
    duplicates: Vec<Duplicate>,
    explicit: Option<&RunStats>,
    mut projection: Option<ProjectionReport>,
) -> Report {
    let summary: Vec<_> = complete.iter().flat_map(|r| analysis::type_summaries(r)).collect();
    let ranks: Vec<_> = complete.iter().flat_map(|r| analysis::rank_summaries(r)).collect();
    let scaling = analysis::scaling(complete, explicit);
    let runs: Vec<RunReport> = complete.iter().map(|r| run_report(r)).collect();
    let findings = Findings {
        compute_vs_comm: communication::compute_vs_comm_sentence(&runs),
        bandwidth: communication::bandwidth_sentence(&summary),
        waterfall: efficiency::waterfall_sentences(&scaling),
        node_types: [
            nodes::node_type_sentences(&runs, &summary),
            nodes::straggler_sentences(&ranks),
            nodes::arrival_sentences(complete),
        ]
        .concat(),
    };
    let (time_to_accuracy, time_to_accuracy_none) = noise::time_to_accuracy(&scaling, &runs);
    let targets = target::rows(&runs);
    join_time_to_target(projection.as_mut(), &targets);
    let decisions = decision::decisions(&scaling, &runs, complete, projection.as_ref());
    Report {
        decisions,
        time_to_accuracy,
        time_to_accuracy_none,
        targets,
        report_version: REPORT_VERSION,
        schema_version: SCHEMA_VERSION,
        folders: folders.to_vec(),
        workloads: speedup::verdicts(&scaling, &runs),
        runs,
        summary,
        ranks,
        scaling,
        findings,
        projection,
        incomplete: incomplete
            .iter()
            .map(|r| LeftOut {
                dir: r.dir.clone(),
                problems: r.problems.clone(),
            })
            .collect(),
        skipped,
        duplicates,
    }
}

/// A complete run's own figures.
fn run_report(r: &RunStats) -> RunReport {
    let m = &r.manifest;
    let (epoch_s, epoch_s_projected) = r.epoch_s();
    let last = r.epochs.last();
    let finite = |v: f64| v.is_finite().then_some(v);
    RunReport {
        run_id: m.run_id.clone(),
        dir: r.dir.clone(),
        model: m.model.clone(),
        dataset: m.dataset.clone(),
        comparison_key: r.key.clone(),
        ranks: m.world_size,
        nodes: m.nodes,
        batch_per_rank: m.batch_size_per_rank,
        global_batch: m.global_batch_size,
        steps: r.steps,
        samples_per_s: samples_per_s(r),
        communication: comm_setup(m),
        bytes_per_step: (m.world_size > 1).then_some(r.bytes_per_step),
        samples_trained: r.samples.saturating_add(r.warmup_samples),
        epoch_s,
        epoch_s_projected,
        per_epoch: per_epoch(r),
        per_step: per_step(r),
        probe: m.allreduce_probe.as_ref().map(|p| ProbeReading {
            bytes: p.bytes,
            busbw_bytes_per_s: p.busbw_bytes_per_s,
        }),
        node_types: r.types.iter().map(|t| t.node_type.clone()).collect(),
        versions: super::Versions {
            ddpbench: m.ddpbench_version.clone(),
            libtorch: m.libtorch_version.clone(),
            mpi: m.mpi_library.clone(),
        },
        rank_step_quantiles_s: r
            .ranks
            .iter()
            .map(|x| RankQuantiles {
                rank: x.rank,
                node_type: x.node_type.clone(),
                step_s: [0.05, 0.25, 0.5, 0.75, 0.95].map(|q| x.step.quantile(q)),
            })
            .collect(),
        stalls: r.stalls(),
        final_val_loss: last.and_then(|e| finite(e.val_loss)),
        final_val_accuracy: last.and_then(|e| finite(e.val_accuracy)),
        warnings: m.warnings.clone(),
        val_s_per_epoch: val_s_per_epoch(r),
        wall_s: m.wall_s.filter(|v| v.is_finite()),
        heatmap: r.heatmap.clone(),
        noise_scale: noise::per_epoch(&r.epochs),
        target: m.target.clone(),
        study_run: m.study_run.clone(),
        noise_windows: analysis::noise_window::windows(&r.noise_steps, m.target.as_ref()),
        noise_steps: r.noise_steps.clone(),
    }
}

/// Each recommendation whose reference runs were trained to a target loss gains the time
/// to it per shape, from the target rows' integrated prediction.
fn join_time_to_target(projection: Option<&mut ProjectionReport>, targets: &[target::TargetRow]) {
    use crate::reduce::analysis::samples_to_target::checked_error_for;
    let Some(p) = projection else { return };
    for rec in &mut p.recommendations {
        let first = rec.from_runs.split(' ').next().unwrap_or_default();
        let curve = targets
            .iter()
            .find(|t| t.run_ids.iter().any(|r| r == first))
            .and_then(|t| t.curve.as_ref());
        if let Some(curve) = curve {
            analysis::recommend::join_time_to_target(rec, curve, checked_error_for(curve.goal, curve.optimizer));
        }
    }
}

/// The median validation time of the epochs that validated, None without any.
fn val_s_per_epoch(r: &RunStats) -> Option<f64> {
    let v: Vec<f64> = r
        .epochs
        .iter()
        .filter(|e| e.val_samples > 0 && e.val_s.is_finite())
        .map(|e| e.val_s)
        .collect();
    (!v.is_empty()).then(|| crate::stats::median(&v))
}

/// Per epoch: compute, all-reduce work, hidden, exposed transfer and waiting, and R from
/// the transfer alone (per-step means × steps per epoch, all ranks averaged). A 1-rank
/// run communicates with nobody: its all-reduce figures are NaN. R is NaN where the
/// all-reduce thread shared backward's cores (`--overlap force`): its time-sliced work is
/// inside backward and in the transfer both.
fn per_epoch(r: &RunStats) -> EpochBreakdown {
    let b = StepBreakdown::of(r);
    let spe = r.manifest.steps_per_epoch as f64;
    let (forward, backward) = (r.phase_mean(Phase::Forward), r.phase_mean(Phase::Backward));
    let mean_over = |f: fn(&TypeStats) -> &Sketch| {
        let (sum, n) = r.types.iter().fold((0.0, 0u64), |a, t| (a.0 + f(t).sum(), a.1 + f(t).count()));
        if n > 0 {
            sum / n as f64
        } else {
            0.0
        }
    };
    let (work, hidden, transfer) = (mean_over(|t| &t.comm), mean_over(|t| &t.hidden), mean_over(|t| &t.transfer));
    let multi = |v: f64| if r.manifest.world_size > 1 { v } else { f64::NAN };
    EpochBreakdown {
        compute_s: (forward + backward) * spe,
        comm_s: multi(work * spe),
        comm_transfer_s: multi(transfer * spe),
        comm_hidden_s: multi(hidden * spe),
        comm_exposed_transfer_s: multi(b.transfer_s * spe),
        comm_wait_s: multi(b.wait_s * spe),
        compute_comm_ratio: if r.manifest.comm.overlap_shares_core {
            f64::NAN
        } else {
            multi(metrics::compute_comm_ratio(forward, backward, transfer))
        },
    }
}

/// Mean seconds per step of each phase, the exposed all-reduce split into transfer and wait.
fn per_step(r: &RunStats) -> StepPhases {
    let b = StepBreakdown::of(r);
    StepPhases {
        phases: PhaseArray::from_fn(|p| r.phase_mean(p)),
        comm_transfer_s: b.transfer_s,
        comm_wait_s: b.wait_s,
    }
}

/// How a run communicated, in a few words: backend, overlap, wire dtype, AMP.
fn comm_setup(m: &crate::record::Manifest) -> String {
    let mut parts = vec![m.comm_backend.name().to_string()];
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
