//! The step's clock. The boundaries between the phases of a step are [`StepEvent`]s,
//! marked as the step runs ([`PhaseClock::record`]); the phases are the differences
//! between the marks, taken afterwards by a pure function ([`StepMarks::times`]), so
//! they are contiguous and add up to the step's wall time whatever the clock.
//!
//! [`HostClock`] reads the host's monotonic clock. On CPU a mark only reads it. On
//! CUDA with `--phase-sync on` it first synchronises libtorch's stream (not NCCL's, so
//! an overlapped all-reduce keeps running), so a phase's time covers its kernels; that
//! costs the CPU/GPU pipelining across phase boundaries, a few kernel launches' worth
//! per phase. With `--phase-sync off` it keeps only the step's start and end, waiting
//! for the device once at the end, and the step is recorded whole as [`Phase::Other`].
//!
//! Each event names the [`Track`] it happens on, so a clock that marks device streams
//! instead of reading the host knows where to place it, and a trace where to draw it.
//! Recording and reading are separate calls: a clock whose marks become readable later
//! (device events) records without waiting and is read when its marks are final.

pub(crate) mod events;

use crate::device;
use crate::record::{Phase, PhaseTimes};
use std::time::Instant;
use tch::Device;

/// A boundary inside one step, in the order a step meets them. The four from
/// `DataReady` to `BackwardDone` repeat once per micro-batch ([`StepEvent::repeats`]).
/// `End` stays the last variant: [`StepEvent::COUNT`] is counted from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StepEvent {
    /// The step begins: waiting for the first batch starts.
    Start,
    /// A batch is in host memory.
    DataReady,
    /// The batch is on the training device.
    CopyDone,
    /// The forward pass and the loss are done.
    ForwardDone,
    /// Backward is done (its last buckets are handed to the all-reduce).
    BackwardDone,
    /// The last all-reduce completed (marked at that instant, [`PhaseClock::record_at`]):
    /// the end of the exposed communication.
    CommDone,
    /// The all-reduce's bookkeeping is done: the buckets' records finished, the reduced
    /// gradients in place. Its time is [`Phase::Other`], not communication.
    CommRecorded,
    /// The optimizer stepped and the gradients are zeroed.
    OptimizerDone,
    /// The step ends (loss read back).
    End,
}

/// How often a step records an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeats {
    /// Once per step.
    OncePerStep,
    /// Once per micro-batch.
    PerMicroBatch,
}

// Every event is in `StepEvent::ALL`, at its declaration's position: a variant added
// before `End` raises `COUNT`, and the array's length no longer matches.
const _: () = {
    let mut i = 0;
    while i < StepEvent::COUNT {
        assert!(
            StepEvent::ALL[i] as usize == i,
            "StepEvent::ALL must list the events in declaration order"
        );
        i += 1;
    }
};

/// Where an event happens: the thread or stream whose progress it marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Track {
    /// The rank's training thread (data, bookkeeping).
    Host,
    /// The device's compute stream (libtorch's current stream; the host on CPU).
    Compute,
    /// The all-reduce (NCCL's stream, or the MPI thread on the staged path).
    Comm,
}

impl StepEvent {
    pub(crate) const COUNT: usize = StepEvent::End as usize + 1;
    /// Every event, in the order a step meets them.
    pub(crate) const ALL: [StepEvent; StepEvent::COUNT] = [
        StepEvent::Start,
        StepEvent::DataReady,
        StepEvent::CopyDone,
        StepEvent::ForwardDone,
        StepEvent::BackwardDone,
        StepEvent::CommDone,
        StepEvent::CommRecorded,
        StepEvent::OptimizerDone,
        StepEvent::End,
    ];

    /// The phase that ends at this boundary; `Start` ends none.
    pub(crate) fn ends(self) -> Option<Phase> {
        match self {
            StepEvent::Start => None,
            StepEvent::DataReady => Some(Phase::Data),
            StepEvent::CopyDone => Some(Phase::BatchCopy),
            StepEvent::ForwardDone => Some(Phase::Forward),
            StepEvent::BackwardDone => Some(Phase::Backward),
            StepEvent::CommDone => Some(Phase::CommExposed),
            StepEvent::CommRecorded => Some(Phase::Other),
            StepEvent::OptimizerDone => Some(Phase::Optimizer),
            StepEvent::End => Some(Phase::Other),
        }
    }

    pub(crate) fn track(self) -> Track {
        match self {
            StepEvent::Start | StepEvent::DataReady | StepEvent::CommRecorded | StepEvent::End => Track::Host,
            StepEvent::CopyDone | StepEvent::ForwardDone | StepEvent::BackwardDone | StepEvent::OptimizerDone => Track::Compute,
            StepEvent::CommDone => Track::Comm,
        }
    }

