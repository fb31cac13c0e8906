//! Reading a run folder: the manifest, `epochs.csv` and every rank file, streamed
//! in lock-step (one step of every rank at a time) so that memory is bounded by
//! the number of ranks, not rows, and each step's straggler wait can be computed
//! from the ranks' entry times into the all-reduce.

use crate::record::{EpochRow, Manifest};
use crate::stats::{Reservoir, Sketch};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Index of the communication phase among a step's phases (data, forward, backward,
/// comm, optimizer, other: they add up to `step_s`). The phase is `comm_exposed_s`, the
/// part of the all-reduce not hidden behind backward; files written before overlap
/// existed have only `comm_s`, which was all exposed.
pub const COMM: usize = 3;

/// One rank's figures over its non-warm-up steps.
#[derive(Debug, Clone)]
pub struct RankStats {
    pub rank: usize,
    pub node_type: String,
    pub host: String,
    pub steps: u64,
    pub samples: u64,
    pub step: Sketch,
    /// Sum over steps of each phase, seconds.
    pub phase_sum: [f64; 6],
    /// Sum over steps of the time this rank waited in the all-reduce for the last rank to enter.
    pub wait_sum: f64,
    /// Steps in which this rank was the last to enter the all-reduce.
    pub last_arrivals: u64,
}

