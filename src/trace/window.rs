//! Which steps a rank traces: `--trace-steps A:B` (global steps A to B, B excluded), or
//! with `--trace` alone the first [`DEFAULT_STEPS`] steps after warm-up. The window is
//! bounded so a trace file stays small whatever the run's length.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Steps `--trace` alone traces, from the first step after warm-up.
pub(crate) const DEFAULT_STEPS: usize = 50;
/// The most steps one window holds. A step takes about 1.5 kB of trace with one
/// bucket and 400 kB with a thousand, so a long window of a many-bucket model stops
/// earlier, at the file's bound (`super::writer::MAX_RANK_BYTES`).
pub(crate) const MAX_STEPS: usize = 10_000;

/// Global steps `first..end` (end excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepWindow {
    pub first: usize,
    pub end: usize,
}

impl StepWindow {
    /// `--trace` alone: the first [`DEFAULT_STEPS`] steps after `warmup_steps`.
    pub(crate) fn after_warmup(warmup_steps: usize) -> StepWindow {
        StepWindow {
            first: warmup_steps,
            end: warmup_steps.saturating_add(DEFAULT_STEPS),
        }
    }

    pub(crate) fn contains(&self, global_step: usize) -> bool {
        (self.first..self.end).contains(&global_step)
    }
}

impl FromStr for StepWindow {
    type Err = String;

    fn from_str(s: &str) -> Result<StepWindow, String> {
        let bad = |why: &str| format!("--trace-steps {s:?}: {why}; give A:B, global steps A to B (B excluded), e.g. 10:60");
        let (a, b) = s.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let first: usize = a.trim().parse().map_err(|_| bad("A is not a whole number"))?;
        let end: usize = b.trim().parse().map_err(|_| bad("B is not a whole number"))?;
        if end <= first {
            return Err(bad("B must be larger than A"));
        }
        if end - first > MAX_STEPS {
            return Err(bad(&format!("at most {MAX_STEPS} steps are traced in one run")));
        }
        Ok(StepWindow { first, end })
    }
}

impl fmt::Display for StepWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.first, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_refuse() {
        assert_eq!("3:7".parse(), Ok(StepWindow { first: 3, end: 7 }));
        assert!(!StepWindow { first: 3, end: 7 }.contains(7));
        for bad in ["7:3", "3:3", "3", "a:5", "0:10001"] {
            let e = bad.parse::<StepWindow>().unwrap_err();
            assert!(e.contains("--trace-steps"), "{e}");
        }
        assert_eq!(StepWindow::after_warmup(5), StepWindow { first: 5, end: 55 });
    }
}
