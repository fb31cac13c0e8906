//! One writer per folder: a run folder and a study folder are written by the job that
//! holds their lock, `.ddpbench.lock`, and by no other.
//!
//! The lock is a file created exclusively (`O_CREAT|O_EXCL`, which NFS 3 and later and
//! Lustre honour across nodes, unlike `flock`) that says who holds it: host, pid, the
//! kernel's boot id and the process's start time, the batch job, when and with what
//! command. The holder removes it when its work ends (completed, failed, stopped by a
//! signal, aborted); a run's lock also goes when a stop signal's handler has written the
//! run's last records ([`super::last_gasp`]), since the run's files then refuse any
//! other job. A job killed outright (SIGKILL, a node lost) leaves it behind, and the
//! rule for such a lock is:
//!
//! - held on this host: cleared at once when its process is gone (no such pid, a pid
//!   now started at another time, or the host restarted since); refused while it runs;
//! - held on another host, or unreadable: refused, since no process there can be
//!   checked from here, until the user says the holder has ended with `--break-lock`.
//!
//! Two jobs that find the same stale lock clear it one at a time: a job clears it only
//! after creating `.ddpbench.lock.break` exclusively, and only when the lock still holds
//! what it judged.

use crate::files;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tracing::warn;

/// The lock's name in the folder it guards.
pub(crate) const LOCK_FILE: &str = ".ddpbench.lock";
/// Created exclusively by a job while it clears a stale lock.
pub(crate) const BREAK_FILE: &str = ".ddpbench.lock.break";
/// The flag that clears a lock whose holder cannot be checked from here.
pub(crate) const BREAK_FLAG: &str = "--break-lock";

/// A lock file is a few hundred bytes; a larger one is not ddpbench's.
const MAX_BYTES: files::SizeBound = files::SizeBound {
    what: "a lock file",
    max_bytes: 64 << 10,
};

/// Who holds a folder: the process that wrote the lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub host: String,
    pub pid: u32,
    /// `/proc/sys/kernel/random/boot_id`: a pid names the same process only within one boot.
    pub boot_id: String,
    /// The process's start, in clock ticks after boot (`/proc/PID/stat`, field 22): a pid
    /// reused by a later process has another.
    pub process_start_ticks: u64,
    /// The inode of `/proc/self/ns/pid`: a pid names a process only inside its PID
    /// namespace, and containers that share a host name (Docker's `--uts=host`,
    /// `unshare -p`) have namespaces of their own. None in a lock written before it was
    /// recorded.
    #[serde(default)]
    pub pid_namespace: Option<u64>,
    /// The batch job, e.g. `Slurm job 12345_7`, when a scheduler started the process.
    pub job: Option<String>,
    pub start_utc: String,
    pub command: Vec<String>,
}

impl Holder {
    /// This process.
    pub(crate) fn me() -> Holder {
        let pid = std::process::id();
        Holder {
            host: hostname(),
            pid,
            boot_id: boot_id(),
            process_start_ticks: process_start_ticks(pid).unwrap_or(0),
            pid_namespace: pid_namespace(),
            job: scheduler_job()
                .map(|(name, id)| format!("{name} job {id}"))
                .or_else(|| std::env::var("PMIX_NAMESPACE").ok().map(|ns| format!("MPI job {ns}"))),
            start_utc: super::rfc3339_utc(SystemTime::now()),
            command: std::env::args().collect(),
        }
    }

    /// `pid 4242 on node17 (Slurm job 12345) since 2026-11-22T08:15:02Z: ddpbench train ...`.
    pub(crate) fn describe(&self) -> String {
        let job = self.job.as_ref().map(|j| format!(", {j}")).unwrap_or_default();
        format!(
            "pid {} on {}{job}, since {}: `{}`",
            self.pid,
            self.host,
            self.start_utc,
            self.command.join(" ")
        )
    }

