//! Reading a run folder: the manifest, `epochs.csv`, the GPU telemetry files and every
//! rank file. The rank files are streamed in lock-step (one step of every rank at a
//! time), so memory is bounded by the number of ranks, not rows. The reader only
//! parses: each step's rows of all ranks go to a visitor, and what they add up to is
//! computed in [`super::analysis`].
//!
//! Files of schema 1 (before `batch_copy_s`, with `copy_d2h_s`/`copy_h2d_s`, and from
//! before overlap with `comm_s` as the exposed phase) read as well as schema 2.

use crate::record::{EndRecord, EpochRow, Manifest, Phase, PhaseTimes, RunStatus};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One parsed rank-file row: the fields the analysis uses.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Row {
    pub global_step: u64,
    pub warmup: bool,
    pub samples: u64,
    /// Seconds per phase ([`Phase::index`]); they add up to `step_s`.
    pub phases: PhaseTimes,
    pub step_s: f64,
    /// All-reduce work (`comm_s`), hidden or not.
    pub comm_s: f64,
    /// When the rank entered the all-reduce, on its own clock.
    pub comm_start_s: f64,
    /// When it entered its last bucket's all-reduce (schema 1: `comm_start_s`).
    pub comm_last_start_s: f64,
    /// All-reduce work done before backward ended (0 in schema 1).
    pub comm_hidden_s: f64,
    pub bytes: u64,
    /// When the step started, seconds from the run's common origin (NaN where the
    /// file has no `elapsed_s`).
    pub elapsed_s: f64,
}

/// Column positions in a rank file.
struct Columns {
    rank: usize,
    node_type: usize,
    global_step: usize,
    warmup: usize,
    samples: usize,
    /// Each phase's column; None for a phase the file's schema lacks (it is 0 there).
    phases: [Option<usize>; Phase::COUNT],
    step_s: usize,
    comm_start_s: usize,
    comm_last_start_s: Option<usize>,
    comm_hidden_s: Option<usize>,
    elapsed_s: Option<usize>,
    run_id: Option<usize>,
    bytes: usize,
    /// `comm_s`, the whole all-reduce, when the exposed phase has its own column.
    comm_s: Option<usize>,
}

impl Columns {
    fn find(headers: &csv::ByteRecord) -> Result<Columns, String> {
        let opt = |name: &str| headers.iter().position(|h| h == name.as_bytes());
        let pos = |name: &str| opt(name).ok_or_else(|| format!("no column {name}"));
        let mut phases = [None; Phase::COUNT];
        for p in Phase::ALL {
            phases[p.index()] = match p {
                // Schema 1 had no batch copy column: the copy is inside data_s.
                Phase::BatchCopy => opt(p.column()),
                // Before overlap existed, comm_s was the (all exposed) communication phase.
                Phase::CommExposed => Some(pos(p.column()).or_else(|_| pos("comm_s"))?),
                _ => Some(pos(p.column())?),
            };
        }
        Ok(Columns {
            rank: pos("rank")?,
            node_type: pos("node_type")?,
            global_step: pos("global_step")?,
            warmup: pos("warmup")?,
            samples: pos("samples")?,
            phases,
            step_s: pos("step_s")?,
            comm_start_s: pos("comm_start_s")?,
            comm_last_start_s: opt("comm_last_start_s"),
            comm_hidden_s: opt("comm_hidden_s"),
            elapsed_s: opt("elapsed_s"),
            run_id: opt("run_id"),
            bytes: pos("bytes")?,
            comm_s: opt("comm_exposed_s").and(opt("comm_s")),
        })
    }
}

fn field<T: std::str::FromStr>(rec: &csv::ByteRecord, i: usize) -> Option<T> {
    std::str::from_utf8(rec.get(i)?).ok()?.parse().ok()
}

/// Parses a row; Err says which field is unreadable or impossible (a time that is not
/// a finite number of seconds ≥ 0).
fn parse_row(rec: &csv::ByteRecord, c: &Columns, headers: &csv::ByteRecord) -> Result<Row, String> {
    let name = |i: usize| String::from_utf8_lossy(headers.get(i).unwrap_or_default()).into_owned();
    let get = |i: usize| -> Result<f64, String> { field::<f64>(rec, i).ok_or_else(|| format!("{} is not a number", name(i))) };
    let seconds = |i: usize| -> Result<f64, String> {
        let v = get(i)?;
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{} is {v}: a time must be a finite number of seconds, 0 or more", name(i)))
        }
    };
    let whole = |i: usize| -> Result<u64, String> { field::<u64>(rec, i).ok_or_else(|| format!("{} is not a whole number", name(i))) };
    let mut phases = [0.0; Phase::COUNT];
    for (k, col) in c.phases.iter().enumerate() {
        if let Some(i) = col {
            phases[k] = seconds(*i)?;
        }
    }
    let comm_start_s = get(c.comm_start_s)?;
    Ok(Row {
        global_step: whole(c.global_step)?,
        warmup: whole(c.warmup)? != 0,
        samples: whole(c.samples)?,
        step_s: seconds(c.step_s)?,
        comm_start_s,
        comm_last_start_s: match c.comm_last_start_s {
            Some(i) => get(i)?,
            None => comm_start_s,
        },
        comm_hidden_s: match c.comm_hidden_s {
            Some(i) => seconds(i)?,
            None => 0.0,
        },
        bytes: whole(c.bytes)?,
        elapsed_s: match c.elapsed_s {
            Some(i) => seconds(i)?,
            None => f64::NAN,
        },
        comm_s: match c.comm_s {
            Some(i) => seconds(i)?,
            None => phases[Phase::CommExposed.index()],
        },
        phases,
    })
}

