//! A run's outcome written from its ranks' end records, when rank 0 could not write it.
//!
//! Rank 0 writes the outcome into `manifest.json`; killed outright (`kill -9`, out of
//! memory, its node lost) it leaves the manifest saying `running` for good, while each
//! other rank recorded its own end (`rank-NNNNN.end.json`, [`super::end`]). `reduce`
//! and `diagnose` settle such a run: once some rank has recorded an end and the newest
//! end record is [`SETTLE_AFTER`] old, the job has ended (a live rank 0 writes its end
//! record within moments of its peers: they leave the run's last collective together),
//! and the manifest's status, error and end time are rewritten from the end records,
//! naming the ranks that recorded none.
//!
//! Done afterwards by the reader rather than by a survivor at the time: a survivor is
//! killed by the launcher within a second of its peer's death, often before it could
//! learn which peer died, while the records it left stay.

use super::{end_file_name, EndRecord, Manifest, RunStatus};
use anyhow::Result;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How old the newest end record must be before a manifest that says `running` is
/// settled from the end records.
pub(crate) const SETTLE_AFTER: Duration = Duration::from_secs(30);

/// What [`settle`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub status: RunStatus,
    pub error: String,
}

/// Settles the run in `dir` (see the module's documentation) as `command` found it at
/// `now`. Ok(None) when there is nothing to settle: the manifest does not say `running`,
/// no rank recorded an end, or the newest end is more recent than [`SETTLE_AFTER`] (the
/// job may still be writing its records). Err when the manifest cannot be rewritten.
pub(crate) fn settle(dir: &Path, command: &str, now: SystemTime) -> Result<Option<Settled>> {
    let Ok(mut m) = Manifest::read(dir) else { return Ok(None) };
    // A newer schema's manifest is not rewritten: its keys this one does not know would be lost.
    if m.status != RunStatus::Running.as_str() || super::schema_problem(u64::from(m.schema_version), "settle").is_some() {
        return Ok(None);
    }
    let ended = ended_records(dir, &m);
    let Some(newest) = ended.iter().map(|(_, at)| *at).max() else {
        return Ok(None);
    };
    if now.duration_since(newest).unwrap_or_default() < SETTLE_AFTER {
        return Ok(None);
    }
    let settled = outcome(&m, &ended, command);
    m.status = settled.status.as_str().into();
    m.error = Some(settled.error.clone());
    m.end_utc = ended.iter().max_by_key(|(_, at)| *at).map(|(e, _)| e.time_utc.clone());
    m.write(dir)?;
    Ok(Some(settled))
}

/// [`settle`] now, saying on stderr what was written, or why it could not be.
pub(crate) fn settle_and_say(dir: &Path, command: &str) {
    match settle(dir, command, SystemTime::now()) {
        Ok(Some(s)) => eprintln!(
            "{}: manifest.json said running; it now says {}, from the ranks' end records",
            dir.display(),
            s.status.as_str()
        ),
        Ok(None) => {}
        Err(e) => eprintln!(
            "{}: manifest.json says running although the ranks recorded their end, and it could not be rewritten: {e:#}",
            dir.display()
        ),
    }
}

/// The status and error the end records `ended` (rank order) give the run of `m`.
fn outcome(m: &Manifest, ended: &[(EndRecord, SystemTime)], command: &str) -> Settled {
    let first = |s: RunStatus| ended.iter().map(|(e, _)| e).find(|e| e.status == s);
    let (status, cause) = match (first(RunStatus::Failed), first(RunStatus::Interrupted)) {
        (Some(e), _) => (RunStatus::Failed, Some(e)),
        (None, Some(e)) => (RunStatus::Interrupted, Some(e)),
        // Every record says completed: rank 0 died before writing the outcome.
        (None, None) => (RunStatus::Failed, None),
    };
    let silent = silent_ranks(m.world_size, ended);
    let mut parts = Vec::new();
    match silent.as_slice() {
        [] => parts.push("every rank recorded its end, but rank 0 did not write the run's outcome (killed outright?)".to_string()),
        [r] => parts.push(format!("rank {r} stopped without recording its end (killed outright?)")),
        many => parts.push(format!(
            "ranks {} stopped without recording their end (killed outright?)",
            list(many, m.world_size - ended.len())
        )),
    }
    if let Some(e) = cause {
        parts.push(format!(
            "rank {} ended {}: {}",
            e.rank,
            e.status.as_str(),
            e.error.as_deref().unwrap_or("no error recorded")
        ));
    }
    Settled {
        status,
        error: format!("{} (written from the ranks' end records by ddpbench {command})", parts.join("; ")),
    }
}

/// The first ranks below `world_size` without an end record among `ended` (eight at
/// most: enough to name them).
fn silent_ranks(world_size: usize, ended: &[(EndRecord, SystemTime)]) -> Vec<usize> {
    let mut ranks = ended.iter().map(|(e, _)| e.rank).peekable();
    let mut silent = Vec::new();
    for r in 0..world_size {
        if ranks.peek() == Some(&r) {
            ranks.next();
        } else {
            silent.push(r);
            if silent.len() == 8 {
                break;
            }
        }
    }
    silent
}

