//! What rank 0 keeps of a study as it goes: `points.csv`, one row per point run, and
//! the study's state, saved after every run.

use super::layout::Layout;
use super::plan::Point;
use super::state::{self, PointOutcome, State};
use crate::record::{self, CsvLog, PointId};
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

/// One row of `points.csv`.
#[derive(Debug, Clone, Serialize)]
pub(super) struct PointRow {
    run: String,
    point: PointId,
    workload: String,
    scaling: String,
    repeat: usize,
    ranks: usize,
    batch_per_rank: usize,
    global_batch: usize,
    world_ranks: String,
    hosts: String,
    /// completed, failed, interrupted, or skipped (done in an earlier launch).
    status: String,
    error: String,
    #[serde(serialize_with = "record::plain_decimal")]
    wall_s: f64,
    /// The most CPU time any idle rank used per second of waiting (0 when none idled).
    #[serde(serialize_with = "record::plain_decimal")]
    idle_cpu_s_per_s: f64,
}

/// What rank 0 keeps of a study as it goes: its folder, layout, state and points.csv.
pub(super) struct Book {
    pub(super) out: PathBuf,
    pub(super) layout: Layout,
    pub(super) state: State,
    pub(super) rows: Option<CsvLog<PointRow>>,
}

impl Book {
    /// A points.csv row (rank 0).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn row(&mut self, point: &Point, rep: usize, name: &str, status: &str, error: &str, wall_s: f64, idle: f64) -> Result<()> {
        let Some(rows) = self.rows.as_mut() else { return Ok(()) };
        rows.write(&row(point, rep, name, &self.layout, status, error, wall_s, idle))?;
        rows.sync()
    }

    /// Records a run's outcome in the state (rank 0), at once.
    pub(super) fn record(&mut self, name: &str, outcome: &PointOutcome) -> Result<()> {
        if self.rows.is_none() {
            return Ok(());
        }
        self.state.insert(name.to_string(), outcome.clone());
        state::save(&self.out, &self.state)
    }
}

#[allow(clippy::too_many_arguments)]
fn row(point: &Point, rep: usize, name: &str, layout: &Layout, status: &str, error: &str, wall_s: f64, idle: f64) -> PointRow {
    let hosts: Vec<&str> = layout
        .nodes
        .iter()
        .zip(&layout.hosts)
        .filter(|(ranks, _)| ranks.iter().any(|r| point.world_ranks.contains(r)))
        .map(|(_, h)| h.as_str())
        .collect();
    PointRow {
        run: name.into(),
        point: point.id.clone(),
        workload: point.workload.clone(),
        scaling: point.scaling.clone(),
        repeat: rep,
        ranks: point.ranks,
        batch_per_rank: point.batch_per_rank,
        global_batch: point.global_batch,
        world_ranks: crate::topology::compact_list(&point.world_ranks.iter().map(|&r| r as u32).collect::<Vec<_>>()),
        hosts: hosts.join(" "),
        status: status.into(),
        error: error.into(),
        wall_s,
        idle_cpu_s_per_s: idle,
    }
}
