//! The flight recorder: every collective a rank enters (bucket all-reduces, broadcasts,
//! barriers, checksums, the probe, clock estimates) gets a sequence number, the same on
//! every rank since all ranks make the same calls in the same order, and a state
//! (scheduled, started, completed) with its times, in a small ring buffer. When a
//! collective does not complete, the ranks that can still act dump it to
//! `rank-NNNNN.flight.json`, and [`hang::diagnose`] names the ranks that never entered it:
//! the rank that hangs a job, and where.
//!
//! Between collectives the rank's main thread says which [`Activity`] it is in (forward,
//! backward, data loading, closing the run's files...) and when it entered it, so a
//! step that never advances is named with its phase ([`hang::stalled`]) although no
//! collective is pending.

pub(crate) mod hang;

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Collectives kept per rank.
const RING: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum State {
    /// Handed over (a bucket queued for the all-reduce thread or stream), not yet entered.
    Scheduled,
    /// Entered: the rank is inside the collective, waiting for its peers or moving data.
    Started,
    Completed,
}

/// One collective on one rank.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Record {
    pub seq: u64,
    /// e.g. `all-reduce`, `broadcast`, `barrier`.
    pub kind: String,
    /// e.g. `bucket 2`, `parameters`, `stop check`.
    pub detail: String,
    pub epoch: Option<usize>,
    pub step: Option<usize>,
    pub state: State,
    /// Seconds since the process's recorder started.
    pub scheduled_s: f64,
    pub started_s: Option<f64>,
    pub completed_s: Option<f64>,
    /// True when made after the work ended: the final records, closing files, MPI_Finalize.
    #[serde(default)]
    pub teardown: bool,
}

impl Record {
    /// `all-reduce #4812 (bucket 2, epoch 3 step 120)`.
    pub(crate) fn describe(&self) -> String {
        let mut what = vec![self.detail.clone()].into_iter().filter(|d| !d.is_empty()).collect::<Vec<_>>();
        match (self.teardown, self.epoch, self.step) {
            (true, _, _) => what.push("teardown".into()),
            (_, Some(e), Some(s)) => what.push(format!("epoch {e} step {s}")),
            (_, Some(e), None) => what.push(format!("epoch {e}")),
            _ => what.push("set-up".into()),
        }
        format!("{} #{} ({})", self.kind, self.seq, what.join(", "))
    }

    /// True when `other` is the same call (kind and detail) as this one.
    fn same_call(&self, other: &Record) -> bool {
        self.seq == other.seq && self.kind == other.kind && self.detail == other.detail
    }
}

/// What a rank's main thread does between collectives, watched for progress: a phase
/// that lasts longer than the watchdog's limit is a step (or a teardown) that does not
/// advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Activity {
    Data = 1,
    Copy,
    Forward,
    Backward,
    AllReduceWait,
    Optimizer,
    StepRecords,
    Validation,
    LastRecords,
    ClosingFiles,
}

impl Activity {
    const ALL: [Activity; 10] = [
        Activity::Data,
        Activity::Copy,
        Activity::Forward,
        Activity::Backward,
        Activity::AllReduceWait,
        Activity::Optimizer,
        Activity::StepRecords,
        Activity::Validation,
        Activity::LastRecords,
        Activity::ClosingFiles,
    ];

    /// How a message names it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Activity::Data => "data loading",
            Activity::Copy => "the copy to the device",
            Activity::Forward => "forward",
            Activity::Backward => "backward",
            Activity::AllReduceWait => "the wait for the gradient all-reduce",
            Activity::Optimizer => "the optimizer step",
            Activity::StepRecords => "the step's records",
            Activity::Validation => "validation",
            Activity::LastRecords => "teardown (writing the run's last records)",
            Activity::ClosingFiles => "teardown (closing the run's files)",
        }
    }

    /// True for the phases after the work ended.
    fn teardown(self) -> bool {
        matches!(self, Activity::LastRecords | Activity::ClosingFiles)
    }
}

/// The phase this rank is in and when it entered it: nanoseconds since the recorder's
/// origin shifted left by 8, with the phase's number (0: none) in the low byte: a
/// boundary costs one clock read and one relaxed store, and takes no lock.
static PHASE: AtomicU64 = AtomicU64::new(0);

/// True once MPI_Finalize has returned on this rank.
static FINALIZED: AtomicBool = AtomicBool::new(false);