/// True when the file's last byte is a newline (a crash mid-write leaves a partial row).
fn ends_with_newline(path: &Path) -> bool {
    let Ok(mut f) = std::fs::File::open(path) else { return false };
    if f.seek(SeekFrom::End(-1)).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    f.read_exact(&mut b).is_ok() && b[0] == b'\n'
}

struct RankReader {
    rank: usize,
    reader: csv::Reader<std::fs::File>,
    headers: csv::ByteRecord,
    cols: Columns,
    record: csv::ByteRecord,
    rows: u64,
}

/// A run folder opened for reading.
pub struct RunFiles {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub epochs: Vec<EpochRow>,
    /// Host of each rank, from the manifest.
    pub hosts: BTreeMap<usize, String>,
    /// Why the run cannot be used (empty while it can).
    pub problems: Vec<String>,
    /// The ranks' clock offsets to rank 0 (`clock.csv`), for comparing their times.
    pub clock: ClockOffsets,
    readers: Vec<RankReader>,
}

/// More ranks than any run folder ddpbench writes can hold: a manifest saying more is damaged.
const MAX_RANKS: usize = 1 << 22;

/// Opens a run folder. Err only when the folder is not a run at all (no readable
/// manifest); holes (missing, empty or unreadable rank files, a job that did not
/// finish) are problems. Time and memory are bounded by the files present.
pub fn open(dir: &Path) -> Result<RunFiles, String> {
    let manifest = Manifest::read(dir).map_err(|e| format!("{e:#}"))?;
    if manifest.world_size == 0 || manifest.world_size > MAX_RANKS {
        return Err(format!(
            "{}: world_size {} is not a plausible number of ranks: the manifest is damaged",
            dir.display(),
            manifest.world_size
        ));
    }
    let mut problems = Vec::new();
    if manifest.status != "completed" {
        problems.push(outcome(dir, &manifest));
    }
    let epochs: Vec<EpochRow> = match csv::Reader::from_path(dir.join("epochs.csv")) {
        Ok(mut r) => r.deserialize().filter_map(Result::ok).collect(),
        Err(_) => Vec::new(),
    };
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
        match open_rank(dir, r) {
            Ok(rr) => readers.push(rr),
            Err(e) => problems.push(e),
        }
    }
    if readers.is_empty() && problems.is_empty() {
        problems.push("no rank file could be read".into());
    }
    Ok(RunFiles {
        dir: dir.to_path_buf(),
        manifest,
        epochs,
        hosts,
        problems,
        clock: ClockOffsets::read(dir),
        readers,
    })
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