    /// Whether a step records the event once or once per micro-batch. A match with
    /// no catch-all, so a new event is counted in [`StepEvent::per_step`].
    pub(crate) fn repeats(self) -> Repeats {
        match self {
            StepEvent::DataReady | StepEvent::CopyDone | StepEvent::ForwardDone | StepEvent::BackwardDone => Repeats::PerMicroBatch,
            StepEvent::Start | StepEvent::CommDone | StepEvent::CommRecorded | StepEvent::OptimizerDone | StepEvent::End => {
                Repeats::OncePerStep
            }
        }
    }

    /// How many marks a step of `micro_batches` micro-batches records at most: every
    /// event of [`StepEvent::ALL`], as often as it [`StepEvent::repeats`].
    pub(crate) fn per_step(micro_batches: usize) -> usize {
        StepEvent::ALL
            .iter()
            .map(|e| match e.repeats() {
                Repeats::OncePerStep => 1,
                Repeats::PerMicroBatch => micro_batches,
            })
            .sum()
    }
}

/// One boundary as read: the event and its time since the step's `Start`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Mark {
    pub event: StepEvent,
    pub at_s: f64,
}

/// One step's marks in the order they were recorded, the first its `Start`.
#[derive(Debug, Clone)]
pub(crate) struct StepMarks {
    /// The host's clock at the step's `Start`.
    pub start: Instant,
    marks: Vec<Mark>,
}

/// One finished step's times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepTimes {
    pub phases: PhaseTimes,
    /// From `Start` to the last mark: the sum of the phases.
    pub step_s: f64,
    /// The host's clock at the step's `Start`.
    pub start: Instant,
}

impl StepMarks {
    /// Room for the marks of a step of `micro_batches` micro-batches, so recording a
    /// step never allocates.
    pub(crate) fn new(micro_batches: usize, start: Instant) -> StepMarks {
        StepMarks {
            start,
            marks: Vec::with_capacity(StepEvent::per_step(micro_batches)),
        }
    }

    /// Forgets the marks and starts a step at `start` with its `Start` mark.
    pub(crate) fn restart(&mut self, start: Instant) {
        self.start = start;
        self.marks.clear();
        self.push(StepEvent::Start, 0.0);
    }

    pub(crate) fn push(&mut self, event: StepEvent, at_s: f64) {
        self.marks.push(Mark { event, at_s });
    }

    pub(crate) fn marks(&self) -> &[Mark] {
        &self.marks
    }

    /// Pushes `event` at the instant `at`, moved up to the previous mark when earlier
    /// (a phase is never negative); returns the instant marked.
    pub(crate) fn push_at(&mut self, event: StepEvent, at: Instant) -> Instant {
        let previous_s = self.marks.last().map_or(0.0, |m| m.at_s);
        let at_s = at.saturating_duration_since(self.start).as_secs_f64();
        if at_s >= previous_s {
            self.push(event, at_s);
            at
        } else {
            self.push(event, previous_s);
            self.start + std::time::Duration::from_secs_f64(previous_s)
        }
    }

    /// The phases: each mark charges the time since the mark before it to the phase it
    /// ends (a phase met twice, as with micro-batches, adds up); `step_s` is the sum of
    /// the phases in [`Phase::ALL`]'s order (the CSV's column order), so a row adds up to
    /// its step exactly, not to within rounding; it is the first mark to the last up to
    /// that rounding. Depends on the marks alone.
    pub(crate) fn times(&self) -> StepTimes {
        let mut phases = PhaseTimes::default();
        for pair in self.marks.windows(2) {
            if let Some(p) = pair[1].event.ends() {
                phases[p] += pair[1].at_s - pair[0].at_s;
            }
        }
        let step_s = phases.values().sum();
        StepTimes {
            phases,
            step_s,
            start: self.start,
        }
    }
}

