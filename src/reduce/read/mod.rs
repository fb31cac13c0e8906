//! Reading a run folder: the manifest, `epochs.csv`, the GPU telemetry files and every
//! rank file. The rank files are streamed in lock-step (one step of every rank at a
//! time), so memory is bounded by the number of ranks, not rows. The reader parses and
//! checks: every value against what a real run can produce ([`crate::bounds`]; rows in
//! [`row`], the rest in [`limits`]), every row's run id and rank against its file's; a
//! run that fails is named with the file, row, column and value, and left out. Every
//! file is opened only when it is a regular file ([`crate::files::open_regular`]): a
//! FIFO or a device in a run folder is named as a damaged file, never waited on. Each
//! step's rows of all ranks go to a visitor, and what they add up to is computed in
//! [`super::analysis`].
//!
//! Files of schema 1 (before `batch_copy_s`, with `copy_d2h_s`/`copy_h2d_s`, and from
//! before overlap with `comm_s` as the exposed phase) read as well as schema 2.

mod limits;
mod row;

pub(crate) use row::Row;

use crate::files::{open_regular_if_present, RecordBounded};
use crate::record::{ComparisonKey, EndRecord, EpochRow, Manifest, RunStatus};
use row::{field, parse_row, Columns};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// True when the file's last byte is a newline (a crash mid-write leaves a partial row);
/// the file is read from its start again after.
fn ends_with_newline(f: &mut File) -> bool {
    let mut b = [0u8; 1];
    let last = f.seek(SeekFrom::End(-1)).is_ok() && f.read_exact(&mut b).is_ok() && b[0] == b'\n';
    f.seek(SeekFrom::Start(0)).is_ok() && last
}

/// A CSV file of the run, read a row at a time with each row's length bounded
/// ([`crate::bounds::MAX_CSV_ROW_BYTES`]).
type CsvFile = csv::Reader<RecordBounded<File>>;

/// Reads `file` as CSV, no row longer than [`crate::bounds::MAX_CSV_ROW_BYTES`].
fn csv_reader(file: File) -> CsvFile {
    csv::Reader::from_reader(RecordBounded::new(file, crate::bounds::MAX_CSV_ROW_BYTES))
}

/// Whether a CSV error is the file's (unreadable, a row too long), after which nothing
/// more of it can be read, rather than one row's.
fn is_read_error(e: &csv::Error) -> bool {
    matches!(e.kind(), csv::ErrorKind::Io(_))
}

struct RankReader {
    rank: usize,
    reader: CsvFile,
    headers: csv::ByteRecord,
    cols: Columns,
    record: csv::ByteRecord,
    rows: u64,
    /// The node type of its first row, which every row repeats.
    node_type: Option<Vec<u8>>,
    /// Its previous row, which the next one must follow.
    prev: Option<Row>,
    /// The most samples a row may hold: a step of the run ([`limits::batch`]).
    max_samples: u64,
}

