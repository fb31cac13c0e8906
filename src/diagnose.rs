//! `ddpbench diagnose RUN_DIR`: reads the flight records (`rank-NNNNN.flight.json`) the
//! watchdog left in a run folder and prints which ranks never entered the collective
//! the others waited in (or which collective each rank was in, when they differ, or the
//! phase a rank stalled in when none waited), as the watchdog did when it stopped the
//! job, then each rank's last collectives. The world size and every rank number are checked against
//! [`crate::bounds`] before anything is sized by them. A run whose rank 0 died before
//! writing the outcome gets it first, from the ranks' end records
//! ([`crate::record::settle`]), as `reduce` does.

use crate::bounds::{self, MAX_RANKS, MAX_RUN_S};
use crate::flight::hang::{self, FlightDump, RankStatus};
use crate::flight::State;
use crate::record::Manifest;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Collectives one flight record may hold: the recorder keeps 64; a file with many
/// more was not written by it.
const MAX_RECORDS: usize = 1024;

/// A run's size as its manifest says, and the ranks its flight records may carry.
#[derive(Debug, Clone, Copy)]
struct World {
    /// The manifest's `world_size`.
    size: usize,
    /// The launch's ranks: a study point's watchdog numbers ranks in the job that ran
    /// the study (the manifest's `launcher_env`: OMPI_COMM_WORLD_SIZE, SLURM_NTASKS),
    /// which may be more than the point's; at least `size`.
    launched: usize,
}

/// The folder's world, when it has a readable manifest; Err when its size is one no
/// job has. Launch sizes beyond [`MAX_RANKS`] are not taken. A manifest that is there
/// but cannot be read (damaged, or a FIFO or device in its place) is named on stderr,
/// and the records are diagnosed as without one.
fn world(dir: &Path) -> Result<Option<World>> {
    let m = match Manifest::read(dir) {
        Ok(m) => m,
        Err(e) => {
            if std::fs::symlink_metadata(dir.join("manifest.json")).is_ok() {
                eprintln!("note: {e:#}; diagnosing the flight records without it");
            }
            return Ok(None);
        }
    };
    if !(1..=MAX_RANKS).contains(&m.world_size) {
        bail!(
            "{}: world_size is {}: a job has 1 to {MAX_RANKS} ranks; the manifest is damaged",
            dir.join("manifest.json").display(),
            m.world_size
        );
    }
    let launched = m
        .ranks
        .iter()
        .flat_map(|r| &r.launcher_env)
        .filter(|(k, _)| k == "OMPI_COMM_WORLD_SIZE" || k == "SLURM_NTASKS")
        .filter_map(|(_, v)| v.parse::<usize>().ok())
        .filter(|&n| n <= MAX_RANKS)
        .fold(m.world_size, usize::max);
    Ok(Some(World {
        size: m.world_size,
        launched,
    }))
}

/// Err names the key of `dump` (read from `path`) that no rank of `world` (None:
/// unknown) can have written.
fn check_dump(dump: &FlightDump, path: &Path, world: Option<World>) -> Result<()> {
    let at = |why: String| anyhow!("{}: {why}; the flight record is damaged", path.display());
    let rank = dump.status.rank;
    match world {
        Some(w) if rank >= w.launched => {
            let launch = if w.launched > w.size {
                format!(", in a launch of {}", w.launched)
            } else {
                String::new()
            };
            return Err(at(format!(
                "status.rank is {rank}: the run has ranks 0 to {} (manifest.json: world_size is {}{launch})",
                w.launched - 1,
                w.size
            )));
        }
        None if rank >= MAX_RANKS => return Err(at(format!("status.rank is {rank}: a job has at most {MAX_RANKS} ranks"))),
        _ => {}
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name != hang::flight_file_name(rank) {
        return Err(at(format!("status.rank is {rank}: the file is named for another rank")));
    }
    for (key, v) in [("status.waited_s", dump.status.waited_s), ("status.silent_s", dump.status.silent_s)] {
        bounds::seconds(key, v, MAX_RUN_S).map_err(at)?;
    }
    if dump.known.len() > MAX_RANKS {
        return Err(at(format!("known holds {} ranks: more than a job has", dump.known.len())));
    }
    for st in &dump.known {
        let bound = world.map(|w| w.launched).unwrap_or(MAX_RANKS);
        if st.rank >= bound {
            return Err(at(format!("known holds rank {}: the run has ranks 0 to {}", st.rank, bound - 1)));
        }
        bounds::seconds("known.waited_s", st.waited_s, MAX_RUN_S).map_err(at)?;
        bounds::seconds("known.silent_s", st.silent_s, MAX_RUN_S).map_err(at)?;
    }
    if dump.records.len() > MAX_RECORDS {
        return Err(at(format!("records holds {}: the recorder keeps at most 64", dump.records.len())));
    }
    Ok(())
}

/// The flight records in `dir`, each read only when small enough and checked.
fn read_dumps(dir: &Path, world: Option<World>) -> Result<Vec<FlightDump>> {
    let mut dumps: Vec<FlightDump> = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("rank-") && name.ends_with(".flight.json") {
            if dumps.len() >= MAX_RANKS {
                bail!(
                    "{} holds more than {MAX_RANKS} flight records: more than a job has ranks",
                    dir.display()
                );
            }
            let path = e.path();
            let text = bounds::read_json_text(&path, bounds::FLIGHT_RECORD).map_err(|e| anyhow!(e))?;
            let dump: FlightDump = serde_json::from_str(&text).with_context(|| format!("{name} is not a ddpbench flight record"))?;
            check_dump(&dump, &path, world)?;
            dumps.push(dump);
        }
    }
    Ok(dumps)
}

/// The analysis of a run folder's flight records, as text.
pub(crate) fn report(dir: &Path) -> Result<String> {
    let world = world(dir)?;
    let mut dumps = read_dumps(dir, world)?;
    if dumps.is_empty() {
        bail!(
            "{} holds no flight records (rank-NNNNN.flight.json): the watchdog did not stop this run, \
             or the files are on another node's disk",
            dir.display()
        );
    }
    dumps.sort_by_key(|d| d.status.rank);
    let size = world
        .map(|w| w.size)
        .unwrap_or_else(|| dumps.iter().map(|d| d.status.rank + 1).max().unwrap_or(0));
    // A rank without a record of its own is taken as rank 0 last saw it.
    let mut statuses: Vec<RankStatus> = dumps.iter().map(|d| d.status.clone()).collect();
    let seen: Vec<RankStatus> = dumps.iter().flat_map(|d| d.known.iter().cloned()).collect();
    for st in seen {
        if !statuses.iter().any(|s| s.rank == st.rank) {
            statuses.push(st);
        }
    }
    statuses.sort_by_key(|s| s.rank);
    let mut out = String::new();
    let stalled = hang::stalled(&statuses, 0.0);
    match hang::diagnose(&statuses, size) {
        Some(d) => writeln!(out, "{}", d.message())?,
        None if !stalled.is_empty() => writeln!(out, "{}", hang::stall_message(&stalled, None))?,
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

/// `ddpbench diagnose` options.
#[derive(Args, Debug, Clone)]
pub struct DiagnoseArgs {
    /// Run folder holding rank-NNNNN.flight.json files.
    pub run: PathBuf,
}

/// Entry point of `ddpbench diagnose`.
pub fn main(args: DiagnoseArgs) -> Result<()> {
    crate::record::settle::settle_and_say(&args.run, "diagnose");
    // Hosts, collectives and messages come from the flight records: no control character
    // of theirs reaches the terminal.
    print!("{}", crate::escape::terminal(&report(&args.run)?));
    Ok(())
}
