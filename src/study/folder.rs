//! The study folder: created with its lock and its `study.toml` and `study.json`, or
//! found holding this same study and resumed.

use super::layout::Layout;
use super::plan::{self, Plan};
use super::spec::{self, StudySpec};
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

/// The text of `study.json` at `json`: None when nothing is there (a new study). Read
/// from one open of the file, never through a symbolic link and only as a regular file
/// within [`crate::bounds::STUDY_FILE`], so nothing can change it between a check and
/// the read; Err says what is there instead.
fn read_study_file(json: &Path) -> Result<Option<String>> {
    match crate::files::read_regular_no_follow_to_string(json, crate::bounds::STUDY_FILE) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => bail!(
            "{}: a study folder's study.json is the file the study wrote; use another --out, or move it away to start over",
            crate::files::read_error(json, &e)
        ),
    }
}

/// The state of the study in `out` (locked): a new study's files written, or a resumed
/// study's state read.
fn start_or_resume(out: &Path, spec: &StudySpec, plan: &Plan, resolved: &str, layout: &Layout, names: &[String]) -> Result<State> {
    // The report keys change no point: a study resumes under other values of them.
    let points_only = spec::without_report_keys(resolved);
    let hash = plan::study_hash(&points_only);
    let json = out.join("study.json");
    if let Some(text) = read_study_file(&json)? {
        let before: StudyFile = serde_json::from_str(&text).with_context(|| format!("{} is not a ddpbench study file", json.display()))?;
        // A folder made before schema 4 holds the same study under the old keys.
        if before.hash != hash && before.hash != plan::study_hash(&spec::with_old_keys(&points_only)) {
            bail!(
                "{} holds a different study (its study.toml differs from this one's): use another --out, \
                 or remove the folder to start over",
                out.display()
            );
        }
        // study.toml says what this launch's report is made with.
        let saved = out.join("study.toml");
        if let Some(updated) = crate::files::read_regular_to_string(&saved, crate::bounds::STUDY_TOML)
            .ok()
            .and_then(|text| spec::with_report_keys_of(&text, resolved))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::testing::{mkfifo, returns_promptly};

    /// Starts a 1-rank study in `out`, then resumes it: Err from the resumed one.
    fn resume(out: std::path::PathBuf) -> Result<State> {
        let spec = StudySpec::from_toml("ranks = [1]\n", "t")?;
        let layout = Layout::from_hosts(&["h".to_string()]);
        let plan = plan::plan(&spec, &layout, 2)?;
        let resolved = spec.to_toml(&plan.ladder, plan.threads_per_rank);
        start_or_resume(&out, &spec, &plan, &resolved, &layout, &[])
    }

    #[test]
    fn a_study_json_that_is_no_file_the_study_wrote_is_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("study");
        std::fs::create_dir(&out).unwrap();
        resume(out.clone()).unwrap();
        resume(out.clone()).expect("the study it wrote resumes");
        let json = out.join("study.json");
        // Sparse: 100 MiB that take no disk, and would take 100 MiB of memory to read.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&json)
            .unwrap()
            .set_len(100 << 20)
            .unwrap();
        let e = resume(out.clone()).unwrap_err().to_string();
        assert!(e.contains("study.json is 100 MiB, over the 64 MiB a study.json may hold"), "{e}");
        std::fs::remove_file(&json).unwrap();
        mkfifo(&json);
        let e = returns_promptly(move || resume(out).map(drop)).unwrap_err().to_string();
        assert!(e.contains("study.json is a FIFO (named pipe)"), "{e}");
    }
}