/// Figures of all ranks of one node type.
#[derive(Debug, Clone)]
pub struct TypeStats {
    pub node_type: String,
    pub ranks: Vec<usize>,
    pub step: Sketch,
    pub phase: [Sketch; 6],
    /// comm_s (all of the all-reduce work) minus the wait for the last rank: the time
    /// the transfer itself took.
    pub transfer: Sketch,
    pub wait: Sketch,
    /// comm_s: all of the all-reduce work, hidden behind backward or not.
    pub comm_total: Sketch,
    pub last_arrivals: u64,
    /// GPU telemetry of the type's ranks (`rank-NNNNN.gpu.csv`), when there is any.
    pub gpu: GpuTelemetry,
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

/// Everything the analysis needs of one run.
#[derive(Debug, Clone)]
pub struct RunStats {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub ranks: Vec<RankStats>,
    pub types: Vec<TypeStats>,
    /// Per step, the mean over ranks of step_s: a uniform sample (for the bootstrap) and its sketch.
    pub job_step: Sketch,
    pub job_step_sample: Reservoir,
    /// Non-warm-up steps per rank.
    pub steps: u64,
    /// Samples of all ranks over the counted steps.
    pub samples: u64,
    /// Gradient bytes all-reduced per step.
    pub bytes_per_step: u64,
    pub warmup_steps: u64,
    pub epochs: Vec<EpochRow>,
    /// Why the run cannot be used (empty when it is complete).
    pub problems: Vec<String>,
}

impl RunStats {
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Column positions in a rank file.
struct Columns {
    rank: usize,
    node_type: usize,
    global_step: usize,
    warmup: usize,
    samples: usize,
    phases: [usize; 6],
    step_s: usize,
    comm_start_s: usize,
    bytes: usize,
    /// `comm_s`, the whole all-reduce, when the phase column is `comm_exposed_s`.
    comm_total: Option<usize>,
    /// `batch_copy_s` (schema 2), counted with `data_s` here.
    batch_copy: Option<usize>,
}

impl Columns {
    fn find(headers: &csv::ByteRecord) -> Result<Columns, String> {
        let pos = |name: &str| {
            headers
                .iter()
                .position(|h| h == name.as_bytes())
                .ok_or_else(|| format!("no column {name}"))
        };
        Ok(Columns {
            rank: pos("rank")?,
            node_type: pos("node_type")?,
            global_step: pos("global_step")?,
            warmup: pos("warmup")?,
            samples: pos("samples")?,
            phases: [
                pos("data_s")?,
                pos("forward_s")?,
                pos("backward_s")?,
                pos("comm_exposed_s").or_else(|_| pos("comm_s"))?,
                pos("optimizer_s")?,
                pos("other_s")?,
            ],
            step_s: pos("step_s")?,
            comm_start_s: pos("comm_start_s")?,
            bytes: pos("bytes")?,
            comm_total: pos("comm_exposed_s").ok().and(pos("comm_s").ok()),
            batch_copy: pos("batch_copy_s").ok(),
        })
    }
}

/// One parsed row: only the fields the reducer uses.
#[derive(Default, Clone)]
struct Row {
    global_step: u64,
    warmup: bool,
    samples: u64,
    phases: [f64; 6],
    step_s: f64,
    comm_start_s: f64,
    bytes: u64,
    comm_total_s: f64,
}

fn field<T: std::str::FromStr>(rec: &csv::ByteRecord, i: usize) -> Option<T> {
    std::str::from_utf8(rec.get(i)?).ok()?.parse().ok()
}

fn parse_row(rec: &csv::ByteRecord, c: &Columns) -> Option<Row> {
    let mut phases = [0.0; 6];
    for (k, &i) in c.phases.iter().enumerate() {
        phases[k] = field(rec, i)?;
    }
    if let Some(i) = c.batch_copy {
        phases[0] += field::<f64>(rec, i)?;
    }
    Some(Row {
        global_step: field(rec, c.global_step)?,
        warmup: field::<u8>(rec, c.warmup)? != 0,
        samples: field(rec, c.samples)?,
        phases,
        step_s: field(rec, c.step_s)?,
        comm_start_s: field(rec, c.comm_start_s)?,
        bytes: field(rec, c.bytes)?,
        comm_total_s: match c.comm_total {
            Some(i) => field(rec, i)?,
            None => phases[COMM],
        },
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

/// Reads a run folder. Returns Err only when the folder is not a run at all (no
/// readable manifest); a run with holes comes back with `problems` filled in.
pub fn read_run(dir: &Path) -> Result<RunStats, String> {
    let manifest = Manifest::read(dir).map_err(|e| format!("{e:#}"))?;
    let mut problems = Vec::new();
    if manifest.status != "completed" {
        problems.push(format!("status is {:?}: the job did not finish", manifest.status));
    }
    let epochs: Vec<EpochRow> = match csv::Reader::from_path(dir.join("epochs.csv")) {
        Ok(mut r) => r.deserialize().filter_map(Result::ok).collect(),
        Err(_) => Vec::new(),
    };
    let host_of: BTreeMap<usize, String> = manifest.ranks.iter().map(|r| (r.rank, r.host.clone())).collect();

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
        match csv::Reader::from_path(&path) {
            Ok(mut reader) => match reader
                .byte_headers()
                .map_err(|e| e.to_string())
                .and_then(|h| Columns::find(&h.clone()))
            {
                Ok(cols) => readers.push(RankReader {
                    rank: r,
                    reader,
                    cols,
                    record: csv::ByteRecord::new(),
                    rows: 0,
                }),
                Err(e) => problems.push(format!("{}: not a ddpbench rank file ({e})", path.display())),
            },
            Err(e) => problems.push(format!("{}: unreadable ({e})", path.display())),
        }
    }

    let mut ranks: Vec<RankStats> = readers
        .iter()
        .map(|rr| RankStats {
            rank: rr.rank,
            node_type: String::new(),
            host: host_of.get(&rr.rank).cloned().unwrap_or_default(),
            steps: 0,
            samples: 0,
            step: Sketch::new(),
            phase_sum: [0.0; 6],
            wait_sum: 0.0,
            last_arrivals: 0,
        })
        .collect();
    let mut type_index: Vec<usize> = vec![0; readers.len()];
    let mut types: Vec<TypeStats> = Vec::new();
    let mut job_step = Sketch::new();
    let mut job_step_sample = Reservoir::new(Sketch::EXACT_CAP);
    let (mut steps, mut samples, mut bytes_per_step, mut warmup_steps) = (0u64, 0u64, 0u64, 0u64);
    let mut rows: Vec<Row> = vec![Row::default(); readers.len()];

    'steps: loop {
        let mut ended = 0;
        for (i, rr) in readers.iter_mut().enumerate() {
            match rr.reader.read_byte_record(&mut rr.record) {
                Ok(true) => {
                    rr.rows += 1;
                    match parse_row(&rr.record, &rr.cols) {
                        Some(row) => {
                            if rr.rows == 1 {
                                let nt = String::from_utf8_lossy(rr.record.get(rr.cols.node_type).unwrap_or_default()).into_owned();
                                let file_rank: Option<usize> = field(&rr.record, rr.cols.rank);
                                if file_rank != Some(rr.rank) {
                                    problems.push(format!("rank file {} holds rows of rank {file_rank:?}", rr.rank));
                                }
                                let t = types.iter().position(|t| t.node_type == nt).unwrap_or_else(|| {
                                    types.push(TypeStats {
                                        node_type: nt.clone(),
                                        ranks: Vec::new(),
                                        step: Sketch::new(),
                                        phase: std::array::from_fn(|_| Sketch::new()),
                                        transfer: Sketch::new(),
                                        wait: Sketch::new(),
                                        comm_total: Sketch::new(),
                                        last_arrivals: 0,
                                        gpu: GpuTelemetry::default(),
                                    });
                                    types.len() - 1
                                });
                                types[t].ranks.push(rr.rank);
                                type_index[i] = t;
                                ranks[i].node_type = nt;
                            }
                            rows[i] = row;
                        }
                        None => {
                            problems.push(format!("rank {} row {}: malformed (truncated or edited)", rr.rank, rr.rows + 1));
                            break 'steps;
                        }
                    }
                }
                Ok(false) => ended += 1,
                Err(e) => {
                    problems.push(format!("rank {} row {}: {e}", rr.rank, rr.rows + 1));
                    break 'steps;
                }
            }
        }
        if ended == readers.len() {
            break;
        }
        if ended > 0 {
            // Count what the longer files still hold, so the message gives real totals.
            for rr in readers.iter_mut() {
                while let Ok(true) = rr.reader.read_byte_record(&mut rr.record) {
                    rr.rows += 1;
                }
            }
            let counts: Vec<String> = readers.iter().map(|r| format!("rank {}: {}", r.rank, r.rows)).collect();
            problems.push(format!("rank files hold different numbers of steps ({})", counts.join(", ")));
            break;
        }
        let g = rows[0].global_step;
        if let Some(bad) = rows.iter().position(|r| r.global_step != g) {
            problems.push(format!(
                "step mismatch: rank {} is at global_step {} where rank {} is at {g}",
                readers[bad].rank, rows[bad].global_step, readers[0].rank
            ));
            break;
        }
        if rows[0].warmup {
            warmup_steps += 1;
            continue;
        }
        // The all-reduce completes only when the last rank has entered it.
        let (last, last_entry) = rows.iter().enumerate().fold((0, f64::NEG_INFINITY), |acc, (i, r)| {
            if r.comm_start_s > acc.1 {
                (i, r.comm_start_s)
            } else {
                acc
            }
        });
        let mut step_mean = 0.0;
        for (i, row) in rows.iter().enumerate() {
            // A rank cannot be held up by a late peer for longer than it waited for
            // communication at all (with overlap, early waiting hides behind backward).
            let wait = (last_entry - row.comm_start_s).clamp(0.0, row.phases[COMM]);
            let transfer = (row.comm_total_s - wait).max(0.0);
            let rs = &mut ranks[i];
            rs.steps += 1;
            rs.samples += row.samples;
            rs.step.push(row.step_s);
            for k in 0..6 {
                rs.phase_sum[k] += row.phases[k];
            }
            rs.wait_sum += wait;
            let ts = &mut types[type_index[i]];
            ts.step.push(row.step_s);
            for k in 0..6 {
                ts.phase[k].push(row.phases[k]);
            }
            ts.transfer.push(transfer);
            ts.wait.push(wait);
            ts.comm_total.push(row.comm_total_s);
            samples += row.samples;
            step_mean += row.step_s;
        }
        ranks[last].last_arrivals += 1;
        types[type_index[last]].last_arrivals += 1;
        step_mean /= rows.len() as f64;
        job_step.push(step_mean);
        job_step_sample.push(step_mean);
        bytes_per_step = rows[0].bytes;
        steps += 1;
    }
    for (i, rr) in readers.iter().enumerate() {
        if let Some(ts) = types.get_mut(type_index[i]) {
            ts.gpu.add_file(&dir.join(crate::record::gpu_file_name(rr.rank)));
        }
    }
    if readers.is_empty() && manifest.world_size > 0 && problems.is_empty() {
        problems.push("no rank file could be read".into());
    }
    if steps == 0 && problems.is_empty() {
        problems.push(format!(
            "no steps after the {warmup_steps} warm-up step(s): run longer or lower --warmup-steps"
        ));
    }
    Ok(RunStats {
        dir: dir.to_path_buf(),
        manifest,
        ranks,
        types,
        job_step,
        job_step_sample,
        steps,
        samples,
        bytes_per_step,
        warmup_steps,
        epochs,
        problems,
    })
}
