//! The study folder: created with its lock and its `study.toml` and `study.json`, or
//! found holding this same study and resumed.

use super::plan::{self, Layout, Plan, StudySpec};
use super::state::{self, State};
use crate::record;
use crate::record::lock::{FolderLock, LOCK_FILE};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// `study.json`: what a resumed study is checked against.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StudyFile {
    name: String,
    /// Hash of `study.toml` as resolved for this job.
    hash: String,
    world_size: usize,
    nodes: usize,
    points: Vec<serde_json::Value>,
}

/// Creates the study folder and takes its lock, or checks that the folder there holds
/// this same study (and takes its lock: a study resumes once the job before has ended).
pub(super) fn open_folder(
    out: &Path,
    spec: &StudySpec,
    plan: &Plan,
    resolved: &str,
    layout: &Layout,
    names: &[String],
    break_lock: bool,
) -> Result<(State, FolderLock)> {
    let created = !out.exists();
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let lock = FolderLock::take(out, "study folder", break_lock).inspect_err(|_| {
        if created {
            let _ = std::fs::remove_dir(out);
        }
    })?;
    Ok((start_or_resume(out, spec, plan, resolved, layout, names)?, lock))
}

/// The state of the study in `out` (locked): a new study's files written, or a resumed
/// study's state read.
fn start_or_resume(out: &Path, spec: &StudySpec, plan: &Plan, resolved: &str, layout: &Layout, names: &[String]) -> Result<State> {
    // The report keys change no point: a study resumes under other values of them.
    let points_only = plan::without_report_keys(resolved);
    let hash = plan::study_hash(&points_only);
    let json = out.join("study.json");
    if crate::files::is_regular_no_follow(&json) {
        let before: StudyFile = serde_json::from_str(&std::fs::read_to_string(&json)?)
            .with_context(|| format!("{} is not a ddpbench study file", json.display()))?;
        // A folder made before schema 4 holds the same study under the old keys.
        if before.hash != hash && before.hash != plan::study_hash(&plan::with_old_keys(&points_only)) {
            bail!(
                "{} holds a different study (its study.toml differs from this one's): use another --out, \
                 or remove the folder to start over",
                out.display()
            );
        }
        // study.toml says what this launch's report is made with.
        let saved = out.join("study.toml");
        if let Some(updated) = crate::files::read_regular_to_string(&saved, 1 << 20)
            .ok()
            .and_then(|text| plan::with_report_keys_of(&text, resolved))
        {
            record::write_atomic(&saved, &updated)?;
        }
        return state::load(out, names);
    }
    let other = std::fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        // The lock, and another job's attempts at it (`.ddpbench.lock.*`), are not the folder's.
        .find(|n| !n.to_string_lossy().starts_with(LOCK_FILE));
    if let Some(name) = other {
        bail!(
            "{} exists and is not a study folder (it holds {}): choose another --out",
            out.display(),
            name.to_string_lossy()
        );
    }
    std::fs::create_dir(out.join("runs")).with_context(|| format!("cannot create {}", out.join("runs").display()))?;
    record::write_atomic(&out.join("study.toml"), resolved)?;
    let file = StudyFile {
        name: spec.name.clone(),
        hash,
        world_size: layout.world_size(),
        nodes: layout.nodes.len(),
        points: plan.points.iter().map(|p| serde_json::to_value(p).unwrap_or_default()).collect(),
    };
    record::write_atomic(&json, &(serde_json::to_string_pretty(&file)? + "\n"))?;
    Ok(State::new())
}