/// "0, 3, 4", or the first eight and how many in all.
fn list(ranks: &[usize], all: usize) -> String {
    let shown: Vec<String> = ranks.iter().map(usize::to_string).collect();
    if all > ranks.len() {
        format!("{}, … ({all} in all)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The end records in `dir` of the run of `m` that say the rank ended (not `running`),
/// in rank order, each with when it was last written. Found from one listing of the
/// folder: what is read is bounded by the files present.
fn ended_records(dir: &Path, m: &Manifest) -> Vec<(EndRecord, SystemTime)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut ended: Vec<(EndRecord, SystemTime)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let r: usize = name.strip_prefix("rank-")?.strip_suffix(".end.json")?.parse().ok()?;
            // Only regular files: a FIFO planted under the name would block the read.
            if r >= m.world_size || name != end_file_name(r) || !entry.file_type().ok()?.is_file() {
                return None;
            }
            let at = entry.metadata().ok()?.modified().ok()?;
            let e = EndRecord::read(dir, r).ok()?;
            (e.run_id == m.run_id && e.rank == r && e.status != RunStatus::Running).then_some((e, at))
        })
        .collect();
    ended.sort_by_key(|(e, _)| e.rank);
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(world_size: usize, ends: &[(usize, RunStatus, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let m = serde_json::json!({
            "run_id": "run", "status": "running", "ddpbench_version": "t", "libtorch_version": "t",
            "mpi_library": "t", "command_line": [], "config": {}, "model": "mnist-cnn",
            "dataset": "synthetic", "dataset_source": "", "parameters": 1, "gradient_bytes": 4,
            "comm_backend": "mpi", "buckets": 1, "world_size": world_size, "nodes": 1,
            "batch_size_per_rank": 1, "global_batch_size": world_size, "steps_per_epoch": 1,
            "start_utc": "2026-01-01T00:00:00.000000Z", "ranks": [],
        });
        std::fs::write(d.path().join("manifest.json"), m.to_string()).unwrap();
        for &(rank, status, error) in ends {
            EndRecord {
                run_id: "run".into(),
                rank,
                host: "node".into(),
                status,
                error: (!error.is_empty()).then(|| error.to_string()),
                steps: 5,
                time_utc: format!("2026-01-01T00:00:0{rank}.000000Z"),
            }
            .write(d.path())
            .unwrap();
        }
        d
    }

    fn later() -> SystemTime {
        SystemTime::now() + SETTLE_AFTER + Duration::from_secs(1)
    }

    #[test]
    fn a_run_whose_rank_0_left_no_end_is_settled_from_the_other_ranks() {
        let d = run(
            3,
            &[
                (0, RunStatus::Running, ""),
                (1, RunStatus::Interrupted, "SIGTERM with 5 steps done"),
                (2, RunStatus::Interrupted, "SIGTERM with 5 steps done"),
            ],
        );
        let settled = settle(d.path(), "reduce", later()).unwrap().unwrap();
        assert_eq!(settled.status, RunStatus::Interrupted);
        let m = Manifest::read(d.path()).unwrap();
        assert_eq!(m.status, "interrupted");
        assert_eq!(
            m.error.as_deref(),
            Some(
                "rank 0 stopped without recording its end (killed outright?); rank 1 ended interrupted: \
                 SIGTERM with 5 steps done (written from the ranks' end records by ddpbench reduce)"
            )
        );
        assert_eq!(m.end_utc.as_deref(), Some("2026-01-01T00:00:02.000000Z"), "the newest end");
        assert_eq!(settle(d.path(), "reduce", later()).unwrap(), None, "settled once");
    }

    #[test]
    fn a_run_whose_ends_are_recent_or_absent_is_left_running() {
        let d = run(2, &[(0, RunStatus::Running, ""), (1, RunStatus::Completed, "")]);
        // Rank 0 may be writing its end and the outcome at this moment.
        assert_eq!(settle(d.path(), "reduce", SystemTime::now()).unwrap(), None);
        assert_eq!(Manifest::read(d.path()).unwrap().status, "running");
        // No rank recorded an end: the job may still run, or every rank was killed.
        let d = run(2, &[(0, RunStatus::Running, ""), (1, RunStatus::Running, "")]);
        assert_eq!(settle(d.path(), "reduce", later()).unwrap(), None);
        assert_eq!(Manifest::read(d.path()).unwrap().status, "running");
    }

    #[test]
    fn a_failure_names_its_rank_and_every_silent_rank_is_named() {
        let d = run(
            4,
            &[
                (1, RunStatus::Interrupted, "SIGTERM"),
                (3, RunStatus::Failed, "watchdog: rank 0 stopped answering"),
            ],
        );
        let settled = settle(d.path(), "diagnose", later()).unwrap().unwrap();
        assert_eq!(settled.status, RunStatus::Failed);
        assert!(
            settled.error.starts_with(
                "ranks 0, 2 stopped without recording their end (killed outright?); \
                 rank 3 ended failed: watchdog: rank 0 stopped answering"
            ),
            "{}",
            settled.error
        );
        // Every rank completed, yet no outcome: rank 0 died in between.
        let d = run(2, &[(0, RunStatus::Completed, ""), (1, RunStatus::Completed, "")]);
        let settled = settle(d.path(), "reduce", later()).unwrap().unwrap();
        assert_eq!(settled.status, RunStatus::Failed);
        assert!(
            settled.error.contains("rank 0 did not write the run's outcome"),
            "{}",
            settled.error
        );
    }
}
