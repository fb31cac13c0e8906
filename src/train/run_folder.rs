//! The run folder: chosen and checked by rank 0, known to every rank, written by one job.
//!
//! Rank 0 takes the folder's lock ([`record::lock`]) before anything is written, and
//! refuses a folder that already holds any file a run writes ([`is_run_file`]), naming
//! it; every file of the run is then created exclusively, never through a symlink. The
//! lock goes when the run ends, whichever way it ends.

use super::config::TrainConfig;
use crate::record::lock::{self, FolderLock};
use crate::record::{self, reserve};
use crate::world::{agree, broadcast_string, Group};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Where a run writes, and its id (the folder's name).
#[derive(Debug, Clone)]
pub(crate) struct RunFolder {
    pub dir: PathBuf,
    pub run_id: String,
    /// On rank 0, the outermost folder ddpbench created for the run (the run folder or
    /// one of its parents), when the user had not made it.
    created: Option<PathBuf>,
    /// On rank 0, the folder's lock, removed when the last copy of this is dropped.
    lock: Option<Arc<FolderLock>>,
}

/// What rank 0 prepared: the folder, the outermost folder it created, its lock.
type Prepared = (PathBuf, Option<PathBuf>, Option<FolderLock>);

impl RunFolder {
    /// Rank 0 picks the folder (`--out`, else a new one under `results/`), creates it,
    /// takes its lock and refuses one that holds a run's files; every rank learns the
    /// path, or the same error.
    pub(crate) fn prepare(g: &Group, cfg: &TrainConfig, started: SystemTime) -> Result<RunFolder> {
        let prepared: Result<Prepared> = if g.rank == 0 {
            create(cfg, g.size, started)
        } else {
            Ok((PathBuf::new(), None, None))
        };
        let (dir, created, lock) = agree(g, prepared)?;
        let dir = PathBuf::from(broadcast_string(g, &dir.to_string_lossy()));
        let run_id = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(RunFolder {
            dir,
            run_id,
            created,
            lock: lock.map(Arc::new),
        })
    }

    /// After a set-up failure: before the manifest was written, rank 0 removes the
    /// folders it created if they are empty (no empty run folder is left behind, and a
    /// folder the user made stays); after it, rank 0 marks the run failed. The lock goes
    /// either way.
    pub(crate) fn abandon(mut self, g: &Group, err: &anyhow::Error) {
        if g.rank != 0 {
            return;
        }
        match record::Manifest::read(&self.dir) {
            Ok(mut m) => {
                m.status = record::RunStatus::Failed.as_str().into();
                m.error = Some(format!("set-up failed: {err:#}"));
                let _ = m.write(&self.dir);
            }
            Err(_) => {
                self.lock = None;
                if let Some(top) = &self.created {
                    remove_created(&self.dir, top);
                }
            }
        }
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The folder's lock, on rank 0.
    pub(crate) fn lock(&self) -> Option<&FolderLock> {
        self.lock.as_deref()
    }
}

/// Whether a run writes an entry of this name into its folder: the manifest, every
/// per-rank file (`rank-NNNNN.csv`, `.gpu.csv`, `.end.json`, `.flight.json`),
/// `epochs.csv`, `clock.csv`, the saved model, the trace folder and the reserve.
pub(crate) fn is_run_file(name: &str) -> bool {
    name.starts_with("rank-")
        || [
            "manifest.json",
            "epochs.csv",
            "clock.csv",
            "model.safetensors",
            "model.pt",
            crate::trace::files::TRACE_DIR,
            reserve::RESERVE_FILE,
        ]
        .contains(&name)
}

/// The folder, the outermost folder created for it (None when it existed), its lock.
fn create(cfg: &TrainConfig, ranks: usize, started: SystemTime) -> Result<Prepared> {
    let (dir, created) = match &cfg.output.out {
        Some(d) => (d.clone(), create_named(d)?),
        None => create_default(cfg, ranks, started)?,
    };
    let undo = |lock: Option<FolderLock>| {
        drop(lock);
        if let Some(top) = &created {
            remove_created(&dir, top);
        }
    };
    let lock = match FolderLock::take(&dir, "run folder", cfg.output.break_lock) {
        Ok(l) => l,
        Err(e) => {
            undo(None);
            return Err(e);
        }
    };
    match first_run_file(&dir) {
        Ok(None) => Ok((dir, created, Some(lock))),
        Ok(Some(name)) => {
            undo(Some(lock));
            if name == "manifest.json" {
                bail!(
                    "{} already holds a run (manifest.json). Choose another --out or move that run away",
                    dir.display()
                );
            }
            bail!(
                "{} already holds {name}, a file a run writes (ddpbench overwrites no file and writes through no \
                 link). Choose another --out, or move {name} away",
                dir.display()
            )
        }
        Err(e) => {
            undo(Some(lock));
            Err(e)
        }
    }
}

/// Creates `--out` and its missing parents; returns the outermost one created.
fn create_named(dir: &Path) -> Result<Option<PathBuf>> {
    let created = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_path_buf);
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create output folder {} (check permissions or choose another --out)",
            dir.display()
        )
    })?;
    Ok(created)
}

