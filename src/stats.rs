//! Order statistics used by the recorder and the reducer, and Student's t for intervals
//! from few repeats.

/// Value at quantile `q` (0..=1) of `sorted` (ascending) by linear interpolation
/// between closest ranks, as numpy's default and spreadsheets' PERCENTILE.INC do.
/// NaN for an empty slice.
pub(crate) fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Sorts a copy of `values` and returns the quantile `q`.
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    quantile_sorted(&v, q)
}

pub(crate) fn median(values: &[f64]) -> f64 {
    quantile(values, 0.5)
}

/// Mean and sample variance (divisor n − 1) of `values`; the variance is NaN for fewer
/// than two values.
pub(crate) fn mean_variance(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, f64::NAN);
    }
    (mean, values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0))
}

/// The geometric mean of positive `values`: exp of the mean log; NaN for none.
pub(crate) fn geometric_mean(values: &[f64]) -> f64 {
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// ln Γ(x) for x > 0: Lanczos' series (g = 7, 9 terms), relative error below 1e-13.
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = C[0] + (1..9).map(|i| C[i] / (x + i as f64)).sum::<f64>();
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The continued fraction of the incomplete beta function (modified Lentz).
fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut h = d;
    for m in 1..1000 {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        h *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// The regularised incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1].
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, 1.0 - x) / b
    }
}

/// P(T ≤ t) for Student's t with `df` > 0 degrees of freedom (not necessarily whole).
pub(crate) fn student_t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
    if t > 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The density of Student's t with `df` degrees of freedom at t.
fn student_t_density(t: f64, df: f64) -> f64 {
    let ln_norm = ln_gamma((df + 1.0) / 2.0) - ln_gamma(df / 2.0) - 0.5 * (df * std::f64::consts::PI).ln();
    (ln_norm - (df + 1.0) / 2.0 * (1.0 + t * t / df).ln()).exp()
}

/// The `p`-quantile (0 < p < 1) of Student's t with `df` > 0 degrees of freedom (a
/// Welch–Satterthwaite df need not be whole): 12.706 at df 1, 4.303 at df 2, 3.182 at
/// df 3 for p = 0.975. Newton steps on the distribution function, kept inside a bracket
/// that bisection narrows where a step would leave it; NaN for df ≤ 0 or NaN.
pub(crate) fn student_t_quantile(p: f64, df: f64) -> f64 {
    if !(df > 0.0 && p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    if p < 0.5 {
        return -student_t_quantile(1.0 - p, df);
    }
    if p == 0.5 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, 2.0f64);
    while student_t_cdf(hi, df) < p && hi < 1e300 {
        lo = hi;
        hi *= 4.0;
    }
    let mut t = (lo + hi) / 2.0;
    for _ in 0..200 {
        let f = student_t_cdf(t, df) - p;
        if f.abs() < 1e-14 {
            break;
        }
        if f < 0.0 {
            lo = t;
        } else {
            hi = t;
        }
        let next = t - f / student_t_density(t, df);
        t = if next > lo && next < hi { next } else { (lo + hi) / 2.0 };
        if hi - lo < 1e-13 * t.abs().max(1.0) {
            break;
        }
    }
    t
}

