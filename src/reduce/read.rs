//! Reading a run folder: the manifest, `epochs.csv`, the GPU telemetry files and every
//! rank file. The rank files are streamed in lock-step (one step of every rank at a
//! time), so memory is bounded by the number of ranks, not rows. The reader only
//! parses: each step's rows of all ranks go to a visitor, and what they add up to is
//! computed in [`super::analysis`].
//!
//! Files of schema 1 (before `batch_copy_s`, with `copy_d2h_s`/`copy_h2d_s`, and from
//! before overlap with `comm_s` as the exposed phase) read as well as schema 2.

use crate::record::{EpochRow, Manifest, Phase, PhaseTimes};
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
    pub bytes: u64,
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
            bytes: pos("bytes")?,
            comm_s: opt("comm_exposed_s").and(opt("comm_s")),
        })
    }
}

fn field<T: std::str::FromStr>(rec: &csv::ByteRecord, i: usize) -> Option<T> {
    std::str::from_utf8(rec.get(i)?).ok()?.parse().ok()
}

fn parse_row(rec: &csv::ByteRecord, c: &Columns) -> Option<Row> {
    let mut phases = [0.0; Phase::COUNT];
    for (k, col) in c.phases.iter().enumerate() {
        if let Some(i) = col {
            phases[k] = field(rec, *i)?;
        }
    }
    Some(Row {
        global_step: field(rec, c.global_step)?,
        warmup: field::<u8>(rec, c.warmup)? != 0,
        samples: field(rec, c.samples)?,
        step_s: field(rec, c.step_s)?,
        comm_start_s: field(rec, c.comm_start_s)?,
        bytes: field(rec, c.bytes)?,
        comm_s: match c.comm_s {
            Some(i) => field(rec, i)?,
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
    readers: Vec<RankReader>,
}

/// Opens a run folder. Err only when the folder is not a run at all (no readable
/// manifest); holes (missing or unreadable rank files, an unfinished job) are problems.
pub fn open(dir: &Path) -> Result<RunFiles, String> {
    let manifest = Manifest::read(dir).map_err(|e| format!("{e:#}"))?;
    let mut problems = Vec::new();
    if manifest.status != "completed" {
        problems.push(format!("status is {:?}: the job did not finish", manifest.status));
    }
    let epochs: Vec<EpochRow> = match csv::Reader::from_path(dir.join("epochs.csv")) {
        Ok(mut r) => r.deserialize().filter_map(Result::ok).collect(),
        Err(_) => Vec::new(),
    };
    let hosts = manifest.ranks.iter().map(|r| (r.rank, r.host.clone())).collect();
    let mut readers = Vec::new();
    for r in 0..manifest.world_size {
        let path = dir.join(crate::record::rank_file_name(r));
        if !path.is_file() {
            problems.push(format!("{} is missing", path.display()));
            continue;
        }
        if !ends_with_newline(&path) {
            problems.push(format!("{}: last row is truncated (the rank stopped mid-write)", path.display()));
        }
        let opened = csv::Reader::from_path(&path)
            .map_err(|e| format!("unreadable ({e})"))
            .and_then(|mut reader| {
                let headers = reader.byte_headers().map_err(|e| e.to_string())?.clone();
                Ok((
                    reader,
                    Columns::find(&headers).map_err(|e| format!("not a ddpbench rank file ({e})"))?,
                ))
            });
        match opened {
            Ok((reader, cols)) => readers.push(RankReader {
                rank: r,
                reader,
                cols,
                record: csv::ByteRecord::new(),
                rows: 0,
            }),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    if readers.is_empty() && manifest.world_size > 0 && problems.is_empty() {
        problems.push("no rank file could be read".into());
    }
    Ok(RunFiles {
        dir: dir.to_path_buf(),
        manifest,
        epochs,
        hosts,
        problems,
        readers,
    })
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
                    let row = parse_row(&rr.record, &rr.cols)
                        .ok_or_else(|| format!("rank {} row {}: malformed (truncated or edited)", rr.rank, rr.rows))?;
                    if rr.rows == 1 {
                        node_types[i] = String::from_utf8_lossy(rr.record.get(rr.cols.node_type).unwrap_or_default()).into_owned();
                        let file_rank: Option<usize> = field(&rr.record, rr.cols.rank);
                        if file_rank != Some(rr.rank) {
                            return Err(format!("rank file {} holds rows of rank {file_rank:?}", rr.rank));
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

/// Sums over the samples of `rank-NNNNN.gpu.csv` files (empty cells skipped).
#[derive(Debug, Clone, Default)]
pub struct GpuTelemetry {
    pub util_pct_sum: f64,
    pub util_samples: u64,
    pub mem_used_max_bytes: Option<u64>,
    pub power_w_sum: f64,
    pub power_samples: u64,
}

impl GpuTelemetry {
    /// Adds one rank's telemetry file; a missing file adds nothing.
    pub fn add_file(&mut self, path: &Path) {
        let Ok(mut r) = csv::Reader::from_path(path) else { return };
        let Ok(h) = r.headers().cloned() else { return };
        let pos = |n: &str| h.iter().position(|c| c == n);
        let (util, mem, power) = (pos("gpu_util_pct"), pos("mem_used_bytes"), pos("power_w"));
        for rec in r.records().flatten() {
            let get = |i: Option<usize>| i.and_then(|i| rec.get(i)).and_then(|v| v.parse::<f64>().ok());
            if let Some(u) = get(util) {
                self.util_pct_sum += u;
                self.util_samples += 1;
            }
            if let Some(m) = get(mem) {
                self.mem_used_max_bytes = Some(self.mem_used_max_bytes.unwrap_or(0).max(m as u64));
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
