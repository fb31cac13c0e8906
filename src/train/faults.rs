//! Test hooks that make a run fail on purpose, read once from the environment before
//! training starts, so the timed loop never reads the environment.

/// Where a test asked this rank to fail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct FaultHooks {
    /// `DDPBENCH_FAULT=RANK:STEP`: this rank fails with an error at global step STEP,
    /// proving that a failing rank takes the job down instead of hanging it.
    pub fail_at_step: Option<usize>,
    /// `DDPBENCH_AMP_OVERFLOW=STEP`: rank 0 fills a gradient with inf at global step STEP
    /// (backward accumulates onto it, the all-reduce spreads it to every rank).
    pub amp_overflow_at_step: Option<usize>,
    /// `DDPBENCH_SLOW_FORWARD=RANK:MS`: this rank sleeps MS milliseconds in every forward
    /// pass, a straggler made on purpose (its peers then wait in the all-reduce).
    pub slow_forward_ms: Option<u64>,
}

impl FaultHooks {
    pub(super) fn from_env(rank: usize) -> FaultHooks {
        let var = |name: &str| std::env::var(name).ok();
        FaultHooks {
            fail_at_step: var("DDPBENCH_FAULT").and_then(|spec| rank_step(&spec, rank)),
            slow_forward_ms: var("DDPBENCH_SLOW_FORWARD")
                .and_then(|spec| rank_step(&spec, rank))
                .map(|ms| ms as u64),
            amp_overflow_at_step: var("DDPBENCH_AMP_OVERFLOW").filter(|_| rank == 0).and_then(|s| s.parse().ok()),
        }
    }
}

/// The variables of [`super::config::ENV_IN_KEY`] set in this process, as `NAME=value`:
/// what the manifest records of them, and the comparison key holds.
pub(super) fn run_env() -> Vec<String> {
    super::config::ENV_IN_KEY
        .iter()
        .filter_map(|(name, _)| std::env::var(name).ok().map(|v| format!("{name}={v}")))
        .collect()
}

/// `RANK:STEP` -> STEP when RANK is `rank`.
fn rank_step(spec: &str, rank: usize) -> Option<usize> {
    let (r, s) = spec.split_once(':')?;
    (r.parse::<usize>().ok()? == rank).then(|| s.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_step_specs() {
        assert_eq!(rank_step("1:7", 1), Some(7));
        assert_eq!(rank_step("1:7", 0), None);
        assert_eq!(rank_step("x:7", 0), None);
        assert_eq!(rank_step("7", 0), None);
    }
}
