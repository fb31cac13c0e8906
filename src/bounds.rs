//! What a value read back from a file may be. `reduce` and `diagnose` read files that
//! anyone may have edited, truncated or forged; every number they size, sum or print
//! is first held against what a real run can produce. The bounds are far above any
//! machine ddpbench runs on, and far below what makes arithmetic overflow or an
//! allocation fail, so a real run never meets them and a forged one never gets past.

use crate::files::SizeBound;
use std::path::Path;

/// Ranks of one job: 2^22 (4,194,304), over ten times the largest MPI jobs run, and
/// small enough that a vector per rank stays within tens of MiB.
pub(crate) const MAX_RANKS: usize = 1 << 22;

/// Gradient bytes one rank all-reduces in a step: 2^50 (1 PiB), the fp32 gradients of
/// 2^48 parameters, beyond any device's memory.
pub(crate) const MAX_BYTES_PER_STEP: u64 = 1 << 50;

/// Samples one rank processes in a step: 2^40. A step of 2^40 samples of even one byte
/// is a TiB of input per rank; sums over 2^22 ranks stay below 2^63.
pub(crate) const MAX_SAMPLES_PER_STEP: u64 = 1 << 40;

/// Gradient buckets of a run: 2^20. A bucket holds at least one parameter tensor, and
/// networks have thousands of tensors, not millions.
pub(crate) const MAX_BUCKETS: usize = 1 << 20;

/// Seconds a run, a step or a collective may last: 10^8 s (over three years), longer
/// than any allocation runs.
pub(crate) const MAX_RUN_S: f64 = 1e8;

/// Samples one rank trains on in one micro-batch (`train --batch-size`): 2^20. `train`
/// refuses more, so no run's manifest holds more.
pub(crate) const MAX_BATCH_PER_RANK: u64 = 1 << 20;

/// Micro-batches of one optimizer step (`train --grad-accum`): 4096. `train` refuses
/// more, so no run's manifest holds more.
pub(crate) const MAX_GRAD_ACCUM: u64 = 4096;

/// `manifest.json`: 256 MiB. A rank's entry (host, binding, launcher and NCCL
/// environment, GPU clocks) takes a few KiB, so this holds tens of thousands of ranks'.
pub(crate) const MANIFEST: SizeBound = SizeBound {
    what: "a manifest",
    max_bytes: 256 << 20,
};

/// One row of a CSV file a run writes (`rank-NNNNN.csv`, `epochs.csv`, `clock.csv`,
/// `rank-NNNNN.gpu.csv`, a peer trainer's rank files): 64 KiB. A rank file's row is under
/// 1 KiB (thirty-odd numbers, a run id of at most 255 bytes, the node type); the bound is
/// per row, not per file, as a long run's rank file holds millions of rows.
pub(crate) const MAX_CSV_ROW_BYTES: u64 = 64 << 10;

/// A study's `state.json`: 64 MiB, for a line per run of the study with its error.
pub(crate) const STUDY_STATE: SizeBound = SizeBound {
    what: "a study's state.json",
    max_bytes: 64 << 20,
};

/// A study's `study.json`: 64 MiB, for its points at under a KiB each.
pub(crate) const STUDY_FILE: SizeBound = SizeBound {
    what: "a study.json",
    max_bytes: 64 << 20,
};

/// The `study.toml` a study folder keeps: 1 MiB, hundreds of times a study file's size.
pub(crate) const STUDY_TOML: SizeBound = SizeBound {
    what: "a saved study.toml",
    max_bytes: 1 << 20,
};

/// A peer trainer's `peer.json`: 1 MiB, for its six short fields (one a list of bucket sizes).
pub(crate) const PEER_INFO: SizeBound = SizeBound {
    what: "a peer.json",
    max_bytes: 1 << 20,
};

/// `report.json`: 256 MiB (its size grows with runs and points, not with steps or rows).
pub(crate) const REPORT_JSON: SizeBound = SizeBound {
    what: "a report.json",
    max_bytes: 256 << 20,
};

/// `link_model.json`: 64 MiB, hundreds of times what a sweep writes into one.
pub(crate) const LINK_MODEL: SizeBound = SizeBound {
    what: "a link model",
    max_bytes: 64 << 20,
};

/// A rank's flight record (`rank-NNNNN.flight.json`): 64 MiB, hundreds of times what its
/// 64 collectives take.
pub(crate) const FLIGHT_RECORD: SizeBound = SizeBound {
    what: "a flight record",
    max_bytes: 64 << 20,
};

/// How far two times of one row may disagree and still be equal: 1 µs plus 1 ppm of
/// the larger. The CSV holds nanoseconds (9 decimals), so seven phases summed differ
/// from `step_s` by under 4 ns from rounding; 1 µs leaves room for other writers.
pub(crate) fn tolerance_s(a: f64, b: f64) -> f64 {
    1e-6 + 1e-6 * a.abs().max(b.abs())
}

/// How far an instant of a rank may lie beyond the run's wall time on rank 0 and still
/// be real: 1 s plus 10^-4 of the run. The ranks leave the start barrier within
/// milliseconds of each other, and their clocks drift apart by parts per million.
pub(crate) fn clock_slack_s(run_s: f64) -> f64 {
    1.0 + 1e-4 * run_s.abs()
}

/// A number as a message shows it: plain decimals in the usual range, exponent
/// notation beyond it (1e300 rather than 301 digits).
pub(crate) fn shown(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || !v.is_finite() || (1e-7..1e15).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// `v` when it is a finite number of seconds from 0 to `max_s`; Err says `key` is not.
pub(crate) fn seconds(key: &str, v: f64, max_s: f64) -> Result<f64, String> {
    if v.is_finite() && (0.0..=max_s).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{key} is {}: a time must be a finite number of seconds from 0 to {}",
            shown(v),
            shown(max_s)
        ))
    }
}

/// `n` when it is at most `max`; Err says `key` is not and what it counts.
pub(crate) fn at_most<T: PartialOrd + std::fmt::Display>(key: &str, n: T, max: T, what: &str) -> Result<T, String> {
    if n <= max {
        Ok(n)
    } else {
        Err(format!("{key} is {n}: more {what} than any run has (at most {max})"))
    }
}

/// The text of a JSON file within `bound` ([`crate::files::read_regular_to_string`]),
/// Err naming the file and what was wrong with it.
pub(crate) fn read_json_text(path: &Path, bound: SizeBound) -> Result<String, String> {
    crate::files::read_regular_to_string(path, bound).map_err(|e| crate::files::read_error(path, &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_shown_readably_and_checked_against_their_bounds() {
        assert_eq!(shown(-1e9), "-1000000000");
        assert_eq!(shown(1e300), "1e300");
        assert_eq!(shown(-0.001), "-0.001");
        assert_eq!(shown(f64::NAN), "NaN");
        assert_eq!(seconds("x", 2.5, 10.0), Ok(2.5));
        assert!(seconds("x", -0.0001, 10.0).unwrap_err().starts_with("x is -0.0001: "));
        assert!(seconds("x", f64::INFINITY, 10.0).is_err());
        assert!(seconds("x", 11.0, 10.0).is_err());
        assert_eq!(at_most("buckets", 3usize, 4, "buckets"), Ok(3));
        assert!(at_most("buckets", 5usize, 4, "buckets").unwrap_err().contains("buckets is 5"));
        // Seven phases rounded to nanoseconds stay within the tolerance of their sum.
        assert!(7.0 * 0.5e-9 < tolerance_s(0.0, 0.0));
    }
}