    /// Whether the holder still runs, as far as this host can tell.
    fn judge(&self) -> Verdict {
        if self.host != hostname() {
            return Verdict::Unknown(format!(
                "it was taken on {}, whose processes cannot be checked from here",
                self.host
            ));
        }
        if !self.boot_id.is_empty() && self.boot_id != boot_id() {
            return Verdict::Stale(format!("{} has restarted since", self.host));
        }
        if let Some(why) = self.namespace_apart() {
            return Verdict::Unknown(why);
        }
        // A process never has pid 0, and kill() reads 0 and anything past i32::MAX as
        // "every process of the group" or "every process": both "exist".
        if self.pid == 0 || self.pid > i32::MAX as u32 || self.process_start_ticks == 0 {
            return Verdict::Unknown(format!(
                "it names pid {} started at tick {}, which no process of a running job has",
                self.pid, self.process_start_ticks
            ));
        }
        // SAFETY: signal 0 sends nothing; it asks whether the pid exists.
        let gone =
            unsafe { libc::kill(self.pid as libc::pid_t, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            return Verdict::Stale(format!("process {} no longer exists", self.pid));
        }
        match process_stat(self.pid) {
            Some((_, t)) if t != self.process_start_ticks => Verdict::Stale(format!("pid {} now belongs to a later process", self.pid)),
            // A zombie has ended; only its exit status waits for its parent (or, where the
            // parent has ended, for a PID 1 that may never collect it).
            Some(('Z' | 'X', _)) => Verdict::Stale(format!("process {} has ended (its exit is not yet collected)", self.pid)),
            _ => Verdict::Live,
        }
    }
}

impl Holder {
    /// Why the holder's pid cannot be checked from this process's PID namespace, if so.
    fn namespace_apart(&self) -> Option<String> {
        let mine = pid_namespace();
        match (self.pid_namespace, mine) {
            (Some(theirs), Some(mine)) if theirs == mine => None,
            (Some(theirs), _) => Some(format!(
                "it was taken in another PID namespace (pid:[{theirs}], a container sharing this host's name), \
                 whose processes cannot be checked from here"
            )),
            (None, _) => Some("it was written by an older ddpbench that did not record its PID namespace".into()),
        }
    }
}

/// Whether `dir` is held by a job that runs or cannot be checked from here, and by whom:
/// None when it has no lock or its holder has ended. A study asks this before it moves
/// an unfinished run folder aside.
pub(crate) fn held_by(dir: &Path) -> Option<String> {
    let path = dir.join(LOCK_FILE);
    let seen = read(&path);
    let holder = match &seen {
        Seen::Special("missing") => return None,
        Seen::Bytes(b) => serde_json::from_slice::<Holder>(b).ok(),
        Seen::Special(_) => None,
    };
    match holder {
        Some(h) => match h.judge() {
            Verdict::Stale(_) => None,
            Verdict::Live => Some(h.describe()),
            Verdict::Unknown(why) => Some(format!("{} ({why})", h.describe())),
        },
        None => Some(format!("a lock that cannot be read as ddpbench's ({})", path.display())),
    }
}

enum Verdict {
    Live,
    /// Its holder has ended, and why that is known.
    Stale(String),
    /// Cannot be told from here, and why.
    Unknown(String),
}

/// What a lock file held when it was read: its bytes, or what it is when not a file.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Bytes(Vec<u8>),
    Special(&'static str),
}

/// The lock of one folder, held by this process; removed when dropped (only while it
/// still holds what this process wrote).
#[derive(Debug)]
pub(crate) struct FolderLock {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl FolderLock {
    /// Takes the lock of `dir` (which exists), clearing a stale one by the module's rule
    /// (and one of another host, or unreadable, when `break_lock`); a lock held by a
    /// running job is refused with who holds it. `what` names the folder in messages
    /// (`run folder`, `study folder`).
    pub(crate) fn take(dir: &Path, what: &str, break_lock: bool) -> Result<FolderLock> {
        let path = dir.join(LOCK_FILE);
        let bytes = serde_json::to_vec_pretty(&Holder::me())?;
        for _ in 0..4 {
            match create_whole(&path, &bytes) {
                Ok(true) => {
                    crate::cleanup::hold_lock(&path, &bytes);
                    return Ok(FolderLock { path, bytes });
                }
                Ok(false) => {}
                // The folder was put aside between the lock's write and its link (another
                // job swapped a new report into its place): the name holds a folder again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir.is_dir() => continue,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "output folder {} is not writable (check its permissions; is the file system full? \
                             free some space or choose another --out)",
                            dir.display()
                        )
                    })
                }
            }
            let seen = read(&path);
            if seen == Seen::Special("missing") {
                // Its holder has just removed it: try again.
                continue;
            }
            let holder = match &seen {
                Seen::Bytes(b) => serde_json::from_slice::<Holder>(b).ok(),
                Seen::Special(_) => None,
            };
            let verdict = match (&holder, &seen) {
                (Some(h), _) => h.judge(),
                (None, Seen::Special(kind)) => Verdict::Unknown(format!("{} is {kind}, not a lock ddpbench wrote", path.display())),
                // Met between its creation and its write (a file system without hard links).
                (None, Seen::Bytes(_)) if modified_within(&path, 60) => Verdict::Live,
                (None, Seen::Bytes(_)) => Verdict::Unknown(format!("{} cannot be read as a ddpbench lock", path.display())),
            };
            let who = holder
                .as_ref()
                .map(Holder::describe)
                .unwrap_or_else(|| "a job whose lock cannot be read".into());
            match verdict {
                Verdict::Live => bail!(
                    "the {what} {} is being written by another ddpbench job ({who}). One folder takes one job: \
                     wait for that job to end, or choose another --out",
                    dir.display()
                ),
                Verdict::Stale(why) => {
                    clear(&path, &seen, break_lock)?;
                    warn!(
                        "cleared a stale lock of {} left by a job that ended without removing it ({who}): {why}",
                        dir.display()
                    );
                }
                Verdict::Unknown(why) if break_lock => {
                    clear(&path, &seen, true)?;
                    warn!("{BREAK_FLAG}: removed the lock of {} ({who}; {why})", dir.display());
                }
                Verdict::Unknown(why) => bail!(
                    "the {what} {} is locked by another ddpbench job ({who}), and {why}. One folder takes one job. \
                     A lock is cleared by itself when its process is gone on the host that took it; if that job \
                     has ended (it was killed: check with your scheduler, e.g. `squeue -j ID`), run again with \
                     {BREAK_FLAG}, or remove {}",
                    dir.display(),
                    path.display()
                ),
            }
        }
        bail!(
            "cannot take the lock of {}: other jobs keep taking it; one folder takes one job",
            dir.display()
        )
    }
}

