//! What a study knows of its runs, and the rule that keeps it from losing one.
//!
//! `state.json` maps each run's name to its outcome; it is written atomically after
//! every point. It is a summary, not the truth: the run folders' manifests and end
//! records are. A resumed study therefore judges each run by its folder: a run whose
//! manifest and every rank's end record say `completed` is skipped whatever the state
//! says, and a missing or unreadable `state.json` is rebuilt from the folders (the
//! damaged file is kept beside it). An unfinished folder that makes way for a new run
//! is moved into `discarded/`, never deleted: nothing a study wrote is removed unless
//! the user removes it.

use crate::record::{self, EndRecord, Manifest, RunStatus};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tracing::{info, warn};

/// Outcome of every run of the study so far, by run name.
pub(super) type State = BTreeMap<String, PointOutcome>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct PointOutcome {
    pub status: RunStatus,
    pub error: Option<String>,
}

impl PointOutcome {
    pub(super) fn new(status: RunStatus, error: Option<String>) -> PointOutcome {
        PointOutcome { status, error }
    }
}

pub(super) const STATE_FILE: &str = "state.json";
/// Where unfinished run folders go when their point runs again.
pub(super) const DISCARDED: &str = "discarded";

/// The outcome a run folder shows, None when it holds no readable manifest.
/// `completed` only when the manifest and every rank's end record say so.
pub(super) fn folder_outcome(dir: &Path) -> Option<PointOutcome> {
    let m = Manifest::read(dir).ok()?;
    let ends: Vec<Option<EndRecord>> = (0..m.world_size.min(1 << 20)).map(|r| EndRecord::read(dir, r).ok()).collect();
    let outcome = match m.status.as_str() {
        "completed" => match ends
            .iter()
            .position(|e| e.as_ref().is_none_or(|e| e.status != RunStatus::Completed))
        {
            None => PointOutcome::new(RunStatus::Completed, None),
            Some(r) => PointOutcome::new(
                RunStatus::Failed,
                Some(format!("rank {r}'s end record is missing or does not say completed")),
            ),
        },
        "interrupted" => PointOutcome::new(RunStatus::Interrupted, m.error.clone()),
        "failed" => PointOutcome::new(RunStatus::Failed, m.error.clone()),
        // The job ended under the run (killed, node lost): it was interrupted, not refused.
        other => PointOutcome::new(
            RunStatus::Interrupted,
            Some(format!(
                "the run did not finish (its manifest says `{other}`): the job ended under it"
            )),
        ),
    };
    Some(outcome)
}