/// Says that this rank's main thread enters `phase` now (None: nothing to watch, as in
/// set-up, where loading a data set may take long and only collectives are watched).
#[inline]
pub(crate) fn phase(phase: Option<Activity>) {
    let at_ns = recorder().origin.elapsed().as_nanos() as u64;
    PHASE.store((at_ns << 8) | phase.map_or(0, |p| p as u64), Ordering::Relaxed);
}

/// Where a rank's main thread is, as its watchdog reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PhaseStatus {
    /// [`Activity::describe`].
    pub name: String,
    pub epoch: Option<usize>,
    pub step: Option<usize>,
    /// True after the work ended (the step and epoch are then the last ones).
    #[serde(default)]
    pub teardown: bool,
    /// Seconds since it entered the phase.
    pub for_s: f64,
}

impl PhaseStatus {
    /// `forward of epoch 0 step 3`, `validation of epoch 2`, `teardown (closing the run's files)`.
    pub(crate) fn describe(&self) -> String {
        match (self.teardown, self.epoch, self.step) {
            (false, Some(e), Some(s)) => format!("{} of epoch {e} step {s}", self.name),
            (false, Some(e), None) => format!("{} of epoch {e}", self.name),
            _ => self.name.clone(),
        }
    }
}

struct Inner {
    next_seq: u64,
    ring: VecDeque<Record>,
    epoch: Option<usize>,
    step: Option<usize>,
    /// True while this rank sits out a part of the job (a study point it is not in).
    idle: bool,
    /// The value of [`PROGRESS`] last seen, and when it was seen to change.
    seen_progress: u64,
    progress_s: f64,
    /// True once the work has ended ([`Recorder::begin_teardown`]).
    teardown: bool,
}

/// Operations completed inside long entries (a sweep's timed loop): one relaxed
/// increment per operation, read by the watchdog's thread.
static PROGRESS: AtomicU64 = AtomicU64::new(0);

/// Says that the rank's pending entry has moved on (one more operation of a loop
/// recorded as one entry), so its wait counts from now.
#[inline]
pub(crate) fn progress() {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// The process's recorder ([`recorder`]).
pub(crate) struct Recorder {
    origin: Instant,
    inner: Mutex<Inner>,
}

/// The process-wide recorder.
pub(crate) fn recorder() -> &'static Recorder {
    static R: OnceLock<Recorder> = OnceLock::new();
    R.get_or_init(|| Recorder {
        origin: Instant::now(),
        inner: Mutex::new(Inner {
            next_seq: 0,
            ring: VecDeque::with_capacity(RING),
            epoch: None,
            step: None,
            idle: false,
            seen_progress: 0,
            progress_s: 0.0,
            teardown: false,
        }),
    })
}

/// A started collective; completed when dropped.
pub(crate) struct Entered(u64);

impl Drop for Entered {
    fn drop(&mut self) {
        recorder().complete(self.0);
    }
}

/// Records entry into a blocking collective made now; it completes when the guard drops.
pub(crate) fn enter(kind: &str, detail: &str) -> Entered {
    let r = recorder();
    let seq = r.schedule(kind, detail);
    r.start(seq);
    Entered(seq)
}

impl Recorder {
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where training is: later records carry this epoch and step.
    pub(crate) fn set_position(&self, epoch: Option<usize>, step: Option<usize>) {
        let mut i = self.lock();
        i.epoch = epoch;
        i.step = step;
        i.teardown = false;
    }

    /// The work has ended: later records are the teardown's (final records, closing
    /// files, MPI_Finalize).
    pub(crate) fn begin_teardown(&self) {
        self.lock().teardown = true;
    }

    /// This rank is past MPI_Finalize: only its exit is left.
    pub(crate) fn mark_finalized(&self) {
        FINALIZED.store(true, Ordering::Relaxed);
    }

    /// True once MPI_Finalize has returned on this rank ([`Recorder::mark_finalized`]).
    pub(crate) fn finalized(&self) -> bool {
        // Not under the lock: a panic hook asks, whatever the panicking thread holds.
        FINALIZED.load(Ordering::Relaxed)
    }

    /// Starts a part of the job that all ranks begin together (a study point): its
    /// collectives are numbered from `base` on every rank, so members' numbers agree
    /// whatever each rank did before; `idle` marks a rank that takes no part in it, which
    /// a hang diagnosis then leaves out.
    pub(crate) fn begin_part(&self, base: u64, idle: bool) {
        let mut i = self.lock();
        i.next_seq = i.next_seq.max(base);
        i.idle = idle;
        i.teardown = false;
    }