impl RankReader {
    /// The file's next row, checked: its run id, rank and node type those of the file,
    /// its values possible ([`parse_row`]), after the previous row, and ended before a
    /// run of `run_s` seconds did. Err names the file, row, column and value.
    fn next_row(&mut self, run_id: &str, run_s: Option<f64>) -> Result<Option<Row>, String> {
        let at = |rr: &RankReader, why: String| format!("{} row {}: {why}", crate::record::rank_file_name(rr.rank), rr.rows);
        match self.reader.read_byte_record(&mut self.record) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                self.rows += 1;
                return Err(at(self, e.to_string()));
            }
        }
        self.rows += 1;
        let row = self.check_identity(run_id).and_then(|()| {
            let row = parse_row(&self.record, &self.cols, &self.headers, self.max_samples)?;
            if let Some(prev) = &self.prev {
                row.follows(prev)?;
            }
            if let Some(w) = run_s {
                row.within_run(w)?;
            }
            Ok(row)
        });
        let row = row.map_err(|why| at(self, format!("{why} (the file was edited or damaged)")))?;
        self.prev = Some(row.clone());
        Ok(Some(row))
    }

    /// Err when the current row is not the file's: another rank, run or node type.
    fn check_identity(&mut self, run_id: &str) -> Result<(), String> {
        let text = |c: usize| String::from_utf8_lossy(self.record.get(c).unwrap_or_default()).into_owned();
        if field::<usize>(&self.record, self.cols.rank) != Some(self.rank) {
            return Err(format!(
                "rank is {}: the file holds rank {}'s rows",
                text(self.cols.rank),
                self.rank
            ));
        }
        if let Some(c) = self.cols.run_id {
            if text(c) != run_id {
                return Err(format!(
                    "run_id is {:?}: the row belongs to run {:?}, not to this folder's run {run_id:?} (a file or rows from another run)",
                    text(c),
                    text(c)
                ));
            }
        }
        let node_type = self.record.get(self.cols.node_type).unwrap_or_default();
        match &self.node_type {
            None => self.node_type = Some(node_type.to_vec()),
            Some(first) if first.as_slice() != node_type => {
                return Err(format!(
                    "node_type is {:?}, where the file's first row has {:?}",
                    text(self.cols.node_type),
                    String::from_utf8_lossy(first)
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// A run folder opened for reading.
pub(crate) struct RunFiles {
    pub manifest: Manifest,
    /// What the run is compared by: the manifest's, or derived from its fields (None when
    /// a field holds what no run has: a problem says which).
    pub key: Option<ComparisonKey>,
    pub epochs: Vec<EpochRow>,
    /// Host of each rank, from the manifest.
    pub hosts: BTreeMap<usize, String>,
    /// Why the run cannot be used (empty while it can).
    pub problems: Vec<String>,
    /// The ranks' clock offsets to rank 0 (`clock.csv`), for comparing their times.
    pub clock: ClockOffsets,
    readers: Vec<RankReader>,
    /// The run's wall time (manifest), which no step ends after; None when unknown.
    run_s: Option<f64>,
}

/// Opens a run folder. Err only when the folder is not a run at all (no readable
/// manifest, a schema newer than this ddpbench reads ([`limits::schema`]), a run id that
/// is not the folder's name ([`limits::run_id`]), or a world size no run has); holes (missing, empty or unreadable rank
/// files, a job that did not finish, impossible values) are problems. Time and memory
/// are bounded by the files present.
pub(crate) fn open(dir: &Path) -> Result<RunFiles, String> {
    let manifest = Manifest::read(dir).map_err(|e| format!("{e:#}"))?;
    let manifest_path = dir.join("manifest.json");
    limits::schema(&manifest).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    limits::run_id(&manifest, dir).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    // gloo is PyTorch's all-reduce: only a peer trainer's run (a study's twin) records it.
    if manifest.comm_backend == crate::record::Backend::Gloo && manifest.comparison_key.as_ref().and_then(|k| k.peer).is_none() {
        return Err(format!(
            "{}: comm_backend is gloo, which ddpbench never runs (`mpi`, `nccl` or `none`), and comparison_key names no peer trainer",
            manifest_path.display()
        ));
    }
    limits::world_size(&manifest).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut problems: Vec<String> = limits::manifest(&manifest)
        .into_iter()
        .map(|e| format!("{}: {e}", manifest_path.display()))
        .collect();
    let key = ComparisonKey::of(&manifest)
        .map_err(|e| problems.push(format!("{}: {e}", manifest_path.display())))
        .ok();
    let grad_accum = key.as_ref().and_then(|k| k.grad_accum).unwrap_or(1);
    // A run whose step cannot be sized reads no row: every samples cell would be refused.
    let max_samples = limits::batch(&manifest, grad_accum).unwrap_or_else(|e| {
        problems.push(format!("{}: {e}", manifest_path.display()));
        0
    });
    if manifest.status != "completed" {
        problems.push(outcome(dir, &manifest));
    }
    // wall_s bounds every instant only once it is known to be a time.
    let run_s = manifest.wall_s.filter(|_| problems.is_empty());
    let epochs = read_epochs(dir, &manifest, run_s).unwrap_or_else(|e| {
        problems.push(e);
        Vec::new()
    });
    let clock = ClockOffsets::read(dir, manifest.world_size, run_s).unwrap_or_else(|e| {
        problems.push(e);
        ClockOffsets::default()
    });
    let hosts = manifest.ranks.iter().map(|r| (r.rank, r.host.clone())).collect();
    let present = rank_files_present(dir, manifest.world_size);
    let missing = manifest.world_size - present.len();
    if missing > 0 {
        let first: Vec<String> = (0..manifest.world_size)
            .filter(|r| !present.contains(r))
            .take(5)
            .map(crate::record::rank_file_name)
            .collect();
        problems.push(format!(
            "{missing} of {} rank files are missing ({}{})",
            manifest.world_size,
            first.join(", "),
            if missing > 5 { ", ..." } else { "" }
        ));
    }
    let mut readers = Vec::new();
    for r in present {
        match open_rank(dir, r, max_samples) {
            Ok(rr) => readers.push(rr),
            Err(e) => problems.push(e),
        }
    }
    if readers.is_empty() && problems.is_empty() {
        problems.push("no rank file could be read".into());
    }
    Ok(RunFiles {
        manifest,
        key,
        epochs,
        hosts,
        problems,
        clock,
        readers,
        run_s,
    })
}

/// The rows of `epochs.csv` (none without the file), each checked; rows that do not
/// parse (from before a column existed) are passed over, as the epoch time is then
/// projected from the steps.
fn read_epochs(dir: &Path, m: &Manifest, run_s: Option<f64>) -> Result<Vec<EpochRow>, String> {
    let path = dir.join("epochs.csv");
    let Some(file) = open_regular_if_present(&path)? else {
        return Ok(Vec::new());
    };
    let mut r = csv_reader(file);
    let mut out = Vec::new();
    for (i, row) in r.deserialize::<EpochRow>().enumerate() {
        if i >= limits::MAX_TABLE_ROWS {
            return Err(format!(
                "{} holds more than {} rows: it is not one ddpbench wrote",
                path.display(),
                limits::MAX_TABLE_ROWS
            ));
        }
        let e = match row {
            Ok(e) => e,
            Err(e) if is_read_error(&e) => return Err(format!("{} row {}: {e}", path.display(), i + 1)),
            Err(_) => continue,
        };
        limits::epoch_row(&e, m.steps_per_epoch, run_s).map_err(|why| format!("{} row {}: {why}", path.display(), i + 1))?;
        out.push(e);
    }
    Ok(out)
}

/// The ranks below `world_size` whose `rank-NNNNN.csv` is in `dir`, from one listing.
fn rank_files_present(dir: &Path, world_size: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let r: usize = name.strip_prefix("rank-")?.strip_suffix(".csv")?.parse().ok()?;
                    (r < world_size && name == crate::record::rank_file_name(r)).then_some(r)
                })
                .collect()
        })
        .unwrap_or_default();
    ranks.sort_unstable();
    ranks
}

/// Opens rank `r`'s file and finds its columns; Err says what is wrong with it. A row
/// may hold at most `max_samples` samples.
fn open_rank(dir: &Path, r: usize, max_samples: u64) -> Result<RankReader, String> {
    let path = dir.join(crate::record::rank_file_name(r));
    let mut file = crate::files::open_regular(&path).map_err(|e| crate::files::read_error(&path, &e))?;
    if file.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
        return Err(format!(
            "{} is empty: rank {r} wrote nothing (it died before its first row?)",
            path.display()
        ));
    }
    if !ends_with_newline(&mut file) {
        return Err(format!("{}: last row is truncated (the rank stopped mid-write)", path.display()));
    }
    let mut reader = csv_reader(file);
    let headers = reader.byte_headers().map_err(|e| format!("{}: {e}", path.display()))?.clone();
    let cols = Columns::find(&headers).map_err(|e| format!("{}: not a ddpbench rank file ({e})", path.display()))?;
    Ok(RankReader {
        rank: r,
        reader,
        headers,
        cols,
        record: csv::ByteRecord::new(),
        rows: 0,
        node_type: None,
        prev: None,
        max_samples,
    })
}