/// Marks the boundaries of one step at a time.
pub(crate) trait PhaseClock {
    /// Marks `event` on its track (`Start` begins a new step and forgets the previous
    /// one's marks). Returns the host's clock at the mark: what the all-reduce's own
    /// host readings (its hand-over times) are compared with.
    fn record(&mut self, event: StepEvent) -> Instant;
    /// Marks `event` at `at`, an instant already past (the host's reading of when it
    /// happened, taken by whoever waited for it), never before the step's previous
    /// mark; waits for nothing. Returns the instant marked.
    fn record_at(&mut self, event: StepEvent, at: Instant) -> Instant;
    /// The marks of the step whose `End` was recorded last (for a clock that reads its
    /// marks later, [`events::EventClock`], the last step [`PhaseClock::finished`] gave).
    fn marks(&self) -> &StepMarks;
    /// The marks of the oldest step whose `End` was recorded and that was not given yet,
    /// once they are final: at once for a clock that reads as it marks; a step late for
    /// device events read without waiting, the last step with `flush` (which waits for
    /// the device). None when no ended step is waiting, or it is not readable yet.
    fn finished(&mut self, flush: bool) -> Option<&StepMarks>;
    /// Whether a step's device work may still be running when its `End` is recorded,
    /// its figures read only when [`PhaseClock::finished`] gives it (device events): then
    /// the all-reduce's own device times are read there too, not waited for in the step.
    fn reads_device_late(&self) -> bool {
        false
    }
}

/// The clock `--phase-sync` `mode` asks for, for tensors on `device` and steps of
/// `micro_batches` micro-batches: the host clock for `on` and `off`, device events for
/// `events` and `events-at-end` (on CPU, events read from the host clock, so the
/// deferred read runs there too). Err when CUDA cannot make its events.
pub(crate) fn clock_for(mode: crate::record::PhaseSync, device: Device, micro_batches: usize) -> anyhow::Result<Box<dyn PhaseClock>> {
    use crate::record::PhaseSync;
    use events::{CudaEvents, EventClock, HostEvents, ReadAt};
    let read_at = match mode {
        PhaseSync::On | PhaseSync::Off => {
            return Ok(Box::new(HostClock::new(device, mode == PhaseSync::On, micro_batches)));
        }
        PhaseSync::Events => ReadAt::NextStep,
        PhaseSync::EventsAtEnd => ReadAt::StepEnd,
    };
    let slots = EventClock::<HostEvents>::slots(micro_batches);
    Ok(match device {
        Device::Cpu => Box::new(EventClock::new(HostEvents::new(slots), read_at, micro_batches)),
        _ => Box::new(EventClock::new(CudaEvents::new(slots)?, read_at, micro_batches)),
    })
}

/// How a mark waits for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// CPU tensors: work is done when the call returns.
    Nothing,
    /// CUDA: synchronise libtorch's stream at every mark but `Start` and `End`.
    TorchStream(Device),
    /// CUDA with `--phase-sync off`: only `Start` and `End` are marked, and `End` waits.
    StepEndOnly(Device),
}

/// The host's monotonic clock, waiting for the device as `--phase-sync` says.
#[derive(Debug)]
pub(crate) struct HostClock {
    wait: Wait,
    marks: StepMarks,
    /// An `End` was recorded and [`PhaseClock::finished`] has not given its step yet.
    ended: bool,
}

impl HostClock {
    /// The clock for tensors on `device`, steps of `micro_batches` micro-batches;
    /// `phase_sync` false: see [`Wait::StepEndOnly`].
    pub(crate) fn new(device: Device, phase_sync: bool, micro_batches: usize) -> HostClock {
        HostClock {
            wait: match (device, phase_sync) {
                (Device::Cpu, _) => Wait::Nothing,
                (_, true) => Wait::TorchStream(device),
                (_, false) => Wait::StepEndOnly(device),
            },
            marks: StepMarks::new(micro_batches, Instant::now()),
            ended: false,
        }
    }
}

impl PhaseClock for HostClock {
    fn record(&mut self, event: StepEvent) -> Instant {
        match (self.wait, event) {
            (_, StepEvent::Start) => {
                let now = Instant::now();
                self.marks.restart(now);
                return now;
            }
            (Wait::StepEndOnly(d), StepEvent::End) => device::sync(d),
            (Wait::StepEndOnly(_), _) => return Instant::now(),
            (Wait::TorchStream(d), e) if e != StepEvent::End => device::sync(d),
            _ => {}
        }
        let now = Instant::now();
        self.marks.push(event, (now - self.marks.start).as_secs_f64());
        self.ended = event == StepEvent::End;
        now
    }

    fn record_at(&mut self, event: StepEvent, at: Instant) -> Instant {
        if let Wait::StepEndOnly(_) = self.wait {
            return at;
        }
        self.marks.push_at(event, at)
    }

    fn marks(&self) -> &StepMarks {
        &self.marks
    }

