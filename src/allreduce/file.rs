//! The sweep's files: its output folder, `allreduce.csv` rows, `allreduce.json`, and the
//! link models in `link_model.json` at the end of a whole sweep.

use super::fit::fit_models;
use super::print::print_model;
use crate::job::signals;
use crate::link::{LinkModelFile, LINK_MODEL_FILE};
use crate::record::{RunStatus, SweepRow};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `allreduce.json`: the sweep and what it ran on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SweepFile {
    pub command_line: Vec<String>,
    /// `completed`, or `interrupted` (a stop signal ended the sweep after a size; `rows`
    /// hold the sizes measured). Files written before this field were complete.
    #[serde(default = "completed")]
    pub status: RunStatus,
    /// What stopped an interrupted sweep: the signal and the last size measured.
    #[serde(default)]
    pub error: Option<String>,
    pub world_size: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub node_type: String,
    pub device: String,
    pub notes: Vec<String>,
    pub rows: Vec<SweepRow>,
}

fn completed() -> RunStatus {
    RunStatus::Completed
}

/// How a sweep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swept {
    /// Every size of every backend and level.
    Whole,
    /// A stop signal (its number) ended it on every rank after the same size.
    Interrupted(i32),
}

/// The sweep's folder (`--out`, else a new one under `results/`, made exclusively so
/// that two sweeps started in the same second never share one) and its allreduce.csv.
/// A folder that holds a file a sweep writes is refused, naming it.
pub(super) fn prepare_out(out: Option<&Path>) -> Result<(PathBuf, crate::record::CsvLog<SweepRow>)> {
    let dir = match out {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create output folder {} (choose another --out)", d.display()))?;
            d.to_path_buf()
        }
        None => {
            let parent = Path::new("results");
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
            let job = crate::record::lock::scheduler_job()
                .map(|(_, id)| format!("-j{id}"))
                .unwrap_or_default();
            let stem = format!("allreduce-{}{job}", crate::record::compact_utc(std::time::SystemTime::now()));
            crate::files::create_dir_fresh(parent, &stem, 2, 0o777)
                .with_context(|| format!("cannot create a sweep folder in {} (give --out)", parent.display()))?
        }
    };
    let held = |name: &str| std::fs::symlink_metadata(dir.join(name)).is_ok();
    if held("allreduce.csv") {
        bail!(
            "{} already holds a sweep (allreduce.csv): choose another --out or move it away",
            dir.display()
        );
    }
    let written = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list output folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .find(|n| n == "allreduce.json" || n == LINK_MODEL_FILE || n.starts_with("rank-"));
    if let Some(name) = written {
        bail!(
            "{} already holds {name}, a file a sweep writes (ddpbench overwrites no file and writes through no link): \
             choose another --out or move it away",
            dir.display()
        );
    }
    let csv = crate::record::CsvLog::create_new(&dir.join("allreduce.csv"))
        .with_context(|| format!("{} is being written by another sweep: choose another --out", dir.display()))?;
    Ok((dir, csv))
}

/// Rank 0's end of a whole sweep: `allreduce.json`, the models fitted to it in
/// `link_model.json`, each printed.
pub(super) fn write_whole(out: &Path, file: &SweepFile) -> Result<Swept> {
    crate::record::write_atomic(&out.join("allreduce.json"), &(serde_json::to_string_pretty(file)? + "\n"))?;
    let rows = &file.rows;
    let models = fit_models(rows, file.nodes, file.ranks_per_node, &file.node_type);
    let mf = LinkModelFile {
        formula: crate::link::model::FORMULA.into(),
        models: models.iter().filter_map(|m| m.as_ref().ok().cloned()).collect(),
    };
    println!();
    for m in &models {
        match m {
            Ok(bm) => print_model(bm, rows),
            Err(e) => println!("no link model: {e:#}"),
        }
    }
    crate::record::write_atomic(&out.join(LINK_MODEL_FILE), &(serde_json::to_string_pretty(&mf)? + "\n"))?;
    println!("\nwrote {}/{{allreduce.csv, allreduce.json, {LINK_MODEL_FILE}}}", out.display());
    check_sums(rows)?;
    Ok(Swept::Whole)
}

/// Rank 0's end of a sweep that signal `sig` stopped: `allreduce.json` says so and holds
/// the sizes measured; no model is fitted, since the sizes not reached would be
/// extrapolated (and a study takes a folder with a model as a finished sweep).
pub(super) fn write_interrupted(out: &Path, file: &mut SweepFile, sig: i32) -> Result<Swept> {
    let signal = signals::name(sig);
    let why = match file.rows.last() {
        Some(r) => format!("{signal} after {} B of {} at {} level", r.bytes, r.backend, r.level),
        None => format!("{signal} before any size was measured"),
    };
    file.status = RunStatus::Interrupted;
    file.error = Some(why.clone());
    crate::record::write_atomic(&out.join("allreduce.json"), &(serde_json::to_string_pretty(&file)? + "\n"))?;
    tracing::warn!(
        "interrupted by {why}: the {} measurements so far are in {}/{{allreduce.csv, allreduce.json}}; no link model is fitted \
         from part of a sweep (run it again whole)",
        file.rows.len(),
        out.display()
    );
    check_sums(&file.rows)?;
    Ok(Swept::Interrupted(sig))
}

/// Err when any sum of `rows` was wrong on any rank.
pub(super) fn check_sums(rows: &[SweepRow]) -> Result<()> {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        bail!("{wrong} element(s) of the all-reduce results were wrong (column wrong in allreduce.csv): the sums are not to be trusted");
    }
    Ok(())
}
