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
    /// `DDPBENCH_TEST_BUSY_FORWARD=MS`: every rank sleeps MS milliseconds in every forward
    /// pass, a test's stand-in for a repeat that ran on a busy machine. Unlike a straggler
    /// it is left out of the comparison key: a run beside a CPU load is a repeat too.
    pub busy_forward_ms: Option<u64>,
}

impl FaultHooks {
    pub(super) fn from_env(rank: usize) -> FaultHooks {
        let var = |name: &str| std::env::var(name).ok();
        FaultHooks {
            fail_at_step: var("DDPBENCH_FAULT").and_then(|spec| rank_step(&spec, rank)),
            slow_forward_ms: var("DDPBENCH_SLOW_FORWARD")
                .and_then(|spec| rank_step(&spec, rank))
                .map(|ms| ms as u64),
            busy_forward_ms: var("DDPBENCH_TEST_BUSY_FORWARD").and_then(|ms| ms.parse().ok()),
            amp_overflow_at_step: var("DDPBENCH_AMP_OVERFLOW").filter(|_| rank == 0).and_then(|s| s.parse().ok()),
        }
    }

    /// How long this rank sleeps in every forward pass: its straggler's delay and the busy
    /// machine's, added.
    pub(super) fn forward_sleep(&self) -> Option<std::time::Duration> {
        match (self.slow_forward_ms, self.busy_forward_ms) {
            (None, None) => None,
            (a, b) => Some(std::time::Duration::from_millis(a.unwrap_or(0) + b.unwrap_or(0))),
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

    #[test]
    fn a_straggler_and_a_busy_machine_add_their_sleeps() {
        let ms = std::time::Duration::from_millis;
        let hooks = |slow, busy| FaultHooks {
            slow_forward_ms: slow,
            busy_forward_ms: busy,
            ..FaultHooks::default()
        };
        assert_eq!(hooks(None, None).forward_sleep(), None);
        assert_eq!(hooks(Some(30), None).forward_sleep(), Some(ms(30)));
        assert_eq!(hooks(None, Some(20)).forward_sleep(), Some(ms(20)));
        assert_eq!(hooks(Some(30), Some(20)).forward_sleep(), Some(ms(50)));
    }
}