/// The study's state: `state.json` when it reads, else rebuilt from the folders of the
/// runs named in `names` (the damaged file, or one larger than a state
/// ([`crate::bounds::STUDY_STATE`]), is kept as `state.json.damaged-<time>`). Err at once
/// when what is there is no regular file (a FIFO would block a reader for good).
pub(super) fn load(out: &Path, names: &[String]) -> Result<State> {
    let path = out.join(STATE_FILE);
    let damaged = |e: &dyn std::fmt::Display| -> Result<String> {
        let kept = out.join(format!("{STATE_FILE}.damaged-{}", record::compact_utc(SystemTime::now())));
        std::fs::rename(&path, &kept).with_context(|| format!("{} is damaged ({e}) and cannot be moved aside", path.display()))?;
        Ok(format!("{} was damaged ({e}; kept as {})", path.display(), kept.display()))
    };
    let why = match crate::files::read_regular_no_follow_to_string(&path, crate::bounds::STUDY_STATE) {
        Ok(text) => match serde_json::from_str::<State>(&text) {
            Ok(state) => return Ok(state),
            Err(e) => damaged(&e)?,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("{} was missing", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => damaged(&e)?,
        Err(e) => bail!(
            "{}: move it away; the study then rebuilds its state from the run folders",
            crate::files::read_error(&path, &e)
        ),
    };
    let state = rebuild(&out.join("runs"), names);
    let done = state.values().filter(|o| o.status == RunStatus::Completed).count();
    warn!(
        "{why}: rebuilt from the run folders ({} run(s) found, {done} completed; none is run again)",
        state.len()
    );
    save(out, &state)?;
    Ok(state)
}

/// The state the run folders under `runs` show, for the runs named in `names`.
pub(super) fn rebuild(runs: &Path, names: &[String]) -> State {
    names
        .iter()
        .filter_map(|n| folder_outcome(&runs.join(n)).map(|o| (n.clone(), o)))
        .collect()
}

pub(super) fn save(out: &Path, state: &State) -> Result<()> {
    record::write_atomic(&out.join(STATE_FILE), &(serde_json::to_string_pretty(state)? + "\n"))
}

/// What a resumed study does with one run.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Decision {
    Run,
    /// Not run, and why (for points.csv).
    Skip(String),
}

/// Decides from the run's folder (and, for failures, the state) whether to run it. A
/// completed run is always kept; a failed one is kept unless `retry_failed`; a folder
/// that makes way for a new run is moved to `discarded/` first.
pub(super) fn decide(out: &Path, state: &State, name: &str, retry_failed: bool) -> Result<Decision> {
    let dir = out.join("runs").join(name);
    let folder = folder_outcome(&dir);
    if folder.as_ref().is_some_and(|o| o.status == RunStatus::Completed) {
        return Ok(Decision::Skip("skipped (completed earlier)".into()));
    }
    let failed_before =
        state.get(name).is_some_and(|o| o.status == RunStatus::Failed) || folder.as_ref().is_some_and(|o| o.status == RunStatus::Failed);
    if failed_before && !retry_failed {
        return Ok(Decision::Skip("skipped (failed earlier; --retry-failed runs it again)".into()));
    }
    if dir.exists() {
        if let Some(who) = record::lock::held_by(&dir) {
            anyhow::bail!(
                "the unfinished run {} is still held by {who}: a study moves a run folder aside only when the \
                 job that wrote it has ended. Wait for that job, or, if it has ended, remove {}",
                dir.display(),
                dir.join(record::lock::LOCK_FILE).display()
            );
        }
        let kept = move_aside(out, &dir, name)?;
        info!("the unfinished run {name} makes way for a new one: moved to {}", kept.display());
    }
    Ok(Decision::Run)
}

/// Moves `dir` to `<out>/discarded/<name>-<time>[-N]`.
fn move_aside(out: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let parent = out.join(DISCARDED);
    std::fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let stamp = record::compact_utc(SystemTime::now());
    let mut target = parent.join(format!("{name}-{stamp}"));
    let mut n = 1;
    while target.exists() {
        n += 1;
        target = parent.join(format!("{name}-{stamp}-{n}"));
    }
    std::fs::rename(dir, &target).with_context(|| {
        format!(
            "cannot move the unfinished run {} aside to {} (nothing was deleted): move or remove it yourself, then run the study again",
            dir.display(),
            target.display()
        )
    })?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_folder(runs: &Path, name: &str, status: &str, ends: &[RunStatus]) {
        let dir = runs.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let m = serde_json::json!({
            "run_id": name, "status": status, "ddpbench_version": "0", "libtorch_version": "0",
            "mpi_library": "", "command_line": [], "config": {}, "model": "m", "dataset": "d",
            "dataset_source": "", "parameters": 1, "gradient_bytes": 4, "comm_backend": "mpi",
            "buckets": 1, "world_size": ends.len(), "nodes": 1, "batch_size_per_rank": 1,
            "global_batch_size": 1, "steps_per_epoch": 1, "start_utc": "", "ranks": [],
        });
        std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
        for (rank, st) in ends.iter().enumerate() {
            let e = EndRecord {
                run_id: name.into(),
                rank,
                host: "h".into(),
                status: *st,
                error: None,
                steps: 3,
                time_utc: String::new(),
            };
            e.write(&dir).unwrap();
        }
    }

    #[test]
    fn a_fifo_for_the_state_is_named_at_once_never_waited_on() {
        use crate::files::testing::{mkfifo, returns_promptly};
        let d = tempfile::tempdir().unwrap();
        let out = d.path().to_path_buf();
        mkfifo(&out.join(STATE_FILE));
        let e = returns_promptly(move || load(&out, &[]).map(drop)).unwrap_err().to_string();
        assert!(e.contains("state.json is a FIFO (named pipe)") && e.contains("move it away"), "{e}");
    }

    #[test]
    fn a_missing_or_damaged_state_is_rebuilt_and_no_completed_run_is_touched() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path();
        let runs = out.join("runs");
        use RunStatus::*;
        run_folder(&runs, "a", "completed", &[Completed, Completed]);
        run_folder(&runs, "b", "completed", &[Completed, Interrupted]);
        run_folder(&runs, "c", "running", &[Completed]);
        run_folder(&runs, "d", "failed", &[Failed]);
        let names: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect();
        std::fs::write(out.join(STATE_FILE), "{\"a\": {\"status\": \"compl").unwrap();
        let state = load(out, &names).unwrap();
        assert_eq!(state["a"].status, Completed);
        assert_eq!(state["b"].status, Failed);
        assert_eq!(state["c"].status, Interrupted);
        assert!(state["c"].error.as_deref().unwrap().contains("`running`"));
        assert_eq!(state["d"].status, Failed);
        assert!(!state.contains_key("e"));
        // The damaged file is kept, the rebuilt one written.
        let kept = std::fs::read_dir(out)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("state.json.damaged-"));
        assert!(kept);
        assert_eq!(load(out, &names).unwrap(), state);
        // Deciding: the completed run is skipped even against a state that says otherwise;
        // the unfinished ones move aside, never vanish.
        let mut lying = state.clone();
        lying.insert("a".into(), PointOutcome::new(Failed, None));
        assert_eq!(
            decide(out, &lying, "a", true).unwrap(),
            Decision::Skip("skipped (completed earlier)".into())
        );
        assert!(matches!(decide(out, &state, "d", false).unwrap(), Decision::Skip(_)));
        assert_eq!(decide(out, &state, "c", false).unwrap(), Decision::Run);
        assert!(!runs.join("c").exists());
        let moved: Vec<String> = std::fs::read_dir(out.join(DISCARDED))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(moved.len() == 1 && moved[0].starts_with("c-"), "{moved:?}");
        assert!(runs.join("a").join("manifest.json").is_file());
    }
}
