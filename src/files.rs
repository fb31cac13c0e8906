//! How ddpbench touches files it did not make itself: a file it reads must be a regular
//! file (a FIFO, a device or a socket planted in a run folder would block a reader or
//! feed it without end), and a file it writes is created exclusively, never through a
//! symlink and never over a file that is already there. A leaf: it uses nothing else in
//! the crate.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading only when it is a regular file (a symlink to one is followed).
/// The file is opened without blocking and checked through its open descriptor, so a
/// FIFO with no writer cannot stall the open and nothing can swap the file between the
/// check and the read.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    open_regular_with(path, 0)
}

/// [`open_regular`] with `flags` (`O_NOFOLLOW`) added to the open. A symlink refused by
/// `O_NOFOLLOW` is named as one.
fn open_regular_with(path: &Path, flags: libc::c_int) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if flags & libc::O_NOFOLLOW != 0 => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a symbolic link, not a regular file", path.display()),
            ),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {}, not a regular file", path.display(), describe(kind)),
        ));
    }
    clear_nonblocking(&file)?;
    Ok(file)
}

/// How large a file of one kind may be: the kind in words, as a message names it ("a
/// manifest"), and the most bytes such a file may hold. A reader refuses a larger file
/// before it reads any of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeBound {
    pub what: &'static str,
    pub max_bytes: u64,
}

impl SizeBound {
    /// The error for `path` holding `len` bytes (or more), over this bound.
    fn exceeded(&self, path: &Path, len: u64, at_least: bool) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is {}{}, over the {} {} may hold: it is not a file ddpbench wrote (damaged, or something else put there)",
                path.display(),
                if at_least { "over " } else { "" },
                size_text(len),
                size_text(self.max_bytes),
                self.what
            ),
        )
    }
}

/// A size in bytes as a message shows it: bytes below 1 KiB, else KiB, MiB or GiB (one
/// decimal where it is not whole).
pub(crate) fn size_text(bytes: u64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match units.iter().find(|(size, _)| bytes >= *size) {
        Some(&(size, unit)) if bytes % size == 0 => format!("{} {unit}", bytes / size),
        Some(&(size, unit)) => format!("{:.1} {unit}", bytes as f64 / size as f64),
        None => format!("{bytes} bytes"),
    }
}

/// Reads a whole regular file (a symlink to one is followed) as text, within `bound`:
/// the size the open descriptor reports is checked before anything is read, and a file
/// that grows past the bound while it is read is refused too, so memory stays within the
/// bound whatever the file claims. Err (naming the file, its size and the bound) for a
/// larger file, or one that is no regular file ([`open_regular`]).
pub(crate) fn read_regular_to_string(path: &Path, bound: SizeBound) -> io::Result<String> {
    read_within(open_regular(path)?, path, bound)
}

/// [`read_regular_to_string`] that follows no symlink at the last component: a link there
/// is refused, not read through.
pub(crate) fn read_regular_no_follow_to_string(path: &Path, bound: SizeBound) -> io::Result<String> {
    read_within(open_regular_with(path, libc::O_NOFOLLOW)?, path, bound)
}

fn read_within(file: File, path: &Path, bound: SizeBound) -> io::Result<String> {
    use std::io::Read;
    let len = file.metadata()?.len();
    if len > bound.max_bytes {
        return Err(bound.exceeded(path, len, false));
    }
    let mut text = String::with_capacity(len as usize);
    file.take(bound.max_bytes.saturating_add(1)).read_to_string(&mut text)?;
    if text.len() as u64 > bound.max_bytes {
        return Err(bound.exceeded(path, bound.max_bytes, true));
    }
    Ok(text)
}

/// A reader of CSV text that fails, rather than buffers, on a record (a row, with the
/// line breaks inside its quoted cells) longer than `max_bytes`: a CSV reader holds a
/// whole record in memory, so one edited line of a GiB would otherwise take a GiB. Once
/// it has failed, every later read fails the same way.
pub(crate) struct RecordBounded<R> {
    inner: R,
    max_bytes: u64,
    /// Bytes of the record read so far, and whether they end inside a quoted cell.
    in_record: u64,
    quoted: bool,
    failed: bool,
}

