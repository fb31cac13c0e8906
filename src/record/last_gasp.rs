//! The last record a rank writes from its signal handler.
//!
//! A rank blocked inside a collective when a peer dies never returns to its loop: Open
//! MPI sends it SIGTERM and, a second later, SIGKILL. So once training starts, each rank
//! keeps an `interrupted` version of its `rank-NNNNN.end.json` ready (rank 0 also one of
//! `manifest.json`): the file open for writing and its bytes rendered but for three
//! slots (the signal's error, the time and the steps done). The handler copies it into a
//! buffer made beforehand, the slots filled by plain arithmetic, and writes each file
//! with one `pwrite` at offset 0: no allocation, lock or formatting, only
//! async-signal-safe calls. Last, rank 0's handler removes the run folder's lock
//! ([`super::lock`]) when it still holds what rank 0 wrote: a rank ended before it could
//! stop leaves no lock behind, and the run's files refuse any later job on the folder.
//!
//! The version written is never shorter than the file it overwrites (it is padded with
//! spaces, which JSON ignores), so no old byte stays at its end. Every other writer of
//! these files renames a new file over the name ([`super::write_atomic`]): once the
//! run's real outcome is written, the handler's descriptor points at the replaced file,
//! which no name reaches any more, and a late signal cannot undo the outcome.

use super::{EndRecord, Manifest, RunStatus};
use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Longest signal name the error holds (`SIGTERM`, `SIGUSR1`, ...).
const SIGNAL_MAX: usize = 16;
const ERROR_MIDDLE: &[u8] = b" with ";
const ERROR_END: &[u8] = b" steps done: the rank was ended before it could stop after a step (recorded by its signal handler)";
/// The error's slot: the quoted text at its longest (20 digits: any u64).
const ERROR_WIDTH: usize = 2 + SIGNAL_MAX + ERROR_MIDDLE.len() + 20 + ERROR_END.len();
/// Stands for the time while rendering: as wide as an RFC 3339 stamp.
const TIME_MARK: &str = "@@ddpbench-last-gasp-time@@";

/// Steps completed by this rank, for the handler's record.
static STEPS: AtomicU64 = AtomicU64::new(0);
/// The armed records; taken (swapped for null) by the one handler call that writes them.
static ARMED: AtomicPtr<Armed> = AtomicPtr::new(std::ptr::null_mut());

/// What the handler writes in a slot.
#[derive(Debug, Clone, Copy)]
enum Fill {
    Error,
    Time,
    Steps,
}

/// Where a slot's stand-in is in a rendered file, how wide it is, and what replaces it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    at: usize,
    width: usize,
    fill: Fill,
}

/// A file's `interrupted` version, rendered with stand-ins in its slots.
#[derive(Debug)]
pub(crate) struct Template {
    bytes: Vec<u8>,
    /// In the order they come in the file.
    slots: Vec<Slot>,
}

impl Template {
    /// The `interrupted` version of the end record `running`.
    pub(crate) fn end_record(running: &EndRecord) -> Result<Template> {
        let marked = EndRecord {
            status: RunStatus::Interrupted,
            error: Some(error_mark()),
            steps: usize::MAX,
            time_utc: TIME_MARK.into(),
            ..running.clone()
        };
        let mut t = Template::find_slots(serde_json::to_string_pretty(&marked)? + "\n")?;
        // `usize::MAX` stands for the steps (no name holds it: find_once checks).
        let steps = format!("\"steps\": {}", usize::MAX);
        let at = find_once(&t.bytes, steps.as_bytes())?;
        let width = usize::MAX.to_string().len();
        t.slots.push(Slot {
            at: at + steps.len() - width,
            width,
            fill: Fill::Steps,
        });
        t.slots.sort_by_key(|s| s.at);
        Ok(t)
    }

    /// The `interrupted` version of the manifest `running` (its end time and error filled
    /// in by the handler).
    pub(crate) fn manifest(running: &Manifest) -> Result<Template> {
        let mut marked = running.clone();
        marked.status = RunStatus::Interrupted.as_str().into();
        marked.error = Some(error_mark());
        marked.end_utc = Some(TIME_MARK.into());
        Template::find_slots(serde_json::to_string_pretty(&marked)? + "\n")
    }

    fn find_slots(text: String) -> Result<Template> {
        let bytes = text.into_bytes();
        let mut slots = Vec::new();
        for (mark, fill) in [(error_mark(), Fill::Error), (TIME_MARK.to_string(), Fill::Time)] {
            let quoted = format!("\"{mark}\"");
            slots.push(Slot {
                at: find_once(&bytes, quoted.as_bytes())?,
                width: quoted.len(),
                fill,
            });
        }
        slots.sort_by_key(|s| s.at);
        Ok(Template { bytes, slots })
    }
}