impl FolderLock {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What this process wrote into the lock.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Whether `name` is a lock's temporary file ([`create_whole`]'s): one another job left in
/// a folder that was put aside while it wrote.
pub(crate) fn is_lock_temporary(name: &str) -> bool {
    name.strip_prefix(LOCK_FILE)
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|rest| rest.strip_suffix(".tmp"))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Creates the lock `path` holding `bytes`, whole from its first instant, when nothing is
/// there: written under a random name created exclusively, then linked to `path` (a
/// link fails on anything there, atomically on NFS and Lustre too). Where the file
/// system makes no hard links, `path` itself is created exclusively and written (a
/// reader may then meet it empty for an instant). Returns false when something is there.
fn create_whole(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::{ErrorKind, Write};
    let write = |mut f: std::fs::File| f.write_all(bytes).and_then(|()| f.sync_all());
    let tmp = path.with_file_name(format!("{LOCK_FILE}.{}.tmp", files::random_hex(8)));
    let written = files::create_exclusive(&tmp).and_then(write);
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK)) => {
            match files::create_exclusive(path) {
                Ok(f) => write(f).map(|()| true).inspect_err(|_| {
                    let _ = std::fs::remove_file(path);
                }),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        crate::cleanup::release_lock(&self.path);
        if read(&self.path) == Seen::Bytes(self.bytes.clone()) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the file at `path` was modified less than `seconds` ago.
fn modified_within(path: &Path, seconds: u64) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|e| e.as_secs() < seconds))
}

