//! `clock.csv`: the clock offsets between ranks that rank 0 estimates at the start and
//! after every epoch ([`ClockRow`]), one row per rank and estimate; `reduce` corrects
//! the ranks' times by them.

use super::CsvLog;
use anyhow::Result;
use serde::{Deserialize, Serialize};

/// Round trips at most, per rank and estimate (bounds the rows' work whatever the link).
pub(crate) const MAX_ROUNDS: usize = 100_000;

/// One rank's offset at one synchronisation point (a row of `clock.csv`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ClockRow {
    /// 0 at the start of training, k after epoch k-1.
    pub sync: usize,
    pub rank: usize,
    /// Rank 0's clock (seconds since its start of the run) at this estimate
    /// (`rank0_elapsed_s` before schema 3).
    #[serde(alias = "rank0_elapsed_s")]
    pub rank0_at_s: f64,
    /// Rank 0's clock minus this rank's clock, estimated by round trips: add it to this
    /// rank's times.
    pub offset_s: f64,
    /// Half the shortest round trip: the estimate is right to within this.
    pub error_s: f64,
    /// Round trips made for this estimate (absent in older files).
    #[serde(default)]
    pub rounds: Option<usize>,
    /// The exact offset, from the ranks' origins on one `CLOCK_MONOTONIC`; empty where
    /// this rank runs under another kernel than rank 0 (or in older files).
    #[serde(default, deserialize_with = "empty_as_none")]
    pub exact_offset_s: Option<f64>,
    /// What `exact_offset_s` is right to within: the two origins' reading error.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub exact_error_s: Option<f64>,
}

impl ClockRow {
    /// The offset to use and its error: the exact one where there is one.
    pub(crate) fn best(&self) -> (f64, f64) {
        match (self.exact_offset_s, self.exact_error_s) {
            (Some(o), Some(e)) => (o, e),
            (Some(o), None) => (o, 0.0),
            _ => (self.offset_s, self.error_s),
        }
    }
}

/// An empty CSV cell reads as None.
fn empty_as_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    match s.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => t.parse::<f64>().map(Some).map_err(serde::de::Error::custom),
    }
}

/// `clock.csv` in the run folder, written by rank 0.
pub(crate) struct ClockLog(CsvLog<ClockRow>);

impl ClockLog {
    pub(crate) fn create(path: &std::path::Path) -> Result<ClockLog> {
        Ok(ClockLog(CsvLog::create_new(path)?))
    }

    pub(crate) fn write(&mut self, rows: &[ClockRow]) -> Result<()> {
        for r in rows {
            self.0.write(r)?;
        }
        self.0.flush()
    }
}
