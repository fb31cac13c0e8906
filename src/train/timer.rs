//! [`PhaseTimer`]: the one clock every phase of a step goes through. Each boundary
//! ([`PhaseTimer::end`]) waits for the device work queued so far and charges the time
//! since the previous boundary to the phase that just ended, so the phases of a step
//! are contiguous and add up to its wall time.
//!
//! On CPU a boundary only reads the clock. On CUDA it first synchronises libtorch's
//! stream (not NCCL's, so an overlapped all-reduce keeps running), so a phase's time
//! covers its kernels; that costs the CPU/GPU pipelining across phase boundaries, a
//! few kernel launches' worth per phase.

use crate::device;
use crate::record::{Phase, PhaseTimes};
use std::time::Instant;
use tch::Device;

/// How a boundary waits for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// CPU tensors: work is done when the call returns.
    Nothing,
    /// CUDA: synchronise libtorch's stream.
    TorchStream(Device),
    /// CUDA with `--phase-sync off`: no waits at boundaries, one at the step's end, and
    /// the step is recorded whole as [`Phase::Other`].
    StepEndOnly(Device),
}

/// Times the phases of one step at a time.
#[derive(Debug)]
pub struct PhaseTimer {
    wait: Wait,
    step_start: Instant,
    last: Instant,
    times: PhaseTimes,
}

/// One finished step's clock readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTimes {
    pub phases: PhaseTimes,
    pub step_s: f64,
    pub start: Instant,
}

impl PhaseTimer {
    /// The timer for tensors on `device`; `phase_sync` false: see [`Wait::StepEndOnly`].
    pub fn new(device: Device, phase_sync: bool) -> PhaseTimer {
        let now = Instant::now();
        PhaseTimer {
            wait: match (device, phase_sync) {
                (Device::Cpu, _) => Wait::Nothing,
                (_, true) => Wait::TorchStream(device),
                (_, false) => Wait::StepEndOnly(device),
            },
            step_start: now,
            last: now,
            times: [0.0; Phase::COUNT],
        }
    }

    /// Starts a step: its first phase starts now.
    pub fn start_step(&mut self) {
        self.step_start = Instant::now();
        self.last = self.step_start;
        self.times = [0.0; Phase::COUNT];
    }

    /// Ends `phase` here: waits for the device, then adds the time since the previous
    /// boundary to `phase` (a phase met twice in a step, as with micro-batches, adds up).
    pub fn end(&mut self, phase: Phase) -> Instant {
        if let Wait::TorchStream(d) = self.wait {
            device::sync(d);
        }
        let now = Instant::now();
        if let Wait::StepEndOnly(_) = self.wait {
            return now;
        }
        self.times[phase.index()] += (now - self.last).as_secs_f64();
        self.last = now;
        now
    }

    /// Ends the step: the time since the last boundary is [`Phase::Other`], and the step's
    /// wall time is the sum of its phases.
    pub fn finish_step(&mut self) -> StepTimes {
        if let Wait::StepEndOnly(d) = self.wait {
            device::sync(d);
        }
        let now = Instant::now();
        self.times[Phase::Other.index()] += (now - self.last).as_secs_f64();
        self.last = now;
        StepTimes {
            phases: self.times,
            step_s: (now - self.step_start).as_secs_f64(),
            start: self.step_start,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_are_contiguous_accumulate_and_add_up_to_the_step() {
        let mut t = PhaseTimer::new(Device::Cpu, true);
        t.start_step();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(2));
            t.end(Phase::Data);
            std::thread::sleep(Duration::from_millis(1));
            t.end(Phase::Forward);
        }
        t.end(Phase::CommExposed);
        let s = t.finish_step();
        // Two micro-batches: each phase holds both of its sleeps.
        assert!(s.phases[Phase::Data.index()] >= 0.004);
        assert!(s.phases[Phase::Forward.index()] >= 0.002);
        assert_eq!(s.phases[Phase::Backward.index()], 0.0);
        let sum: f64 = s.phases.iter().sum();
        assert!((sum - s.step_s).abs() < 1e-9, "{sum} vs {}", s.step_s);
        // A new step starts from zero.
        t.start_step();
        let s2 = t.finish_step();
        assert_eq!(s2.phases[Phase::Data.index()], 0.0);
        assert!(s2.start > s.start);
    }
}

#[cfg(test)]
mod unsynced_tests {
    use super::*;

    #[test]
    fn without_phase_sync_the_whole_step_is_other() {
        // device::sync does nothing for Device::Cpu, so this checks the bookkeeping of
        // the unsynced mode on a machine without a GPU.
        let mut t = PhaseTimer {
            wait: Wait::Nothing,
            step_start: Instant::now(),
            last: Instant::now(),
            times: [0.0; Phase::COUNT],
        };
        t.wait = Wait::StepEndOnly(Device::Cpu);
        t.start_step();
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.end(Phase::Forward);
        t.end(Phase::Backward);
        let s = t.finish_step();
        assert_eq!(s.phases[Phase::Forward.index()], 0.0);
        assert_eq!(s.phases[Phase::Backward.index()], 0.0);
        assert_eq!(s.phases[Phase::Other.index()], s.step_s);
        assert!(s.step_s >= 0.002);
    }
}
