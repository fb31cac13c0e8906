//! All-reduce bandwidths as nccl-tests defines them, used by the training probe, the
//! `ddpbench allreduce` sweep and `reduce` alike. A leaf: it names no other module,
//! so every layer may use it without a cycle.

/// Algorithm bandwidth, bytes/s: `bytes / seconds` (0 when no time was measured).
pub(crate) fn algbw(bytes: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes / seconds
    } else {
        0.0
    }
}

/// Bus bandwidth of an all-reduce of `bytes` over `ranks` ranks, as nccl-tests defines
/// it: `algbw · 2(ranks − 1)/ranks`, the bytes each link carries in a ring; 0 for one rank.
pub(crate) fn busbw(bytes: f64, ranks: usize, seconds: f64) -> f64 {
    if ranks <= 1 {
        return 0.0;
    }
    algbw(bytes, seconds) * 2.0 * (ranks as f64 - 1.0) / ranks as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_follow_nccl_tests() {
        // 1 GB in 0.5 s: algbw 2 GB/s; 4 ranks: factor 2·3/4 = 1.5, busbw 3 GB/s.
        assert_eq!(algbw(1e9, 0.5), 2e9);
        assert_eq!(busbw(1e9, 4, 0.5), 3e9);
        // 2 ranks: factor 1.
        assert_eq!(busbw(1e9, 2, 1.0), 1e9);
        assert_eq!(busbw(1e9, 1, 0.5), 0.0);
        assert_eq!(algbw(1e9, 0.0), 0.0);
    }
}
