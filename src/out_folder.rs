//! An output folder that `reduce` or `compare` writes a report into: one writer at a
//! time, and the report replaced whole.
//!
//! - One writer: the folder's lock ([`crate::record::lock`], the lock runs and studies
//!   take) is held from before the first file is staged until the report is in place. A
//!   second writer is refused with who holds it.
//! - Whole: every file is staged in a new hidden folder, then put in place at once. When
//!   the folder holds only what an earlier report wrote (or nothing), the staged folder
//!   takes its place in one step (`renameat2` with `RENAME_EXCHANGE`; where the file
//!   system has no such exchange, two renames), so a reader sees the old report or the
//!   new one. A folder that holds other files (a run folder, a folder of runs) cannot be
//!   swapped: there the files are renamed in one by one, still under the lock.
//! - Owned: the files a report writes are listed in [`MANIFEST`] in the folder; a later
//!   report removes those of them it does not write again, and nothing else.
//! - Cleaned up: an error, or a stop signal ([`crate::cleanup::on_report_signal`]),
//!   removes the staged folder; a folder the writer created for itself is removed too.

use crate::files::{self, StagedFiles};
use crate::record::lock::{FolderLock, LOCK_FILE};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The list of files the last report wrote, in the folder it wrote them to.
pub(crate) const MANIFEST: &str = ".ddpbench-report.json";

/// A list of written files is a few kilobytes; a longer file is not ddpbench's.
const MANIFEST_BOUND: files::SizeBound = files::SizeBound {
    what: "a report's list of written files",
    max_bytes: 1 << 20,
};

/// Kinds of file a report holds: a name listed in [`MANIFEST`] with another extension
/// is not one ddpbench wrote, and is never removed.
const REPORT_EXTENSIONS: [&str; 6] = ["csv", "md", "json", "html", "svg", "png"];

/// [`MANIFEST`]'s content.
#[derive(Debug, Serialize, Deserialize)]
struct Written {
    /// The command that wrote the files (`ddpbench reduce`).
    written_by: String,
    /// The files' names, in the folder.
    files: Vec<String>,
}

/// How the staged files reach the folder.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// The staged folder (a sibling) takes the folder's place.
    Swap,
    /// The staged folder (inside) gives up its files one by one.
    InPlace,
}

/// A report being written into one folder: its lock held, its files staged.
pub(crate) struct OutFolder {
    out: PathBuf,
    /// Taken when the folder opens; dropped last.
    lock: Option<FolderLock>,
    staging: PathBuf,
    files: Option<StagedFiles>,
    mode: Mode,
    /// The files the previous report listed (checked names only).
    previous: Vec<String>,
    /// Whether this writer created `out`: removed again when nothing is written.
    created: bool,
    /// The command, for [`MANIFEST`].
    written_by: &'static str,
}

impl OutFolder {
    /// Opens `out` (created with its parents when absent) for `written_by`
    /// (`ddpbench reduce`): takes its lock (`what` names the folder in messages;
    /// `break_lock` as `--break-lock`) and makes the staging folder.
    pub(crate) fn open(out: &Path, what: &str, break_lock: bool, written_by: &'static str) -> Result<OutFolder> {
        let _stops = crate::cleanup::StopsDeferred::begin();
        let created = !out.exists();
        std::fs::create_dir_all(out)
            .with_context(|| format!("cannot create {}: choose an --out in a folder you can write", out.display()))?;
        if created {
            crate::cleanup::arm_created(out);
        }
        Self::open_created(out, what, break_lock, written_by, created)
    }

    /// [`OutFolder::open`] on `out`, which exists; `created` says this process made it
    /// and armed it for the stop signals' handler ([`crate::cleanup::arm_created`]): then
    /// it is removed again when nothing is written. A stop signal is held back until the
    /// lock and the staging folder are armed for its handler.
    pub(crate) fn open_created(out: &Path, what: &str, break_lock: bool, written_by: &'static str, created: bool) -> Result<OutFolder> {
        let _stops = crate::cleanup::StopsDeferred::begin();
        let opened = Self::open_locked(out, what, break_lock, written_by, created);
        if opened.is_err() && created {
            let _ = std::fs::remove_dir(out);
            crate::cleanup::disarm_created();
        }
        opened
    }

