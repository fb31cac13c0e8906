//! The compute/communication grid: per workload, one row per configuration (ranks,
//! nodes, how it communicated) and one column group per batch per rank, each cell the
//! seconds per epoch of compute and of the all-reduce and the all-reduce's share of
//! the two (compute_comm_grid.csv and report.md's "Compute and communication by batch
//! and configuration"). A study of batch sizes at several rank counts is read from it:
//! where the share is large, communication, not compute, sets the epoch.

use super::RunReport;
use crate::record::{Backend, ComparisonKey, Overlap};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// One cell of the grid (a row of compute_comm_grid.csv): the runs of one workload at
/// one configuration and batch per rank, their per-epoch seconds averaged.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GridCell {
    pub model: String,
    pub dataset: String,
    /// The rest of the comparison key, without how the run communicated (that is the
    /// configuration): runs that differ here are never one grid.
    pub comparison: String,
    pub ranks: usize,
    pub nodes: usize,
    /// How it communicated: backend, overlap, wire dtype, AMP (report.json's `communication`).
    pub communication: String,
    pub batch_per_rank: usize,
    pub runs: usize,
    pub run_ids: Vec<String>,
    /// Forward and backward per epoch (report.json's `per_epoch.compute_s`), the mean over the runs.
    pub compute_s_per_epoch: f64,
    /// The all-reduce's whole time per epoch, the wait for a late rank included
    /// (`per_epoch.comm_s`); empty for 1 rank, whose all-reduce is a local copy.
    pub comm_s_per_epoch: f64,
    /// Of it, the transfer after the last rank entered (`per_epoch.comm_transfer_s`).
    pub comm_transfer_s_per_epoch: f64,
    /// Of it, the wait for a late rank (`per_epoch.comm_wait_s`).
    pub comm_wait_s_per_epoch: f64,
    /// `comm_s_per_epoch` / (`compute_s_per_epoch` + `comm_s_per_epoch`).
    pub comm_share: f64,
}

/// The key without how the run communicated, described.
fn comparison_without_comm(key: Option<&ComparisonKey>) -> String {
    key.map_or_else(String::new, |k| {
        let mut k = k.clone();
        k.backend = Backend::Mpi;
        k.overlap = Overlap::Off;
        k.grad_dtype = None;
        k.amp = None;
        // The two settings that stay in the key, at the values set above, say nothing.
        k.describe()
            .split(' ')
            .filter(|w| !w.starts_with("overlap=") && !w.starts_with("backend="))
            .collect::<Vec<_>>()
            .join(" ")
    })
}

type CellKey = (String, String, String, usize, usize, String, usize);

/// The grid's cells, ordered by workload, configuration (ranks, nodes, communication)
/// and batch per rank.
pub(crate) fn cells(runs: &[RunReport]) -> Vec<GridCell> {
    let mut groups: BTreeMap<CellKey, Vec<&RunReport>> = BTreeMap::new();
    for r in runs {
        let key = (
            r.model.clone(),
            r.dataset.clone(),
            comparison_without_comm(r.comparison_key.as_ref()),
            r.ranks,
            r.nodes,
            r.communication.clone(),
            r.batch_per_rank,
        );
        groups.entry(key).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|((model, dataset, comparison, ranks, nodes, communication, batch_per_rank), rs)| {
            let mean = |f: fn(&RunReport) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / rs.len() as f64;
            let compute = mean(|r| r.per_epoch.compute_s);
            let comm = mean(|r| r.per_epoch.comm_s);
            GridCell {
                model,
                dataset,
                comparison,
                ranks,
                nodes,
                communication,
                batch_per_rank,
                runs: rs.len(),
                run_ids: rs.iter().map(|r| r.run_id.clone()).collect(),
                compute_s_per_epoch: compute,
                comm_s_per_epoch: comm,
                comm_transfer_s_per_epoch: mean(|r| r.per_epoch.comm_transfer_s),
                comm_wait_s_per_epoch: mean(|r| r.per_epoch.comm_wait_s),
                comm_share: comm / (compute + comm),
            }
        })
        .collect()
}

