//! What a run writes as it goes: the manifest, one row per step and per epoch, rank 0's
//! clock offsets, and the all-reduce's per-bucket hand-over statistics.

use super::state::StepAt;
use super::step::StepMeasured;
use super::timer::Mark;
use crate::comm::CommStats;
use crate::record::clock::{ClockLog, ClockRow};
use crate::record::last_gasp::LastGasp;
use crate::record::reserve::Reserve;
use crate::record::{self, ClockSummary, CsvLog, EpochRow, Manifest, Phase, StepRow};
use crate::trace::{RankTrace, TracedStep};
use anyhow::Result;
use std::time::Instant;

/// The run's records, open from set-up to the end.
pub(super) struct Records {
    pub manifest: Manifest,
    pub steps_log: CsvLog<StepRow>,
    /// Rank 0's `epochs.csv`.
    pub epochs_log: Option<CsvLog<EpochRow>>,
    pub offsets: ClockRecord,
    pub bucket_ready: BucketReady,
    /// What names this rank's rows.
    pub rows: RowIdentity,
    /// Rank 0's room for the last records on a full disk, given back when the run ends.
    pub _reserve: Option<Reserve>,
    /// What a stop signal's handler writes, until the run's own outcome replaces it.
    pub _last_gasp: LastGasp,
    /// This rank's trace (`--trace`), open from the start of training.
    pub trace: Option<RankTrace>,
}

/// Draws step `at` in the trace when its window holds it: the phase slices between the
/// marks the step's clock recorded, and the all-reduce's readings.
pub(super) fn trace_step(trace: &mut RankTrace, m: &StepMeasured, marks: &[Mark], at: StepAt) -> Result<()> {
    if !trace.wants(at.global_step) {
        return Ok(());
    }
    let phases: Vec<(Phase, f64, f64)> = marks
        .windows(2)
        .filter_map(|p| p[1].event.ends().map(|ph| (ph, p[0].at_s, p[1].at_s)))
        .collect();
    trace.step(&TracedStep {
        global_step: at.global_step,
        epoch: at.epoch,
        warmup: at.warmup,
        start: m.times.start,
        phases: &phases,
        comm: &m.comm,
        backward_end: m.backward.map(|b| b.1),
        loss: m.loss,
        samples: m.samples,
    })
}

/// The columns every row of one rank's `rank-NNNNN.csv` shares.
pub(super) struct RowIdentity {
    pub run_id: String,
    pub rank: usize,
    pub node_type: String,
    /// The job has more than one rank: its all-reduce puts bytes on a wire (a lone
    /// rank's is a local copy, and its rows say 0 bytes).
    pub communicates: bool,
}

impl RowIdentity {
    /// The row of step `at`, as measured; `origin` is the ranks' common time origin.
    pub(super) fn step_row(&self, m: &StepMeasured, at: StepAt, origin: Instant) -> StepRow {
        let since_origin = |t: Instant| (t - origin).as_secs_f64();
        let comm: &CommStats = &m.comm;
        StepRow {
            run_id: self.run_id.clone(),
            rank: self.rank,
            node_type: self.node_type.clone(),
            epoch: at.epoch,
            step: at.step,
            global_step: at.global_step,
            warmup: u8::from(at.warmup),
            time_utc: record::rfc3339_utc(m.started_utc),
            step_start_at_s: since_origin(m.times.start),
            samples: m.samples,
            step_s: m.times.step_s,
            comm_s: comm.comm_s,
            comm_stage_d2h_s: comm.stage_d2h_s,
            comm_stage_h2d_s: comm.stage_h2d_s,
            comm_start_at_s: comm.first_launch.map_or(f64::NAN, since_origin),
            comm_last_start_at_s: comm.last_launch.map_or(f64::NAN, since_origin),
            comm_hidden_s: comm.hidden_s,
            loss: m.loss,
            bytes: if self.communicates { comm.bytes } else { 0 },
            loss_scale: m.loss_scale,
            step_skipped: u8::from(!m.stepped),
            noise: m.noise,
            phases: m.times.phases,
        }
    }
}

