//! The gradient noise scale: from the squared norms of one gradient over a small batch
//! and one over a big batch of the same step, unbiased estimates of |G|² (the squared
//! norm of the true gradient) and tr(Σ) (the trace of the per-sample gradient
//! covariance), and the batch B_simple = tr(Σ)/|G|² past which a bigger batch buys
//! little time to a given loss.
//!
//! For a batch of B samples, E[|G_B|²] = |G|² + tr(Σ)/B. Two batches of one step,
//! B_small < B_big, give per step
//! |G|² ≈ (B_big·|G_big|² − B_small·|G_small|²)/(B_big − B_small) and
//! tr(Σ) ≈ (|G_small|² − |G_big|²)/(1/B_small − 1/B_big). Each is averaged over the
//! steps of a window before B_simple is taken as their ratio: a ratio of means, never a
//! mean of per-step ratios (which noise makes negative or infinite). A window whose
//! mean |G|² is not positive has no noise scale: it is undetermined.
//!
//! The interval is the delta method's on the ratio of the two means, steps taken as
//! independent (consecutive steps see different batches; their gradients drift slowly
//! with training, which the interval does not model), at 95 % with Student's t.

use crate::stats::{mean_variance, student_t_quantile};
use serde::{Deserialize, Serialize};

/// One step's two squared gradient norms, each of the mean gradient over its batch,
/// after AMP unscaling and the loss pre-division.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NormPair {
    /// Samples behind the small gradient (one rank's batch, or one micro-batch).
    pub batch_small: f64,
    /// Samples behind the big gradient (the global batch, or the whole step).
    pub batch_big: f64,
    /// |G_small|².
    pub sq_small: f64,
    /// |G_big|².
    pub sq_big: f64,
}

impl NormPair {
    /// Usable: both norms finite and two different batch sizes.
    pub(crate) fn is_usable(&self) -> bool {
        self.sq_small.is_finite() && self.sq_big.is_finite() && self.batch_small > 0.0 && self.batch_big > self.batch_small
    }

    /// This step's unbiased estimate of |G|².
    pub(crate) fn grad_sq(&self) -> f64 {
        (self.batch_big * self.sq_big - self.batch_small * self.sq_small) / (self.batch_big - self.batch_small)
    }

    /// This step's unbiased estimate of tr(Σ).
    pub(crate) fn trace_sigma(&self) -> f64 {
        (self.sq_small - self.sq_big) / (1.0 / self.batch_small - 1.0 / self.batch_big)
    }
}

/// The noise scale of a window of steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NoiseEstimate {
    /// Steps averaged.
    pub steps: usize,
    /// Steps left out because a norm was not finite (fp16 overflow) or the two batches
    /// were the same size.
    pub skipped: usize,
    /// Mean of the steps' |G|² estimates.
    pub grad_sq: f64,
    /// Mean of the steps' tr(Σ) estimates.
    pub trace_sigma: f64,
    /// tr(Σ)/|G|² in samples; None (undetermined) when the mean |G|² is not positive.
    pub b_simple: Option<f64>,
    /// 95 % interval of `b_simple` (delta method); the upper end None when the interval
    /// of |G|² reaches 0 (unbounded), the whole None with fewer than 2 steps.
    pub interval: Option<(f64, Option<f64>)>,
}

/// The noise scale of `pairs`; None when no step is usable.
pub(crate) fn estimate(pairs: &[NormPair]) -> Option<NoiseEstimate> {
    let usable: Vec<&NormPair> = pairs.iter().filter(|p| p.is_usable()).collect();
    let skipped = pairs.len() - usable.len();
    if usable.is_empty() {
        return None;
    }
    let g: Vec<f64> = usable.iter().map(|p| p.grad_sq()).collect();
    let s: Vec<f64> = usable.iter().map(|p| p.trace_sigma()).collect();
    let (g_mean, g_var) = mean_variance(&g);
    let (s_mean, s_var) = mean_variance(&s);
    let b_simple = (g_mean > 0.0).then(|| s_mean / g_mean);
    let n = usable.len();
    let interval = b_simple.filter(|_| n >= 2).map(|b| {
        let cov = g.iter().zip(&s).map(|(x, y)| (x - g_mean) * (y - s_mean)).sum::<f64>() / (n - 1) as f64;
        let nf = n as f64;
        // Var(S̄/Ḡ) ≈ (Var S − 2·b·Cov(S, G) + b²·Var G) / (n·Ḡ²).
        let var_b = ((s_var - 2.0 * b * cov + b * b * g_var) / (nf * g_mean * g_mean)).max(0.0);
        let t = student_t_quantile(0.975, nf - 1.0);
        let half = t * var_b.sqrt();
        let g_low = g_mean - t * (g_var / nf).sqrt();
        // A batch is not negative: the lower end stops at 0.
        ((b - half).max(0.0), (g_low > 0.0).then_some(b + half))
    });
    Some(NoiseEstimate {
        steps: n,
        skipped,
        grad_sq: g_mean,
        trace_sigma: s_mean,
        b_simple,
        interval,
    })
}

