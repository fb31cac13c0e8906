//! `summary.csv` (one row per run and node type) and `ranks.csv` (one row per rank).

use super::{RunStats, TypeStats};
use crate::record::{Phase, PhaseArray, PhaseRole, SCHEMA_VERSION};
use crate::reduce::metrics;
use serde::Serialize;
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// One row of summary.csv: one node type of one run. A rank-CSV column `x_s` appears
/// as `x_s_median` (median over the type's rank-steps) and, for a phase, `x_share`
/// (its mean over the mean step, so the shares add up to 1; at 1 rank they leave out the
/// local copy that stands for the all-reduce, whose share is empty). Written as CSV, every
/// real is a plain decimal and an undefined one (NaN) an empty cell.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TypeSummary {
    pub run_id: String,
    /// The schema of this file (`record::SCHEMA_VERSION` of the reducer).
    pub schema_version: u32,
    pub model: String,
    pub dataset: String,
    pub node_type: String,
    pub ranks: usize,
    pub nodes: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    /// Rank-steps counted over all ranks of this type (warm-up excluded).
    pub rank_steps: u64,
    pub step_s_median: f64,
    pub step_s_p95: f64,
    pub step_s_max: f64,
    /// Samples per second of all ranks of this type together.
    pub samples_per_s: f64,
    /// Epoch time: the median of the full epochs measured (epochs.csv), or, when none
    /// ran whole, steps per epoch × mean step (then `epoch_s_projected` is 1).
    pub epoch_s: f64,
    pub epoch_s_projected: u8,
    /// Per phase, in the step's order: columns `<phase>_median` and `<phase without
    /// _s>_share` (`data_s_median`, `data_share`). The communication phase
    /// (`comm_exposed_s`: waiting for the all-reduce after backward, at 1 rank the local
    /// copy that stands for it) has an empty share at 1 rank, which communicates with
    /// nobody.
    pub phases: PhaseArray<PhaseFigures>,
    /// All of the all-reduce work per step (comm_s), hidden behind backward or not.
    pub comm_s_median: f64,
    /// The straggler wait inside the all-reduce ([`metrics::straggler_wait`]).
    pub comm_wait_s_median: f64,
    /// The all-reduce work without that wait ([`metrics::transfer_time`]); empty at 1 rank,
    /// which puts nothing on a wire.
    pub comm_transfer_s_median: f64,
    /// R ([`metrics::compute_comm_ratio`]) from mean forward, backward and transfer
    /// time: the wait for a late rank is not communication. NaN for a 1-rank run, whose
    /// all-reduce is a local copy, and where the all-reduce thread shared backward's
    /// cores (`--overlap force`): its time-sliced work is then inside backward_s and in
    /// the transfer both, so R would count it twice.
    pub compute_comm_ratio: f64,
    /// Mean comm_hidden_s: all-reduce work done while backward ran, as the rows say it
    /// (where the all-reduce thread shared backward's cores, it time-sliced with backward).
    pub comm_hidden_s_mean: f64,
    /// Mean comm_exposed_s minus mean comm_wait_s: the exposed all-reduce without the wait
    /// (empty at 1 rank).
    pub comm_exposed_transfer_s_mean: f64,
    pub comm_wait_s_mean: f64,
    /// From the median transfer time ([`metrics::busbw`]).
    pub busbw_bytes_per_s: f64,
    pub algbw_bytes_per_s: f64,
    /// Bus bandwidth of the raw MPI_Allreduce probe of the same buckets in the same run,
    /// caches flushed between iterations (gradients come from memory after backward).
    pub probe_busbw_bytes_per_s: f64,
    /// The same probe with warm caches (the best case).
    pub probe_warm_busbw_bytes_per_s: f64,
    /// The probe's element type (fp32 in runs from before it followed `--grad-dtype`).
    pub probe_dtype: String,
    /// busbw over the cold probe's; empty where the probe ran in another dtype than the
    /// gradients travel in (the same bytes at another element type are no comparison).
    pub busbw_vs_probe: f64,
    /// Share of steps in which a rank of this type was the last to enter the all-reduce
    /// (NaN for a 1-rank run: a lone rank arrives in no order).
    pub last_arrival_share: f64,
    /// Seconds per step each other rank waited, on average over them, because a rank of
    /// this type entered last (the sum of their waits over the steps, divided by the steps
    /// and by the ranks that could wait: all but one); empty at 1 rank.
    pub caused_wait_s_mean: f64,
    /// 1 for the node type that gates the job: of two or more types, the one whose late
    /// arrivals cost the others the most waiting.
    pub gating: u8,
    /// Mean GPU utilisation over the telemetry samples of this type's ranks taken while
    /// their timed (not warm-up) steps ran (empty without telemetry).
    pub gpu_util_pct_mean: f64,
    /// Peak GPU memory used by a rank of this type.
    pub gpu_mem_used_max_bytes: f64,
    /// Mean GPU power over the same samples as `gpu_util_pct_mean`.
    pub gpu_power_w_mean: f64,
}