/// Reads the lock at `path`, never through a symlink.
fn read(path: &Path) -> Seen {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => match files::read_regular_to_string(path, MAX_BYTES) {
            Ok(text) => Seen::Bytes(text.into_bytes()),
            Err(_) => Seen::Special("unreadable"),
        },
        Ok(m) => Seen::Special(files::describe(m.file_type())),
        Err(_) => Seen::Special("missing"),
    }
}

/// Removes the lock at `path` when it still holds `seen`, under [`BREAK_FILE`] (taken
/// exclusively, so two jobs never both clear a lock and each take a new one). `forced`
/// (the user's `--break-lock`) also removes a break file left behind.
fn clear(path: &Path, seen: &Seen, forced: bool) -> Result<()> {
    let guard = path.with_file_name(BREAK_FILE);
    if forced {
        let _ = std::fs::remove_file(&guard);
    }
    match files::create_exclusive(&guard) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "another job is clearing the stale lock {} at this moment; if none is, remove {} or run again with {BREAK_FLAG}",
            path.display(),
            guard.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot clear the lock {}", path.display())),
    }
    let result = if read(path) == *seen {
        std::fs::remove_file(path).with_context(|| format!("cannot remove the stale lock {}", path.display()))
    } else {
        Ok(())
    };
    let _ = std::fs::remove_file(&guard);
    result
}

/// This host's name (`gethostname`), as MPI names it too.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The inode of this process's PID namespace (`/proc/self/ns/pid`), None where /proc
/// does not show it.
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// Field 22 of `/proc/PID/stat` (after the command, which may hold spaces and parentheses).
fn process_start_ticks(pid: u32) -> Option<u64> {
    process_stat(pid).map(|(_, ticks)| ticks)
}

/// The state letter (`R`, `S`, `Z` for a zombie, …) and the start in clock ticks after
/// boot of the process `pid`, from `/proc/PID/stat`.
fn process_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold both: the fields follow the last ')'.
    let mut after = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = after.next()?.chars().next()?;
    Some((state, after.nth(18)?.parse().ok()?))
}

/// The batch scheduler's job that started this process, as (scheduler, id): a Slurm
/// array task as `ARRAYJOB_TASK`, PBS's and LSF's ids (an LSF array index after `_`).
/// The id keeps only letters, digits, `.`, `_` and `-`, so it can be part of a folder name.
pub(crate) fn scheduler_job() -> Option<(&'static str, String)> {
    scheduler_job_in(|k| std::env::var(k).ok())
}

