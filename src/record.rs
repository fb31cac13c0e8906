//! What a run leaves behind: one long-form CSV per rank (`rank-00000.csv`, one row
//! per step), `epochs.csv` (validation per epoch, rank 0), and `manifest.json`
//! (configuration, versions, every rank's placement, outcome).
//!
//! CSV conventions: RFC 4180, snake_case headers with units, plain decimals with a
//! dot, RFC 3339 UTC timestamps beside numeric seconds, so spreadsheets import
//! every number as a number.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes an f64 as a plain decimal (never `1e-6`), up to 9 decimals, trailing
/// zeros trimmed, so every spreadsheet reads it as a number; NaN and infinities
/// (undefined figures, e.g. a speedup interval of the baseline itself) as empty cells.
pub fn plain_decimal<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_plain(*v))
}

/// As [`plain_decimal`], with None as an empty cell.
pub fn plain_decimal_opt<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.map(format_plain).unwrap_or_default())
}

pub fn format_plain(v: f64) -> String {
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

/// One training step on one rank.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepRow {
    pub rank: usize,
    pub node_type: String,
    pub epoch: usize,
    /// Step within the epoch, from 0.
    pub step: usize,
    /// Step since the start of the run, from 0.
    pub global_step: usize,
    /// 1 for the first `--warmup-steps` steps (kept in the file, excluded by `reduce`).
    pub warmup: u8,
    /// Wall-clock time of the step's start.
    pub time_utc: String,
    /// Seconds from the run's common start (ranks leave a barrier together) to the step's start.
    #[serde(serialize_with = "plain_decimal")]
    pub elapsed_s: f64,
    /// Samples this rank processed in the step.
    pub samples: usize,
    /// Waiting for the batch and copying it to the device.
    #[serde(serialize_with = "plain_decimal")]
    pub data_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub forward_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub backward_s: f64,
    /// Gradient all-reduce work: the sum over buckets of each bucket's all-reduce,
    /// staging copies included, whether or not it was hidden behind backward.
    #[serde(serialize_with = "plain_decimal")]
    pub comm_s: f64,
    /// The part of the step spent waiting for communication after backward: what
    /// overlap did not hide. This (not comm_s) is the phase that adds up to step_s.
    #[serde(serialize_with = "plain_decimal")]
    pub comm_exposed_s: f64,
    /// Device→host copies of the CPU-staged all-reduce (inside comm_s; 0 on CPU and with NCCL).
    #[serde(serialize_with = "plain_decimal")]
    pub copy_d2h_s: f64,
    /// Host→device copies of the CPU-staged all-reduce (inside comm_s).
    #[serde(serialize_with = "plain_decimal")]
    pub copy_h2d_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub optimizer_s: f64,
    /// Everything else in the step (loss read-back, bookkeeping): step_s minus the phases.
    #[serde(serialize_with = "plain_decimal")]
    pub other_s: f64,
    /// Wall time of the whole step.
    #[serde(serialize_with = "plain_decimal")]
    pub step_s: f64,
    /// Seconds from the run's common start to this rank's entry into the all-reduce.
    #[serde(serialize_with = "plain_decimal")]
    pub comm_start_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub loss: f64,
    /// Gradient bytes this rank put into the all-reduce (at --grad-dtype).
    pub bytes: u64,
    /// fp16 AMP's loss scale during the step (empty without --amp fp16).
    #[serde(serialize_with = "plain_decimal_opt")]
    pub loss_scale: Option<f64>,
    /// 1 when fp16 AMP found inf/NaN gradients and skipped the optimizer step.
    pub step_skipped: u8,
}

/// End of one epoch (written by rank 0; all figures are over all ranks).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpochRow {
    pub epoch: usize,
    pub time_utc: String,
    pub steps: usize,
    /// Slowest rank's wall time for the epoch's training steps.
    #[serde(serialize_with = "plain_decimal")]
    pub epoch_s: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub train_loss: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub val_loss: f64,
    #[serde(serialize_with = "plain_decimal")]
    pub val_accuracy: f64,
    pub val_samples: usize,
    #[serde(serialize_with = "plain_decimal")]
    pub val_s: f64,
    /// L2 norm of all parameters (identical on every rank, checked).
    #[serde(serialize_with = "plain_decimal")]
    pub param_l2: f64,
}

/// Appends rows to a CSV file, flushing on demand so a crash keeps completed rows.
pub struct CsvLog<R: Serialize> {
    writer: csv::Writer<BufWriter<File>>,
    path: PathBuf,
    _row: std::marker::PhantomData<R>,
}

impl<R: Serialize> CsvLog<R> {
    pub fn create(path: &Path) -> Result<CsvLog<R>> {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(CsvLog {
            writer: csv::Writer::from_writer(BufWriter::with_capacity(1 << 16, file)),
            path: path.to_path_buf(),
            _row: std::marker::PhantomData,
        })
    }
    pub fn write(&mut self, row: &R) -> Result<()> {
        self.writer
            .serialize(row)
            .with_context(|| format!("cannot write to {}", self.path.display()))
    }
    pub fn flush(&mut self) -> Result<()> {
        self.writer.flush().with_context(|| format!("cannot flush {}", self.path.display()))
    }
}

pub fn rank_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.csv")
}

/// The companion file of GPU telemetry samples of rank `rank`.
pub fn gpu_file_name(rank: usize) -> String {
    format!("rank-{rank:05}.gpu.csv")
}