/// The Welch–Satterthwaite degrees of freedom of a sum of independent variance
/// estimates, each given as (its value, its degrees of freedom): (Σ v)² / Σ (v² / df).
/// NaN when a term has no degrees of freedom.
pub(crate) fn welch_satterthwaite_df(terms: &[(f64, f64)]) -> f64 {
    let total: f64 = terms.iter().map(|t| t.0).sum();
    let denominator: f64 = terms.iter().map(|&(v, df)| if v == 0.0 { 0.0 } else { v * v / df }).sum();
    if terms.iter().any(|t| !(t.1 > 0.0)) {
        return f64::NAN;
    }
    if denominator == 0.0 {
        // Every variance is 0: the df of the terms together.
        return terms.iter().map(|t| t.1).sum();
    }
    total * total / denominator
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_hand_values() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        // p95 of 1..=21: position 0.95*20 = 19 -> 20.
        let v: Vec<f64> = (1..=21).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.95), 20.0);
        // p95 of 1..=10: position 8.55 -> 9 + 0.55 = 9.55.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!((quantile(&v, 0.95) - 9.55).abs() < 1e-12);
    }

    #[test]
    fn student_t_quantiles_match_tables() {
        // Two-sided 95 % critical values from the tables, and df 2.5 (a Welch df).
        for (df, want) in [
            (1.0, 12.706_204_7),
            (2.0, 4.302_652_7),
            (2.5, 3.574_654_8),
            (3.0, 3.182_446_3),
            (5.0, 2.570_581_8),
            (10.0, 2.228_138_9),
            (1000.0, 1.962_339_1),
        ] {
            let got = student_t_quantile(0.975, df);
            assert!((got - want).abs() < 1e-6, "df {df}: {got}");
        }
        // df 1 is the Cauchy: tan(π (p − 1/2)).
        let cauchy = (std::f64::consts::PI * 0.49).tan();
        assert!((student_t_quantile(0.99, 1.0) - cauchy).abs() < 1e-8 * cauchy);
        assert!((student_t_quantile(0.025, 4.0) + student_t_quantile(0.975, 4.0)).abs() < 1e-12);
        assert!(student_t_quantile(0.975, 0.0).is_nan());
        assert!((student_t_cdf(2.776_445_1, 4.0) - 0.975).abs() < 1e-8);
    }

    #[test]
    fn welch_satterthwaite_by_hand() {
        // Equal variances and df: the df add up.
        assert!((welch_satterthwaite_df(&[(1.0, 2.0), (1.0, 2.0)]) - 4.0).abs() < 1e-12);
        // (1 + 9)² / (1/2 + 81/2) = 100 / 41.
        assert!((welch_satterthwaite_df(&[(1.0, 2.0), (9.0, 2.0)]) - 100.0 / 41.0).abs() < 1e-12);
        assert!(welch_satterthwaite_df(&[(1.0, 2.0), (1.0, 0.0)]).is_nan());
        let (m, v) = mean_variance(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((m, v), (2.5, 5.0 / 3.0));
        assert!(mean_variance(&[1.0]).1.is_nan());
    }
}

/// Quantiles of a stream in bounded memory: exact while it holds at most
/// [`Sketch::EXACT_CAP`] values, then a histogram whose bins are the f64's exponent
/// and top 9 mantissa bits (relative width 2^-9, so quantiles within ±0.1 %), over
/// 2^-40 (≈1e-12) to 2^24 (≈1.7e7). Smaller values, zero and negatives share the
/// lowest bin; larger ones the highest. No logarithm is computed per value.
#[derive(Debug, Clone, Default)]
pub struct Sketch {
    exact: Vec<f64>,
    bins: Vec<u32>,
    count: u64,
    sum: f64,
    max: f64,
    min: f64,
}

const MANTISSA_BITS: u32 = 9;
const EXP_MIN: i64 = -40;
const EXP_MAX: i64 = 24;
const N_BINS: usize = ((EXP_MAX - EXP_MIN) as usize) << MANTISSA_BITS;

impl Sketch {
    pub(crate) const EXACT_CAP: usize = 4096;

    pub(crate) fn new() -> Sketch {
        Sketch {
            max: f64::NEG_INFINITY,
            min: f64::INFINITY,
            ..Default::default()
        }
    }

    fn bin_of(v: f64) -> usize {
        if !(v > 0.0) {
            return 0;
        }
        // Biased exponent and leading mantissa bits, as one integer: monotone in v.
        let key = (v.to_bits() >> (52 - MANTISSA_BITS)) as i64;
        let lowest = (EXP_MIN + 1023) << MANTISSA_BITS;
        (key - lowest).clamp(0, N_BINS as i64 - 1) as usize
    }

    fn bin_center(i: usize) -> f64 {
        let lowest = ((EXP_MIN + 1023) << MANTISSA_BITS) as u64;
        let lo = f64::from_bits((i as u64 + lowest) << (52 - MANTISSA_BITS));
        let hi = f64::from_bits((i as u64 + 1 + lowest) << (52 - MANTISSA_BITS));
        (lo + hi) / 2.0
    }

    fn spill(&mut self) {
        self.bins = vec![0; N_BINS];
        for v in std::mem::take(&mut self.exact) {
            self.bins[Self::bin_of(v)] += 1;
        }
    }

    pub(crate) fn push(&mut self, v: f64) {
        self.count += 1;
        self.sum += v;
        self.max = self.max.max(v);
        self.min = self.min.min(v);
        if self.bins.is_empty() {
            self.exact.push(v);
            if self.exact.len() > Self::EXACT_CAP {
                self.spill();
            }
        } else {
            self.bins[Self::bin_of(v)] += 1;
        }
    }