/// Why a run did not complete, from its manifest and the ranks' end records: what
/// failed or stopped it, or, when no record says (rank 0 died first, the job was
/// killed), that it ended without one; and the ranks whose end record still says
/// `running` (killed before they could record anything).
fn outcome(dir: &Path, m: &Manifest) -> String {
    let ends = end_records(dir, m);
    let silent: Vec<usize> = ends.iter().filter(|e| e.status == RunStatus::Running).map(|e| e.rank).collect();
    let ended: Vec<&EndRecord> = ends.iter().filter(|e| e.status != RunStatus::Running).collect();
    let killed = match silent.as_slice() {
        [] => String::new(),
        [r] => format!("; rank {r} recorded no end: killed (SIGKILL, out of memory, node lost)"),
        many => format!(
            "; ranks {} recorded no end: killed (SIGKILL, out of memory, node lost)",
            list_ranks(many)
        ),
    };
    if m.status != "running" {
        return match &m.error {
            Some(e) => format!("status is {}: {e}{killed}", m.status),
            None => format!("status is {:?}: the job did not finish{killed}", m.status),
        };
    }
    let first = |s: RunStatus| ended.iter().find(|e| e.status == s);
    if let Some(e) = first(RunStatus::Failed) {
        return format!(
            "failed (from rank {}'s end record): {}{killed}",
            e.rank,
            e.error.clone().unwrap_or_default()
        );
    }
    if let Some(e) = first(RunStatus::Interrupted) {
        return format!(
            "interrupted (from rank {}'s end record): {}{killed}",
            e.rank,
            e.error.clone().unwrap_or_default()
        );
    }
    format!(
        "the job ended without finishing and {} of {} ranks recorded an end: killed (SIGKILL, out of memory, node lost) while running",
        ended.len(),
        m.world_size
    )
}

