//! [`EventClock`]: phase marks from device events, with no wait at any boundary
//! (`--phase-sync events`, the default on GPUs). As c10d's reducer timer, each mark on
//! the compute or communication track records an event on libtorch's stream and the
//! times are read once the events have completed: a step later ([`ReadAt::NextStep`],
//! when the step after it ends, so the wait for the earlier step's last event finds it
//! done) or at the step's end with one wait ([`ReadAt::StepEnd`]). Which of the two
//! costs less is a GPU measurement, so both exist.
//!
//! Host marks (`Start`, `DataReady`, `End`) keep the host clock. A step's time line
//! starts at its `Start`, recorded on both clocks: a device mark is at its event's time
//! since the `Start` event, a host mark at its host time since the host's `Start`, and
//! no mark is before the mark before it (a later mark read earlier on the other clock
//! is moved to it). The phases are then the differences of consecutive marks, none
//! negative, and [`StepMarks::times`] sums them into the step, so a row still adds up to
//! its `step_s` exactly. A host phase that ran while the device was still busy with the
//! step before is charged at its host time, taken from the device phase after it.
//!
//! Events are identified by slot ([`EventSource`]): two banks of one step's marks each,
//! so the step being recorded never reuses the events of the step waiting to be read.

use super::{PhaseClock, StepEvent, StepMarks, Track};
use std::time::Instant;

/// Events recorded on the compute stream and read back later, by slot: what
/// [`EventClock`] needs of a device. [`CudaEvents`] are CUDA's; [`HostEvents`] read the
/// host clock (CPU, where work is done when the call returns).
pub(crate) trait EventSource {
    /// Records the event of `slot` behind the work queued so far; never waits.
    fn record(&mut self, slot: usize);
    /// Waits until the event of `slot` has completed.
    fn wait(&mut self, slot: usize);
    /// Seconds from the event of slot `from` to the one of `to`, both completed; None when
    /// the device cannot say (the mark then keeps its host time).
    fn elapsed_s(&mut self, from: usize, to: usize) -> Option<f64>;
    /// The host's clock, read at every mark.
    fn host_now(&mut self) -> Instant {
        Instant::now()
    }
}

/// When a step's marks are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadAt {
    /// When the next step ends: no wait the device has not already passed.
    NextStep,
    /// At the step's own end, after one wait for its last event.
    StepEnd,
}

/// One mark as recorded: its host time since the step's `Start` and, for a device mark,
/// its event's slot.
#[derive(Debug, Clone, Copy)]
struct Recorded {
    event: StepEvent,
    host_s: f64,
    slot: Option<usize>,
}

/// A step's recorded marks, the first its `Start`.
#[derive(Debug)]
struct Recording {
    start: Instant,
    marks: Vec<Recorded>,
}

/// Marks a step's boundaries with device events and reads them later ([`ReadAt`]).
pub(crate) struct EventClock<S: EventSource> {
    source: S,
    read_at: ReadAt,
    /// Slots per bank: the most marks a step records.
    per_step: usize,
    /// The bank the step being recorded uses (0 or 1).
    bank: usize,
    current: Recording,
    /// An ended step not read yet (with [`ReadAt::NextStep`]).
    waiting: Option<Recording>,
    /// The last step read.
    read: StepMarks,
    /// `read` holds a step [`PhaseClock::finished`] has not given yet.
    fresh: bool,
}

impl<S: EventSource> EventClock<S> {
    /// A clock for steps of `micro_batches` micro-batches; `source` has at least
    /// [`EventClock::slots`] of them.
    pub(crate) fn new(source: S, read_at: ReadAt, micro_batches: usize) -> EventClock<S> {
        let per_step = StepEvent::per_step(micro_batches);
        let now = Instant::now();
        let recording = || Recording {
            start: now,
            marks: Vec::with_capacity(per_step),
        };
        EventClock {
            source,
            read_at,
            per_step,
            bank: 0,
            current: recording(),
            waiting: None,
            read: StepMarks::new(micro_batches, now),
            fresh: false,
        }
    }

    /// The event slots a clock for steps of `micro_batches` micro-batches uses.
    pub(crate) fn slots(micro_batches: usize) -> usize {
        2 * StepEvent::per_step(micro_batches)
    }

    /// Reads `step` into `self.read`, once its last device event has completed.
    fn read_step(&mut self, step: &Recording) {
        if let Some(last) = step.marks.iter().rev().find_map(|m| m.slot) {
            self.source.wait(last);
        }
        let origin = step.marks.first().and_then(|m| m.slot);
        let source = &mut self.source;
        assemble(step, |slot| origin.and_then(|o| source.elapsed_s(o, slot)), &mut self.read);
        self.fresh = true;
    }