/// The communication set-up a run actually used (which may differ from what was asked).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CommInfo {
    /// Buckets all-reduced while backward ran.
    pub overlap: bool,
    /// Stages backward ran in (1 without overlap).
    pub backward_stages: usize,
    /// Gradient dtype on the wire.
    pub grad_dtype: String,
    /// Autocast dtype, or "off".
    pub amp: String,
    /// NCCL's version, when NCCL was used.
    pub nccl_version: Option<String>,
    /// MPI's thread support level as granted (overlap on MPI needs serialized or multiple).
    pub mpi_threading: String,
    /// Why the backend or overlap differs from what was asked, if it does.
    pub note: Option<String>,
}

/// Where and on what one rank ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub node_type: String,
    pub device: String,
    /// Core binding policy and the hardware threads bound (e.g. "auto: 0-11").
    pub binding: String,
    pub threads: usize,
    pub cpu_model: String,
    pub gpus: Vec<String>,
    /// PCI bus id of this rank's GPU (from CUDA, so CUDA_VISIBLE_DEVICES is honoured).
    #[serde(default)]
    pub gpu_bus_id: Option<String>,
    /// Why the rank is not bound to the cores nearest its GPU, when it is not.
    #[serde(default)]
    pub binding_note: Option<String>,
    /// Launcher variables (OMPI_COMM_WORLD_*, SLURM_*, CUDA_VISIBLE_DEVICES).
    pub launcher_env: Vec<(String, String)>,
}

/// `manifest.json`: everything needed to interpret, compare and repeat a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub run_id: String,
    /// "running", "completed" or "failed".
    pub status: String,
    pub error: Option<String>,
    pub ddpbench_version: String,
    pub libtorch_version: String,
    pub mpi_library: String,
    pub command_line: Vec<String>,
    pub config: serde_json::Value,
    pub model: String,
    pub dataset: String,
    pub dataset_source: String,
    pub parameters: usize,
    pub gradient_bytes: u64,
    pub comm_backend: String,
    /// How communication ran: overlap with backward, wire dtype, AMP, and why (e.g. the
    /// fallback from NCCL to MPI).
    #[serde(default)]
    pub comm: CommInfo,
    pub buckets: usize,
    pub world_size: usize,
    pub nodes: usize,
    pub batch_size_per_rank: usize,
    pub global_batch_size: usize,
    pub steps_per_epoch: usize,
    pub start_utc: String,
    pub end_utc: Option<String>,
    pub wall_s: Option<f64>,
    pub final_param_l2: Option<f64>,
    pub final_val_accuracy: Option<f64>,
    /// Raw MPI_Allreduce of the gradient buckets timed before training, caches flushed
    /// between iterations (gradients come from memory after backward): what the
    /// all-reduce inside training is compared with.
    pub allreduce_probe: Option<crate::comm::AllreduceProbe>,
    /// The same probe with warm caches: the best case, for comparison.
    #[serde(default)]
    pub allreduce_probe_warm: Option<crate::comm::AllreduceProbe>,
    pub ranks: Vec<RankInfo>,
}

impl Manifest {
    /// Writes atomically (temp file + rename) so a reader never sees half a manifest.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join("manifest.json");
        let tmp = dir.join(".manifest.json.tmp");
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&tmp, text + "\n").with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a ddpbench manifest", path.display()))
    }
}

/// RFC 3339 UTC with microseconds, e.g. `2026-11-22T08:15:02.123456Z`.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
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
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Compact UTC stamp for run ids, e.g. `20261122T081502Z`.
pub fn compact_utc(t: SystemTime) -> String {
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
    fn step_rows_round_trip_with_unit_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(rank_file_name(3));
        let row = StepRow {
            rank: 3,
            node_type: "Xeon, 48c".into(),
            epoch: 0,
            step: 1,
            global_step: 1,
            warmup: 1,
            time_utc: "2026-01-01T00:00:00.000000Z".into(),
            elapsed_s: 0.5,
            samples: 64,
            data_s: 0.001,
            forward_s: 0.01,
            backward_s: 0.02,
            comm_s: 0.003,
            comm_exposed_s: 0.003,
            copy_d2h_s: 0.0,
            copy_h2d_s: 0.0,
            optimizer_s: 0.004,
            other_s: 0.0005,
            step_s: 0.0385,
            comm_start_s: 0.53,
            loss: 2.3,
            bytes: 4_799_528,
            loss_scale: None,
            step_skipped: 0,
        };
        let mut log = CsvLog::create(&path).unwrap();
        log.write(&row).unwrap();
        log.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(path.ends_with("rank-00003.csv"));
        let header = text.lines().next().unwrap();
        assert_eq!(header, "rank,node_type,epoch,step,global_step,warmup,time_utc,elapsed_s,samples,data_s,forward_s,backward_s,comm_s,comm_exposed_s,copy_d2h_s,copy_h2d_s,optimizer_s,other_s,step_s,comm_start_s,loss,bytes,loss_scale,step_skipped");
        // A comma inside a field is quoted (RFC 4180); numbers are plain decimals.
        assert!(text.lines().nth(1).unwrap().starts_with("3,\"Xeon, 48c\",0,1,1,1,"));
        assert!(text.contains(",4799528,,0\n"), "no loss scale is an empty cell: {text}");
        let back: StepRow = csv::Reader::from_path(&path).unwrap().deserialize().next().unwrap().unwrap();
        assert_eq!(back, row);
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
}