/// Stands for the error while rendering: a string exactly as wide as the slot's text.
fn error_mark() -> String {
    format!("{:@<w$}", "@@ddpbench-last-gasp-error", w = ERROR_WIDTH - 2)
}

/// Where `needle` is in `hay`, when it is there exactly once.
fn find_once(hay: &[u8], needle: &[u8]) -> Result<usize> {
    let mut hits = hay.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle);
    match (hits.next(), hits.next()) {
        (Some((at, _)), None) => Ok(at),
        _ => bail!(
            "cannot prepare the signal handler's last record: a stand-in for its slots appears in the run's own text \
             (its folder name, host or command line)"
        ),
    }
}

/// One file the handler writes, open and ready.
struct Ready {
    file: File,
    t: Template,
    /// The file's bytes are made here: as long as the template or the file, whichever is longer.
    out: Box<[u8]>,
    /// The file's length when armed: what is written covers it.
    min_len: usize,
}

impl Ready {
    /// Puts the template with its slots filled into `out`, padded to the old length,
    /// and writes it at offset 0. Called from a signal handler: slices and arithmetic,
    /// then `pwrite`.
    fn write(&mut self, signal: &[u8], steps: u64, stamp: &[u8; 27]) {
        let mut digits = [0u8; 20];
        let steps = decimal(steps, &mut digits);
        let signal = &signal[..signal.len().min(SIGNAL_MAX)];
        let (bytes, mut w) = (&self.t.bytes, Writer { out: &mut self.out, at: 0 });
        let mut from = 0;
        for slot in &self.t.slots {
            w.put(&bytes[from..slot.at]);
            match slot.fill {
                Fill::Error => w.put_all(&[b"\"", signal, ERROR_MIDDLE, steps, ERROR_END, b"\""]),
                Fill::Time => w.put_all(&[b"\"", stamp, b"\""]),
                Fill::Steps => w.put(steps),
            }
            from = slot.at + slot.width;
        }
        // Spaces before the final newline, as many as cover the old file: still JSON.
        w.put(&bytes[from..bytes.len() - 1]);
        while w.at + 1 < self.min_len {
            w.put(b" ");
        }
        w.put(b"\n");
        let len = w.at;
        let (fd, b) = (self.file.as_raw_fd(), &self.out[..len]);
        let mut done = 0usize;
        while done < b.len() {
            // SAFETY: writes from a live buffer of b.len() bytes to a descriptor this
            // process owns; pwrite is async-signal-safe.
            let n = unsafe { libc::pwrite(fd, b[done..].as_ptr().cast(), b.len() - done, done as libc::off_t) };
            if n > 0 {
                done += n as usize;
            } else if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            } else {
                break;
            }
        }
    }
}

/// Bytes appended to a fixed buffer, cut at its end (sized so that they never are).
struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, part: &[u8]) {
        let n = part.len().min(self.out.len() - self.at);
        self.out[self.at..self.at + n].copy_from_slice(&part[..n]);
        self.at += n;
    }

    fn put_all(&mut self, parts: &[&[u8]]) {
        for p in parts {
            self.put(p);
        }
    }
}

/// `n` in decimal, in `buf`'s tail.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

struct Armed {
    files: Vec<Ready>,
    /// The run folder's reserve ([`super::reserve`]), open, and its path: emptied and
    /// removed first, so the writes have room on a full disk.
    reserve: Option<(File, CString)>,
    /// The run folder's lock, on rank 0: removed last.
    lock: Option<HeldLock>,
}

/// The run folder's lock ([`super::lock`]) as the handler removes it: its path, what it
/// holds, and room to read it back.
struct HeldLock {
    path: CString,
    bytes: Box<[u8]>,
    /// One byte longer than `bytes`, so a longer file does not compare equal.
    buf: Box<[u8]>,
}

