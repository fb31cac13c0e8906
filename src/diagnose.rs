//! `ddpbench diagnose RUN_DIR`: reads the flight records (`rank-NNNNN.flight.json`) the
//! watchdog left in a run folder and prints which ranks never entered the collective
//! the others waited in, as the watchdog did when it stopped the job, then each rank's
//! last collectives.

use crate::flight::{self, FlightDump, RankStatus, State};
use crate::record::Manifest;
use anyhow::{bail, Context, Result};
use std::fmt::Write;
use std::path::Path;

/// The analysis of a run folder's flight records, as text.
pub fn report(dir: &Path) -> Result<String> {
    let size = Manifest::read(dir).map(|m| m.world_size).ok();
    let mut dumps: Vec<FlightDump> = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("rank-") && name.ends_with(".flight.json") {
            let text = std::fs::read_to_string(e.path()).with_context(|| format!("cannot read {name}"))?;
            let dump: FlightDump = serde_json::from_str(&text).with_context(|| format!("{name} is not a ddpbench flight record"))?;
            dumps.push(dump);
        }
    }
    if dumps.is_empty() {
        bail!(
            "{} holds no flight records (rank-NNNNN.flight.json): the watchdog did not stop this run, \
             or the files are on another node's disk",
            dir.display()
        );
    }
    dumps.sort_by_key(|d| d.status.rank);
    let size = size.unwrap_or_else(|| dumps.iter().map(|d| d.status.rank + 1).max().unwrap_or(0));
    let statuses: Vec<RankStatus> = dumps.iter().map(|d| d.status.clone()).collect();
    let mut out = String::new();
    match flight::diagnose(&statuses, size) {
        Some(d) => writeln!(out, "{}", d.message())?,
        None => writeln!(out, "no rank was waiting in a collective when the records were written")?,
    }
    if let Some(m) = dumps.iter().map(|d| &d.message).find(|m| !m.is_empty()) {
        writeln!(out, "the watchdog said: {m}")?;
    }
    writeln!(
        out,
        "\nlast collectives per rank (flight records of {} of {size} ranks):",
        dumps.len()
    )?;
    for d in &dumps {
        let last: Vec<String> = d
            .records
            .iter()
            .rev()
            .take(3)
            .map(|r| {
                let state = match r.state {
                    State::Scheduled => "scheduled",
                    State::Started => "waiting in",
                    State::Completed => "completed",
                };
                format!("{state} {}", r.describe())
            })
            .collect();
        writeln!(out, "  rank {} on {}: {}", d.status.rank, d.status.host, last.join("; "))?;
    }
    Ok(out)
}

/// Entry point of `ddpbench diagnose`.
pub fn main(dir: &Path) -> Result<()> {
    print!("{}", report(dir)?);
    Ok(())
}
