//! One side of a comparison: report.json as `reduce` wrote it, read back with only the
//! fields `compare` uses, every refusal a [`Refusal`].

use super::Refusal;
use crate::record::schema_problem;
use crate::reduce::report::REPORT_VERSION;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A report folder or report.json file, read.
#[derive(Debug)]
pub(super) struct Side {
    /// The report.json read.
    pub file: PathBuf,
    pub report: ReportFile,
}

/// The parts of report.json a comparison reads.
#[derive(Debug, Deserialize)]
pub(super) struct ReportFile {
    pub runs: Vec<RunEntry>,
    pub summary: Vec<SummaryEntry>,
    pub scaling: Vec<ScalingEntry>,
}

/// One complete run (report.json's `runs`).
#[derive(Debug, Deserialize)]
pub(super) struct RunEntry {
    pub run_id: String,
    pub model: String,
    pub dataset: String,
    /// What the run is compared by; runs without one are left out.
    pub comparison_key: Option<serde_json::Map<String, Value>>,
    pub ranks: usize,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    #[serde(deserialize_with = "number")]
    pub samples_per_s: f64,
    pub per_step: PhaseSeconds,
    /// The node types its ranks ran on, and its nodes (absent in older reports).
    #[serde(default)]
    pub node_types: Vec<String>,
    #[serde(default)]
    pub nodes: usize,
    /// ddpbench, libtorch and MPI (absent in older reports).
    #[serde(default)]
    pub versions: Option<RunVersions>,
}

/// What a run ran with (report.json's `versions`).
#[derive(Debug, Deserialize, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RunVersions {
    #[serde(default)]
    pub ddpbench: String,
    #[serde(default)]
    pub libtorch: String,
    #[serde(default)]
    pub mpi: String,
}

impl ReportFile {
    /// What a side ran on, in words: its runs' node types, devices and most nodes.
    pub(super) fn hardware(&self) -> String {
        let mut types: Vec<&str> = self.runs.iter().flat_map(|r| r.node_types.iter().map(String::as_str)).collect();
        types.sort_unstable();
        types.dedup();
        let mut devices: Vec<String> = self
            .runs
            .iter()
            .filter_map(|r| {
                r.comparison_key
                    .as_ref()?
                    .get("device")
                    .map(|d| d.as_str().map_or_else(|| d.to_string(), str::to_string))
            })
            .collect();
        devices.sort_unstable();
        devices.dedup();
        let nodes = self.runs.iter().map(|r| r.nodes).max().unwrap_or(0);
        let or_unknown = |v: Vec<String>| if v.is_empty() { "not recorded".to_string() } else { v.join(", ") };
        // The MPI library's first words (its version string goes on with build details).
        let mut versions: Vec<String> = self
            .runs
            .iter()
            .filter_map(|r| r.versions.as_ref())
            .map(|v| {
                let mpi = v.mpi.split(',').next().unwrap_or_default().trim();
                format!(
                    "ddpbench {}, libtorch {}, {}",
                    v.ddpbench,
                    v.libtorch,
                    if mpi.is_empty() { "MPI not recorded" } else { mpi }
                )
            })
            .collect();
        versions.sort_unstable();
        versions.dedup();
        format!(
            "node type {}; device {}; {} node(s) at most; {} run(s); {}",
            or_unknown(types.iter().map(|t| format!("\"{t}\"")).collect()),
            or_unknown(devices),
            if nodes == 0 { "?".to_string() } else { nodes.to_string() },
            self.runs.len(),
            if versions.is_empty() {
                "versions not recorded (a report written before they were)".to_string()
            } else {
                format!("versions {}", versions.join("; "))
            }
        )
        // compare.md shows it inside a code span: a backtick of the data cannot end it.
        .replace('`', "'")
    }
}