/// Rank 0's `clock.csv` and what its estimates add up to (empty on other ranks).
#[derive(Default)]
pub(super) struct ClockRecord {
    pub log: Option<ClockLog>,
    pub summary: ClockSummary,
    /// Each rank's first offset estimate, for the drift.
    first_offsets: Vec<f64>,
}

impl ClockRecord {
    /// Writes one estimate of every rank's offset and adds it to the summary; nothing
    /// without a log (ranks other than 0).
    pub(super) fn add(&mut self, rows: &[ClockRow]) -> Result<()> {
        let Some(log) = self.log.as_mut() else { return Ok(()) };
        log.write(rows)?;
        if self.first_offsets.is_empty() {
            self.first_offsets = rows.iter().map(|r| r.best().0).collect();
        }
        let c = &mut self.summary;
        c.syncs += 1;
        c.target_error_s = super::clock::TARGET_ERROR_S;
        c.budget_s = super::clock::BUDGET_S;
        c.exact_ranks = rows.iter().filter(|r| r.exact_offset_s.is_some()).count();
        for (r, first) in rows.iter().zip(&self.first_offsets) {
            let (offset_s, error_s) = r.best();
            c.max_error_s = c.max_error_s.max(error_s);
            c.max_estimate_error_s = c.max_estimate_error_s.max(r.error_s);
            c.max_abs_offset_s = c.max_abs_offset_s.max(offset_s.abs());
            c.max_drift_s = c.max_drift_s.max((offset_s - first).abs());
        }
        Ok(())
    }
}

/// Per bucket, over the timed steps: the mean fraction of backward elapsed when it was
/// handed to the all-reduce.
#[derive(Debug, Default)]
pub(super) struct BucketReady {
    sums: Vec<f64>,
    steps: u64,
}

impl BucketReady {
    /// Adds each bucket's hand-over (`launches`, in bucket order) as the fraction, 0 to 1,
    /// of the backward pass `(start, end)`; a bucket not handed over before backward
    /// ended counts 1.
    pub(super) fn add(&mut self, launches: &[Option<Instant>], backward: Option<(Instant, Instant)>) {
        let Some((start, end)) = backward else { return };
        let span = (end - start).as_secs_f64();
        self.sums.resize(launches.len(), 0.0);
        for (sum, launch) in self.sums.iter_mut().zip(launches) {
            let f = match launch {
                Some(t) if span > 0.0 && *t < end => (t.saturating_duration_since(start).as_secs_f64() / span).clamp(0.0, 1.0),
                _ => 1.0,
            };
            *sum += f;
        }
        self.steps += 1;
    }

    /// The mean per bucket, or None before any step was added.
    pub(super) fn means(&self) -> Option<Vec<f64>> {
        (self.steps > 0).then(|| self.sums.iter().map(|s| s / self.steps as f64).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_hand_overs_are_fractions_of_backward_averaged_over_steps() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = BucketReady::default();
        assert_eq!(b.means(), None);
        // Backward 0..100 ms: a quarter, three quarters, and a bucket left for finish.
        b.add(&[Some(at(25)), Some(at(75)), None], Some((at(0), at(100))));
        // Backward 100..200 ms: at its start, and after it ended.
        b.add(&[Some(at(100)), Some(at(250)), Some(at(150))], Some((at(100), at(200))));
        // No backward: not counted.
        b.add(&[Some(at(0)), None, None], None);
        let m = b.means().unwrap();
        assert_eq!(m.len(), 3);
        assert!((m[0] - 0.125).abs() < 1e-12, "{m:?}");
        assert!((m[1] - 0.875).abs() < 1e-12, "{m:?}");
        assert!((m[2] - 0.75).abs() < 1e-12, "{m:?}");
    }
}
