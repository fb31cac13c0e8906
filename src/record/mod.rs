//! What a run leaves behind: one long-form CSV per rank (`rank-00000.csv`, one row
//! per step), `epochs.csv` (validation per epoch, rank 0), and `manifest.json`
//! (configuration, versions, every rank's placement, outcome, and the [`key`] runs are
//! compared by).
//!
//! CSV conventions: RFC 4180, snake_case headers with units, plain decimals with a
//! dot, RFC 3339 UTC timestamps beside numeric seconds, so spreadsheets import
//! every number as a number.

mod cells;
pub(crate) mod clock;
mod end;
pub(crate) mod key;
pub(crate) mod last_gasp;
pub(crate) mod lock;
mod manifest;
pub(crate) mod reserve;
mod rows;
pub(crate) mod settings;
pub(crate) mod settle;
mod sweep;
pub(crate) mod warning;

pub(crate) use cells::Cells;
pub(crate) use end::{end_file_name, write_atomic, EndRecord, RunStatus};
pub use key::ComparisonKey;
pub use settings::{
    AmpMode, Backend, DeviceKind, GradDtype, MallocMode, Memory, MemoryFormat, NoiseScaleMode, OptimizerKind, Overlap, PhaseSync, Twin,
};

pub(crate) use manifest::schema_problem;
pub use manifest::{
    AllreduceProbe, ClockSummary, CommInfo, GpuClocks, Manifest, PointId, RankInfo, ScriptFile, StudyRun, TargetGoal, TargetOutcome,
    SCHEMA_VERSION,
};
#[cfg(test)]
pub(crate) use rows::epoch_tests::epoch as epoch_row_example;
pub use rows::{EpochRow, Phase, PhaseArray, PhaseRole, PhaseTimes, StepRow};
#[cfg(feature = "train")]
pub(crate) use sweep::{Buffer, SweepRow};
pub use warning::{RunWarning, WarningCode};

use anyhow::{Context, Result};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes an f64 as a plain decimal (never `1e-6`), up to 9 decimals, trailing
/// zeros trimmed, so every spreadsheet reads it as a number; NaN and infinities
/// (undefined figures, e.g. a speedup interval of the baseline itself) as empty cells.
pub(crate) fn plain_decimal<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_plain(*v))
}

