//! Reads a rank's trace file back, in either form the writer leaves: the object form of a
//! finished run, or the array form of one that stopped (one event a line, perhaps a
//! half-written last line). Every event is checked before it is used; reading stops at
//! the first line that is not a whole event, so a rank killed mid-write gives every
//! event it finished.

use crate::trace::writer::MAX_FILE_BYTES;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::io::Read;
use std::path::Path;

/// What was read from one rank's file.
#[derive(Debug)]
pub struct RankEvents {
    pub events: Vec<Map<String, Value>>,
    /// True when the file ended in the object form (the run finished it).
    pub complete: bool,
    /// The line reading stopped at, when one was not a whole event.
    pub stopped_at_line: Option<usize>,
}

/// Reads `path`, written for rank `rank`.
pub fn rank_file(path: &Path, rank: usize) -> Result<RankEvents> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if len > MAX_FILE_BYTES {
        bail!(
            "{} is {len} bytes, over the {MAX_FILE_BYTES} a trace of at most 10000 steps can reach: \
             not a file ddpbench wrote; remove it or trace fewer steps (--trace-steps)",
            path.display()
        );
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .with_context(|| format!("{} is not UTF-8 text: not a trace ddpbench wrote", path.display()))?;
    let mut out = RankEvents {
        events: Vec::new(),
        complete: text.trim_end().ends_with("]}"),
        stopped_at_line: None,
    };
    for (i, line) in text.lines().enumerate() {
        let l = line.trim().trim_end_matches(',');
        if !l.starts_with("{\"ph\"") {
            continue;
        }
        match serde_json::from_str::<Value>(l).ok().and_then(|v| checked(v, rank)) {
            Some(e) => out.events.push(e),
            None => {
                out.stopped_at_line = Some(i + 1);
                break;
            }
        }
    }
    Ok(out)
}

/// The event when it has everything a trace reader needs: `ph`, `name`, `cat` strings,
/// this rank's `pid`, a whole `tid`, finite `ts` and `dur ≥ 0`.
fn checked(v: Value, rank: usize) -> Option<Map<String, Value>> {
    let Value::Object(m) = v else { return None };
    let s = |k: &str| m.get(k).and_then(Value::as_str).is_some();
    let ts = m.get("ts").and_then(Value::as_f64).filter(|t| t.is_finite())?;
    let dur = m.get("dur").and_then(Value::as_f64).filter(|d| d.is_finite() && *d >= 0.0)?;
    let pid_ok = m.get("pid").and_then(Value::as_u64) == Some(rank as u64);
    let tid_ok = m.get("tid").and_then(Value::as_u64).is_some();
    (s("ph") && s("name") && s("cat") && pid_ok && tid_ok && ts.abs() < 1e15 && dur < 1e15).then_some(m)
}
