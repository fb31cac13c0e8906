//! The all-reduce's own device times read late: when the phase clock reads device
//! events a step late (`--phase-sync events`), a reducer timed by events of its own
//! (NCCL's) reads them when the clock gives the step, rather than waiting for them at
//! the step's end. Its events come in two banks, as the clock's slots do.

/// The banks of device events of the steps not read yet, for a recorder of its own
/// events (the NCCL all-reduce's) read when the clock reads the step: as the clock's
/// slots, two banks, the step being recorded using the one the step waiting to be
/// read does not. Oldest first.
#[derive(Debug, Default)]
pub(crate) struct DeferredBanks {
    /// The bank the step being recorded uses.
    current: usize,
    /// Ended steps' banks, not read yet.
    waiting: std::collections::VecDeque<usize>,
}

impl DeferredBanks {
    /// The bank the step being recorded records into.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// The step being recorded ended: its bank waits to be read and the next step
    /// records into the other.
    pub(crate) fn end_step(&mut self) {
        self.waiting.push_back(self.current);
        self.current = 1 - self.current;
    }

    /// Before a step records into its bank: that bank when it still waits to be read
    /// (its step, two back, not given by the clock yet), to read now rather than let
    /// this step overwrite it; it is the oldest waiting.
    pub(crate) fn overdue(&mut self) -> Option<usize> {
        let due = self.waiting.front().is_some_and(|&b| b == self.current);
        due.then(|| self.waiting.pop_front()).flatten()
    }

    /// The oldest ended step's bank, to read now that the clock has given that step.
    pub(crate) fn take_oldest(&mut self) -> Option<usize> {
        self.waiting.pop_front()
    }
}

/// A step's all-reduce time from its buckets' device intervals, each given as
/// (seconds of its work, seconds from its start to backward's end): `comm_s` the
/// work's sum, `hidden_s` the part of each bucket's work before backward ended.
pub(crate) fn comm_seconds(buckets: impl IntoIterator<Item = (f64, f64)>) -> (f64, f64) {
    buckets.into_iter().fold((0.0, 0.0), |(comm_s, hidden_s), (work_s, before_s)| {
        (comm_s + work_s, hidden_s + before_s.clamp(0.0, work_s))
    })
}
