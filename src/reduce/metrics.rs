//! Every derived figure `reduce` prints, each defined once, as a pure function of the
//! numbers it is computed from. Tables, CSV files and plots all call these.

pub(crate) use crate::bandwidth::{algbw, busbw};

/// The straggler wait of a rank in one step: `last_entry − own_entry`, where an entry is
/// when a rank handed its last bucket to the all-reduce (on rank 0's clock): the
/// all-reduce cannot complete before the last rank has entered it. Never negative.
pub(crate) fn straggler_wait(last_entry_s: f64, own_entry_s: f64) -> f64 {
    (last_entry_s - own_entry_s).max(0.0)
}

/// The transfer time of a rank's all-reduce in one step: its all-reduce work minus the
/// straggler wait inside it, `max(comm_s − wait_s, 0)`.
pub(crate) fn transfer_time(comm_s: f64, wait_s: f64) -> f64 {
    (comm_s - wait_s).max(0.0)
}

/// Throughput of a run: `samples per step / mean step time` (samples/s).
pub(crate) fn throughput(samples_per_step: f64, mean_step_s: f64) -> f64 {
    if mean_step_s > 0.0 {
        samples_per_step / mean_step_s
    } else {
        f64::NAN
    }
}

/// Speedup: `throughput / baseline throughput`.
pub(crate) fn speedup(throughput: f64, base_throughput: f64) -> f64 {
    throughput / base_throughput
}

/// Parallel efficiency: `speedup / (ranks / baseline ranks)`.
pub(crate) fn efficiency(speedup: f64, rank_ratio: f64) -> f64 {
    speedup / rank_ratio
}

/// Compute/communication ratio R: `(forward + backward) / all-reduce work`, from mean
/// times per step; NaN without communication.
pub(crate) fn compute_comm_ratio(forward_s: f64, backward_s: f64, comm_s: f64) -> f64 {
    if comm_s > 0.0 {
        (forward_s + backward_s) / comm_s
    } else {
        f64::NAN
    }
}

/// The efficiency the transfer alone allows without overlap: `T1 / (T1 + transfer)`,
/// with T1 the measured 1-rank step at the point's per-rank batch and `transfer` the
/// point's all-reduce after the last rank entered, both per step. A point whose step is
/// T1 plus its transfer, nothing else slower than alone, has exactly this efficiency.
/// NaN without a step.
pub(crate) fn transfer_limit_efficiency(t1_s: f64, transfer_s: f64) -> f64 {
    if t1_s > 0.0 {
        t1_s / (t1_s + transfer_s.max(0.0))
    } else {
        f64::NAN
    }
}

/// Karp–Flatt experimentally determined serial fraction for speedup `s` on `p` times
/// the baseline's ranks: `e = (1/s − 1/p) / (1 − 1/p)`. NaN for p ≤ 1.
pub fn karp_flatt(speedup: f64, p: f64) -> f64 {
    if p <= 1.0 || speedup <= 0.0 {
        return f64::NAN;
    }
    (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)
}

/// Gustafson's serial fraction of a weak-scaling point: from the scaled speedup
/// `S = n − s·(n − 1)` on `n` times the ranks, `s = (n − S) / (n − 1)`. NaN for n ≤ 1.
pub(crate) fn gustafson_serial_fraction(speedup: f64, n: f64) -> f64 {
    if n <= 1.0 {
        return f64::NAN;
    }
    (n - speedup) / (n - 1.0)
}

/// Amdahl's law: the speedup on `p` times the ranks with serial fraction `f`,
/// `1 / (f + (1 − f)/p)`.
pub(crate) fn amdahl(f: f64, p: f64) -> f64 {
    1.0 / (f + (1.0 - f) / p)
}

/// The least-squares serial fraction f in [0, 1] of Amdahl's law through the points
/// (p, speedup), by golden-section search (the error is unimodal in f); NaN without points.
pub(crate) fn amdahl_fit(points: &[(f64, f64)]) -> f64 {
    if points.is_empty() {
        return f64::NAN;
    }
    let err = |f: f64| points.iter().map(|&(p, s)| (amdahl(f, p) - s).powi(2)).sum::<f64>();
    let (mut a, mut b) = (0.0f64, 1.0f64);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..200 {
        let c = b - g * (b - a);
        let d = a + g * (b - a);
        if err(c) <= err(d) {
            b = d
        } else {
            a = c
        }
    }
    (a + b) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn waits_and_transfers() {
        // The last rank entered at 10.3 s, this one at 10.0 s.
        assert!(close(straggler_wait(10.3, 10.0), 0.3));
        // The last rank itself waits for nobody.
        assert_eq!(straggler_wait(10.3, 10.3), 0.0);
        assert!(close(transfer_time(0.5, 0.3), 0.2));
        assert_eq!(transfer_time(0.2, 0.3), 0.0);
    }

    #[test]
    fn scaling_figures_by_hand() {
        // 20 samples/step at 1.5 s: 13.33 samples/s; baseline 10 samples/s.
        let t = throughput(20.0, 1.5);
        assert!(close(t, 40.0 / 3.0));
        let s = speedup(t, 10.0);
        assert!(close(s, 4.0 / 3.0));
        assert!(close(efficiency(s, 2.0), 2.0 / 3.0));
        // Karp–Flatt at s = 4/3, p = 2: (3/4 − 1/2) / (1/2) = 1/2.
        assert!(close(karp_flatt(s, 2.0), 0.5));
        assert!(karp_flatt(1.0, 1.0).is_nan());
        // Weak scaling: scaled speedup 3.4 on 4 ranks: s = (4 − 3.4) / 3 = 0.2.
        assert!(close(gustafson_serial_fraction(3.4, 4.0), 0.2));
        assert!(gustafson_serial_fraction(1.0, 1.0).is_nan());
        // R = (0.3 + 0.5) / 0.4 = 2.
        assert!(close(compute_comm_ratio(0.3, 0.5, 0.4), 2.0));
        assert!(compute_comm_ratio(0.3, 0.5, 0.0).is_nan());
        // A 1.0 s step alone plus 0.25 s of transfer: 80 %.
        assert!(close(transfer_limit_efficiency(1.0, 0.25), 0.8));
        assert!(transfer_limit_efficiency(0.0, 0.25).is_nan());
    }

    #[test]
    fn amdahl_and_its_fit() {
        // f = 0.1, p = 4: 1 / (0.1 + 0.9/4) = 1/0.325.
        assert!(close(amdahl(0.1, 4.0), 1.0 / 0.325));
        let pts: Vec<(f64, f64)> = [2.0, 4.0, 8.0].iter().map(|&p| (p, amdahl(0.2, p))).collect();
        assert!((amdahl_fit(&pts) - 0.2).abs() < 1e-6);
        assert!(amdahl_fit(&[]).is_nan());
    }
}