    fn open_locked(out: &Path, what: &str, break_lock: bool, written_by: &'static str, created: bool) -> Result<OutFolder> {
        let out = out.canonicalize().with_context(|| format!("cannot open {}", out.display()))?;
        let lock = FolderLock::take(&out, what, break_lock)?;
        let previous = previous_files(&out);
        let foreign = foreign_entries(&out, &previous)?;
        let sibling = match (foreign.is_empty(), out.parent(), out.file_name()) {
            (true, Some(parent), Some(name)) => {
                files::create_dir_fresh(parent, &format!(".{}.staging", name.to_string_lossy()), 8, 0o755).ok()
            }
            _ => None,
        };
        let (staging, mode) = match sibling {
            Some(s) => (s, Mode::Swap),
            None => (
                files::create_dir_fresh(&out, ".ddpbench-staging", 8, 0o700)
                    .with_context(|| format!("cannot write into {}: check its permissions and free space", out.display()))?,
                Mode::InPlace,
            ),
        };
        crate::cleanup::arm_staging(&staging, lock.path());
        let files = StagedFiles::new(&staging).map_err(anyhow::Error::from);
        let mut folder = OutFolder {
            out,
            lock: Some(lock),
            staging,
            files: None,
            mode,
            previous,
            created,
            written_by,
        };
        folder.files = Some(files?);
        Ok(folder)
    }

    /// The files to stage.
    pub(crate) fn files(&mut self) -> &mut StagedFiles {
        self.files.as_mut().expect("staged files until commit")
    }

    /// Puts every staged file in place, the previous report's files that were not
    /// written again removed, and [`MANIFEST`] listing the new ones.
    pub(crate) fn commit(mut self) -> Result<()> {
        let files = self.files.take().expect("staged files until commit");
        let names = files.names();
        files.commit()?;
        // The folder holds the old report or the new one whole, never a mix.
        let _stops = crate::cleanup::StopsDeferred::begin();
        let listed = |names: &[String]| {
            let written = Written {
                written_by: self.written_by.into(),
                files: names.to_vec(),
            };
            serde_json::to_vec_pretty(&written).map(|mut b| {
                b.push(b'\n');
                b
            })
        };
        match self.mode {
            Mode::Swap => {
                write_new(&self.staging.join(MANIFEST), &listed(&names)?)?;
                self.swap()?;
            }
            Mode::InPlace => {
                // Listed first with the old files too: whatever this leaves, if stopped, is listed.
                let mut both = self.previous.clone();
                both.extend(names.iter().filter(|n| !self.previous.contains(n)).cloned());
                replace(&self.out, MANIFEST, &listed(&both)?)?;
                for n in &names {
                    std::fs::rename(self.staging.join(n), self.out.join(n))
                        .with_context(|| format!("cannot put {} in place", self.out.join(n).display()))?;
                }
                for stale in self.previous.iter().filter(|p| !names.contains(p)) {
                    remove_own(&self.out.join(stale));
                }
                replace(&self.out, MANIFEST, &listed(&names)?)?;
            }
        }
        self.created = false;
        crate::cleanup::disarm_created();
        Ok(())
    }

