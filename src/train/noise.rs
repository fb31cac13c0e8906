//! The gradient noise scale of an epoch: every rank's squared norms of the steps that
//! took them, gathered on rank 0 once per epoch, the ranks' small norms averaged step
//! by step, then estimated ([`crate::noise_scale::estimate`]) for `epochs.csv`.

use crate::noise_scale::NormPair;
use crate::world::{gather_strings, Group};

/// One rank's norms of an epoch as text: `batch_small,sq_small,batch_big,sq_big` per
/// step, steps separated by `;`. A norm that is not finite is written `inf` or `NaN`
/// and read back as such.
fn encode(pairs: &[NormPair]) -> String {
    pairs
        .iter()
        .map(|p| format!("{},{},{},{}", p.batch_small, p.sq_small, p.batch_big, p.sq_big))
        .collect::<Vec<_>>()
        .join(";")
}

fn decode(text: &str) -> Vec<NormPair> {
    text.split(';')
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let v: Vec<f64> = s.split(',').map(|x| x.parse().unwrap_or(f64::NAN)).collect();
            (v.len() == 4).then(|| NormPair {
                batch_small: v[0],
                sq_small: v[1],
                batch_big: v[2],
                sq_big: v[3],
            })
        })
        .collect()
}

/// Step by step over the ranks' lists (the same steps on every rank): the mean of
/// each field, so a norm not finite on any rank makes the step's not finite.
pub(super) fn combine(per_rank: &[Vec<NormPair>]) -> Vec<NormPair> {
    let steps = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    let n = per_rank.len() as f64;
    (0..steps)
        .map(|i| {
            let mean = |f: fn(&NormPair) -> f64| per_rank.iter().map(|r| f(&r[i])).sum::<f64>() / n;
            NormPair {
                batch_small: mean(|p| p.batch_small),
                sq_small: mean(|p| p.sq_small),
                batch_big: mean(|p| p.batch_big),
                sq_big: mean(|p| p.sq_big),
            }
        })
        .collect()
}

/// Every rank's norms of the epoch, combined on rank 0 (None elsewhere). A collective:
/// every rank calls it.
pub(super) fn gather_epoch(g: &Group, mine: &[NormPair]) -> Option<Vec<NormPair>> {
    let all = gather_strings(g, &encode(mine))?;
    Some(combine(&all.iter().map(|s| decode(s)).collect::<Vec<_>>()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(sq_small: f64) -> NormPair {
        NormPair {
            batch_small: 32.0,
            sq_small,
            batch_big: 64.0,
            sq_big: 1.5,
        }
    }

    #[test]
    fn norms_travel_as_text_and_ranks_average_per_step() {
        let a = vec![pair(2.0), pair(f64::INFINITY), pair(4.0)];
        let b = vec![pair(4.0), pair(3.0), pair(f64::NAN)];
        let back = decode(&encode(&a));
        assert_eq!(back[0], a[0]);
        assert!(back[1].sq_small.is_infinite());
        assert!(decode("").is_empty());
        let c = combine(&[back, decode(&encode(&b))]);
        assert_eq!(c.len(), 3);
        assert_eq!((c[0].sq_small, c[0].sq_big, c[0].batch_small), (3.0, 1.5, 32.0));
        // Not finite on one rank: not finite for the step, so the estimate skips it.
        assert!(!c[1].sq_small.is_finite() && !c[2].sq_small.is_finite());
        let e = crate::noise_scale::estimate(&c).unwrap();
        assert_eq!((e.steps, e.skipped), (1, 2));
    }
}