impl HeldLock {
    /// Unlinks the lock when it still holds `bytes` (another job may hold it now).
    /// Called from a signal handler: open, read, compare, close, unlink.
    fn release(&mut self) {
        // SAFETY: a NUL-terminated path, a buffer of buf.len() bytes this struct owns,
        // and a descriptor opened here; each call is async-signal-safe.
        unsafe {
            let fd = libc::open(
                self.path.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            let mut got = 0usize;
            while got < self.buf.len() {
                let n = libc::read(fd, self.buf[got..].as_mut_ptr().cast(), self.buf.len() - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            libc::close(fd);
            if self.buf[..got] == self.bytes[..] {
                libc::unlink(self.path.as_ptr());
            }
        }
    }
}

/// The handler's records while a run trains; disarmed when dropped.
#[must_use = "the records are disarmed when this is dropped"]
pub(crate) struct LastGasp(());

impl LastGasp {
    /// Opens each file (which must exist: the handler overwrites it), makes room for its
    /// record (at least the file's length) and arms the handler with them. `reserve` is the
    /// run folder's reserve file (opened when it is there); `lock`, the run folder's lock
    /// this process holds, which the handler removes after the records: the run's files
    /// then refuse any other job, and a rank ended before it could stop leaves no lock.
    pub(crate) fn arm(targets: Vec<(PathBuf, Template)>, reserve: &Path, lock: Option<&super::lock::FolderLock>) -> Result<LastGasp> {
        let mut files = Vec::with_capacity(targets.len());
        for (path, t) in targets {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .with_context(|| format!("cannot open {} for the signal handler's record", path.display()))?;
            let min_len = file.metadata()?.len() as usize;
            let out = vec![0u8; min_len.max(t.bytes.len())].into_boxed_slice();
            files.push(Ready { file, t, out, min_len });
        }
        let reserve_fd = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(reserve)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        let armed = Box::new(Armed {
            files,
            reserve: reserve_fd.zip(CString::new(reserve.as_os_str().as_bytes()).ok()),
            lock: lock.and_then(|l| {
                Some(HeldLock {
                    path: CString::new(l.path().as_os_str().as_bytes()).ok()?,
                    bytes: l.bytes().into(),
                    buf: vec![0u8; l.bytes().len() + 1].into_boxed_slice(),
                })
            }),
        });
        STEPS.store(0, Ordering::SeqCst);
        replace(Box::into_raw(armed));
        Ok(LastGasp(()))
    }
}

impl Drop for LastGasp {
    fn drop(&mut self) {
        replace(std::ptr::null_mut());
    }
}

/// Arms `next` (or nothing) and frees what was armed before: a handler that took it
/// swapped it out first, so nothing else holds it.
fn replace(next: *mut Armed) {
    let old = ARMED.swap(next, Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: `old` came from Box::into_raw in `arm` and the swap made this its only holder.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// Steps this rank has completed, for the handler's record.
pub(crate) fn set_steps(steps: usize) {
    STEPS.store(steps as u64, Ordering::Relaxed);
}

/// Writes the armed records, once, for the signal named `signal`. Async-signal-safe:
/// called from the handler. The records stay allocated for good (a handler frees nothing).
pub(crate) fn fire(signal: &[u8]) {
    let p = ARMED.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if p.is_null() {
        return;
    }
    // SAFETY: the swap made this call the pointer's only holder, and nothing frees it now.
    let armed = unsafe { &mut *p };
    // SAFETY: errno is thread-local; the interrupted code must find it as it left it.
    let errno = unsafe { *libc::__errno_location() };
    if let Some((f, path)) = &armed.reserve {
        // SAFETY: a descriptor this process owns and a NUL-terminated path; ftruncate
        // and unlink are async-signal-safe. Emptying frees the room at once, even while
        // other ranks still hold the file open.
        unsafe {
            libc::ftruncate(f.as_raw_fd(), 0);
            libc::unlink(path.as_ptr());
        }
    }
    let stamp = now_stamp();
    let steps = STEPS.load(Ordering::Relaxed);
    for f in armed.files.iter_mut() {
        f.write(signal, steps, &stamp);
    }
    if let Some(lock) = armed.lock.as_mut() {
        lock.release();
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The time now, RFC 3339 UTC, from `clock_gettime` (async-signal-safe).
fn now_stamp() -> [u8; 27] {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: fills a timespec on the stack.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    super::rfc3339_utc_bytes(ts.tv_sec, (ts.tv_nsec / 1000) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler is one per process ([`crate::cleanup::test_turn`]).
    fn turn() -> std::sync::MutexGuard<'static, ()> {
        crate::cleanup::test_turn()
    }

    fn running(dir: &Path) -> EndRecord {
        let rec = EndRecord {
            run_id: "run".into(),
            rank: 3,
            host: "node-7".into(),
            status: RunStatus::Running,
            error: None,
            steps: 0,
            time_utc: "2026-01-01T00:00:00.000000Z".into(),
        };
        rec.write(dir).unwrap();
        rec
    }

    #[test]
    fn the_handler_turns_a_running_record_interrupted_once_and_not_after_disarming() {
        let _turn = turn();
        let d = tempfile::tempdir().unwrap();
        let rec = running(d.path());
        let path = d.path().join(super::super::end_file_name(3));
        let reserve = d.path().join("reserve");
        std::fs::write(&reserve, b"room").unwrap();
        let gasp = LastGasp::arm(vec![(path.clone(), Template::end_record(&rec).unwrap())], &reserve, None).unwrap();
        set_steps(12_345);
        fire(b"SIGUSR2");
        let end = EndRecord::read(d.path(), 3).unwrap();
        assert_eq!(
            (end.status, end.steps, end.host.as_str()),
            (RunStatus::Interrupted, 12_345, "node-7")
        );
        assert!(
            end.error
                .as_deref()
                .unwrap()
                .starts_with("SIGUSR2 with 12345 steps done: the rank was ended"),
            "{end:?}"
        );
        assert_eq!(end.time_utc.len(), 27);
        assert!(!reserve.exists(), "the reserve is given back first");
        // Once: a second signal writes nothing.
        running(d.path());
        fire(b"SIGTERM");
        assert_eq!(EndRecord::read(d.path(), 3).unwrap().status, RunStatus::Running);
        drop(gasp);
        // Disarmed: nothing written.
        let rec = running(d.path());
        let gasp = LastGasp::arm(vec![(path.clone(), Template::end_record(&rec).unwrap())], &reserve, None).unwrap();
        drop(gasp);
        fire(b"SIGTERM");
        assert_eq!(EndRecord::read(d.path(), 3).unwrap().status, RunStatus::Running);
    }

    #[test]
    fn the_handler_removes_the_run_folders_lock_last_and_only_while_it_is_ours() {
        use super::super::lock::{FolderLock, LOCK_FILE};
        let _turn = turn();
        let d = tempfile::tempdir().unwrap();
        let rec = running(d.path());
        let path = d.path().join(super::super::end_file_name(3));
        let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
        let gasp = LastGasp::arm(
            vec![(path.clone(), Template::end_record(&rec).unwrap())],
            &d.path().join("r"),
            Some(&lock),
        )
        .unwrap();
        fire(b"SIGTERM");
        assert!(!d.path().join(LOCK_FILE).exists());
        assert_eq!(EndRecord::read(d.path(), 3).unwrap().status, RunStatus::Interrupted);
        drop((gasp, lock));
        // Taken over by another job meanwhile: it stays.
        let rec = running(d.path());
        let lock = FolderLock::take(d.path(), "run folder", false).unwrap();
        let gasp = LastGasp::arm(vec![(path, Template::end_record(&rec).unwrap())], &d.path().join("r"), Some(&lock)).unwrap();
        std::fs::write(d.path().join(LOCK_FILE), "another job's").unwrap();
        fire(b"SIGTERM");
        drop((gasp, lock));
        assert_eq!(std::fs::read_to_string(d.path().join(LOCK_FILE)).unwrap(), "another job's");
    }

    #[test]
    fn a_record_replaced_by_rename_is_not_overwritten() {
        let _turn = turn();
        let d = tempfile::tempdir().unwrap();
        let rec = running(d.path());
        let path = d.path().join(super::super::end_file_name(3));
        let _gasp = LastGasp::arm(vec![(path, Template::end_record(&rec).unwrap())], &d.path().join("r"), None).unwrap();
        let done = EndRecord {
            status: RunStatus::Completed,
            steps: 9,
            ..rec
        };
        done.write(d.path()).unwrap();
        fire(b"SIGTERM");
        assert_eq!(EndRecord::read(d.path(), 3).unwrap(), done);
    }

    #[test]
    fn a_shorter_record_is_padded_to_cover_the_old_one() {
        let _turn = turn();
        let d = tempfile::tempdir().unwrap();
        let mut rec = running(d.path());
        // A longer file on disk than the template: the old tail must not survive.
        rec.host = "h".repeat(400);
        rec.write(d.path()).unwrap();
        rec.host = "h".into();
        let path = d.path().join(super::super::end_file_name(3));
        let _gasp = LastGasp::arm(vec![(path, Template::end_record(&rec).unwrap())], &d.path().join("r"), None).unwrap();
        fire(b"SIGINT");
        let end = EndRecord::read(d.path(), 3).unwrap();
        assert_eq!((end.status, end.host.as_str()), (RunStatus::Interrupted, "h"));
    }
}