/// Opens rank `r`'s file and finds its columns; Err says what is wrong with it.
fn open_rank(dir: &Path, r: usize) -> Result<RankReader, String> {
    let path = dir.join(crate::record::rank_file_name(r));
    if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) == 0 {
        return Err(format!(
            "{} is empty: rank {r} wrote nothing (it died before its first row?)",
            path.display()
        ));
    }
    if !ends_with_newline(&path) {
        return Err(format!("{}: last row is truncated (the rank stopped mid-write)", path.display()));
    }
    let mut reader = csv::Reader::from_path(&path).map_err(|e| format!("{}: unreadable ({e})", path.display()))?;
    let headers = reader.byte_headers().map_err(|e| format!("{}: {e}", path.display()))?.clone();
    let cols = Columns::find(&headers).map_err(|e| format!("{}: not a ddpbench rank file ({e})", path.display()))?;
    Ok(RankReader {
        rank: r,
        reader,
        headers,
        cols,
        record: csv::ByteRecord::new(),
        rows: 0,
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
    pub fn ranks(&self) -> Vec<usize> {
        self.readers.iter().map(|r| r.rank).collect()
    }

    /// Streams the steps: `visit(rows, node_types)` gets one row per readable rank (in
    /// [`RunFiles::ranks`] order) for every step all of them hold, and each rank's node
    /// type (from its first row). Stops at the first hole (a malformed row, files of
    /// different lengths, ranks at different steps) and records it in `problems`.
    pub fn for_each_step(&mut self, mut visit: impl FnMut(&[Row], &[String])) {
        let n = self.readers.len();
        let mut rows: Vec<Row> = vec![Row::default(); n];
        let mut node_types: Vec<String> = vec![String::new(); n];
        loop {
            match self.read_step(&mut rows, &mut node_types) {
                Ok(true) => visit(&rows, &node_types),
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
            match rr.reader.read_byte_record(&mut rr.record) {
                Ok(true) => {
                    rr.rows += 1;
                    let row = parse_row(&rr.record, &rr.cols, &rr.headers)
                        .map_err(|e| format!("rank {} row {}: {e} (the file was edited or damaged)", rr.rank, rr.rows))?;
                    if rr.rows == 1 {
                        node_types[i] = String::from_utf8_lossy(rr.record.get(rr.cols.node_type).unwrap_or_default()).into_owned();
                        let file_rank: Option<usize> = field(&rr.record, rr.cols.rank);
                        if file_rank != Some(rr.rank) {
                            return Err(format!("rank file {} holds rows of rank {file_rank:?}", rr.rank));
                        }
                        if let Some(c) = rr.cols.run_id {
                            let id = String::from_utf8_lossy(rr.record.get(c).unwrap_or_default()).into_owned();
                            if id != self.manifest.run_id {
                                return Err(format!(
                                    "{} belongs to run {id:?}, not to this folder's run {:?}: a file from another run",
                                    crate::record::rank_file_name(rr.rank),
                                    self.manifest.run_id
                                ));
                            }
                        }
                    }
                    rows[i] = row;
                }
                Ok(false) => ended += 1,
                Err(e) => return Err(format!("rank {} row {}: {e}", rr.rank, rr.rows + 1)),
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
    /// rank's timed steps, (first start, last end) in `elapsed_s` seconds: utilisation
    /// and power samples outside it (set-up, warm-up, validation after the last step)
    /// are left out; None takes every sample.
    pub fn add_file(&mut self, path: &Path, window: Option<(f64, f64)>) {
        let Ok(mut r) = csv::Reader::from_path(path) else { return };
        let Ok(h) = r.headers().cloned() else { return };
        let pos = |n: &str| h.iter().position(|c| c == n);
        let (util, mem, power) = (pos("gpu_util_pct"), pos("mem_used_bytes"), pos("power_w"));
        let elapsed = pos("elapsed_s");
        for rec in r.records().flatten() {
            let get = |i: Option<usize>| i.and_then(|i| rec.get(i)).and_then(|v| v.parse::<f64>().ok());
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
    }

    pub fn util_pct_mean(&self) -> f64 {
        if self.util_samples == 0 {
            f64::NAN
        } else {
            self.util_pct_sum / self.util_samples as f64
        }
    }

    pub fn power_w_mean(&self) -> f64 {
        if self.power_samples == 0 {
            f64::NAN
        } else {
            self.power_w_sum / self.power_samples as f64
        }
    }
}

/// Each rank's clock offset to rank 0 over the run, from `clock.csv` (none for runs
/// written before it existed: offsets are then taken as 0).
#[derive(Debug, Clone, Default)]
pub struct ClockOffsets {
    /// Per rank, (rank 0's clock, offset) at each estimate, in time order.
    by_rank: BTreeMap<usize, Vec<(f64, f64)>>,
}

impl ClockOffsets {
    pub fn read(dir: &Path) -> ClockOffsets {
        let mut by_rank: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
        if let Ok(mut r) = csv::Reader::from_path(dir.join("clock.csv")) {
            for row in r.deserialize::<crate::train::clock::ClockRow>().flatten() {
                if row.offset_s.is_finite() && row.rank0_elapsed_s.is_finite() {
                    by_rank.entry(row.rank).or_default().push((row.rank0_elapsed_s, row.offset_s));
                }
            }
        }
        for v in by_rank.values_mut() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        ClockOffsets { by_rank }
    }

    /// Rank `rank`'s time `t` on rank 0's clock: `t` plus the offset interpolated
    /// linearly between the estimates around it (held constant beyond them).
    pub fn correct(&self, rank: usize, t: f64) -> f64 {
        let Some(points) = self.by_rank.get(&rank).filter(|p| !p.is_empty()) else {
            return t;
        };
        let i = points.partition_point(|p| p.0 <= t);
        let offset = match i {
            0 => points[0].1,
            i if i == points.len() => points[i - 1].1,
            i => {
                let ((t0, o0), (t1, o1)) = (points[i - 1], points[i]);
                if t1 > t0 {
                    o0 + (o1 - o0) * (t - t0) / (t1 - t0)
                } else {
                    o1
                }
            }
        };
        t + offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_offsets_interpolate_between_estimates() {
        let mut c = ClockOffsets::default();
        c.by_rank.insert(1, vec![(0.0, 0.001), (10.0, 0.003)]);
        assert!((c.correct(1, 5.0) - (5.0 + 0.002)).abs() < 1e-12);
        assert!((c.correct(1, 20.0) - 20.003).abs() < 1e-12, "held beyond the last estimate");
        assert!((c.correct(1, -1.0) - (-0.999)).abs() < 1e-12);
        assert_eq!(c.correct(0, 7.0), 7.0, "no estimates: no correction");
    }
}