    /// Ends the step being recorded: it is read now or waits for the next step's end.
    fn end_step(&mut self) {
        let next = Recording {
            start: self.current.start,
            marks: Vec::with_capacity(self.per_step),
        };
        let ended = std::mem::replace(&mut self.current, next);
        match self.read_at {
            ReadAt::StepEnd => self.read_step(&ended),
            ReadAt::NextStep => {
                if let Some(before) = self.waiting.take() {
                    self.read_step(&before);
                }
                self.waiting = Some(ended);
            }
        }
    }
}

/// The marks of `step` into `out`: a mark with a slot is at `device_s(slot)` (its time
/// since the `Start` event) when the device says, otherwise at its host time; and never
/// before the mark before it. Pure but for `device_s`.
fn assemble(step: &Recording, mut device_s: impl FnMut(usize) -> Option<f64>, out: &mut StepMarks) {
    out.restart(step.start);
    let mut last_s = 0.0f64;
    for m in step.marks.iter().skip(1) {
        let at_s = m.slot.and_then(&mut device_s).unwrap_or(m.host_s);
        last_s = last_s.max(at_s);
        out.push(m.event, last_s);
    }
}

impl<S: EventSource> PhaseClock for EventClock<S> {
    fn record(&mut self, event: StepEvent) -> Instant {
        let now = self.source.host_now();
        if event == StepEvent::Start {
            self.bank = 1 - self.bank;
            self.current.start = now;
            self.current.marks.clear();
        }
        let index = self.current.marks.len();
        let on_device = event == StepEvent::Start || event.track() != Track::Host;
        let slot = (on_device && index < self.per_step).then(|| self.bank * self.per_step + index);
        if let Some(s) = slot {
            self.source.record(s);
        }
        self.current.marks.push(Recorded {
            event,
            host_s: (now - self.current.start).as_secs_f64(),
            slot,
        });
        if event == StepEvent::End {
            self.end_step();
        }
        now
    }

    /// A mark at an instant already past carries the host's time of it: no device event
    /// can be recorded in the past. Never before the step's previous mark ([`assemble`]).
    fn record_at(&mut self, event: StepEvent, at: Instant) -> Instant {
        self.current.marks.push(Recorded {
            event,
            host_s: at.saturating_duration_since(self.current.start).as_secs_f64(),
            slot: None,
        });
        at
    }

    fn marks(&self) -> &StepMarks {
        &self.read
    }

    fn reads_device_late(&self) -> bool {
        true
    }

    fn finished(&mut self, flush: bool) -> Option<&StepMarks> {
        if !self.fresh && flush {
            if let Some(step) = self.waiting.take() {
                self.read_step(&step);
            }
        }
        std::mem::take(&mut self.fresh).then_some(&self.read)
    }
}

/// Events as host clock readings: on CPU a mark's work is done when it is recorded.
/// What `--phase-sync events` runs on CPU, so that the deferred read is exercised there.
#[derive(Debug)]
pub(crate) struct HostEvents {
    at: Vec<Instant>,
}

impl HostEvents {
    pub(crate) fn new(slots: usize) -> HostEvents {
        HostEvents {
            at: vec![Instant::now(); slots],
        }
    }
}

impl EventSource for HostEvents {
    fn record(&mut self, slot: usize) {
        self.at[slot] = Instant::now();
    }

    fn wait(&mut self, _slot: usize) {}

    fn elapsed_s(&mut self, from: usize, to: usize) -> Option<f64> {
        Some(self.at[to].saturating_duration_since(self.at[from]).as_secs_f64())
    }
}

/// CUDA timing events on libtorch's stream (the legacy default stream, where the
/// compute runs and where the communication's end is made visible by a stream wait).
pub(crate) struct CudaEvents {
    driver: &'static crate::device::cuda::Driver,
    events: Vec<crate::device::cuda::Event>,
    /// The first failure, said once; the marks then keep their host times.
    failed: bool,
}

impl CudaEvents {
    /// `slots` timing events on the current device.
    pub(crate) fn new(slots: usize) -> anyhow::Result<CudaEvents> {
        let driver = crate::device::cuda::driver()?;
        let events = (0..slots).map(|_| driver.event(true)).collect::<anyhow::Result<_>>()?;
        Ok(CudaEvents {
            driver,
            events,
            failed: false,
        })
    }

    fn check<T>(&mut self, r: anyhow::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                if !std::mem::replace(&mut self.failed, true) {
                    tracing::warn!("phase events: {e:#}; phases keep host times from here");
                }
                None
            }
        }
    }
}

impl EventSource for CudaEvents {
    fn record(&mut self, slot: usize) {
        let r = self.driver.record(&self.events[slot], crate::device::cuda::LEGACY_STREAM);
        self.check(r);
    }