/// One phase's figures in a [`TypeSummary`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseFigures {
    /// Median over the type's rank-steps, seconds.
    pub median_s: f64,
    /// Its mean over the mean step.
    pub share: f64,
}

/// summary.csv's two columns per phase: `<column>_median` and `<column without _s>_share`.
static PHASE_COLUMNS: LazyLock<PhaseArray<[String; 2]>> = LazyLock::new(|| {
    PhaseArray::from_fn(|p| {
        let column = p.column();
        let stem = column.strip_suffix("_s").unwrap_or(column);
        [format!("{column}_median"), format!("{stem}_share")]
    })
});

/// Writes every field under its own name, in order, with the phases' columns
/// ([`PHASE_COLUMNS`]) after `epoch_s_projected`. The pattern names every field, so a
/// field added to the struct does not compile until it is written here.
impl Serialize for TypeSummary {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let TypeSummary {
            run_id,
            schema_version,
            model,
            dataset,
            node_type,
            ranks,
            nodes,
            batch_per_rank,
            global_batch,
            rank_steps,
            step_s_median,
            step_s_p95,
            step_s_max,
            samples_per_s,
            epoch_s,
            epoch_s_projected,
            phases,
            comm_s_median,
            comm_wait_s_median,
            comm_transfer_s_median,
            compute_comm_ratio,
            comm_hidden_s_mean,
            comm_exposed_transfer_s_mean,
            comm_wait_s_mean,
            busbw_bytes_per_s,
            algbw_bytes_per_s,
            probe_busbw_bytes_per_s,
            probe_warm_busbw_bytes_per_s,
            probe_dtype,
            busbw_vs_probe,
            last_arrival_share,
            caused_wait_s_mean,
            gating,
            gpu_util_pct_mean,
            gpu_mem_used_max_bytes,
            gpu_power_w_mean,
        } = self;
        let mut st = s.serialize_struct("TypeSummary", 35 + 2 * Phase::COUNT)?;
        macro_rules! fields {
            ($($f:ident),*) => { $( st.serialize_field(stringify!($f), $f)?; )* };
        }
        fields!(
            run_id,
            schema_version,
            model,
            dataset,
            node_type,
            ranks,
            nodes,
            batch_per_rank,
            global_batch,
            rank_steps,
            step_s_median,
            step_s_p95,
            step_s_max,
            samples_per_s,
            epoch_s,
            epoch_s_projected
        );
        for (p, f) in phases.iter() {
            let [median, share] = &PHASE_COLUMNS[p];
            st.serialize_field(median, &f.median_s)?;
            st.serialize_field(share, &f.share)?;
        }
        fields!(
            comm_s_median,
            comm_wait_s_median,
            comm_transfer_s_median,
            compute_comm_ratio,
            comm_hidden_s_mean,
            comm_exposed_transfer_s_mean,
            comm_wait_s_mean,
            busbw_bytes_per_s,
            algbw_bytes_per_s,
            probe_busbw_bytes_per_s,
            probe_warm_busbw_bytes_per_s,
            probe_dtype,
            busbw_vs_probe,
            last_arrival_share,
            caused_wait_s_mean,
            gating,
            gpu_util_pct_mean,
            gpu_mem_used_max_bytes,
            gpu_power_w_mean
        );
        st.end()
    }
}