    /// Whether this rank sits out the current part ([`Recorder::begin_part`]).
    pub(crate) fn idle(&self) -> bool {
        self.lock().idle
    }

    /// A collective handed over (not entered yet); returns its sequence number.
    pub(crate) fn schedule(&self, kind: &str, detail: &str) -> u64 {
        let now = self.now();
        let mut i = self.lock();
        let seq = i.next_seq;
        i.next_seq += 1;
        if i.ring.len() == RING {
            i.ring.pop_front();
        }
        let (epoch, step, teardown) = (i.epoch, i.step, i.teardown);
        i.ring.push_back(Record {
            seq,
            kind: kind.into(),
            detail: detail.into(),
            epoch,
            step,
            state: State::Scheduled,
            scheduled_s: now,
            started_s: None,
            completed_s: None,
            teardown,
        });
        seq
    }

    pub(crate) fn start(&self, seq: u64) {
        let now = self.now();
        if let Some(r) = self.lock().ring.iter_mut().rev().find(|r| r.seq == seq) {
            r.state = State::Started;
            r.started_s = Some(now);
        }
    }

    pub(crate) fn complete(&self, seq: u64) {
        let now = self.now();
        if let Some(r) = self.lock().ring.iter_mut().rev().find(|r| r.seq == seq) {
            r.state = State::Completed;
            r.completed_s = Some(now);
            r.started_s.get_or_insert(now);
        }
    }

    /// The collective this rank is held in: its oldest one not completed, with the
    /// seconds since it was started (or scheduled, or last made [`progress`]). None
    /// when nothing is pending.
    pub(crate) fn pending(&self) -> Option<(Record, f64)> {
        let now = self.now();
        let mut i = self.lock();
        let p = PROGRESS.load(Ordering::Relaxed);
        if p != i.seen_progress {
            i.seen_progress = p;
            i.progress_s = now;
        }
        let r = i.ring.iter().find(|r| r.state != State::Completed)?;
        let since = r.started_s.unwrap_or(r.scheduled_s).max(i.progress_s);
        Some((r.clone(), now - since))
    }

    /// The last completed sequence number (None before the first collective).
    pub(crate) fn last_completed(&self) -> Option<u64> {
        let i = self.lock();
        i.ring.iter().rev().find(|r| r.state == State::Completed).map(|r| r.seq)
    }

    pub(crate) fn snapshot(&self) -> Vec<Record> {
        self.lock().ring.iter().cloned().collect()
    }

    /// The phase this rank's main thread is in ([`phase`]), None outside watched work.
    pub(crate) fn phase(&self) -> Option<PhaseStatus> {
        let word = PHASE.load(Ordering::Relaxed);
        let p = Activity::ALL.into_iter().find(|p| *p as u64 == word & 0xff)?;
        let for_s = (self.now() - (word >> 8) as f64 * 1e-9).max(0.0);
        let i = self.lock();
        Some(PhaseStatus {
            name: p.describe().into(),
            epoch: i.epoch,
            step: i.step,
            teardown: p.teardown() || i.teardown,
            for_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_numbers_collectives_and_finds_the_pending_one_and_the_phase() {
        let r = recorder();
        r.set_position(Some(1), Some(7));
        let a = r.schedule("all-reduce", "bucket 0");
        let b = r.schedule("all-reduce", "bucket 1");
        assert_eq!(b, a + 1);
        r.start(a);
        r.complete(a);
        r.start(b);
        let (p, _) = r.pending().unwrap();
        assert_eq!((p.seq, p.state, p.step), (b, State::Started, Some(7)));
        {
            let _g = enter("barrier", "");
        }
        r.complete(b);
        assert!(r.pending().is_none());
        assert_eq!(r.last_completed(), Some(b + 1));
        // The phase, with the position and its age (one test: both are process-wide).
        r.set_position(Some(2), Some(5));
        phase(Some(Activity::Backward));
        let p = r.phase().unwrap();
        assert_eq!(
            (p.name.as_str(), p.epoch, p.step, p.teardown),
            ("backward", Some(2), Some(5), false)
        );
        assert!(p.for_s >= 0.0 && p.for_s < 60.0, "{p:?}");
        assert_eq!(p.describe(), "backward of epoch 2 step 5");
        phase(Some(Activity::ClosingFiles));
        assert_eq!(r.phase().unwrap().describe(), "teardown (closing the run's files)");
        phase(None);
        assert_eq!(r.phase(), None);
    }
}