/// Samples to reach a given loss at global batch `batch`, relative to `batch0`, for a
/// noise scale `b_noise`: (1 + B/B_noise)/(1 + B0/B_noise).
pub(crate) fn samples_factor(batch: f64, batch0: f64, b_noise: f64) -> f64 {
    (1.0 + batch / b_noise) / (1.0 + batch0 / b_noise)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Rng;

    /// A standard normal draw (Box–Muller).
    fn normal(rng: &mut Rng) -> f64 {
        let u = |rng: &mut Rng| ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let (a, b) = (u(rng), u(rng));
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }

    /// Per-sample gradients g = μ + σ·z in `dim` dimensions with z standard normal:
    /// |G|² = |μ|² and tr(Σ) = dim·σ². Returns one step's pair of batch means.
    fn step(rng: &mut Rng, mu: &[f64], sigma: f64, small: usize, big: usize) -> NormPair {
        let dim = mu.len();
        let mut sum_small = vec![0.0; dim];
        let mut sum_big = vec![0.0; dim];
        for i in 0..big {
            for d in 0..dim {
                let g = mu[d] + sigma * normal(rng);
                sum_big[d] += g;
                if i < small {
                    sum_small[d] += g;
                }
            }
        }
        let sq = |v: &[f64], n: usize| v.iter().map(|x| (x / n as f64).powi(2)).sum::<f64>();
        NormPair {
            batch_small: small as f64,
            batch_big: big as f64,
            sq_small: sq(&sum_small, small),
            sq_big: sq(&sum_big, big),
        }
    }

    #[test]
    fn synthetic_gradients_give_back_their_mean_norm_and_trace() {
        let mut rng = Rng(7);
        let (dim, sigma) = (20, 0.5);
        let mu: Vec<f64> = (0..dim).map(|d| 0.1 * (d as f64 - 9.5) / 10.0).collect();
        let g_true: f64 = mu.iter().map(|m| m * m).sum();
        let s_true = dim as f64 * sigma * sigma;
        let pairs: Vec<NormPair> = (0..400).map(|_| step(&mut rng, &mu, sigma, 8, 32)).collect();
        let e = estimate(&pairs).unwrap();
        // Sampling error of the means, from the per-step estimates' own spread.
        let se = |v: Vec<f64>| (mean_variance(&v).1 / v.len() as f64).sqrt();
        let g_se = se(pairs.iter().map(NormPair::grad_sq).collect());
        let s_se = se(pairs.iter().map(NormPair::trace_sigma).collect());
        assert!((e.grad_sq - g_true).abs() < 4.0 * g_se, "{} vs {g_true} ± {g_se}", e.grad_sq);
        assert!(
            (e.trace_sigma - s_true).abs() < 4.0 * s_se,
            "{} vs {s_true} ± {s_se}",
            e.trace_sigma
        );
        assert_eq!((e.steps, e.skipped), (400, 0));
        let b_true = s_true / g_true;
        let (low, high) = e.interval.unwrap();
        let high = high.expect("|G|² clearly positive: bounded");
        assert!(low < b_true && b_true < high, "{b_true} outside [{low}, {high}]");
        assert!(low < e.b_simple.unwrap() && e.b_simple.unwrap() < high);
    }

    #[test]
    fn non_finite_norms_are_skipped_and_counted_never_averaged() {
        let ok = NormPair {
            batch_small: 2.0,
            batch_big: 4.0,
            sq_small: 3.0,
            sq_big: 2.0,
        };
        let inf = NormPair {
            sq_small: f64::INFINITY,
            ..ok
        };
        let nan = NormPair { sq_big: f64::NAN, ..ok };
        let e = estimate(&[ok, inf, nan, ok]).unwrap();
        assert_eq!((e.steps, e.skipped), (2, 2));
        // |G|² = (4·2 − 2·3)/2 = 1, tr(Σ) = (3 − 2)/(1/2 − 1/4) = 4.
        assert_eq!((e.grad_sq, e.trace_sigma, e.b_simple), (1.0, 4.0, Some(4.0)));
        assert_eq!(estimate(&[inf, nan]), None);
    }

    #[test]
    fn a_non_positive_gradient_norm_leaves_the_noise_scale_undetermined() {
        // The big batch's norm is below what noise alone gives: |G|² estimate < 0.
        let p = NormPair {
            batch_small: 2.0,
            batch_big: 4.0,
            sq_small: 3.0,
            sq_big: 1.0,
        };
        let e = estimate(&[p, p]).unwrap();
        assert!(e.grad_sq < 0.0);
        assert_eq!((e.b_simple, e.interval), (None, None));
    }

    #[test]
    fn samples_grow_with_the_batch_by_the_noise_scale() {
        assert_eq!(samples_factor(64.0, 64.0, 100.0), 1.0);
        assert!((samples_factor(1024.0, 64.0, 64.0) - 17.0 / 2.0).abs() < 1e-12);
    }
}