/// The run's end records (those of this run id), in rank order.
fn end_records(dir: &Path, m: &Manifest) -> Vec<EndRecord> {
    let mut ends: Vec<EndRecord> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let r: usize = name.strip_prefix("rank-")?.strip_suffix(".end.json")?.parse().ok()?;
                    (r < m.world_size && name == crate::record::end_file_name(r)).then_some(r)
                })
                .filter_map(|r| EndRecord::read(dir, r).ok().filter(|end| end.run_id == m.run_id && end.rank == r))
                .collect()
        })
        .unwrap_or_default();
    ends.sort_by_key(|e| e.rank);
    ends
}

/// "1, 3, 4" (the first eight, then how many in all).
fn list_ranks(ranks: &[usize]) -> String {
    let shown: Vec<String> = ranks.iter().take(8).map(usize::to_string).collect();
    match ranks.len() {
        n if n > 8 => format!("{}, … ({n} in all)", shown.join(", ")),
        _ => shown.join(", "),
    }
}

impl RunFiles {
    /// The ranks whose files are being read, in rank order.
    pub(crate) fn ranks(&self) -> Vec<usize> {
        self.readers.iter().map(|r| r.rank).collect()
    }

    /// Streams the steps: `visit(rows, node_types)` gets one row per readable rank (in
    /// [`RunFiles::ranks`] order) for every step all of them hold, and each rank's node
    /// type. Stops at the first hole (a malformed or impossible row, files of different
    /// lengths, ranks at different steps) or the first Err of `visit`, and records it in
    /// `problems`.
    pub(crate) fn for_each_step(&mut self, mut visit: impl FnMut(&[Row], &[String]) -> Result<(), String>) {
        let n = self.readers.len();
        let mut rows: Vec<Row> = vec![Row::default(); n];
        let mut node_types: Vec<String> = vec![String::new(); n];
        loop {
            match self.read_step(&mut rows, &mut node_types).and_then(|more| {
                if more {
                    visit(&rows, &node_types)?;
                }
                Ok(more)
            }) {
                Ok(true) => {}
                Ok(false) => break,
                Err(problem) => {
                    self.problems.push(problem);
                    break;
                }
            }
        }
    }