    fn finished(&mut self, _flush: bool) -> Option<&StepMarks> {
        std::mem::take(&mut self.ended).then_some(&self.marks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A clock that returns chosen times: the `k`-th mark of a step is at `times_s[k]`
    /// after the step's start.
    struct FakeClock {
        times_s: Vec<f64>,
        next: usize,
        marks: StepMarks,
    }

    impl FakeClock {
        fn new(times_s: &[f64]) -> FakeClock {
            FakeClock {
                times_s: times_s.to_vec(),
                next: 0,
                marks: StepMarks::new(1, Instant::now()),
            }
        }
    }

    impl PhaseClock for FakeClock {
        fn record(&mut self, event: StepEvent) -> Instant {
            let at_s = self.times_s[self.next];
            self.next += 1;
            if event == StepEvent::Start {
                self.marks.restart(self.marks.start);
            } else {
                self.marks.push(event, at_s);
            }
            self.marks.start + Duration::from_secs_f64(at_s)
        }
        fn record_at(&mut self, event: StepEvent, at: Instant) -> Instant {
            self.next += 1;
            self.marks.push_at(event, at)
        }
        fn marks(&self) -> &StepMarks {
            &self.marks
        }
        fn finished(&mut self, _flush: bool) -> Option<&StepMarks> {
            Some(&self.marks)
        }
    }

    /// The events of a step of `micro` micro-batches, in the order the step records them.
    fn step_events(micro: usize) -> Vec<StepEvent> {
        use StepEvent::*;
        let mut v = vec![Start];
        for _ in 0..micro {
            v.extend([DataReady, CopyDone, ForwardDone, BackwardDone]);
        }
        v.extend([CommDone, CommRecorded, OptimizerDone, End]);
        v
    }

    /// The count of marks follows the event list: a step replays every event of
    /// [`StepEvent::ALL`], the per-micro-batch ones once per micro-batch.
    #[test]
    fn per_step_counts_the_events_a_step_records() {
        for micro in 1..=4 {
            assert_eq!(StepEvent::per_step(micro), step_events(micro).len(), "{micro} micro-batches");
        }
        let mut replayed: Vec<StepEvent> = step_events(2);
        replayed.dedup();
        let mut listed: Vec<StepEvent> = StepEvent::ALL.to_vec();
        listed.retain(|e| replayed.contains(e));
        assert_eq!(listed, StepEvent::ALL, "every event is replayed");
        let per_micro: Vec<StepEvent> = StepEvent::ALL
            .into_iter()
            .filter(|e| e.repeats() == Repeats::PerMicroBatch)
            .collect();
        assert_eq!(step_events(3).iter().filter(|e| per_micro.contains(e)).count(), 3 * per_micro.len());
    }

    fn phase(t: &StepTimes, p: Phase) -> f64 {
        t.phases[p]
    }

    #[test]
    fn phases_are_the_differences_of_chosen_mark_times() {
        // Binary fractions: every difference and sum below is exact.
        let at = [0.0, 0.25, 0.3125, 1.0, 2.5, 3.0, 3.0625, 3.5, 3.625];
        let mut c = FakeClock::new(&at);
        for e in step_events(1) {
            c.record(e);
        }
        let t = c.marks().times();
        assert_eq!(phase(&t, Phase::Data), 0.25);
        assert_eq!(phase(&t, Phase::BatchCopy), 0.0625);
        assert_eq!(phase(&t, Phase::Forward), 0.6875);
        assert_eq!(phase(&t, Phase::Backward), 1.5);
        assert_eq!(phase(&t, Phase::CommExposed), 0.5);
        // The all-reduce's bookkeeping (0.0625) and the step's end (0.125) are other.
        assert_eq!(phase(&t, Phase::Optimizer), 0.4375);
        assert_eq!(phase(&t, Phase::Other), 0.1875);
        assert_eq!(t.step_s, 3.625);
        assert_eq!(t.phases.values().sum::<f64>(), t.step_s);
    }

    #[test]
    fn micro_batches_add_up_per_phase() {
        // Two micro-batches: data 0.5 + 0.25, copy 0 + 0.125, forward 1 + 1, backward 2 + 0.5.
        let at = [0.0, 0.5, 0.5, 1.5, 3.5, 3.75, 3.875, 4.875, 5.375, 6.0, 6.0, 6.25, 6.5];
        let mut c = FakeClock::new(&at);
        for e in step_events(2) {
            c.record(e);
        }
        let t = c.marks().times();
        let want = [0.75, 0.125, 2.0, 2.5, 0.625, 0.25, 0.25];
        for p in Phase::ALL {
            assert_eq!(phase(&t, p), want[p.index()], "{p}");
        }
        assert_eq!(t.step_s, 6.5);
        assert_eq!(t.phases.values().sum::<f64>(), t.step_s);
        assert_eq!(c.marks().marks().len(), StepEvent::per_step(2));
    }

    #[test]
    fn a_new_start_forgets_the_last_step() {
        let mut c = FakeClock::new(&[0.0, 1.0, 2.0, 0.0, 0.5]);
        for e in [StepEvent::Start, StepEvent::DataReady, StepEvent::End] {
            c.record(e);
        }
        assert_eq!(c.marks().times().step_s, 2.0);
        c.record(StepEvent::Start);
        c.record(StepEvent::End);
        let t = c.marks().times();
        assert_eq!((t.step_s, phase(&t, Phase::Data), phase(&t, Phase::Other)), (0.5, 0.0, 0.5));
    }

    #[test]
    fn host_clock_phases_are_contiguous_accumulate_and_add_up_to_the_step() {
        let mut c = HostClock::new(Device::Cpu, true, 2);
        let start = c.record(StepEvent::Start);
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(2));
            c.record(StepEvent::DataReady);
            std::thread::sleep(Duration::from_millis(1));
            c.record(StepEvent::ForwardDone);
        }
        c.record(StepEvent::CommDone);
        c.record(StepEvent::End);
        let s = c.marks().times();
        assert_eq!(s.start, start);
        // Two micro-batches: each phase holds both of its sleeps.
        assert!(phase(&s, Phase::Data) >= 0.004);
        assert!(phase(&s, Phase::Forward) >= 0.002);
        assert_eq!(phase(&s, Phase::Backward), 0.0);
        let sum: f64 = s.phases.values().sum();
        assert!((sum - s.step_s).abs() < 1e-9, "{sum} vs {}", s.step_s);
        // A new step starts from zero.
        c.record(StepEvent::Start);
        c.record(StepEvent::End);
        let s2 = c.marks().times();
        assert_eq!(phase(&s2, Phase::Data), 0.0);
        assert!(s2.start > s.start);
    }