impl<R: io::Read> RecordBounded<R> {
    pub(crate) fn new(inner: R, max_bytes: u64) -> RecordBounded<R> {
        RecordBounded {
            inner,
            max_bytes,
            in_record: 0,
            quoted: false,
            failed: false,
        }
    }

    fn too_long(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a row of over {}, more than any row ddpbench writes: the file was edited or damaged",
                size_text(self.max_bytes)
            ),
        )
    }
}

impl<R: io::Read> io::Read for RecordBounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failed {
            return Err(self.too_long());
        }
        let n = self.inner.read(buf)?;
        for (at, &b) in buf[..n].iter().enumerate() {
            match b {
                // A doubled quote inside a quoted cell toggles twice: still quoted.
                b'"' => self.quoted = !self.quoted,
                b'\n' if !self.quoted => {
                    self.in_record = 0;
                    continue;
                }
                _ => {}
            }
            self.in_record += 1;
            if self.in_record > self.max_bytes {
                self.failed = true;
                // The rows before the long one are handed over whole; the next read fails.
                return if at > 0 { Ok(at) } else { Err(self.too_long()) };
            }
        }
        Ok(n)
    }
}

/// A message for `e`, met opening or reading `path` with [`open_regular`] or
/// [`read_regular_to_string`], that names the file once.
pub(crate) fn read_error(path: &Path, e: &io::Error) -> String {
    let text = e.to_string();
    if text.contains(&*path.to_string_lossy()) {
        text
    } else {
        format!("cannot read {}: {text}", path.display())
    }
}

/// Opens `path` with [`open_regular`]: None when nothing is there, Err ([`read_error`])
/// when what is there is no regular file or cannot be read.
pub(crate) fn open_regular_if_present(path: &Path) -> Result<Option<File>, String> {
    match open_regular(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_error(path, &e)),
    }
}

/// Whether `path` names a regular file, not following a symlink at the last component.
pub(crate) fn is_regular_no_follow(path: &Path) -> bool {
    std::fs::symlink_metadata(path).map(|m| m.file_type().is_file()).unwrap_or(false)
}

/// Creates `path` for writing only when nothing is there: not a file, not a symlink
/// (dangling or not), not a FIFO. Mode 0644 before the umask.
pub(crate) fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// `bytes` random bytes from the kernel (`getrandom`), as lowercase hex: names that no
/// one can guess ahead (a scratch folder, a temporary file) or that two jobs started in
/// the same second do not share.
pub(crate) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: getrandom writes at most the given length into the buffer's tail.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    if filled < buf.len() {
        // No getrandom (a kernel before 3.17): the clock's nanoseconds and the pid,
        // mixed, are still unknown ahead to anyone else.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut x = (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        for b in &mut buf[filled..] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates a new folder `<parent>/<prefix>-<random hex>` (`random_bytes` of randomness)
/// with `mode` (before the umask), and only a new one: `mkdir` never follows a symlink
/// at its last component and fails on anything already there, in which case another
/// random name is tried. The parent must exist.
pub(crate) fn create_dir_fresh(parent: &Path, prefix: &str, random_bytes: usize, mode: u32) -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..64 {
        let dir = parent.join(format!("{prefix}-{}", random_hex(random_bytes)));
        match std::fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free name")))
}

/// Gives the finished file `tmp` the name `path` only when nothing is at `path`: a hard
/// link (which fails on anything there, a dangling symlink too), then `tmp` unlinked.
/// Where the file system makes no hard links, a rename after checking that `path` is free.
pub(crate) fn rename_new(tmp: &Path, path: &Path) -> io::Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => std::fs::remove_file(tmp),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} is already there (ddpbench overwrites no file and writes through no link)",
                path.display()
            ),
        )),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK)) => {
            match std::fs::symlink_metadata(path) {
                Err(m) if m.kind() == io::ErrorKind::NotFound => std::fs::rename(tmp, path),
                _ => Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is already there", path.display()),
                )),
            }
        }
        Err(e) => Err(e),
    }
}