    /// Reads the next row of every rank: Ok(false) when all files ended together.
    fn read_step(&mut self, rows: &mut [Row], node_types: &mut [String]) -> Result<bool, String> {
        let mut ended = 0;
        for (i, rr) in self.readers.iter_mut().enumerate() {
            match rr.next_row(&self.manifest.run_id, self.run_s)? {
                Some(row) => {
                    if rr.rows == 1 {
                        node_types[i] = String::from_utf8_lossy(rr.node_type.as_deref().unwrap_or_default()).into_owned();
                    }
                    rows[i] = row;
                }
                None => ended += 1,
            }
        }
        if ended == self.readers.len() {
            return Ok(false);
        }
        if ended > 0 {
            // Count what the longer files still hold, so the message gives real totals.
            for rr in self.readers.iter_mut() {
                while let Ok(true) = rr.reader.read_byte_record(&mut rr.record) {
                    rr.rows += 1;
                }
            }
            let counts: Vec<String> = self.readers.iter().map(|r| format!("rank {}: {}", r.rank, r.rows)).collect();
            return Err(format!("rank files hold different numbers of steps ({})", counts.join(", ")));
        }
        let g = rows[0].global_step;
        if let Some(bad) = rows.iter().position(|r| r.global_step != g) {
            return Err(format!(
                "step mismatch: rank {} is at global_step {} where rank {} is at {g}",
                self.readers[bad].rank, rows[bad].global_step, self.readers[0].rank
            ));
        }
        Ok(true)
    }
}

/// Sums over the samples of `rank-NNNNN.gpu.csv` files (empty cells skipped):
/// utilisation and power over the samples taken while the timed steps ran, peak memory
/// over all of them.
#[derive(Debug, Clone, Default)]
pub struct GpuTelemetry {
    pub util_pct_sum: f64,
    pub util_samples: u64,
    pub mem_used_max_bytes: Option<u64>,
    pub power_w_sum: f64,
    pub power_samples: u64,
}

impl GpuTelemetry {
    /// Adds one rank's telemetry file; a missing file adds nothing. `window` is the
    /// rank's timed steps, (first start, last end) in seconds from the run's common start: utilisation
    /// and power samples outside it (set-up, warm-up, validation after the last step)
    /// are left out; None takes every sample. Err names the row and reading that no
    /// GPU can give ([`limits::gpu_sample`]), or a file there that is no regular file.
    pub(crate) fn add_file(&mut self, path: &Path, window: Option<(f64, f64)>) -> Result<(), String> {
        let Some(file) = open_regular_if_present(path)? else {
            return Ok(());
        };
        let mut r = csv_reader(file);
        let h = match r.headers() {
            Ok(h) => h.clone(),
            Err(e) if is_read_error(&e) => return Err(format!("{}: {e}", path.display())),
            Err(_) => return Ok(()),
        };
        let pos = |n: &str| h.iter().position(|c| c == n);
        let (util, mem, power) = (pos("gpu_util_pct"), pos("mem_used_bytes"), pos("power_w"));
        let elapsed = pos("sample_at_s").or_else(|| pos("elapsed_s"));
        for (i, rec) in r.records().enumerate() {
            let rec = match rec {
                Ok(rec) => rec,
                Err(e) if is_read_error(&e) => return Err(format!("{} row {}: {e}", path.display(), i + 1)),
                Err(_) => continue,
            };
            let get = |i: Option<usize>| i.and_then(|i| rec.get(i)).and_then(|v| v.parse::<f64>().ok());
            limits::gpu_sample(get(util), get(mem), get(power)).map_err(|why| format!("{} row {}: {why}", path.display(), i + 1))?;
            if let Some(m) = get(mem) {
                self.mem_used_max_bytes = Some(self.mem_used_max_bytes.unwrap_or(0).max(m as u64));
            }
            if let (Some((from, to)), Some(t)) = (window, get(elapsed)) {
                if t < from || t > to {
                    continue;
                }
            }
            if let Some(u) = get(util) {
                self.util_pct_sum += u;
                self.util_samples += 1;
            }
            if let Some(p) = get(power) {
                self.power_w_sum += p;
                self.power_samples += 1;
            }
        }
        Ok(())
    }

    pub(crate) fn util_pct_mean(&self) -> f64 {
        if self.util_samples == 0 {
            f64::NAN
        } else {
            self.util_pct_sum / self.util_samples as f64
        }
    }

    pub(crate) fn power_w_mean(&self) -> f64 {
        if self.power_samples == 0 {
            f64::NAN
        } else {
            self.power_w_sum / self.power_samples as f64
        }
    }
}