/// Of two or more node types, the one whose late arrivals made the others wait longest
/// in all (ties: the slower median step); None with fewer than two types.
pub(crate) fn gating_type(run: &RunStats) -> Option<String> {
    if run.types.len() < 2 {
        return None;
    }
    run.types
        .iter()
        .max_by(|a, b| {
            a.caused_wait_s
                .total_cmp(&b.caused_wait_s)
                .then(a.step.median().total_cmp(&b.step.median()))
        })
        .map(|t| t.node_type.clone())
}

pub fn type_summaries(run: &RunStats) -> Vec<TypeSummary> {
    let gating = gating_type(run);
    run.types.iter().map(|t| type_summary(run, t, gating.as_deref())).collect()
}

fn type_summary(run: &RunStats, t: &TypeStats, gating: Option<&str>) -> TypeSummary {
    let m = &run.manifest;
    let n = m.world_size;
    let med = |p: Phase| t.phase[p].median();
    let mean = |p: Phase| t.phase[p].mean();
    let step_median = t.step.median();
    let step_mean = t.step.mean();
    let share = |p: Phase| if step_mean > 0.0 { mean(p) / step_mean } else { f64::NAN };
    let ranks: Vec<_> = run.ranks.iter().filter(|r| r.node_type == t.node_type).collect();
    let samples_per_s: f64 = ranks
        .iter()
        .map(|r| if r.step.sum() > 0.0 { r.samples as f64 / r.step.sum() } else { 0.0 })
        .sum();
    let nodes = ranks.iter().map(|r| r.host.as_str()).collect::<BTreeSet<_>>().len();
    let transfer = t.transfer.median();
    let bytes = run.bytes_per_step as f64;
    let multi = |v: f64| if n > 1 { v } else { f64::NAN };
    let shares_core = m.comm.overlap_shares_core;
    let busbw = multi(metrics::busbw(bytes, n, transfer));
    let probe = m.allreduce_probe.as_ref().map_or(f64::NAN, |p| p.busbw_bytes_per_s);
    let name = |d: crate::record::GradDtype| serde_json::to_value(d).ok().and_then(|v| v.as_str().map(String::from));
    let probe_dtype = m.allreduce_probe.as_ref().and_then(|p| name(p.dtype)).unwrap_or_default();
    let wire = if m.comm.grad_dtype.is_empty() {
        "fp32"
    } else {
        m.comm.grad_dtype.as_str()
    };
    TypeSummary {
        run_id: m.run_id.clone(),
        schema_version: SCHEMA_VERSION,
        model: m.model.clone(),
        dataset: m.dataset.clone(),
        node_type: t.node_type.clone(),
        ranks: t.ranks.len(),
        nodes,
        batch_per_rank: m.batch_size_per_rank,
        global_batch: m.global_batch_size,
        rank_steps: t.step.count(),
        step_s_median: step_median,
        step_s_p95: t.step.quantile(0.95),
        step_s_max: t.step.max(),
        samples_per_s,
        epoch_s: run.epoch_s().0,
        epoch_s_projected: u8::from(run.epoch_s().1),
        phases: PhaseArray::from_fn(|p| PhaseFigures {
            median_s: med(p),
            // A lone rank's all-reduce is a local copy: it has no share of communication.
            share: if p.role() == PhaseRole::Communication {
                multi(share(p))
            } else {
                share(p)
            },
        }),
        comm_s_median: t.comm.median(),
        comm_wait_s_median: t.wait.median(),
        comm_transfer_s_median: multi(transfer),
        compute_comm_ratio: if shares_core {
            f64::NAN
        } else {
            multi(metrics::compute_comm_ratio(
                mean(Phase::Forward),
                mean(Phase::Backward),
                t.transfer.mean(),
            ))
        },
        comm_hidden_s_mean: t.hidden.mean(),
        comm_exposed_transfer_s_mean: multi((mean(Phase::CommExposed) - t.wait.mean()).max(0.0)),
        comm_wait_s_mean: t.wait.mean(),
        busbw_bytes_per_s: busbw,
        algbw_bytes_per_s: multi(if transfer > 0.0 {
            metrics::algbw(bytes, transfer)
        } else {
            f64::NAN
        }),
        probe_busbw_bytes_per_s: probe,
        probe_warm_busbw_bytes_per_s: m.allreduce_probe_warm.as_ref().map_or(f64::NAN, |p| p.busbw_bytes_per_s),
        busbw_vs_probe: if probe_dtype == wire { busbw / probe } else { f64::NAN },
        probe_dtype,
        last_arrival_share: multi(t.last_arrivals as f64 / run.steps.max(1) as f64),
        caused_wait_s_mean: multi(t.caused_wait_s / run.steps.max(1) as f64 / n.saturating_sub(1).max(1) as f64),
        gating: u8::from(gating == Some(t.node_type.as_str())),
        gpu_util_pct_mean: t.gpu.util_pct_mean(),
        gpu_mem_used_max_bytes: t.gpu.mem_used_max_bytes.map_or(f64::NAN, |b| b as f64),
        gpu_power_w_mean: t.gpu.power_w_mean(),
    }
}