/// A new folder `results/<model>-<data>-n<ranks>-<time>[-j<job>]-<4 hex digits>`, made
/// exclusively (another random suffix when the name is taken): two jobs started in the
/// same second, a Slurm job array's tasks among them, never share one.
fn create_default(cfg: &TrainConfig, ranks: usize, started: SystemTime) -> Result<(PathBuf, Option<PathBuf>)> {
    let name = |v: serde_json::Value| v.as_str().unwrap_or("x").to_string();
    let job = lock::scheduler_job().map(|(_, id)| format!("-j{id}")).unwrap_or_default();
    let stem = format!(
        "{}-{}-n{}-{}{job}",
        crate::files::safe_component(&cfg.workload.model.name()),
        name(serde_json::to_value(cfg.workload.dataset)?),
        ranks,
        record::compact_utc(started)
    );
    let parent = Path::new("results");
    let created_parent = create_named(parent)?;
    let dir = crate::files::create_dir_fresh(parent, &stem, 2, 0o777).with_context(|| {
        format!(
            "cannot create a run folder in {} (check permissions or give --out)",
            parent.display()
        )
    })?;
    Ok((dir.clone(), Some(created_parent.unwrap_or(dir))))
}

/// The first entry of `dir` (by name) that a run writes.
fn first_run_file(dir: &Path) -> Result<Option<String>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot list output folder {}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| is_run_file(n))
        .collect();
    names.sort();
    // The manifest first: a folder with one holds a whole run.
    Ok(names.iter().find(|n| *n == "manifest.json").or(names.first()).cloned())
}

/// Removes `dir` and its parents up to `top`, each only if empty.
fn remove_created(dir: &Path, top: &Path) {
    for d in dir.ancestors() {
        if std::fs::remove_dir(d).is_err() || d == top {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_a_run_writes_is_a_run_file() {
        for name in [
            record::rank_file_name(12),
            record::gpu_file_name(3),
            record::end_file_name(0),
            crate::flight::hang::flight_file_name(7),
            "manifest.json".into(),
            "trace".into(),
            ".ddpbench-reserve".into(),
        ] {
            assert!(is_run_file(&name), "{name}");
        }
        for name in ["slurm-123.out", "notes.txt", ".ddpbench.lock", "report"] {
            assert!(!is_run_file(name), "{name}");
        }
    }

    #[test]
    fn a_planted_file_is_named_the_manifest_first() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("slurm-1.out"), "").unwrap();
        assert_eq!(first_run_file(d.path()).unwrap(), None);
        std::os::unix::fs::symlink("/nowhere", d.path().join("rank-00001.csv")).unwrap();
        assert_eq!(first_run_file(d.path()).unwrap().as_deref(), Some("rank-00001.csv"));
        std::fs::write(d.path().join("manifest.json"), "{}").unwrap();
        assert_eq!(first_run_file(d.path()).unwrap().as_deref(), Some("manifest.json"));
    }
}
