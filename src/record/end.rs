//! `rank-NNNNN.end.json`: how each rank's part of a run ended, written by the rank
//! itself (atomically), so a run's outcome is known even when rank 0 died first. A
//! rank killed outright (SIGKILL, a node lost) leaves none: `reduce` says so.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How a run, or one rank's part of it, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Running,
    Completed,
    /// An error stopped it (`error` says which, on which rank, at which step).
    Failed,
    /// A signal stopped it (SIGINT, SIGTERM: Ctrl-C, scancel, Slurm's time limit;
    /// SIGUSR1/SIGUSR2: `sbatch --signal`) after the step in progress.
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// One rank's end of a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndRecord {
    pub run_id: String,
    pub rank: usize,
    pub host: String,
    pub status: RunStatus,
    /// The error or the signal, when there was one.
    pub error: Option<String>,
    /// Steps this rank completed (rows in its rank file).
    pub steps: usize,
    pub time_utc: String,
}

pub fn end_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.end.json")
}

impl EndRecord {
    /// Writes `rank-NNNNN.end.json` in `dir` atomically (temp file, fsync, rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(end_file_name(self.rank));
        write_atomic(&path, &(serde_json::to_string_pretty(self)? + "\n"))
    }

    pub fn read(dir: &Path, rank: usize) -> Result<EndRecord> {
        let path = dir.join(end_file_name(rank));
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a ddpbench end record", path.display()))
    }
}

/// Writes `text` to `path` through a temporary file in the same folder, synced before
/// the rename, so a reader sees the old or the new file, whole.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp: PathBuf = path.with_file_name(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_data())
        .with_context(|| format!("cannot write {} (is the file system full?)", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
