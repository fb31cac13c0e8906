//! The order of a split's samples in an epoch and each rank's share of it, sharded as
//! PyTorch's `DistributedSampler(shuffle=True, drop_last=False)`: a permutation of the n
//! samples seeded by the seed and the epoch (the same on every rank), padded by wrapping
//! to a multiple of the world size, rank r taking every size-th place from r.
//!
//! The permutation is computed, never stored ([`Permutation`]: a keyed Feistel network
//! on the smallest power of four that holds n, cycle-walked into [0, n)), and a rank's
//! batches are computed as they are taken ([`Batches`]): memory does not grow with n,
//! which a synthetic split may take up to 10^12.

/// The name of this order, recorded in the manifest (`config.sample_order`). Runs
/// without it shuffled with a stored Fisher–Yates permutation: the same seed gave
/// another order of the same samples.
pub(crate) const SAMPLE_ORDER: &str = "feistel-v1";

/// Feistel rounds: four make a keyed permutation indistinguishable from a random one
/// (Luby–Rackoff); two more mix the small domains of small splits.
const ROUNDS: usize = 6;

/// A permutation of [0, n) chosen by a seed and an epoch, computed place by place in
/// constant memory and time per place (a few Feistel evaluations on average).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Permutation {
    n: u64,
    /// Bits of each half of the Feistel network's domain (of 4^half_bits values ≥ n).
    half_bits: u32,
    keys: [u64; ROUNDS],
}

/// SplitMix64's finaliser: a bijection of u64 whose every output bit depends on every
/// input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Permutation {
    /// The permutation of `n` places (n ≥ 1) for `seed` and `epoch`.
    pub(crate) fn new(n: u64, seed: u64, epoch: u64) -> Permutation {
        assert!(n > 0, "a permutation of no places");
        let bits = u64::BITS - (n - 1).leading_zeros();
        let mut state = mix(seed ^ 0xddb0_5eed) ^ mix(epoch.wrapping_add(0x9e37_79b9_7f4a_7c15));
        let keys = std::array::from_fn(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            mix(state)
        });
        Permutation {
            n,
            half_bits: bits.div_ceil(2).max(1),
            keys,
        }
    }

    /// Places permuted.
    pub(crate) fn len(&self) -> u64 {
        self.n
    }

    /// What place `i` (below [`Permutation::len`]) holds. The Feistel network permutes the
    /// 4^half_bits values of its domain; values at or above n are walked on until one is
    /// below (the cycle through i comes back below n, at i itself at the latest).
    pub(crate) fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            (left, right) = (right, left ^ (mix(right ^ k) & mask));
        }
        (left << self.half_bits) | right
    }
}

/// One rank's samples in one epoch: `ceil(n / world)` of them, place `rank + k·world` of
/// the epoch's permutation for the k-th (places past n wrap to the start).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shard {
    order: Permutation,
    world: u64,
    rank: u64,
}

impl Shard {
    /// Rank `rank`'s share of `n` samples (n ≥ 1) among `world` ranks in epoch `epoch`,
    /// shuffled by `seed`.
    pub(crate) fn new(n: usize, world: usize, rank: usize, seed: u64, epoch: usize) -> Shard {
        assert!(world > 0 && rank < world && n > 0);
        Shard {
            order: Permutation::new(n as u64, seed, epoch as u64),
            world: world as u64,
            rank: rank as u64,
        }
    }

    /// Samples of this rank: `ceil(n / world)`, the same on every rank.
    pub(crate) fn len(&self) -> usize {
        self.order.len().div_ceil(self.world) as usize
    }

    /// The rank's `k`-th sample (k below [`Shard::len`]).
    pub(crate) fn get(&self, k: usize) -> i64 {
        let place = (self.rank + k as u64 * self.world) % self.order.len();
        self.order.at(place) as i64
    }
}

/// The first `count` batches of `size` samples of a [`Shard`] (the last may be short),
/// each computed when it is taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batches {
    shard: Shard,
    size: usize,
    count: usize,
}

impl Batches {
    /// At most `count` batches of `size` samples (size ≥ 1) of `shard`: as many as it holds.
    pub(crate) fn new(shard: Shard, size: usize, count: usize) -> Batches {
        assert!(size > 0);
        Batches {
            shard,
            size,
            count: count.min(shard.len().div_ceil(size)),
        }
    }