/// One row of ranks.csv.
#[derive(Debug, Clone, Serialize)]
pub struct RankSummary {
    pub run_id: String,
    pub rank: usize,
    pub node_type: String,
    pub host: String,
    pub steps: u64,
    pub step_s_median: f64,
    pub step_s_p95: f64,
    pub comm_wait_s_mean: f64,
    pub last_arrival_share: f64,
    /// Seconds per step each other rank waited for this one, on average over them (the
    /// sum of their waits in the steps this rank entered last, over the steps and the
    /// other ranks); NaN for a 1-rank run.
    pub caused_wait_s_mean: f64,
}

pub fn rank_summaries(run: &RunStats) -> Vec<RankSummary> {
    run.ranks
        .iter()
        .map(|r| RankSummary {
            run_id: run.manifest.run_id.clone(),
            rank: r.rank,
            node_type: r.node_type.clone(),
            host: r.host.clone(),
            steps: r.steps,
            step_s_median: r.step.median(),
            step_s_p95: r.step.quantile(0.95),
            comm_wait_s_mean: r.wait_sum / r.steps.max(1) as f64,
            // A lone rank arrives in no order.
            last_arrival_share: if run.manifest.world_size > 1 {
                r.last_arrivals as f64 / run.steps.max(1) as f64
            } else {
                f64::NAN
            },
            caused_wait_s_mean: if run.manifest.world_size > 1 {
                r.caused_wait_s / run.steps.max(1) as f64 / (run.manifest.world_size - 1) as f64
            } else {
                f64::NAN
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each phase has its two columns, `<column>_median` then `<stem>_share`, in the
    /// step's order, between the epoch's and the all-reduce's columns.
    #[test]
    fn summary_columns_follow_the_phases_in_step_order() {
        let json = serde_json::to_string(&TypeSummary::default()).unwrap();
        let at = |key: &str| json.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no {key} in {json}"));
        let mut last = at("epoch_s_projected");
        for p in Phase::ALL {
            let column = p.column();
            let stem = column.strip_suffix("_s").unwrap();
            for key in [format!("{column}_median"), format!("{stem}_share")] {
                let here = at(&key);
                assert!(here > last, "{key} out of order in {json}");
                last = here;
            }
        }
        assert!(at("comm_s_median") > last);
        assert!(
            json.contains(r#""comm_exposed_s_median":0.0,"comm_exposed_share":0.0,"optimizer_s_median""#),
            "{json}"
        );
    }
}