    pub(crate) fn merge(&mut self, other: &Sketch) {
        if other.count == 0 {
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
        self.min = self.min.min(other.min);
        if self.bins.is_empty() && other.bins.is_empty() && self.exact.len() + other.exact.len() <= Self::EXACT_CAP {
            self.exact.extend_from_slice(&other.exact);
            return;
        }
        if self.bins.is_empty() {
            self.spill();
        }
        for &v in &other.exact {
            self.bins[Self::bin_of(v)] += 1;
        }
        for (i, &c) in other.bins.iter().enumerate() {
            self.bins[i] += c;
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }
    pub(crate) fn sum(&self) -> f64 {
        self.sum
    }
    pub(crate) fn mean(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.sum / self.count as f64
        }
    }
    pub(crate) fn max(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.max
        }
    }
    /// True while quantiles are exact.
    #[cfg(test)]
    pub(crate) fn is_exact(&self) -> bool {
        self.bins.is_empty()
    }

    pub(crate) fn quantile(&self, q: f64) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        if self.bins.is_empty() {
            return quantile(&self.exact, q);
        }
        // Same rank convention as `quantile_sorted`, read off the histogram.
        let target = q.clamp(0.0, 1.0) * (self.count - 1) as f64;
        let mut seen = 0u64;
        for (i, &c) in self.bins.iter().enumerate() {
            if c > 0 && (seen + c as u64) as f64 > target {
                return Self::bin_center(i).clamp(self.min, self.max);
            }
            seen += c as u64;
        }
        self.max
    }

    pub(crate) fn median(&self) -> f64 {
        self.quantile(0.5)
    }
}

/// SplitMix64: small, seedable, good enough for resampling.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub u64);
impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The mean of a block-bootstrap resample of `series`: as many blocks of `block`
/// consecutive values as fit the series, each starting at a random position, so the
/// dependence between neighbouring steps is kept within a block.
pub(crate) fn block_resample_mean(series: &[f64], block: usize, rng: &mut Rng) -> f64 {
    if series.is_empty() {
        return f64::NAN;
    }
    let block = block.clamp(1, series.len());
    let starts = (series.len() - block + 1) as u64;
    let blocks = series.len().div_ceil(block);
    let mut sum = 0.0;
    for _ in 0..blocks {
        let s = rng.below(starts) as usize;
        sum += series[s..s + block].iter().sum::<f64>();
    }
    sum / (blocks * block) as f64
}

#[cfg(test)]
mod sketch_tests {
    use super::*;

    #[test]
    fn sketch_is_exact_when_small_and_close_when_large() {
        let mut s = Sketch::new();
        for v in [3.0, 1.0, 2.0] {
            s.push(v);
        }
        assert_eq!((s.median(), s.max(), s.mean()), (2.0, 3.0, 2.0));
        let mut big = Sketch::new();
        for i in 1..=100_000 {
            big.push(i as f64 * 1e-5); // 0.00001 .. 1.0
        }
        assert!(!big.is_exact());
        assert!((big.median() - 0.5).abs() / 0.5 < 0.001, "{}", big.median());
        assert!((big.quantile(0.95) - 0.95).abs() / 0.95 < 0.001);
        assert!((big.quantile(0.01) - 0.01).abs() / 0.01 < 0.001);
        assert_eq!(big.max(), 1.0);
        let mut merged = Sketch::new();
        merged.merge(&s);
        merged.merge(&big);
        assert_eq!(merged.count(), 100_003);
    }

    #[test]
    fn block_resamples_keep_the_mean_and_blocks() {
        let series: Vec<f64> = (0..1000).map(|i| (i / 100) as f64).collect();
        let mut rng = Rng(3);
        let means: Vec<f64> = (0..500).map(|_| block_resample_mean(&series, 10, &mut rng)).collect();
        let m = means.iter().sum::<f64>() / means.len() as f64;
        assert!((m - 4.5).abs() < 0.2, "{m}");
        // A block as long as the series is the series itself.
        assert_eq!(block_resample_mean(&series, 1000, &mut rng), 4.5);
        assert!(block_resample_mean(&[], 3, &mut rng).is_nan());
    }
}