    /// Batches.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The samples of batch `b` (below [`Batches::len`]).
    pub(crate) fn get(&self, b: usize) -> Vec<i64> {
        let from = b * self.size;
        let to = (from + self.size).min(self.shard.len());
        (from..to).map(|k| self.shard.get(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn all(n: usize, world: usize, seed: u64, epoch: usize) -> Vec<Vec<i64>> {
        (0..world)
            .map(|r| {
                let s = Shard::new(n, world, r, seed, epoch);
                (0..s.len()).map(|k| s.get(k)).collect()
            })
            .collect()
    }

    #[test]
    fn the_permutation_is_a_bijection_chosen_by_seed_and_epoch() {
        for n in [1u64, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4099, 65_536, 65_537] {
            for (seed, epoch) in [(0, 0), (1, 0), (1, 1), (u64::MAX, 7)] {
                let p = Permutation::new(n, seed, epoch);
                let seen: BTreeSet<u64> = (0..n).map(|i| p.at(i)).collect();
                assert_eq!(seen.len() as u64, n, "n={n} seed={seed} epoch={epoch}: not a bijection");
                assert!(seen.iter().all(|&v| v < n));
            }
        }
        let order = |seed, epoch| -> Vec<u64> {
            let p = Permutation::new(1000, seed, epoch);
            (0..1000).map(|i| p.at(i)).collect()
        };
        assert_eq!(order(5, 2), order(5, 2), "the same seed and epoch, the same order");
        assert_ne!(order(5, 2), order(6, 2));
        assert_ne!(order(5, 2), order(5, 3));
        // Shuffled, not near the identity: few places keep their sample.
        let fixed = order(5, 2).iter().enumerate().filter(|&(i, &v)| i as u64 == v).count();
        assert!(fixed < 20, "{fixed} of 1000 places kept their sample");
    }

    #[test]
    fn a_huge_split_costs_no_memory() {
        // 10^12 places: a stored order would take 8 TB; this one is a few words.
        let p = Permutation::new(1_000_000_000_000, 1, 0);
        assert!(std::mem::size_of::<Permutation>() <= 64);
        let first: BTreeSet<u64> = (0..10_000).map(|i| p.at(i)).collect();
        assert_eq!(first.len(), 10_000);
        assert!(first.iter().all(|&v| v < 1_000_000_000_000));
        assert!(p.at(999_999_999_999) < 1_000_000_000_000);
        let s = Shard::new(1_000_000_000_000, 2, 1, 1, 0);
        assert_eq!(s.len(), 500_000_000_000);
        let b = Batches::new(s, 32, usize::MAX);
        assert_eq!((b.len(), b.get(b.len() - 1).len()), (15_625_000_000, 32));
    }

    #[test]
    fn shards_are_disjoint_covering_and_equal_length() {
        for (n, world) in [(10, 3), (60_000, 2), (7, 7), (5, 8), (1000, 4), (1, 1), (1, 3)] {
            let shards = all(n, world, 42, 3);
            let len = n.div_ceil(world);
            assert!(shards.iter().all(|s| s.len() == len), "n={n} world={world}");
            let covered: BTreeSet<i64> = shards.iter().flatten().copied().collect();
            assert_eq!(covered.len(), n, "every sample covered");
            assert!(covered.iter().all(|&i| (0..n as i64).contains(&i)));
            if len * world == n {
                assert_eq!(shards.concat().len(), n, "no duplicates without padding");
            }
        }
    }

    #[test]
    fn padding_wraps_to_the_start_as_distributed_sampler() {
        // 5 samples on 2 ranks: places 0..5 then place 0 again; rank 1 takes 1, 3, 0.
        let p = Permutation::new(5, 0, 0);
        let s = Shard::new(5, 2, 1, 0, 0);
        assert_eq!(
            (0..3).map(|k| s.get(k)).collect::<Vec<_>>(),
            [p.at(1), p.at(3), p.at(0)].map(|v| v as i64)
        );
    }

    #[test]
    fn shards_follow_seed_and_epoch_and_match_single_rank_batches() {
        assert_eq!(all(100, 2, 1, 0), all(100, 2, 1, 0));
        assert_ne!(all(100, 2, 1, 0), all(100, 2, 1, 1));
        assert_ne!(all(100, 2, 1, 0), all(100, 2, 2, 0));
        // Step k of 2 ranks × batch b covers the same samples as step k of 1 rank × batch 2b.
        let one = Batches::new(Shard::new(640, 1, 0, 7, 0), 64, usize::MAX);
        let r0 = Batches::new(Shard::new(640, 2, 0, 7, 0), 32, usize::MAX);
        let r1 = Batches::new(Shard::new(640, 2, 1, 7, 0), 32, usize::MAX);
        assert_eq!((one.len(), r0.len()), (10, 10));
        for k in 0..10 {
            let mut a = one.get(k);
            let mut b = [r0.get(k), r1.get(k)].concat();
            a.sort();
            b.sort();
            assert_eq!(a, b, "step {k}");
        }
        // The last batch is short; count caps the batches.
        let b = Batches::new(Shard::new(70, 1, 0, 7, 0), 32, usize::MAX);
        assert_eq!((b.len(), b.get(2).len()), (3, 6));
        assert_eq!(Batches::new(Shard::new(70, 1, 0, 7, 0), 32, 2).len(), 2);
    }
}
