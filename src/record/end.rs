//! `rank-NNNNN.end.json`: how each rank's part of a run ended, written by the rank
//! itself (atomically), so a run's outcome is known even when rank 0 died first. It is
//! written `running` when training starts; a signal's handler turns it `interrupted`
//! ([`super::last_gasp`]), and a rank killed outright (SIGKILL, a node lost) leaves it
//! `running`: `reduce` says so.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How a run, or one rank's part of it, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RunStatus {
    Running,
    Completed,
    /// An error stopped it (`error` says which, on which rank, at which step).
    Failed,
    /// A signal stopped it (SIGINT, SIGTERM: Ctrl-C, scancel, Slurm's time limit;
    /// SIGUSR1/SIGUSR2: `sbatch --signal`) after the step in progress.
    Interrupted,
}

impl RunStatus {
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct EndRecord {
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

/// An end record is a few hundred bytes (its error text included); a larger file is not one.
pub(super) const END_RECORD_MAX_BYTES: u64 = 64 << 10;

pub(crate) fn end_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.end.json")
}

impl EndRecord {
    /// Writes `rank-NNNNN.end.json` in `dir` atomically (temp file, fsync, rename).
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(end_file_name(self.rank));
        write_atomic(&path, &(serde_json::to_string_pretty(self)? + "\n"))
    }

    /// Reads `rank-NNNNN.end.json` from `dir`; one larger than [`END_RECORD_MAX_BYTES`]
    /// is refused unread.
    pub(crate) fn read(dir: &Path, rank: usize) -> Result<EndRecord> {
        use std::io::Read;
        let path = dir.join(end_file_name(rank));
        let mut text = String::new();
        crate::files::open_regular(&path)
            .and_then(|f| f.take(END_RECORD_MAX_BYTES + 1).read_to_string(&mut text))
            .with_context(|| format!("cannot read {}", path.display()))?;
        if text.len() as u64 > END_RECORD_MAX_BYTES {
            bail!(
                "{} is larger than {END_RECORD_MAX_BYTES} bytes: not a ddpbench end record",
                path.display()
            );
        }
        serde_json::from_str(&text).with_context(|| format!("{} is not a ddpbench end record", path.display()))
    }
}

/// Writes `text` to `path` through a temporary file in the same folder, synced before
/// the rename, so a reader sees the old or the new file, whole. The temporary file has a
/// random name and is created exclusively ([`crate::files::create_exclusive`]): ranks
/// that write the same file at once never share one, and nothing planted ahead (a
/// symlink) is written through; the rename replaces whatever is at `path` itself,
/// never a file a symlink there points to. A write that fails leaves no temporary
/// file; one that finds the disk full takes room from the folder's reserve
/// ([`super::reserve`]) and tries once more.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut result = write_then_rename(path, text.as_bytes());
    if result.as_ref().is_err_and(is_full) {
        // Another rank, or a signal handler emptying the reserve, may have freed room
        // meanwhile: try again even when this one finds no reserve left.
        super::reserve::release(dir, text.len() as u64);
        result = write_then_rename(path, text.as_bytes());
    }
    result.with_context(|| format!("cannot write {} (is the file system full or gone?)", path.display()))
}

/// `.NAME.<random>.tmp` beside `path`.
fn temporary_name(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", crate::files::random_hex(8)))
}

fn write_then_rename(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let (tmp, file) = loop {
        let tmp = temporary_name(path);
        match crate::files::create_exclusive(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let mut file = file;
    let written = file
        .write_all(bytes)
        .and_then(|_| file.sync_data())
        .and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether `e` says the file system (or the user's quota on it) is full.
fn is_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_atomic_write_leaves_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        // A folder where the file should go: the rename fails after the write.
        let target = d.path().join("manifest.json");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"x").unwrap();
        let err = write_atomic(&target, "{}\n").unwrap_err();
        assert!(format!("{err:#}").contains("cannot write"), "{err:#}");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["manifest.json"], "only the folder stays");
        // The same again with a reserve: the retry leaves nothing either.
        std::fs::write(d.path().join(super::super::reserve::RESERVE_FILE), vec![1u8; 1 << 20]).unwrap();
        assert!(write_atomic(&target, "{}\n").is_err());
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn an_atomic_write_replaces_a_planted_symlink_and_leaves_its_target_alone() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside.txt");
        std::fs::write(&outside, "keep").unwrap();
        let path = d.path().join("manifest.json");
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        // The temporary names of the old scheme, planted as links too.
        let pid = std::process::id();
        std::os::unix::fs::symlink(&outside, d.path().join(format!(".manifest.json.{pid}.tmp"))).unwrap();
        write_atomic(&path, "{}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        let a = temporary_name(&path);
        assert_ne!(a, temporary_name(&path), "a random name each time");
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with(".manifest.json."));
    }

    #[test]
    fn an_oversized_end_record_is_refused_unread() {
        let d = tempfile::tempdir().unwrap();
        let huge = format!("{{\"run_id\": \"{}\"}}", "x".repeat(END_RECORD_MAX_BYTES as usize));
        std::fs::write(d.path().join(end_file_name(0)), huge).unwrap();
        let err = EndRecord::read(d.path(), 0).unwrap_err();
        assert!(format!("{err:#}").contains("is larger than 65536 bytes"), "{err:#}");
    }
}