pub(crate) fn format_plain(v: f64) -> String {
    // A missing or undefined value is an empty cell: spreadsheets read "NaN" as text.
    if !v.is_finite() {
        return String::new();
    }
    let mut t = format!("{v:.9}");
    if t.contains('.') {
        t = t.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    if t == "-0" {
        "0".into()
    } else {
        t
    }
}

/// Writes a real number of unknown scale (a squared gradient norm) as a plain decimal
/// that reads back to the same f64: every digit of its shortest form, never an exponent
/// (the 9 decimals of [`format_plain`] leave nothing of 1e-10). NaN and infinities as
/// empty cells, as there.
pub(crate) fn format_exact(v: f64) -> String {
    if !v.is_finite() {
        String::new()
    } else if v == 0.0 {
        "0".into()
    } else {
        // f64's Display is the shortest decimal that reads back exactly, without exponent.
        format!("{v}")
    }
}

/// Appends rows to a CSV file, every real number a plain decimal ([`Cells`]). Each row is handed to the kernel as it is written (one
/// `write` of the whole row), so a process killed at any moment leaves every row it
/// wrote complete on disk, and no torn row; a row the file system takes only in part (it
/// is full) is cut off again. [`CsvLog::sync`] also forces the rows to the device
/// (`fsync`), for the points where a run must survive the node itself.
pub struct CsvLog<R: serde::Serialize> {
    file: File,
    path: PathBuf,
    header_written: bool,
    /// Bytes of whole rows in the file: where a row that failed half-way is cut back to.
    len: u64,
    /// One row's bytes, reused.
    buf: Vec<u8>,
    _row: std::marker::PhantomData<R>,
}

impl<R: serde::Serialize> CsvLog<R> {
    /// Creates `path`, or truncates the file there.
    pub fn create(path: &Path) -> Result<CsvLog<R>> {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(CsvLog::on(file, path))
    }

    /// Creates `path` only when nothing is there ([`crate::files::create_exclusive`]):
    /// never through a symlink, never over another file. Every CSV file of a run is made so.
    pub(crate) fn create_new(path: &Path) -> Result<CsvLog<R>> {
        let file = crate::files::create_exclusive(path).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "{} is already there (a file, a link or another job's file; ddpbench writes through none)",
                    path.display()
                )
            } else {
                format!("cannot create {}", path.display())
            };
            anyhow::Error::new(e).context(why)
        })?;
        Ok(CsvLog::on(file, path))
    }

    fn on(file: File, path: &Path) -> CsvLog<R> {
        CsvLog {
            file,
            path: path.to_path_buf(),
            header_written: false,
            len: 0,
            buf: Vec::with_capacity(1 << 10),
            _row: std::marker::PhantomData,
        }
    }

    /// Appends to `path`, creating it (with a header) when it is absent or empty; a
    /// symlink or anything but a regular file there is refused, not written through.
    pub(crate) fn append_or_create(path: &Path) -> Result<CsvLog<R>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match std::fs::symlink_metadata(path) {
                // A FIFO with no reader fails the non-blocking open (ENXIO), a symlink the
                // O_NOFOLLOW one (ELOOP): say what is there, not the system's words for it.
                Ok(m) if !m.file_type().is_file() => anyhow::anyhow!(
                    "{} is {}, not a regular file: move it away (ddpbench writes through no symbolic link and into \
                     no FIFO or device)",
                    path.display(),
                    crate::files::describe(m.file_type())
                ),
                _ => anyhow::Error::new(e).context(format!("cannot open {}", path.display())),
            })?;
        let meta = file.metadata().with_context(|| format!("cannot open {}", path.display()))?;
        if !meta.file_type().is_file() {
            anyhow::bail!(
                "{} is {}, not a regular file: move it away",
                path.display(),
                crate::files::describe(meta.file_type())
            );
        }
        let len = meta.len();
        Ok(CsvLog {
            header_written: len > 0,
            len,
            ..CsvLog::on(file, path)
        })
    }

    /// Writes `row` (after the header, for the first one) with one `write` call.
    pub fn write(&mut self, row: &R) -> Result<()> {
        self.buf.clear();
        {
            let mut w = csv::WriterBuilder::new()
                .has_headers(!self.header_written)
                .from_writer(&mut self.buf);
            // Through [`Cells`]: every real number a plain decimal, whatever the row type.
            w.serialize(Cells(row))
                .with_context(|| format!("cannot format a row for {}", self.path.display()))?;
            w.flush()?;
        }
        if let Err(e) = self.file.write_all(&self.buf) {
            // A short write (a full disk) left part of the row: cut the file back to the
            // last whole row, which needs no space, so no reader meets a torn row.
            let _ = self.file.set_len(self.len);
            return Err(e).with_context(|| format!("cannot write to {} (is the file system full or gone?)", self.path.display()));
        }
        self.len += self.buf.len() as u64;
        self.header_written = true;
        Ok(())
    }

    /// Rows are handed to the kernel as they are written: nothing is held back.
    pub fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// Forces the rows written so far onto the storage device (`fsync`).
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .with_context(|| format!("cannot sync {} to disk (is the file system full or gone?)", self.path.display()))
    }
}

/// `train`'s settings at their defaults, as a manifest's `config` holds them (what
/// `reduce` tells a run's own settings from). A test of `train`'s flags holds this file
/// to them and prints the new text when a default changes.
pub(crate) const TRAIN_DEFAULTS_JSON: &str = include_str!("train_defaults.json");

/// [`TRAIN_DEFAULTS_JSON`] as a JSON object.
pub(crate) fn train_defaults() -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str(TRAIN_DEFAULTS_JSON).unwrap_or_default()
}

/// A list of ids as the files and messages write it: `[0,1,2,3,8]` -> `0-3,8`.
pub(crate) fn compact_list(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    out.join(",")
}

pub fn rank_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.csv")
}