fn configuration(c: &GridCell) -> String {
    let ranks = if c.ranks == 1 {
        "1 rank".to_string()
    } else {
        format!("{} ranks", c.ranks)
    };
    let nodes = if c.nodes > 1 {
        format!(" on {} nodes", c.nodes)
    } else {
        String::new()
    };
    format!("{ranks}{nodes}, {}", c.communication)
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".into()
    }
}

/// report.md's grid: per workload, configurations down, batches across, then which
/// cell the all-reduce's share is largest and smallest in.
pub(crate) fn markdown(md: &mut String, runs: &[RunReport]) {
    let cells = cells(runs);
    if cells.is_empty() {
        return;
    }
    let _ = writeln!(md, "\n## Compute and communication by batch and configuration\n\nSeconds per epoch (per-step means × steps per epoch, all ranks averaged, the mean over the runs of a cell): compute is forward + backward, comm is the all-reduce's whole time, the wait for a late rank included (the transfer and the wait apart are in compute_comm_grid.csv), share = comm / (compute + comm). Part of comm can run while backward does (overlap), so the two need not add up to the step. With one rank there is nothing to exchange: its comm cell is empty.");
    let mut workloads: BTreeMap<(&str, &str, &str), Vec<&GridCell>> = BTreeMap::new();
    for c in &cells {
        workloads.entry((&c.model, &c.dataset, &c.comparison)).or_default().push(c);
    }
    for ((model, dataset, comparison), cs) in workloads {
        let batches: BTreeSet<usize> = cs.iter().map(|c| c.batch_per_rank).collect();
        let _ = write!(md, "\n### {model} on {dataset}\n\n`{comparison}`\n\n| configuration |");
        for b in &batches {
            let _ = write!(md, " b{b} compute s | b{b} comm s | b{b} share |");
        }
        let _ = write!(md, "\n|---|");
        md.push_str(&"---:|".repeat(3 * batches.len()));
        md.push('\n');
        let mut rows: BTreeMap<(usize, usize, &str), Vec<&GridCell>> = BTreeMap::new();
        for c in &cs {
            rows.entry((c.ranks, c.nodes, &c.communication)).or_default().push(c);
        }
        for row in rows.values() {
            let _ = write!(md, "| {} |", configuration(row[0]));
            for b in &batches {
                match row.iter().find(|c| c.batch_per_rank == *b) {
                    Some(c) => {
                        let _ = write!(
                            md,
                            " {} | {} | {} |",
                            num(c.compute_s_per_epoch),
                            num(c.comm_s_per_epoch),
                            super::pct(c.comm_share)
                        );
                    }
                    None => md.push_str(" | | |"),
                }
            }
            md.push('\n');
        }
        let _ = writeln!(md, "\n{}", share_sentence(&cs));
    }
}

/// Where the all-reduce's share is largest and smallest among the cells that have one.
fn share_sentence(cells: &[&GridCell]) -> String {
    let with: Vec<&&GridCell> = cells.iter().filter(|c| c.comm_share.is_finite()).collect();
    let hi = with.iter().max_by(|a, b| a.comm_share.total_cmp(&b.comm_share));
    let lo = with.iter().min_by(|a, b| a.comm_share.total_cmp(&b.comm_share));
    let at = |c: &GridCell| {
        format!(
            "{} at batch {}/rank ({})",
            configuration(c),
            c.batch_per_rank,
            super::pct(c.comm_share)
        )
    };
    match (lo, hi) {
        (Some(lo), Some(hi)) if with.len() > 1 => format!(
            "The all-reduce takes the largest share with {} and the smallest with {}.",
            at(hi),
            at(lo)
        ),
        (Some(c), _) => format!("The all-reduce's share: {}.", at(c)),
        _ => "No multi-rank run: nothing was all-reduced.".into(),
    }
}