/// Each rank's clock offset to rank 0 over the run, from `clock.csv` (none for runs
/// written before it existed: offsets are then taken as 0, their error as unknown).
#[derive(Debug, Clone, Default)]
pub(crate) struct ClockOffsets {
    /// Per rank, (rank 0's clock, offset, error bound) at each estimate, in time order:
    /// the exact offset where the rank shares rank 0's `CLOCK_MONOTONIC`.
    by_rank: BTreeMap<usize, Vec<Estimate>>,
}

/// (rank 0's clock, offset, error bound) of one estimate, seconds.
type Estimate = (f64, f64, f64);

impl ClockOffsets {
    /// Reads `dir`'s `clock.csv` (no offsets without one) of a run of `world_size` ranks
    /// and `run_s` seconds (None: unknown); Err names the row and column that no clock
    /// estimate can hold ([`limits::clock_row`]), or a `clock.csv` that is no regular file.
    pub(crate) fn read(dir: &Path, world_size: usize, run_s: Option<f64>) -> Result<ClockOffsets, String> {
        let path = dir.join("clock.csv");
        let mut by_rank: BTreeMap<usize, Vec<Estimate>> = BTreeMap::new();
        if let Some(file) = open_regular_if_present(&path)? {
            let mut r = csv_reader(file);
            for (i, row) in r.deserialize::<crate::record::clock::ClockRow>().enumerate() {
                let at = |why: String| format!("{} row {}: {why}", path.display(), i + 1);
                if i >= limits::MAX_TABLE_ROWS {
                    return Err(at(format!("more than {} rows: not a file ddpbench wrote", limits::MAX_TABLE_ROWS)));
                }
                let row = row.map_err(|e| at(e.to_string()))?;
                limits::clock_row(&row, world_size, run_s).map_err(at)?;
                let (offset, error) = row.best();
                by_rank.entry(row.rank).or_default().push((row.rank0_at_s, offset, error));
            }
        }
        for v in by_rank.values_mut() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(ClockOffsets { by_rank })
    }

    /// Whether the run has offsets at all (a `clock.csv`).
    pub(crate) fn known(&self) -> bool {
        !self.by_rank.is_empty()
    }

    /// The estimates around rank `rank`'s time `t`: (before, after), the same one twice
    /// beyond them; None without estimates.
    fn around(&self, rank: usize, t: f64) -> Option<(Estimate, Estimate)> {
        let points = self.by_rank.get(&rank).filter(|p| !p.is_empty())?;
        let i = points.partition_point(|p| p.0 <= t);
        Some(match i {
            0 => (points[0], points[0]),
            i if i == points.len() => (points[i - 1], points[i - 1]),
            i => (points[i - 1], points[i]),
        })
    }

    /// Rank `rank`'s time `t` on rank 0's clock: `t` plus the offset interpolated
    /// linearly between the estimates around it (held constant beyond them).
    pub(crate) fn correct(&self, rank: usize, t: f64) -> f64 {
        let Some(((t0, o0, _), (t1, o1, _))) = self.around(rank, t) else {
            return t;
        };
        let offset = if t1 > t0 { o0 + (o1 - o0) * (t - t0) / (t1 - t0) } else { o1 };
        t + offset
    }

    /// How far [`Self::correct`] may be off at `t`: the larger error of the two estimates
    /// interpolated (a line between two values each within e of the truth stays within
    /// the larger e of the line through the truths); 0 without estimates (unknown).
    pub(crate) fn error_s(&self, rank: usize, t: f64) -> f64 {
        self.around(rank, t).map_or(0.0, |((_, _, e0), (_, _, e1))| e0.max(e1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_offsets_interpolate_between_estimates() {
        let mut c = ClockOffsets::default();
        c.by_rank.insert(1, vec![(0.0, 0.001, 1e-4), (10.0, 0.003, 2e-4)]);
        assert_eq!(c.error_s(1, 5.0), 2e-4, "the larger error of the two interpolated");
        assert_eq!(c.error_s(0, 5.0), 0.0);
        assert!((c.correct(1, 5.0) - (5.0 + 0.002)).abs() < 1e-12);
        assert!((c.correct(1, 20.0) - 20.003).abs() < 1e-12, "held beyond the last estimate");
        assert!((c.correct(1, -1.0) - (-0.999)).abs() < 1e-12);
        assert_eq!(c.correct(0, 7.0), 7.0, "no estimates: no correction");
    }
}