/// [`scheduler_job`] from the variables `env` gives.
fn scheduler_job_in(env: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    let (name, id) = if let (Some(array), Some(task)) = (var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID")) {
        ("Slurm", format!("{array}_{task}"))
    } else if let Some(id) = var("SLURM_JOB_ID").or_else(|| var("SLURM_JOBID")) {
        ("Slurm", id)
    } else if let Some(id) = var("PBS_JOBID") {
        ("PBS", id)
    } else if let Some(id) = var("LSB_JOBID") {
        let index = var("LSB_JOBINDEX").filter(|i| i != "0");
        ("LSF", index.map_or(id.clone(), |i| format!("{id}_{i}")))
    } else {
        return None;
    };
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    Some((name, clean))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock's temporary file is known by its exact form, and nothing else is.
    #[test]
    fn a_lock_temporary_is_known_by_its_name() {
        let tmp = format!("{LOCK_FILE}.{}.tmp", files::random_hex(8));
        assert!(is_lock_temporary(&tmp), "{tmp}");
        for other in [
            LOCK_FILE.to_string(),
            format!("{LOCK_FILE}.tmp"),
            format!("{LOCK_FILE}.0123456789abcdeg.tmp"),
            format!("{LOCK_FILE}.0123.tmp"),
            "summary.csv".into(),
        ] {
            assert!(!is_lock_temporary(&other), "{other}");
        }
    }

    fn plant(dir: &Path, h: &Holder) {
        std::fs::write(dir.join(LOCK_FILE), serde_json::to_vec_pretty(h).unwrap()).unwrap();
    }

    /// A pid that no process has: a child that has been waited for.
    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    #[test]
    fn a_lock_is_exclusive_and_goes_when_dropped() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
        let on_disk: Holder = serde_json::from_slice(&std::fs::read(d.path().join(LOCK_FILE)).unwrap()).unwrap();
        assert_eq!((on_disk.pid, on_disk.host.as_str()), (std::process::id(), hostname().as_str()));
        assert!(on_disk.process_start_ticks > 0 && !on_disk.boot_id.is_empty());
        // This process runs: a second take is refused, even with --break-lock.
        for force in [false, true] {
            let err = format!("{:#}", FolderLock::take(d.path(), "run folder", force).unwrap_err());
            assert!(
                err.contains("is being written by another ddpbench job") && err.contains(&format!("pid {}", std::process::id())),
                "{err}"
            );
        }
        drop(lock);
        assert!(!d.path().join(LOCK_FILE).exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn another_pid_namespace_or_an_impossible_pid_is_unknown_and_the_flag_clears_it() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        let me = Holder::me();
        assert!(me.pid_namespace.is_some(), "/proc/self/ns/pid is readable here");
        // A live pid of this host, from a container of its own: this process's pid and
        // start, so only the namespace can tell them apart.
        let elsewhere = Holder {
            pid_namespace: Some(me.pid_namespace.unwrap() + 1),
            ..me.clone()
        };
        let older = Holder {
            pid_namespace: None,
            pid: dead_pid(),
            ..me.clone()
        };
        let impossible = [
            Holder { pid: 0, ..me.clone() },
            Holder {
                pid: u32::MAX,
                ..me.clone()
            },
            Holder {
                process_start_ticks: 0,
                ..me.clone()
            },
        ];
        for (h, why) in [(&elsewhere, "another PID namespace"), (&older, "did not record its PID namespace")]
            .into_iter()
            .chain(impossible.iter().map(|h| (h, "which no process of a running job has")))
        {
            plant(d.path(), h);
            let err = format!("{:#}", FolderLock::take(d.path(), "study folder", false).unwrap_err());
            assert!(err.contains(why) && err.contains(BREAK_FLAG), "{h:?}: {err}");
            assert!(held_by(d.path()).is_some_and(|w| w.contains(why)), "{h:?}");
            assert_eq!(
                read(&d.path().join(LOCK_FILE)),
                Seen::Bytes(serde_json::to_vec_pretty(h).unwrap()),
                "untouched"
            );
            drop(FolderLock::take(d.path(), "study folder", true).unwrap());
            assert_eq!(held_by(d.path()), None);
        }
    }

    /// A holder that has ended but whose exit nobody has collected (a zombie: a rank whose
    /// launcher has gone, under a PID 1 that reaps nothing) holds the folder no longer.
    #[test]
    fn a_zombie_holder_is_cleared() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = std::time::Instant::now();
        while process_stat(pid).is_some_and(|(state, _)| state != 'Z') {
            assert!(start.elapsed().as_secs() < 60, "`true` has not ended");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let zombie = Holder {
            pid,
            process_start_ticks: process_start_ticks(pid).unwrap(),
            ..Holder::me()
        };
        plant(d.path(), &zombie);
        assert_eq!(held_by(d.path()), None);
        let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
        assert_ne!(read(lock.path()), Seen::Bytes(serde_json::to_vec_pretty(&zombie).unwrap()));
        drop(lock);
        child.wait().unwrap();
    }

    #[test]
    fn a_dead_or_reused_pid_on_this_host_is_cleared_and_another_hosts_lock_needs_the_flag() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        let me = Holder::me();
        for stale in [
            Holder {
                pid: dead_pid(),
                ..me.clone()
            },
            Holder {
                process_start_ticks: me.process_start_ticks + 1,
                ..me.clone()
            },
            Holder {
                boot_id: "another-boot".into(),
                ..me.clone()
            },
        ] {
            plant(d.path(), &stale);
            let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
            drop(lock);
        }
        let other = Holder {
            host: "node-elsewhere".into(),
            job: Some("Slurm job 4242".into()),
            ..me.clone()
        };
        plant(d.path(), &other);
        let err = format!("{:#}", FolderLock::take(d.path(), "study folder", false).unwrap_err());
        for part in ["study folder", "node-elsewhere", "Slurm job 4242", BREAK_FLAG] {
            assert!(err.contains(part), "{part}: {err}");
        }
        assert_eq!(
            read(&d.path().join(LOCK_FILE)),
            Seen::Bytes(serde_json::to_vec_pretty(&other).unwrap()),
            "untouched"
        );
        drop(FolderLock::take(d.path(), "run folder", true).unwrap());
        // Garbage and a symlink are refused too, and the flag clears them.
        // An unreadable lock: being written at this moment while it is new, then unknown.
        std::fs::write(d.path().join(LOCK_FILE), "").unwrap();
        let err = format!("{:#}", FolderLock::take(d.path(), "run folder", true).unwrap_err());
        assert!(err.contains("is being written by another ddpbench job"), "{err}");
        let old = SystemTime::now() - std::time::Duration::from_secs(120);
        std::fs::File::options()
            .write(true)
            .open(d.path().join(LOCK_FILE))
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(format!("{:#}", FolderLock::take(d.path(), "run folder", false).unwrap_err()).contains("cannot be read"));
        drop(FolderLock::take(d.path(), "run folder", true).unwrap());
        let target = d.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, d.path().join(LOCK_FILE)).unwrap();
        assert!(format!("{:#}", FolderLock::take(d.path(), "run folder", false).unwrap_err()).contains("a symbolic link"));
        drop(FolderLock::take(d.path(), "run folder", true).unwrap());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn a_lock_being_cleared_by_another_job_is_left_to_it() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        plant(
            d.path(),
            &Holder {
                pid: dead_pid(),
                ..Holder::me()
            },
        );
        std::fs::write(d.path().join(BREAK_FILE), "").unwrap();
        let err = format!("{:#}", FolderLock::take(d.path(), "run folder", false).unwrap_err());
        assert!(err.contains("another job is clearing"), "{err}");
        drop(FolderLock::take(d.path(), "run folder", true).unwrap());
        assert!(!d.path().join(BREAK_FILE).exists());
    }

    #[test]
    fn a_lock_taken_over_is_not_removed_by_its_old_holder() {
        let _turn = crate::cleanup::test_turn();
        let d = tempfile::tempdir().unwrap();
        let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
        std::fs::write(d.path().join(LOCK_FILE), "another job's").unwrap();
        drop(lock);
        assert_eq!(std::fs::read_to_string(d.path().join(LOCK_FILE)).unwrap(), "another job's");
    }

    #[test]
    fn a_batch_job_is_named_by_its_scheduler() {
        let _turn = crate::cleanup::test_turn();
        let env =
            |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let array = env(&[("SLURM_ARRAY_JOB_ID", "777"), ("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_JOB_ID", "780")]);
        assert_eq!(scheduler_job_in(array), Some(("Slurm", "777_3".into())));
        assert_eq!(scheduler_job_in(env(&[("SLURM_JOB_ID", "780")])), Some(("Slurm", "780".into())));
        assert_eq!(
            scheduler_job_in(env(&[("PBS_JOBID", "12.pbs/x")])),
            Some(("PBS", "12.pbs_x".into()))
        );
        assert_eq!(
            scheduler_job_in(env(&[("LSB_JOBID", "5"), ("LSB_JOBINDEX", "2")])),
            Some(("LSF", "5_2".into()))
        );
        assert_eq!(scheduler_job_in(env(&[("PMIX_NAMESPACE", "1880")])), None);
    }
}
