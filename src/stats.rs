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