    fn wait(&mut self, slot: usize) {
        let r = self.driver.event_synchronize(&self.events[slot]);
        self.check(r);
    }

    fn elapsed_s(&mut self, from: usize, to: usize) -> Option<f64> {
        if self.failed {
            return None;
        }
        let r = self.driver.elapsed_s(&self.events[from], &self.events[to]);
        self.check(r).map(|s| s.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::deferred::{comm_seconds, DeferredBanks};
    use crate::record::Phase;
    use std::time::Duration;

    /// Chosen times: the `k`-th event recorded is at `device_s[k]` on the device and the
    /// `k`-th host reading at `host_s[k]`, both from one origin; it counts its waits.
    struct FakeEvents {
        origin: Instant,
        device_s: Vec<f64>,
        host_s: Vec<f64>,
        recorded: usize,
        read: usize,
        slot_s: Vec<f64>,
        waits: Vec<usize>,
    }

    impl FakeEvents {
        fn new(device_s: &[f64], host_s: &[f64], slots: usize) -> FakeEvents {
            FakeEvents {
                origin: Instant::now(),
                device_s: device_s.to_vec(),
                host_s: host_s.to_vec(),
                recorded: 0,
                read: 0,
                slot_s: vec![f64::NAN; slots],
                waits: Vec::new(),
            }
        }
    }

    impl EventSource for FakeEvents {
        fn record(&mut self, slot: usize) {
            self.slot_s[slot] = self.device_s[self.recorded];
            self.recorded += 1;
        }
        fn wait(&mut self, slot: usize) {
            self.waits.push(slot);
        }
        fn elapsed_s(&mut self, from: usize, to: usize) -> Option<f64> {
            Some(self.slot_s[to] - self.slot_s[from])
        }
        fn host_now(&mut self) -> Instant {
            let t = self.host_s[self.read];
            self.read += 1;
            self.origin + Duration::from_secs_f64(t)
        }
    }

    /// One step of one micro-batch: every event in order.
    const STEP: [StepEvent; 8] = [
        StepEvent::Start,
        StepEvent::DataReady,
        StepEvent::CopyDone,
        StepEvent::ForwardDone,
        StepEvent::BackwardDone,
        StepEvent::CommDone,
        StepEvent::OptimizerDone,
        StepEvent::End,
    ];

    fn phases(m: &StepMarks) -> Vec<f64> {
        m.times().phases.0.to_vec()
    }

    /// Step 1 from 0 s on both clocks, step 2 from 10 s: host times for all eight marks,
    /// device times for the six device ones (Start, copy, forward, backward, comm, optimizer).
    /// Binary fractions, so every difference is exact.
    fn two_steps() -> (Vec<f64>, Vec<f64>) {
        let host = [0.0, 0.5, 0.625, 0.75, 0.875, 1.0, 1.125, 1.25];
        // Device from its Start event: copy 0.25 (before the host's data mark: moved to
        // it), forward 2, backward 5, comm 5.5, optimizer 6.
        let device = [0.0, 0.25, 2.0, 5.0, 5.5, 6.0];
        let shift = |v: &[f64], by: f64| v.iter().map(|t| t + by).collect::<Vec<f64>>();
        let h = [shift(&host, 0.0), shift(&host, 10.0)].concat();
        let d = [shift(&device, 0.0), shift(&device, 10.0)].concat();
        (d, h)
    }

    /// What `two_steps` gives each step: data 0.5 (host), copy 0 (its device time 0.25
    /// is before the data mark), forward 1.5, backward 3, comm 0.5, optimizer 0.5, other 0
    /// (the host's End, 1.25, is before the optimizer's device end).
    const WANT: [f64; Phase::COUNT] = [0.5, 0.0, 1.5, 3.0, 0.5, 0.5, 0.0];

    #[test]
    fn chosen_event_times_give_exact_phases_a_step_late_and_the_last_is_flushed() {
        let (d, h) = two_steps();
        let mut c = EventClock::new(FakeEvents::new(&d, &h, EventClock::<FakeEvents>::slots(1)), ReadAt::NextStep, 1);
        for e in STEP {
            c.record(e);
        }
        assert!(c.finished(false).is_none(), "step 1 is read when step 2 ends");
        assert!(c.source.waits.is_empty(), "no wait at any mark of step 1");
        for e in STEP {
            c.record(e);
        }
        let first = c.finished(false).expect("step 1 after step 2's end").clone();
        assert_eq!(phases(&first), WANT);
        assert_eq!(first.times().step_s, 6.0);
        assert_eq!(first.times().phases.values().sum::<f64>(), first.times().step_s);
        assert_eq!(c.source.waits.len(), 1, "one wait, for step 1's last event");
        assert!(c.finished(false).is_none(), "step 2 waits for step 3, or a flush");
        let last = c.finished(true).expect("the flush reads the last step").clone();
        assert_eq!(phases(&last), WANT, "step 2 is timed from its own Start");
        assert!(last.start > first.start);
        assert!(c.finished(true).is_none(), "nothing left after the flush");
    }

    #[test]
    fn read_at_step_end_gives_each_step_at_its_end_after_one_wait() {
        let (d, h) = two_steps();
        let mut c = EventClock::new(FakeEvents::new(&d, &h, EventClock::<FakeEvents>::slots(1)), ReadAt::StepEnd, 1);
        for step in 0..2 {
            for e in STEP {
                c.record(e);
            }
            assert_eq!(c.source.waits.len(), step + 1, "one wait per step, at its end");
            assert_eq!(phases(c.finished(false).expect("read at the step's end")), WANT);
        }
    }

    #[test]
    fn a_host_end_after_the_device_is_other_and_missing_device_times_keep_host_times() {
        let mut step = Recording {
            start: Instant::now(),
            marks: Vec::new(),
        };
        let marks = [
            (StepEvent::Start, 0.0, Some(0)),
            (StepEvent::DataReady, 0.25, None),
            (StepEvent::ForwardDone, 0.5, Some(2)),
            (StepEvent::BackwardDone, 0.75, Some(3)),
            (StepEvent::End, 4.0, None),
        ];
        for (event, host_s, slot) in marks {
            step.marks.push(Recorded { event, host_s, slot });
        }
        let mut out = StepMarks::new(1, step.start);
        // The device knows the forward (at 1.0) but not the backward (host 0.75, moved to 1.0).
        assemble(&step, |s| (s == 2).then_some(1.0), &mut out);
        let t = out.times();
        assert_eq!(t.phases[Phase::Data], 0.25);
        assert_eq!(t.phases[Phase::Forward], 0.75);
        assert_eq!(t.phases[Phase::Backward], 0.0);
        assert_eq!(t.phases[Phase::Other], 3.0);
        assert_eq!(t.step_s, 4.0);
    }

    #[test]
    fn banks_alternate_so_a_waiting_step_keeps_its_events() {
        let mut c = EventClock::new(HostEvents::new(EventClock::<HostEvents>::slots(2)), ReadAt::NextStep, 2);
        let mut slots = Vec::new();
        for _ in 0..2 {
            c.record(StepEvent::Start);
            slots.push(c.current.marks[0].slot.unwrap());
            c.record(StepEvent::End);
        }
        assert_eq!(slots, [StepEvent::per_step(2), 0]);
        assert!(c.finished(false).is_some());
    }

    /// An all-reduce timed by its own events in two banks, read when the clock gives
    /// the step: chosen intervals per step, each step's bank read after the next step
    /// recorded into the other, give each step its own figures.
    #[test]
    fn deferred_comm_banks_give_each_step_its_own_times_a_step_late() {
        // Step k's two buckets: (work, start to backward's end) in its bank.
        let step_buckets = |k: f64| [(0.5 + k, 0.25), (0.125 * k, -1.0)];
        let mut bank_times = [[(0.0, 0.0); 2]; 2];
        let mut banks = DeferredBanks::default();
        let mut clock = EventClock::new(HostEvents::new(EventClock::<HostEvents>::slots(1)), ReadAt::NextStep, 1);
        let mut read = Vec::new();
        for k in 0..4 {
            for e in STEP {
                if e == StepEvent::CommDone {
                    assert_eq!(banks.overdue(), None, "no bank is overwritten before it is read");
                    bank_times[banks.current()] = step_buckets(f64::from(k));
                    banks.end_step();
                }
                clock.record(e);
            }
            if clock.finished(false).is_some() {
                read.push(comm_seconds(bank_times[banks.take_oldest().unwrap()]));
            }
        }
        if clock.finished(true).is_some() {
            read.push(comm_seconds(bank_times[banks.take_oldest().unwrap()]));
        }
        // Work 0.5 + k and k/8; hidden 0.25 of the first and none of the second (it started after).
        let want: Vec<(f64, f64)> = (0..4).map(|k| (0.5 + 1.125 * f64::from(k), 0.25)).collect();
        assert_eq!(read, want);
        assert_eq!(banks.take_oldest(), None);
        // A step's bank still unread when the step after next ends is handed back to read at once.
        let mut late = DeferredBanks::default();
        late.end_step();
        assert_eq!(late.overdue(), None, "bank 1 is free");
        late.end_step();
        assert_eq!(late.overdue(), Some(0), "bank 0's step was never read");
        assert_eq!(late.take_oldest(), Some(1));
        // Hidden time is cut to the bucket's work.
        assert_eq!(comm_seconds([(1.0, 3.0)]), (1.0, 1.0));
    }
}
