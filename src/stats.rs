//! Order statistics used by the recorder and the reducer.

/// Value at quantile `q` (0..=1) of `sorted` (ascending) by linear interpolation
/// between closest ranks, as numpy's default and spreadsheets' PERCENTILE.INC do.
/// NaN for an empty slice.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Sorts a copy of `values` and returns the quantile `q`.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    quantile_sorted(&v, q)
}

pub fn median(values: &[f64]) -> f64 {
    quantile(values, 0.5)
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
    pub const EXACT_CAP: usize = 4096;

    pub fn new() -> Sketch {
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

    pub fn push(&mut self, v: f64) {
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

    pub fn merge(&mut self, other: &Sketch) {
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

    pub fn count(&self) -> u64 {
        self.count
    }
    pub fn sum(&self) -> f64 {
        self.sum
    }
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.sum / self.count as f64
        }
    }
    pub fn max(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.max
        }
    }
    pub fn min(&self) -> f64 {
        if self.count == 0 {
            f64::NAN
        } else {
            self.min
        }
    }
    /// True while quantiles are exact.
    pub fn is_exact(&self) -> bool {
        self.bins.is_empty()
    }

    pub fn quantile(&self, q: f64) -> f64 {
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

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }
}

/// A uniform sample of at most `cap` values of a stream (Vitter's algorithm R),
/// with a fixed seed so reports are reproducible.
#[derive(Debug, Clone)]
pub struct Reservoir {
    pub values: Vec<f64>,
    pub seen: u64,
    cap: usize,
    rng: Rng,
}

impl Reservoir {
    pub fn new(cap: usize) -> Reservoir {
        Reservoir {
            values: Vec::new(),
            seen: 0,
            cap,
            rng: Rng(0x5eed_0f_ddb),
        }
    }
    pub fn push(&mut self, v: f64) {
        self.seen += 1;
        if self.values.len() < self.cap {
            self.values.push(v);
        } else {
            let j = self.rng.below(self.seen);
            if (j as usize) < self.cap {
                self.values[j as usize] = v;
            }
        }
    }
}

/// SplitMix64: small, seedable, good enough for resampling.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Bootstrap replicates of the mean of a stream of `n` values from a uniform sample
/// of it: each replicate is the mean of a resample (with replacement) of `sample`,
/// its deviation from the sample mean shrunk by sqrt(m/n) when the sample (m values)
/// is smaller than the stream, so the spread is that of a mean of n values.
pub fn bootstrap_means(sample: &[f64], n: u64, replicates: usize, seed: u64) -> Vec<f64> {
    if sample.is_empty() {
        return Vec::new();
    }
    let m = sample.len();
    let centre = sample.iter().sum::<f64>() / m as f64;
    let shrink = ((m as f64) / (n.max(m as u64) as f64)).sqrt();
    let mut rng = Rng(seed);
    (0..replicates)
        .map(|_| {
            let s: f64 = (0..m).map(|_| sample[rng.below(m as u64) as usize]).sum();
            centre + (s / m as f64 - centre) * shrink
        })
        .collect()
}

/// The mean of a block-bootstrap resample of `series`: as many blocks of `block`
/// consecutive values as fit the series, each starting at a random position, so the
/// dependence between neighbouring steps is kept within a block.
pub fn block_resample_mean(series: &[f64], block: usize, rng: &mut Rng) -> f64 {
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

    #[test]
    fn bootstrap_centres_on_the_mean_and_shrinks_for_long_streams() {
        let sample: Vec<f64> = (0..100).map(|i| (i % 10) as f64).collect();
        let reps = bootstrap_means(&sample, 100, 2000, 1);
        let mean = reps.iter().sum::<f64>() / reps.len() as f64;
        assert!((mean - 4.5).abs() < 0.05, "{mean}");
        let spread = quantile(&reps, 0.975) - quantile(&reps, 0.025);
        // SE of the mean = 2.87/sqrt(100) = 0.287: the 95 % interval is about 1.1 wide.
        assert!(spread > 0.9 && spread < 1.35, "{spread}");
        let reps = bootstrap_means(&sample, 10_000, 2000, 1);
        let narrow = quantile(&reps, 0.975) - quantile(&reps, 0.025);
        assert!((narrow / spread - 0.1).abs() < 0.02, "{narrow}");
    }
}