/// The companion file of GPU telemetry samples of rank `rank`.
pub(crate) fn gpu_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.gpu.csv")
}

/// RFC 3339 UTC with microseconds, e.g. `2026-11-22T08:15:02.123456Z`.
pub(crate) fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    String::from_utf8_lossy(&rfc3339_utc_bytes(d.as_secs() as i64, d.subsec_micros())).into_owned()
}

/// The bytes of [`rfc3339_utc`] for `secs` since the epoch and `micros`, made without
/// allocating or locking, so a signal handler may call it.
pub(crate) fn rfc3339_utc_bytes(secs: i64, micros: u32) -> [u8; 27] {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = *b"0000-00-00T00:00:00.000000Z";
    let fields: [(usize, usize, i64); 7] = [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, rem / 3600),
        (14, 2, rem % 3600 / 60),
        (17, 2, rem % 60),
        (20, 6, i64::from(micros)),
    ];
    for (at, width, value) in fields {
        let mut v = value.clamp(0, 10i64.pow(width as u32) - 1);
        for i in (at..at + width).rev() {
            out[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    out
}

/// Compact UTC stamp for run ids, e.g. `20261122T081502Z`.
pub(crate) fn compact_utc(t: SystemTime) -> String {
    let s = rfc3339_utc(t);
    format!("{}{}{}T{}{}{}Z", &s[0..4], &s[5..7], &s[8..10], &s[11..13], &s[14..16], &s[17..19])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        // 2024-02-29T12:34:56.5Z (a leap day).
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_500);
        assert_eq!(rfc3339_utc(t), "2024-02-29T12:34:56.500000Z");
        assert_eq!(compact_utc(t), "20240229T123456Z");
    }

    #[test]
    fn appending_to_a_fifo_or_a_link_names_what_is_there() {
        use crate::files::testing::{mkfifo, returns_promptly};
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("points.csv");
        mkfifo(&fifo);
        let e = returns_promptly(move || CsvLog::<EpochRow>::append_or_create(&fifo).map(drop)).unwrap_err();
        assert!(
            format!("{e:#}").contains("points.csv is a FIFO (named pipe), not a regular file: move it away"),
            "{e:#}"
        );
        let link = d.path().join("linked.csv");
        std::os::unix::fs::symlink(d.path().join("elsewhere.csv"), &link).unwrap();
        let e = CsvLog::<EpochRow>::append_or_create(&link).map(drop).unwrap_err();
        assert!(
            format!("{e:#}").contains("linked.csv is a symbolic link, not a regular file"),
            "{e:#}"
        );
        assert!(!d.path().join("elsewhere.csv").exists());
    }

    #[test]
    fn compact_lists() {
        assert_eq!(compact_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(compact_list(&[]), "");
    }
}

#[cfg(test)]
mod plain_tests {
    use super::format_plain;

    #[test]
    fn plain_decimals_never_use_exponents() {
        assert_eq!(format_plain(8.786999999982337e-6), "0.000008787");
        assert_eq!(format_plain(0.1874), "0.1874");
        assert_eq!(format_plain(2.0), "2");
        assert_eq!(format_plain(1.5e12), "1500000000000");
        assert_eq!(format_plain(-1e-12), "0");
        assert_eq!(format_plain(f64::NAN), "");
        assert_eq!(format_plain(f64::INFINITY), "");
    }

    /// Every digit a squared norm needs, at any scale, and it reads back exactly.
    #[test]
    fn exact_decimals_read_back_to_the_same_number() {
        use super::format_exact;
        assert_eq!(format_exact(1.234e-10), "0.0000000001234");
        assert_eq!(format_exact(2.5e7), "25000000");
        assert_eq!(format_exact(-0.0), "0");
        assert_eq!(format_exact(f64::NAN), "");
        for v in [1e-300, 3.0e-12 / 7.0, 0.1 + 0.2, 123456.789e-9, 9.87e15] {
            let t = format_exact(v);
            assert!(!t.contains('e') && !t.contains('E'), "{t}");
            assert_eq!(t.parse::<f64>().unwrap(), v, "{t}");
        }
    }
}