/// Mean seconds per rank-step by part of the step (report.json's `per_step`, keyed as
/// [`crate::reduce::report::StepPhases::layout`] names them); None where it wrote null.
#[derive(Debug, Deserialize, Clone)]
#[serde(transparent)]
pub(super) struct PhaseSeconds(BTreeMap<String, Option<f64>>);

impl PhaseSeconds {
    /// The seconds of part `key`: NaN where the report wrote null, 0 where it has no such
    /// key (a report written before that phase existed).
    pub(super) fn seconds(&self, key: &str) -> f64 {
        self.0.get(key).map_or(0.0, |v| v.unwrap_or(f64::NAN))
    }
}

/// One run and node type (report.json's `summary`).
#[derive(Debug, Deserialize)]
pub(super) struct SummaryEntry {
    pub run_id: String,
    #[serde(deserialize_with = "number")]
    pub busbw_bytes_per_s: f64,
}

/// One point and mode (report.json's `scaling`).
#[derive(Debug, Deserialize)]
pub(super) struct ScalingEntry {
    pub run_ids: Vec<String>,
    #[serde(deserialize_with = "number")]
    pub speedup: f64,
}

/// A number, or NaN where JSON holds null (how NaN is written).
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Reads `path`: a folder holding report.json, or a report.json file.
pub(super) fn side(path: &Path) -> Result<Side, Refusal> {
    let file = if path.is_dir() {
        path.join("report.json")
    } else {
        path.to_path_buf()
    };
    if path.is_dir() && std::fs::symlink_metadata(&file).is_err() {
        return Err(Refusal(format!(
            "{} holds no report.json: give a folder `ddpbench reduce` wrote into (its --out), or run `ddpbench reduce` on its runs first",
            path.display()
        )));
    }
    if !crate::files::is_regular_no_follow(&file) {
        return Err(Refusal(match std::fs::symlink_metadata(&file) {
            Err(_) => format!(
                "{} does not exist: give a folder `ddpbench reduce` wrote into (its --out), or its report.json",
                file.display()
            ),
            Ok(m) => format!(
                "{} is {}, not a regular file: give the report folder or its report.json itself",
                file.display(),
                crate::files::describe(m.file_type())
            ),
        }));
    }
    let text = crate::files::read_regular_to_string(&file, crate::bounds::REPORT_JSON)
        .map_err(|e| Refusal(crate::files::read_error(&file, &e)))?;
    let report = parse(&file, &text)?;
    Ok(Side { file, report })
}

/// report.json's text, its version checked before its fields are read.
fn parse(file: &Path, text: &str) -> Result<ReportFile, Refusal> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Refusal(format!(
            "{} is not whole JSON ({e}): it is damaged or truncated; run `ddpbench reduce` on its runs again",
            file.display()
        ))
    })?;
    match value.get("report_version").map(Value::as_u64) {
        None => Err(Refusal(format!(
            "{} has no report_version: it is not a report.json of `ddpbench reduce`; run `ddpbench reduce` on its runs to write one",
            file.display()
        ))),
        Some(None) => Err(Refusal(format!("{}: report_version is not a whole number: the file is damaged", file.display()))),
        Some(Some(v)) if v > u64::from(REPORT_VERSION) => Err(Refusal(format!(
            "{} is report_version {v}, written by a newer ddpbench; this one reads up to {REPORT_VERSION}: compare with the newer ddpbench, or run this one's `reduce` on the runs",
            file.display()
        ))),
        Some(Some(_)) => match value.get("schema_version").and_then(Value::as_u64).and_then(|v| schema_problem(v, "compare")) {
            Some(why) => Err(Refusal(format!("{} is {why}", file.display()))),
            None => typed(file, text),
        },
    }
}

/// report.json's fields, read from its text so that an error names the line and column.
fn typed(file: &Path, text: &str) -> Result<ReportFile, Refusal> {
    serde_json::from_str(text).map_err(|e| {
        Refusal(format!(
            "{} is damaged: {e}; run `ddpbench reduce` on its runs again",
            file.display()
        ))
    })
}