    /// The staged folder in the folder's place (the lock linked into it first, so it is
    /// held throughout), and the old folder, now at the staged folder's name, emptied of
    /// what ddpbench wrote and removed.
    fn swap(&mut self) -> Result<()> {
        let lock = self.lock.as_ref().expect("held until dropped");
        let lock_copy = self.staging.join(LOCK_FILE);
        if std::fs::hard_link(lock.path(), &lock_copy).is_err() {
            write_new(&lock_copy, lock.bytes())?;
        }
        if let Ok(m) = std::fs::metadata(&self.out) {
            let _ = std::fs::set_permissions(&self.staging, m.permissions());
        }
        let old =
            exchange(&self.staging, &self.out).with_context(|| format!("cannot put the new report in place of {}", self.out.display()))?;
        for name in self.previous.iter().map(String::as_str).chain([MANIFEST, LOCK_FILE]) {
            remove_own(&old.join(name));
        }
        // A job that was taking the lock as the folders swapped wrote its temporary
        // lock file into the old folder; it takes the lock again in the new one.
        for e in std::fs::read_dir(&old).into_iter().flatten().flatten() {
            let plain = e.file_type().is_ok_and(|t| t.is_file());
            if plain && crate::record::lock::is_lock_temporary(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if let Err(e) = std::fs::remove_dir(&old) {
            eprintln!(
                "the previous report's folder, now {}, holds files ddpbench did not write ({e}): they were kept there; \
                 move what you need and remove it",
                old.display()
            );
        }
        // The staged folder is in place: nothing of it is removed from here on.
        crate::cleanup::disarm_staging();
        self.staging = PathBuf::new();
        Ok(())
    }
}

impl Drop for OutFolder {
    fn drop(&mut self) {
        // What is disarmed here is removed before a stop signal is acted on.
        let _stops = crate::cleanup::StopsDeferred::begin();
        crate::cleanup::disarm_staging();
        drop(self.files.take());
        // A folder this process created exclusively under a random name: all of it is its own.
        if !self.staging.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
        crate::cleanup::disarm_lock();
        drop(self.lock.take());
        if self.created {
            // Only an empty folder goes: what another process put there stays.
            let _ = std::fs::remove_dir(&self.out);
            crate::cleanup::disarm_created();
        }
    }
}

/// The files [`MANIFEST`] in `out` lists whose names are a report file's: one name of
/// its own, not hidden, with a report's extension. Empty when there is no list, or it
/// cannot be read.
fn previous_files(out: &Path) -> Vec<String> {
    let Ok(text) = files::read_regular_to_string(&out.join(MANIFEST), MANIFEST_BOUND) else {
        return Vec::new();
    };
    let Ok(written) = serde_json::from_str::<Written>(&text) else {
        return Vec::new();
    };
    let mut names: Vec<String> = written.files.into_iter().filter(|n| is_report_name(n)).collect();
    names.sort();
    names.dedup();
    names
}

/// Whether `name` can be a file a report wrote.
fn is_report_name(name: &str) -> bool {
    files::name_problem(name).is_none()
        && !name.starts_with('.')
        && name.rsplit_once('.').is_some_and(|(_, ext)| REPORT_EXTENSIONS.contains(&ext))
}

/// What `out` holds that is neither a file the last report listed, nor its list, nor
/// the lock.
fn foreign_entries(out: &Path, previous: &[String]) -> Result<Vec<String>> {
    let mut foreign = Vec::new();
    for e in std::fs::read_dir(out).with_context(|| format!("cannot list {}", out.display()))? {
        let e = e.with_context(|| format!("cannot list {}", out.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name == MANIFEST || name.starts_with(LOCK_FILE) || previous.contains(&name);
        if !ours {
            foreign.push(name);
        }
    }
    Ok(foreign)
}

/// Removes `path` when it is a regular file (a link or a folder is left alone).
fn remove_own(path: &Path) {
    if files::is_regular_no_follow(path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Creates `path` exclusively with `bytes`, checked as it is closed.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = files::create_exclusive(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Replaces `dir/name` with `bytes`: written under a name of its own, then renamed.
fn replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let temp = dir.join(format!("{name}.{}.{}.tmp", std::process::id(), files::random_hex(8)));
    let written = write_new(&temp, bytes)
        .and_then(|()| std::fs::rename(&temp, dir.join(name)).with_context(|| format!("cannot replace {}", dir.join(name).display())));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Puts the folder `new` at `out`'s place; returns where `out`'s old folder now is (at
/// `new`'s name after an exchange, else at a name of its own beside it).
fn exchange(new: &Path, out: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (cn, co) = (c(new)?, c(out)?);
    // SAFETY: two NUL-terminated paths, relative to the working folder.
    let swapped = unsafe { libc::renameat2(libc::AT_FDCWD, cn.as_ptr(), libc::AT_FDCWD, co.as_ptr(), libc::RENAME_EXCHANGE) };
    if swapped == 0 {
        return Ok(new.to_path_buf());
    }
    let e = std::io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)) {
        return Err(e);
    }
    // No exchange on this file system: the old folder aside, the new one in its place.
    let aside = new.with_file_name(format!(
        "{}.old-{}",
        new.file_name().unwrap_or_default().to_string_lossy(),
        files::random_hex(4)
    ));
    std::fs::rename(out, &aside)?;
    if let Err(e) = std::fs::rename(new, out) {
        let _ = std::fs::rename(&aside, out);
        return Err(e);
    }
    Ok(aside)
}
