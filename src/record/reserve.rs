//! Room kept on a run's file system for the run's last records. A disk that fills during
//! training must still let the run say so: `manifest.json` marked failed and the ranks'
//! end records, each written through a new temporary file ([`super::write_atomic`]). So
//! before the manifest, rank 0 writes [`RESERVE_FILE`] into the run folder, and a write
//! of a record that finds the disk full cuts the reserve short by what it needs (under a
//! lock, since several ranks may fail at once) and tries once more. The reserve goes
//! when the run ends (or a signal handler's last record is written); only a job killed
//! outright on every rank leaves it behind.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The reserve's name in the run folder.
pub(crate) const RESERVE_FILE: &str = ".ddpbench-reserve";

/// Room beyond the manifest's own size: the end records and the failure's text.
const MARGIN_BYTES: u64 = 64 << 10;

/// The reserve of one run folder; removed when dropped.
#[derive(Debug)]
pub(crate) struct Reserve {
    dir: PathBuf,
}

impl Reserve {
    /// Writes a reserve in `dir` large enough to rewrite a manifest of `manifest_bytes`
    /// (plus the margin), or removes what it wrote and says why.
    pub(crate) fn make(dir: &Path, manifest_bytes: u64) -> Result<Reserve> {
        let bytes = (manifest_bytes + MARGIN_BYTES).div_ceil(MARGIN_BYTES) * MARGIN_BYTES;
        let path = dir.join(RESERVE_FILE);
        // Created exclusively: a file already there (planted, or a link) is refused, not
        // written through, and not removed.
        let written = crate::files::create_exclusive(&path).and_then(|f| {
            let filled = write_filler(f, bytes);
            if filled.is_err() {
                let _ = std::fs::remove_file(&path);
            }
            filled
        });
        written.with_context(|| {
            format!(
                "cannot keep {} KiB free in {} for the run's last records (is the file system full or gone?)",
                bytes >> 10,
                dir.display()
            )
        })?;
        Ok(Reserve { dir: dir.to_path_buf() })
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(RESERVE_FILE));
    }
}

/// Gives back enough of `dir`'s reserve to write a file of `bytes` (whole blocks, and
/// two more for the file's own bookkeeping), or all of it when it holds less. Returns
/// the bytes given back.
pub(crate) fn release(dir: &Path, bytes: u64) -> u64 {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::io::AsRawFd;
    let path = dir.join(RESERVE_FILE);
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    else {
        return 0;
    };
    // SAFETY: locks a descriptor this function owns; the lock goes when `f` is closed.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    let Ok(meta) = f.metadata().and_then(|m| {
        if m.is_file() {
            Ok(m)
        } else {
            Err(std::io::ErrorKind::InvalidInput.into())
        }
    }) else {
        return 0;
    };
    let block = meta.blksize().max(512);
    let need = bytes.div_ceil(block) * block + 2 * block;
    let keep = meta.len().saturating_sub(need);
    if keep == 0 {
        let _ = std::fs::remove_file(&path);
    } else if f.set_len(keep).is_err() {
        return 0;
    }
    meta.len() - keep
}

/// `bytes` of data that no file system stores in less room (zeros and repeated bytes are
/// compressed or kept as holes by some), synced so the space is really taken.
fn write_filler(mut f: std::fs::File, bytes: u64) -> std::io::Result<()> {
    let mut chunk = vec![0u8; MARGIN_BYTES as usize];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in chunk.iter_mut() {
        // xorshift64: incompressible enough, and cheap.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_takes_room_and_gives_it_back() {
        let d = tempfile::tempdir().unwrap();
        let r = Reserve::make(d.path(), 5000).unwrap();
        let len = std::fs::metadata(d.path().join(RESERVE_FILE)).unwrap().len();
        assert_eq!(len, 128 << 10, "5000 B + 64 KiB, in 64 KiB steps");
        // A write of 10 000 bytes takes 3 blocks and 2 more: 20 KiB of 4 KiB blocks.
        let block = std::os::unix::fs::MetadataExt::blksize(&std::fs::metadata(d.path().join(RESERVE_FILE)).unwrap());
        let given = release(d.path(), 10_000);
        assert_eq!(given, 5 * block);
        assert_eq!(std::fs::metadata(d.path().join(RESERVE_FILE)).unwrap().len(), len - given);
        // More than is left: all of it, and the file goes.
        assert_eq!(release(d.path(), 1 << 30), len - given);
        assert!(!d.path().join(RESERVE_FILE).exists());
        assert_eq!(release(d.path(), 1), 0, "nothing left to release");
        drop(r);
    }
}