    #[test]
    fn without_phase_sync_the_whole_step_is_other() {
        // device::sync does nothing for Device::Cpu, so this checks the bookkeeping of
        // the unsynced mode on a machine without a GPU.
        let mut c = HostClock::new(Device::Cpu, false, 1);
        c.wait = Wait::StepEndOnly(Device::Cpu);
        c.record(StepEvent::Start);
        std::thread::sleep(Duration::from_millis(2));
        c.record(StepEvent::ForwardDone);
        c.record(StepEvent::BackwardDone);
        c.record(StepEvent::End);
        let s = c.marks().times();
        assert_eq!(phase(&s, Phase::Forward), 0.0);
        assert_eq!(phase(&s, Phase::Backward), 0.0);
        assert_eq!(phase(&s, Phase::Other), s.step_s);
        assert!(s.step_s >= 0.002);
        assert_eq!(c.marks().marks().len(), 2);
    }

    #[test]
    fn recording_a_step_does_not_grow_the_marks() {
        let mut c = HostClock::new(Device::Cpu, true, 3);
        let cap = c.marks.marks.capacity();
        for _ in 0..2 {
            c.record(StepEvent::Start);
            for _ in 0..3 {
                for e in [
                    StepEvent::DataReady,
                    StepEvent::CopyDone,
                    StepEvent::ForwardDone,
                    StepEvent::BackwardDone,
                ] {
                    c.record(e);
                }
            }
            for e in [
                StepEvent::CommDone,
                StepEvent::CommRecorded,
                StepEvent::OptimizerDone,
                StepEvent::End,
            ] {
                c.record(e);
            }
        }
        assert_eq!(c.marks().marks().len(), StepEvent::per_step(3));
        assert_eq!(c.marks.marks.capacity(), cap);
    }

    #[test]
    fn a_mark_at_a_past_instant_ends_its_phase_there_and_never_before_the_last() {
        let mut c = HostClock::new(Device::Cpu, true, 1);
        let start = c.record(StepEvent::Start);
        c.marks.push(StepEvent::BackwardDone, 0.5);
        // The all-reduce completed at 0.75 s; its bookkeeping ran until the next mark.
        c.record_at(StepEvent::CommDone, start + Duration::from_millis(750));
        c.marks.push(StepEvent::CommRecorded, 1.0);
        let t = c.marks().times();
        assert_eq!(phase(&t, Phase::CommExposed), 0.25);
        assert_eq!(phase(&t, Phase::Other), 0.25);
        // An instant before the previous mark is marked at it: no negative phase.
        let at = c.record_at(StepEvent::CommDone, start + Duration::from_millis(100));
        assert_eq!(at, start + Duration::from_secs(1));
        assert_eq!(c.marks().marks().last().unwrap().at_s, 1.0);
    }
}