/// What a file type is, in words, for error messages.
pub(crate) fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a folder"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// The longest name one path component may have (Linux's `NAME_MAX`), in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 255;

/// Whether `c` may stand in a name ddpbench uses as one path component as it is: an
/// ASCII letter or digit, `.`, `_` or `-`.
pub(crate) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Why `name` (a run id, the name of a run folder) cannot be one path component as it
/// is, or None when it can: it must be 1 to [`MAX_NAME_BYTES`] bytes of
/// [`is_name_char`] characters, and neither `.` nor `..`. Such a name holds no `/`,
/// so a path it is joined into stays in its folder.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "it is {} bytes long: a folder's name has at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|&c| !is_name_char(c)) {
        return Some(format!("it holds {c:?}: a name has letters, digits, `.`, `_` and `-` only"));
    }
    if name == "." || name == ".." {
        return Some("it names a folder by its place, not a folder".into());
    }
    None
}

/// A file name made from `text` taken from data (a run id, a workload, a model file's
/// name), never a path: every character other than [`is_name_char`]'s becomes `_`, a
/// leading `.` too (no hidden file, no `..`), nothing becomes `_`, and a result longer
/// than 200 bytes keeps its first 200 and a hash of the whole text, so that a prefix
/// and an extension still fit in [`MAX_NAME_BYTES`] and two long texts stay apart.
/// A text of [`is_name_char`] characters only, not starting with `.`, of at most 200
/// bytes, comes back as it is.
pub(crate) fn safe_component(text: &str) -> String {
    const KEEP_BYTES: usize = 200;
    let mut name: String = text.chars().map(|c| if is_name_char(c) { c } else { '_' }).collect();
    if name.starts_with('.') {
        name.replace_range(..1, "_");
    }
    if name.is_empty() {
        name.push('_');
    }
    if name.len() > KEEP_BYTES {
        // FNV-1a over the original text: the same text always gives the same name.
        let hash = text
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        name.truncate(KEEP_BYTES);
        name.push_str(&format!("-{hash:016x}"));
    }
    name
}

/// Files that replace those of the same names in one folder all together or not at all:
/// each is written to a temporary file in that folder (hidden, named after the file,
/// this process and random digits, created exclusively) and checked as it is closed (a network file system may report a full
/// disk only then); [`StagedFiles::commit`] renames every one into place once all are
/// written. Dropped without a commit (an error on the way), it removes its temporary
/// files and the folder keeps the files it had.
pub struct StagedFiles {
    dir: std::path::PathBuf,
    /// (temporary file, final name), in the order written.
    staged: Vec<(std::path::PathBuf, String)>,
}

impl StagedFiles {
    /// Files to be written into `dir`, created (with its parents) when absent.
    pub(crate) fn new(dir: &Path) -> io::Result<StagedFiles> {
        std::fs::create_dir_all(dir).map_err(|e| at_path(dir, "cannot create", e))?;
        Ok(StagedFiles {
            dir: dir.to_path_buf(),
            staged: Vec::new(),
        })
    }

