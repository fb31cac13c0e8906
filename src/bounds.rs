//! What a value read back from a file may be. `reduce` and `diagnose` read files that
//! anyone may have edited, truncated or forged; every number they size, sum or print
//! is first held against what a real run can produce. The bounds are far above any
//! machine ddpbench runs on, and far below what makes arithmetic overflow or an
//! allocation fail, so a real run never meets them and a forged one never gets past.

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

/// Bytes of a JSON file read whole (`link_model.json`, a flight record): 64 MiB,
/// hundreds of times what ddpbench writes into one.
pub(crate) const MAX_JSON_BYTES: u64 = 64 << 20;

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

/// The text of a JSON file no larger than [`MAX_JSON_BYTES`], checked before it is read;
/// only a regular file is read (a FIFO or a device in its place is named, not waited on).
pub(crate) fn read_json_text(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = crate::files::open_regular(path).map_err(|e| crate::files::read_error(path, &e))?;
    let len = file.metadata().map_err(|e| crate::files::read_error(path, &e))?.len();
    if len > MAX_JSON_BYTES {
        return Err(format!(
            "{} holds {len} bytes: more than ddpbench writes into such a file ({MAX_JSON_BYTES}); it is not one",
            path.display()
        ));
    }
    let mut text = String::new();
    file.take(MAX_JSON_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| crate::files::read_error(path, &e))?;
    Ok(text)
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
