//! The run folder: chosen and checked by rank 0, known to every rank.

use super::config::TrainConfig;
use crate::record;
use crate::world::{agree, broadcast_string, Group};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Where a run writes, and its id (the folder's name).
#[derive(Debug, Clone)]
pub struct RunFolder {
    pub dir: PathBuf,
    pub run_id: String,
    /// On rank 0, the outermost folder ddpbench created for the run (the run folder or
    /// one of its parents), when the user had not made it.
    created: Option<PathBuf>,
}

impl RunFolder {
    /// Rank 0 picks the folder (`--out`, else `results/<model>-<data>-n<ranks>-<time>`),
    /// refuses one that already holds a run, creates it and checks it is writable; every
    /// rank learns the path, or the same error.
    pub fn prepare(g: &Group, cfg: &TrainConfig, started: SystemTime) -> Result<RunFolder> {
        let prepared = if g.rank == 0 {
            create(cfg, g.size, started)
        } else {
            Ok((PathBuf::new(), None))
        };
        let (dir, created) = agree(g, prepared)?;
        let dir = PathBuf::from(broadcast_string(g, &dir.to_string_lossy()));
        let run_id = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(RunFolder { dir, run_id, created })
    }

    /// After a set-up failure: before the manifest was written, rank 0 removes the
    /// folders it created if they are empty (no empty run folder is left behind, and a
    /// folder the user made stays); after it, rank 0 marks the run failed.
    pub fn abandon(&self, g: &Group, err: &anyhow::Error) {
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
                if let Some(top) = &self.created {
                    remove_created(&self.dir, top);
                }
            }
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

/// The folder, and the outermost folder created for it (None when it existed).
fn create(cfg: &TrainConfig, ranks: usize, started: SystemTime) -> Result<(PathBuf, Option<PathBuf>)> {
    let dir = match &cfg.output.out {
        Some(d) => d.clone(),
        None => {
            let name = |v: serde_json::Value| v.as_str().unwrap_or("x").to_string();
            let id = format!(
                "{}-{}-n{}-{}",
                crate::files::safe_component(&cfg.workload.model.name()),
                name(serde_json::to_value(cfg.workload.dataset)?),
                ranks,
                record::compact_utc(started)
            );
            Path::new("results").join(id)
        }
    };
    let created = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_path_buf);
    if dir.join("manifest.json").exists() {
        bail!(
            "{} already holds a run (manifest.json). Choose another --out or move that run away",
            dir.display()
        );
    }
    std::fs::create_dir_all(&dir).with_context(|| {
        format!(
            "cannot create output folder {} (check permissions or choose another --out)",
            dir.display()
        )
    })?;
    let probe = dir.join(".write-test");
    let written = std::fs::write(&probe, b"ok");
    // The probe goes whether or not it could be written; on failure the folders made for
    // the run go too, so a refused run leaves nothing.
    let _ = std::fs::remove_file(&probe);
    if let Err(e) = written {
        if let Some(top) = &created {
            remove_created(&dir, top);
        }
        return Err(e).with_context(|| {
            format!(
                "output folder {} is not writable (is the file system full? free some space or choose another --out)",
                dir.display()
            )
        });
    }
    Ok((dir, created))
}

/// Removes `dir` and its parents up to `top`, each only if empty.
fn remove_created(dir: &Path, top: &Path) {
    for d in dir.ancestors() {
        if std::fs::remove_dir(d).is_err() || d == top {
            break;
        }
    }
}