    /// Stages `bytes` as the file `name` (one component: [`safe_component`]'s output, or
    /// a name ddpbench chose). Err names the file and what the system said.
    pub(crate) fn write(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        if name_problem(name).is_some() || name.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("internal error: {name:?} is not a file name of its own"),
            ));
        }
        let target = self.dir.join(name);
        // A name no other writer uses: this process's id and random digits.
        let temp = self.dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), random_hex(8)));
        let mut file = create_exclusive(&temp).map_err(|e| at_path(&temp, "cannot create", e))?;
        // Staged first, so that a failed write is removed with the others.
        self.staged.push((temp, name.to_string()));
        let written = file.write_all(bytes).and_then(|()| close_checked(file));
        written.map_err(|e| at_path(&target, "cannot write", e))
    }

    /// The names of the files staged so far, in the order written.
    pub(crate) fn names(&self) -> Vec<String> {
        self.staged.iter().map(|(_, n)| n.clone()).collect()
    }

    /// Renames every staged file into place, in the order written. Err names the file
    /// that could not be renamed; those renamed before it stay replaced.
    pub(crate) fn commit(mut self) -> io::Result<()> {
        for (temp, name) in std::mem::take(&mut self.staged) {
            let target = self.dir.join(&name);
            if let Err(e) = std::fs::rename(&temp, &target) {
                let _ = std::fs::remove_file(&temp);
                return Err(at_path(&target, "cannot replace", e));
            }
        }
        Ok(())
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        for (temp, _) in &self.staged {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Closes `file`, returning what `close` says: where a network file system reports that
/// data written could not be stored.
fn close_checked(file: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = file.into_raw_fd();
    // SAFETY: `fd` came from `into_raw_fd`, so this is its only owner and it is closed once.
    if unsafe { libc::close(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `e` with `path` and what was being done, for a message that names the file.
fn at_path(path: &Path, doing: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{doing} {}: {e}", path.display()))
}

fn clear_nonblocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns, with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What tests of readers share: a FIFO to plant, and a deadline for a reader that would
/// block on it for good.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;
    use std::time::Duration;

    /// Makes a FIFO (named pipe) at `path`, which nothing ever writes.
    pub(crate) fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path this function owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
    }

    /// What `f` returns, run on a thread of its own; panics when it has not returned
    /// within 10 s (a reader blocked on a FIFO), so the test fails rather than hangs.
    pub(crate) fn returns_promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the reader did not return within 10 s: it waits on the FIFO")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_fifo_is_refused_at_once_and_a_regular_file_reads() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("clock.csv");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = open_regular(&fifo).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        assert!(open_regular(dir.path()).unwrap_err().to_string().contains("a folder"));
        let file = dir.path().join("a.csv");
        std::fs::write(&file, "x,y\n").unwrap();
        let mut s = String::new();
        open_regular(&file).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "x,y\n");
        let bound = |max_bytes| SizeBound {
            what: "a test file",
            max_bytes,
        };
        let e = read_regular_to_string(&file, bound(3)).unwrap_err();
        assert!(
            e.to_string().contains("a.csv is 4 bytes, over the 3 bytes a test file may hold"),
            "{e}"
        );
        assert_eq!(read_regular_to_string(&file, bound(4)).unwrap(), "x,y\n");
        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular_to_string(&link, bound(4)).unwrap(), "x,y\n");
        let e = read_regular_no_follow_to_string(&link, bound(4)).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert!(read_regular_no_follow_to_string(&fifo, bound(4))
            .unwrap_err()
            .to_string()
            .contains("FIFO"));
    }

    #[test]
    fn a_csv_row_longer_than_its_bound_fails_before_it_is_held() {
        let text = format!("a,b\n1,\"x\ny\"\n2,{}\n", "z".repeat(100));
        let mut r = csv::Reader::from_reader(RecordBounded::new(text.as_bytes(), 50));
        let mut rec = csv::ByteRecord::new();
        assert!(r.read_byte_record(&mut rec).unwrap());
        assert_eq!(&rec[1], b"x\ny", "a line break inside quotes is part of the row");
        let e = r.read_byte_record(&mut rec).unwrap_err();
        assert!(e.to_string().contains("a row of over 50 bytes"), "{e}");
        // Short lines inside one quoted cell are one long row.
        let quoted = format!("a\n\"{}\"\n", "x\n".repeat(40));
        let mut r = csv::Reader::from_reader(RecordBounded::new(quoted.as_bytes(), 50));
        assert!(r.read_byte_record(&mut rec).is_err());
        assert_eq!(size_text(64 << 10), "64 KiB");
        assert_eq!(size_text(3_000_000_000), "2.8 GiB");
        assert_eq!(size_text(1000), "1000 bytes");
    }

    #[test]
    fn exclusive_creation_refuses_files_and_symlinks_and_writes_nothing_through_them() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.txt");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("rank-00000.csv");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_exclusive(&link).is_err());
        let dangling = dir.path().join("dangling.csv");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(create_exclusive(&dangling).is_err());
        assert!(!dir.path().join("nowhere").exists());
        assert!(create_exclusive(&target).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let fresh = dir.path().join("fresh.csv");
        create_exclusive(&fresh).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "new");
        assert!(is_regular_no_follow(&fresh) && !is_regular_no_follow(&link));
    }
    #[test]
    fn a_fresh_folder_never_reuses_a_name_and_never_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        assert_eq!(random_hex(8).len(), 16);
        assert_ne!(random_hex(8), random_hex(8));
        let a = create_dir_fresh(dir.path(), "x", 8, 0o700).unwrap();
        let b = create_dir_fresh(dir.path(), "x", 8, 0o700).unwrap();
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("x-"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&a).unwrap().permissions().mode() & 0o077, 0);
        // With one random byte and every even name taken by a symlink, an odd one is made
        // and nothing is made through a link.
        for i in (0..=255u8).step_by(2) {
            std::os::unix::fs::symlink(outside.path(), dir.path().join(format!("y-{i:02x}"))).unwrap();
        }
        for _ in 0..8 {
            let c = create_dir_fresh(dir.path(), "y", 1, 0o755).unwrap();
            let last = u8::from_str_radix(&c.file_name().unwrap().to_str().unwrap()[2..], 16).unwrap();
            assert!(last % 2 == 1 && std::fs::symlink_metadata(&c).unwrap().is_dir(), "{c:?}");
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_finished_file_takes_only_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, path, target) = (dir.path().join(".m.tmp"), dir.path().join("model.pt"), dir.path().join("t"));
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        std::fs::write(&tmp, "new").unwrap();
        assert!(rename_new(&tmp, &path).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_file(&path).unwrap();
        rename_new(&tmp, &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert!(!tmp.exists());
    }

    #[test]
    fn names_from_data_never_leave_their_folder() {
        assert_eq!(name_problem("mnist-cnn-fashion-mnist-n2-20260101T000000Z"), None);
        assert_eq!(name_problem(".tmpAb1"), None);
        for bad in ["", ".", "..", "x/../../escape_pwn", "a b", "rank\n0", "é"] {
            assert!(name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(name_problem(&"a".repeat(256)).unwrap().contains("256 bytes"));
        assert_eq!(safe_component("step_time_per_rank-run0"), "step_time_per_rank-run0");
        assert_eq!(safe_component("x/../../escape_pwn"), "x_.._.._escape_pwn");
        assert_eq!(safe_component(".."), "_.");
        assert_eq!(safe_component(""), "_");
        assert_eq!(safe_component("my model.pt"), "my_model.pt");
        let long = safe_component(&"a".repeat(400));
        let other = safe_component(&("a".repeat(399) + "b"));
        assert!(long.len() <= 217 && long != other, "{long}");
        assert_eq!(long, safe_component(&"a".repeat(400)), "the same text, the same name");
        for text in ["x/../../escape_pwn", "..", "/etc/passwd", &"é/".repeat(300)] {
            let name = safe_component(text);
            assert!(name_problem(&name).is_none() && !name.starts_with('.'), "{text:?} gave {name:?}");
        }
    }

    #[test]
    fn staged_files_replace_all_or_none_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut files = StagedFiles::new(&out).unwrap();
        files.write("a.csv", b"new a").unwrap();
        files.write("b.md", b"new b").unwrap();
        files.commit().unwrap();
        assert_eq!(std::fs::read_to_string(out.join("a.csv")).unwrap(), "new a");
        // An error before the commit: nothing replaced, no temporary file left.
        let mut files = StagedFiles::new(&out).unwrap();
        files.write("a.csv", b"newer a").unwrap();
        assert!(files.write("../escape", b"x").is_err());
        drop(files);
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a.csv", "b.md"]);
        assert_eq!(std::fs::read_to_string(out.join("a.csv")).unwrap(), "new a");
        assert!(!dir.path().join("escape").exists());
    }
}
