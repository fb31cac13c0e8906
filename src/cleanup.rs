//! What a process removes on its way out, however it ends: a scratch folder
//! ([`ScratchDir`], the study's dry run times its workloads in one) and the locks of the
//! folders it writes ([`crate::record::lock`]). On the normal ways out their owners are
//! dropped and remove them; the other ways out call here: an aborted job ([`on_abort`]:
//! a panic, the watchdog's verdict, a rank's own error) and, for a scratch folder, a
//! stop signal ([`on_signal`]), whose handler removes it with system calls alone and
//! ends the process at once, so that nothing writes into the folder again and the
//! SIGKILL that follows a SIGTERM finds nothing left. A report command (`reduce`,
//! `compare`) arms its staging folder and its folder's lock ([`arm_staging`]) and installs
//! [`install_report_signals`], whose handler removes both on SIGINT, SIGTERM, SIGHUP
//! and SIGQUIT and ends the process by that signal; the steps between making such a
//! thing and arming it run in a [`StopsDeferred`] section, which holds the signal back
//! till its end. A leaf beside [`crate::files`].

use std::ffi::{c_char, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The folder locks this process holds, each with the bytes it wrote: removed on abort
/// when the file still holds them.
static LOCKS: Mutex<Vec<(PathBuf, Vec<u8>)>> = Mutex::new(Vec::new());

/// The scratch folder a stop signal removes, as a C string from `CString::into_raw`;
/// taken (swapped for null) by whoever removes it.
static SCRATCH: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// A report command's staging folder and its folder's lock, as C strings from
/// `CString::into_raw`: removed by [`on_report_signal`]; taken (swapped for null) by
/// whoever removes or disarms them.
static STAGING: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
static REPORT_LOCK: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
/// A report command's output folder that it created itself: removed by
/// [`on_report_signal`] when empty once the staging folder and lock are gone.
static CREATED: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// How many [`StopsDeferred`] sections are open: while any is, [`on_report_signal`]
/// only records its signal in [`DEFERRED_SIGNAL`], and the last section to close acts on it.
static DEFERRING: AtomicUsize = AtomicUsize::new(0);
/// A stop signal that arrived inside a [`StopsDeferred`] section; 0 when none.
static DEFERRED_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Folder depth the signal handler descends to (a scratch run folder and its trace
/// folder are 2 and 3 deep).
const MAX_DEPTH: usize = 12;

/// Says that this process holds the lock file `path`, which holds `bytes`.
pub(crate) fn hold_lock(path: &Path, bytes: &[u8]) {
    locks().push((path.to_path_buf(), bytes.to_vec()));
}

/// Says that this process no longer holds the lock file `path`.
pub(crate) fn release_lock(path: &Path) {
    locks().retain(|(p, _)| p != path);
}

fn locks() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Vec<u8>)>> {
    LOCKS.lock().unwrap_or_else(|p| p.into_inner())
}

/// For a job about to be aborted: removes the armed scratch folder and every lock this
/// process holds that still holds what it wrote (a lock taken over by another job stays).
pub(crate) fn on_abort() {
    if let Some(path) = take_scratch() {
        let _ = std::fs::remove_dir_all(Path::new(std::ffi::OsStr::from_bytes(path.as_bytes())));
    }
    // The registry is not waited for: the thread that holds it may be the one aborting.
    let held = match LOCKS.try_lock() {
        Ok(mut l) => std::mem::take(&mut *l),
        Err(std::sync::TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
    };
    for (path, bytes) in held {
        if std::fs::read(&path).is_ok_and(|now| now == bytes) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Called by the stop signals' handler: when a scratch folder is armed, removes it and
/// ends the process by the signal `sig` itself (its default action). Async-signal-safe:
/// system calls on buffers on the stack, no allocation or lock.
pub(crate) fn on_signal(sig: libc::c_int) {
    let p = SCRATCH.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if p.is_null() {
        return;
    }
    // SAFETY: the swap made this call the pointer's only holder; it came from
    // CString::into_raw and is never freed now (a handler frees nothing).
    let path = unsafe { CStr::from_ptr(p) };
    remove_tree(libc::AT_FDCWD, path.as_ptr(), MAX_DEPTH);
    // SAFETY: signal and raise are async-signal-safe; the signal is blocked while its
    // handler runs, so it ends the process as soon as the handler returns.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Arms `slot` with `path`, freeing what it held.
fn arm(slot: &AtomicPtr<c_char>, path: &Path) {
    let new = CString::new(path.as_os_str().as_bytes()).map_or(std::ptr::null_mut(), CString::into_raw);
    let old = slot.swap(new, Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: from CString::into_raw, and the swap made this its only holder.
        drop(unsafe { CString::from_raw(old) });
    }
}

/// Disarms `slot`.
fn disarm(slot: &AtomicPtr<c_char>) {
    let old = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: from CString::into_raw, and the swap made this its only holder.
        drop(unsafe { CString::from_raw(old) });
    }
}

/// Says that a stop signal removes the folder `staging` (a report being staged) and the
/// lock file `lock` of the folder it is for.
pub(crate) fn arm_staging(staging: &Path, lock: &Path) {
    arm(&STAGING, staging);
    arm(&REPORT_LOCK, lock);
}

/// The staging folder is in place or gone: a stop signal leaves it.
pub(crate) fn disarm_staging() {
    disarm(&STAGING);
}

/// The lock is released: a stop signal leaves it.
pub(crate) fn disarm_lock() {
    disarm(&REPORT_LOCK);
}

/// Says that a stop signal removes the folder `out`, which this process created for its
/// report, when nothing else is left in it.
pub(crate) fn arm_created(out: &Path) {
    arm(&CREATED, out);
}

/// The created folder holds the report, or is gone: a stop signal leaves it.
pub(crate) fn disarm_created() {
    disarm(&CREATED);
}

/// A stretch of a report command in which a stop signal is held back until its end: the
/// steps between creating a file or folder and arming its removal (and between
/// disarming and removing it), and the renames that put a report in place. A signal that
/// arrives inside is acted on when the last open section ends, so that a stopped command
/// leaves either no trace or a whole report. Each section is a few system calls long.
#[must_use = "the section ends when this is dropped"]
pub(crate) struct StopsDeferred(());

impl StopsDeferred {
    pub(crate) fn begin() -> StopsDeferred {
        DEFERRING.fetch_add(1, Ordering::SeqCst);
        StopsDeferred(())
    }
}

impl Drop for StopsDeferred {
    fn drop(&mut self) {
        // The handler records its signal before it looks at DEFERRING, and this looks at
        // the record after closing the section: one of the two acts on every signal.
        if DEFERRING.fetch_sub(1, Ordering::SeqCst) == 1 {
            let sig = DEFERRED_SIGNAL.swap(0, Ordering::SeqCst);
            if sig != 0 {
                stop_report(sig);
            }
        }
    }
}

/// The stop signals a report command cleans up after.
pub(crate) const REPORT_STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Installs [`on_report_signal`] for [`REPORT_STOP_SIGNALS`], in a report command's
/// process (never in a training job, whose stop signals are its own).
pub(crate) fn install_report_signals() {
    for sig in REPORT_STOP_SIGNALS {
        // SAFETY: the handler makes only async-signal-safe system calls.
        unsafe {
            libc::signal(sig, on_report_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// A report command's stop signals' handler: inside a [`StopsDeferred`] section it
/// records the signal for the section's end; elsewhere it stops the command
/// ([`stop_report`]). Async-signal-safe: atomics and system calls alone.
pub(crate) extern "C" fn on_report_signal(sig: libc::c_int) {
    DEFERRED_SIGNAL.store(sig, Ordering::SeqCst);
    if DEFERRING.load(Ordering::SeqCst) > 0 {
        return;
    }
    // Taken here unless a section that just ended took it first.
    let sig = DEFERRED_SIGNAL.swap(0, Ordering::SeqCst);
    if sig != 0 {
        stop_report(sig);
    }
}

/// Removes the armed staging folder, lock and created folder (the lock is this
/// process's while armed: a lock is taken over only from a process that has ended), then
/// ends the process by `sig` itself. Async-signal-safe: system calls on strings armed
/// before, no allocation or lock.
fn stop_report(sig: libc::c_int) {
    let staging = STAGING.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !staging.is_null() {
        remove_tree(libc::AT_FDCWD, staging, MAX_DEPTH);
    }
    let lock = REPORT_LOCK.swap(std::ptr::null_mut(), Ordering::SeqCst);
    let created = CREATED.swap(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: unlink, rmdir, signal and raise are async-signal-safe; the strings are
    // never freed here (a handler frees nothing); the signal is blocked while its handler
    // runs, so it ends the process as soon as the handler returns, and outside a handler
    // the default action ends it at once.
    unsafe {
        if !lock.is_null() {
            libc::unlink(lock);
        }
        if !created.is_null() {
            libc::rmdir(created);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn take_scratch() -> Option<CString> {
    let p = SCRATCH.swap(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: from CString::into_raw, and the swap made this its only holder.
    (!p.is_null()).then(|| unsafe { CString::from_raw(p) })
}

/// Removes `name` in the folder `dirfd`: a file or a symlink (never followed) is
/// unlinked, a folder emptied (at most `depth` levels down) and removed. System calls
/// only, for a signal handler.
fn remove_tree(dirfd: libc::c_int, name: *const c_char, depth: usize) {
    // SAFETY: every call below takes a NUL-terminated name and descriptors this function
    // opened; the directory entries are read into a buffer on the stack.
    unsafe {
        if libc::unlinkat(dirfd, name, 0) == 0 || *libc::__errno_location() != libc::EISDIR || depth == 0 {
            return;
        }
        let fd = libc::openat(dirfd, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        // linux_dirent64: inode (8 bytes), offset (8), record length (2), type (1), name.
        let mut buf = [0u64; 256];
        for _pass in 0..4 {
            let mut seen = false;
            libc::lseek(fd, 0, libc::SEEK_SET);
            loop {
                let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), std::mem::size_of_val(&buf));
                if n <= 0 {
                    break;
                }
                let bytes = buf.as_ptr().cast::<u8>();
                let mut at = 0usize;
                while at < n as usize {
                    let reclen = u16::from_ne_bytes([*bytes.add(at + 16), *bytes.add(at + 17)]) as usize;
                    let entry = bytes.add(at + 19).cast::<c_char>();
                    let dot = *entry == b'.' as c_char && (*entry.add(1) == 0 || (*entry.add(1) == b'.' as c_char && *entry.add(2) == 0));
                    if !dot {
                        seen = true;
                        remove_tree(fd, entry, depth - 1);
                    }
                    at += reclen.max(1);
                }
            }
            if !seen {
                break;
            }
        }
        libc::close(fd);
        libc::unlinkat(dirfd, name, libc::AT_REMOVEDIR);
    }
}

/// A folder of this process's own in `$TMPDIR`, made with a random name (created
/// exclusively, mode 0700: nothing planted ahead can stand in for it) and removed on
/// every way out: when dropped, on abort ([`on_abort`]), and by a stop signal
/// ([`on_signal`]), which then ends the process.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Makes `$TMPDIR/<prefix>-<16 random hex digits>` and arms its removal.
    pub(crate) fn create(prefix: &str) -> std::io::Result<ScratchDir> {
        let path = crate::files::create_dir_fresh(&std::env::temp_dir(), prefix, 8, 0o700)?;
        if let Ok(c) = CString::new(path.as_os_str().as_bytes()) {
            let old = SCRATCH.swap(c.into_raw(), Ordering::SeqCst);
            if !old.is_null() {
                // SAFETY: from CString::into_raw, and the swap made this its only holder.
                drop(unsafe { CString::from_raw(old) });
            }
        }
        Ok(ScratchDir { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let armed = SCRATCH.load(Ordering::SeqCst);
        // SAFETY: read only to compare; freed below only by the one that swaps it out.
        let ours = !armed.is_null() && unsafe { CStr::from_ptr(armed) }.to_bytes() == self.path.as_os_str().as_bytes();
        if ours
            && SCRATCH
                .compare_exchange(armed, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            // SAFETY: the exchange made this its only holder.
            drop(unsafe { CString::from_raw(armed) });
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What a process does on its way out is one per process: the locks it holds (which
/// [`on_abort`] removes), its scratch folder, the stop signals' handler and the last
/// records that handler writes. Every test that takes a folder lock, arms a scratch
/// folder or the last records, raises a stop signal or calls [`on_abort`] takes its turn
/// here: another test's `on_abort` would remove its lock, and a signal raised while a
/// scratch folder is armed ends the test process.
#[cfg(test)]
static TEST_TURN: Mutex<()> = Mutex::new(());

/// Waits for this test's turn at the process's exit-path state ([`TEST_TURN`]).
#[cfg(test)]
pub(crate) fn test_turn() -> std::sync::MutexGuard<'static, ()> {
    TEST_TURN.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree three levels deep with a symlink to a folder outside and one to a file outside.
    fn tree(root: &Path, outside: &Path) {
        std::fs::create_dir_all(root.join("run/trace")).unwrap();
        std::fs::write(root.join("run/rank-00000.csv"), "a\n").unwrap();
        std::fs::write(root.join("run/trace/rank-00000.trace.json"), "[").unwrap();
        for i in 0..300 {
            std::fs::write(root.join(format!("run/f{i:03}")), "x").unwrap();
        }
        std::fs::write(outside.join("keep.txt"), "keep").unwrap();
        std::os::unix::fs::symlink(outside, root.join("run/to-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep.txt"), root.join("to-file")).unwrap();
    }

    #[test]
    fn the_handlers_removal_takes_the_whole_tree_and_follows_no_link() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = d.path().join("scratch");
        tree(&root, outside.path());
        let c = CString::new(root.as_os_str().as_bytes()).unwrap();
        remove_tree(libc::AT_FDCWD, c.as_ptr(), MAX_DEPTH);
        assert!(!root.exists() && std::fs::symlink_metadata(&root).is_err());
        assert_eq!(std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(), "keep");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_scratch_folder_goes_when_dropped_and_on_abort() {
        let _t = test_turn();
        let outside = tempfile::tempdir().unwrap();
        let s = ScratchDir::create("ddpbench-test-scratch").unwrap();
        let path = s.path().to_path_buf();
        assert!(path.starts_with(std::env::temp_dir()));
        tree(&path, outside.path());
        drop(s);
        assert!(!path.exists());
        assert!(SCRATCH.load(Ordering::SeqCst).is_null(), "disarmed when dropped");
        let s = ScratchDir::create("ddpbench-test-scratch").unwrap();
        let path = s.path().to_path_buf();
        tree(&path, outside.path());
        on_abort();
        assert!(!path.exists());
        drop(s);
        assert_eq!(std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(), "keep");
    }

    /// A stop signal raised inside a [`StopsDeferred`] section removes nothing till the
    /// section ends, and then removes what is armed; one raised outside acts at once.
    /// SIGWINCH stands in for a stop signal: its default action, which the handler ends
    /// with, is to do nothing, so the test process lives on.
    #[test]
    fn a_stop_inside_a_section_waits_for_its_end() {
        let _t = test_turn();
        let d = tempfile::tempdir().unwrap();
        let arm_all = || {
            let (staging, lock, created) = (d.path().join("staging"), d.path().join("out/.lock"), d.path().join("out"));
            std::fs::create_dir_all(staging.join("sub")).unwrap();
            std::fs::write(staging.join("sub/f"), "x").unwrap();
            std::fs::create_dir_all(&created).unwrap();
            std::fs::write(&lock, "me").unwrap();
            arm_staging(&staging, &lock);
            arm_created(&created);
        };
        let raise = || {
            // SAFETY: on_report_signal makes only async-signal-safe calls; raise runs the
            // handler on this thread before it returns.
            unsafe {
                libc::signal(libc::SIGWINCH, on_report_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
                libc::raise(libc::SIGWINCH);
            }
        };
        let names = || {
            let mut n: Vec<String> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        arm_all();
        let outer = StopsDeferred::begin();
        let inner = StopsDeferred::begin();
        raise();
        drop(inner);
        assert_eq!(names(), ["out", "staging"], "acted on before the outer section ended");
        assert_eq!(DEFERRED_SIGNAL.load(Ordering::SeqCst), libc::SIGWINCH);
        drop(outer);
        assert!(names().is_empty(), "left {:?}", names());
        assert_eq!(DEFERRED_SIGNAL.load(Ordering::SeqCst), 0);
        arm_all();
        raise();
        assert!(names().is_empty(), "left {:?}", names());
        for slot in [&STAGING, &REPORT_LOCK, &CREATED] {
            assert!(slot.load(Ordering::SeqCst).is_null(), "still armed");
        }
    }

    #[test]
    fn on_abort_removes_only_the_locks_that_are_still_ours() {
        let _t = test_turn();
        let d = tempfile::tempdir().unwrap();
        let (mine, taken, released) = (d.path().join("a.lock"), d.path().join("b.lock"), d.path().join("c.lock"));
        for p in [&mine, &taken, &released] {
            std::fs::write(p, "me").unwrap();
            hold_lock(p, b"me");
        }
        std::fs::write(&taken, "another job").unwrap();
        release_lock(&released);
        on_abort();
        assert!(!mine.exists());
        assert_eq!(std::fs::read_to_string(&taken).unwrap(), "another job");
        assert!(released.exists());
    }
}
