//! The rows of `rank-NNNNN.csv` (one per step) and `epochs.csv` (one per epoch), and
//! [`Phase`], the parts of a step that add up to `step_s`.

use super::cells::{exact_opt, Exact};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A part of a training step. The phases of one step add up to its `step_s`; each is a
/// column of `rank-NNNNN.csv` named by [`Phase::column`] (also its `Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Waiting for the next batch (prepared inline, or taken from the workers' queue).
    Data,
    /// Copying the batch to the training device (0 on CPU).
    BatchCopy,
    /// The network's forward pass and the loss.
    Forward,
    /// The backward pass, handing finished gradient buckets to the all-reduce (`--overlap on`).
    Backward,
    /// Waiting for the gradient all-reduce after backward: the part overlap did not hide,
    /// including the time spent waiting for a late rank to enter it.
    CommExposed,
    /// Unscaling (fp16 AMP), the optimizer step and zeroing the gradients.
    Optimizer,
    /// The rest of the step (loss read-back, bookkeeping): `step_s` minus the other phases.
    Other,
}

impl Phase {
    pub(crate) const COUNT: usize = 7;
    /// Every phase, in the order a step runs through them.
    pub const ALL: [Phase; Phase::COUNT] = [
        Phase::Data,
        Phase::BatchCopy,
        Phase::Forward,
        Phase::Backward,
        Phase::CommExposed,
        Phase::Optimizer,
        Phase::Other,
    ];

    /// The phase's column in `rank-NNNNN.csv`.
    pub fn column(self) -> &'static str {
        match self {
            Phase::Data => "data_s",
            Phase::BatchCopy => "batch_copy_s",
            Phase::Forward => "forward_s",
            Phase::Backward => "backward_s",
            Phase::CommExposed => "comm_exposed_s",
            Phase::Optimizer => "optimizer_s",
            Phase::Other => "other_s",
        }
    }

    /// Position in [`Phase::ALL`], for arrays indexed by phase.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// What the phase is spent on, for the step's breakdown into data, communication
    /// and compute. A match with no catch-all: a new phase does not compile until it is
    /// given a role, so it can never drop out of the breakdown's sum.
    pub(crate) fn role(self) -> PhaseRole {
        match self {
            Phase::Data | Phase::BatchCopy => PhaseRole::Data,
            Phase::CommExposed => PhaseRole::Communication,
            Phase::Forward | Phase::Backward | Phase::Optimizer | Phase::Other => PhaseRole::Compute,
        }
    }
}

/// What a phase's time is spent on ([`Phase::role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseRole {
    /// Waiting for and copying the batch.
    Data,
    /// The exposed all-reduce (split by `reduce` into transfer and the wait for a late rank).
    Communication,
    /// The rank's own work: the network, the optimizer and the rest of the step.
    Compute,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.column())
    }
}

/// One value per phase, indexed by [`Phase`], in [`Phase::ALL`]'s order: a new phase
/// is a new entry everywhere one of these is kept, with no other edit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseArray<T>(pub [T; Phase::COUNT]);

impl<T> PhaseArray<T> {
    /// The array whose entry for each phase is `f(phase)`.
    pub(crate) fn from_fn(mut f: impl FnMut(Phase) -> T) -> Self {
        PhaseArray(Phase::ALL.map(&mut f))
    }

    /// Each phase with its value, in [`Phase::ALL`]'s order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Phase, &T)> {
        Phase::ALL.into_iter().zip(self.0.iter())
    }

    /// The values in [`Phase::ALL`]'s order.
    pub fn values(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// The values in [`Phase::ALL`]'s order, to change in place.
    pub(crate) fn values_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.0.iter_mut()
    }
}

impl<T> std::ops::Index<Phase> for PhaseArray<T> {
    type Output = T;
    fn index(&self, p: Phase) -> &T {
        &self.0[p.index()]
    }
}

impl<T> std::ops::IndexMut<Phase> for PhaseArray<T> {
    fn index_mut(&mut self, p: Phase) -> &mut T {
        &mut self.0[p.index()]
    }
}

/// Seconds per phase of one step.
pub type PhaseTimes = PhaseArray<f64>;

/// One training step on one rank: a row of `rank-NNNNN.csv`. Its columns, in order, are
/// [`StepRow::LEADING`], one per phase of [`Phase::ALL`] named by [`Phase::column`], and
/// [`StepRow::TRAILING`]; a phase added to [`Phase`] is a column here with no other edit.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    /// The run this row belongs to (the manifest's `run_id`).
    pub run_id: String,
    pub rank: usize,
    pub node_type: String,
    pub epoch: usize,
    /// Step within the epoch, from 0.
    pub step: usize,
    /// Step since the start of the run, from 0.
    pub global_step: usize,
    /// 1 for the first `--warmup-steps` steps (kept in the file, excluded by `reduce`).
    pub warmup: u8,
    /// Wall-clock time of the step's start.
    pub time_utc: String,
    /// Seconds from the run's common start (ranks leave a barrier together) to the step's
    /// start (`elapsed_s` before schema 3).
    pub step_start_at_s: f64,
    /// Samples this rank processed in the step.
    pub samples: usize,
    /// Seconds per phase; they add up to `step_s`.
    pub phases: PhaseTimes,
    /// Wall time of the whole step: the sum of the phases.
    pub step_s: f64,
    /// All-reduce work: the sum over buckets of each bucket's all-reduce, staging
    /// copies included, whether or not it was hidden behind backward. Not a phase.
    pub comm_s: f64,
    /// Device→host copies of the CPU-staged all-reduce (inside comm_s; 0 on CPU and with
    /// NCCL). The copies run on the device's default stream, so with overlap on they
    /// include waiting for the backward kernels queued ahead of them.
    pub comm_stage_d2h_s: f64,
    /// Host→device copies of the CPU-staged all-reduce (inside comm_s); with overlap on,
    /// waits behind queued backward kernels included, as for comm_stage_d2h_s.
    pub comm_stage_h2d_s: f64,
    /// The part of comm_s that ran before backward ended, by the clocks (0 without
    /// overlap). With the manifest's `comm.overlap_shares_core` it shared backward's
    /// cores and hid nothing.
    pub comm_hidden_s: f64,
    /// Seconds from the run's common start to this rank's entry into the all-reduce
    /// (its first bucket handed over); `comm_start_s` before schema 3.
    pub comm_start_at_s: f64,
    /// Seconds from the run's common start to this rank's entry into its last bucket's
    /// all-reduce (when its backward ended): from then on it only waits.
    /// `comm_last_start_s` before schema 3.
    pub comm_last_start_at_s: f64,
    pub loss: f64,
    /// Gradient bytes this rank put into the all-reduce (at --grad-dtype); 0 for a lone
    /// rank, whose all-reduce is a local copy that puts nothing on a wire.
    pub bytes: u64,
    /// fp16 AMP's loss scale during the step (empty without --amp fp16).
    pub loss_scale: Option<f64>,
    /// 1 when fp16 AMP found inf/NaN gradients and skipped the optimizer step.
    pub step_skipped: u8,
    /// The gradient noise scale's two squared norms of this step (`--noise-scale`),
    /// columns `noise_batch_small`, `grad_sq_small`, `noise_batch_big`, `grad_sq_big`;
    /// all four empty when the step did not measure, a norm's cell alone empty when it
    /// was not finite.
    pub noise: Option<crate::noise_scale::NormPair>,
}

impl StepRow {
    /// The columns before the phases.
    pub(crate) const LEADING: [&'static str; 10] = [
        "run_id",
        "rank",
        "node_type",
        "epoch",
        "step",
        "global_step",
        "warmup",
        "time_utc",
        "step_start_at_s",
        "samples",
    ];
    /// The columns after the phases.
    pub(crate) const TRAILING: [&'static str; 15] = [
        "step_s",
        "comm_s",
        "comm_stage_d2h_s",
        "comm_stage_h2d_s",
        "comm_hidden_s",
        "comm_start_at_s",
        "comm_last_start_at_s",
        "loss",
        "bytes",
        "loss_scale",
        "step_skipped",
        "noise_batch_small",
        "grad_sq_small",
        "noise_batch_big",
        "grad_sq_big",
    ];

    /// Every column of a rank file, in order.
    #[cfg(test)]
    pub(crate) fn columns() -> Vec<&'static str> {
        let phases = Phase::ALL.iter().map(|p| p.column());
        Self::LEADING.iter().copied().chain(phases).chain(Self::TRAILING).collect()
    }

    /// The seconds of `phase` in this step.
    #[cfg(test)]
    pub(crate) fn phase(&self, phase: Phase) -> f64 {
        self.phases[phase]
    }
}

impl Serialize for StepRow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("StepRow", Self::LEADING.len() + Phase::COUNT + Self::TRAILING.len())?;
        let [run_id, rank, node_type, epoch, step, global_step, warmup, time_utc, start_at, samples] = Self::LEADING;
        st.serialize_field(run_id, &self.run_id)?;
        st.serialize_field(rank, &self.rank)?;
        st.serialize_field(node_type, &self.node_type)?;
        st.serialize_field(epoch, &self.epoch)?;
        st.serialize_field(step, &self.step)?;
        st.serialize_field(global_step, &self.global_step)?;
        st.serialize_field(warmup, &self.warmup)?;
        st.serialize_field(time_utc, &self.time_utc)?;
        st.serialize_field(start_at, &self.step_start_at_s)?;
        st.serialize_field(samples, &self.samples)?;
        for p in Phase::ALL {
            st.serialize_field(p.column(), &self.phases[p])?;
        }
        let [step_s, comm_s, d2h, h2d, hidden, comm_at, last_at, loss, bytes, scale, skipped, b_small, sq_small, b_big, sq_big] =
            Self::TRAILING;
        st.serialize_field(step_s, &self.step_s)?;
        st.serialize_field(comm_s, &self.comm_s)?;
        st.serialize_field(d2h, &self.comm_stage_d2h_s)?;
        st.serialize_field(h2d, &self.comm_stage_h2d_s)?;
        st.serialize_field(hidden, &self.comm_hidden_s)?;
        st.serialize_field(comm_at, &self.comm_start_at_s)?;
        st.serialize_field(last_at, &self.comm_last_start_at_s)?;
        st.serialize_field(loss, &self.loss)?;
        st.serialize_field(bytes, &self.bytes)?;
        st.serialize_field(scale, &self.loss_scale)?;
        st.serialize_field(skipped, &self.step_skipped)?;
        let n = self.noise.as_ref();
        st.serialize_field(b_small, &n.map(|n| n.batch_small))?;
        st.serialize_field(sq_small, &n.map(|n| Exact(n.sq_small)))?;
        st.serialize_field(b_big, &n.map(|n| n.batch_big))?;
        st.serialize_field(sq_big, &n.map(|n| Exact(n.sq_big)))?;
        st.end()
    }
}

/// Reads an empty cell (an undefined figure, as [`super::CsvLog`] writes NaN) as NaN.
fn nan_if_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// End of one epoch (written by rank 0; all figures are over all ranks).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EpochRow {
    pub epoch: usize,
    pub time_utc: String,
    pub steps: usize,
    /// Slowest rank's wall time for the epoch's training steps.
    pub epoch_s: f64,
    #[serde(deserialize_with = "nan_if_empty")]
    pub train_loss: f64,
    /// Empty (NaN) without validation (`--val-samples 0`).
    #[serde(deserialize_with = "nan_if_empty")]
    pub val_loss: f64,
    #[serde(deserialize_with = "nan_if_empty")]
    pub val_accuracy: f64,
    pub val_samples: usize,
    pub val_s: f64,
    /// L2 norm of all parameters (identical on every rank, checked).
    pub param_l2: f64,
    // The epoch's gradient noise scale ([`crate::noise_scale`], ranks' small norms
    // averaged per step): every cell empty with `--noise-scale off` or without two
    // batch sizes. Files written before it have none of these columns.
    /// Measured steps averaged in.
    #[serde(default)]
    pub noise_steps: Option<usize>,
    /// Measured steps left out: a norm not finite on some rank (fp16 overflow).
    #[serde(default)]
    pub noise_skipped: Option<usize>,
    /// Estimate of |G|², the squared norm of the true gradient (every digit: its scale
    /// is the model's).
    #[serde(default, serialize_with = "exact_opt")]
    pub grad_sq: Option<f64>,
    /// Estimate of tr(Σ), the per-sample gradient variance summed over parameters.
    #[serde(default, serialize_with = "exact_opt")]
    pub trace_sigma: Option<f64>,
    /// B_simple = tr(Σ)/|G|², in samples; empty (undetermined) when the |G|² estimate
    /// is not positive.
    #[serde(default)]
    pub b_simple: Option<f64>,
    /// 95 % interval of b_simple (delta method on the two means).
    #[serde(default)]
    pub b_simple_low: Option<f64>,
    /// Its upper end; empty when unbounded (the |G|² interval reaches 0).
    #[serde(default)]
    pub b_simple_high: Option<f64>,
}

impl EpochRow {
    /// Fills the noise scale's cells: `measured` steps took the norms, `estimate` is
    /// what the usable ones give (None: none was usable). Nothing measured: all empty.
    pub(crate) fn set_noise(&mut self, measured: usize, estimate: Option<&crate::noise_scale::NoiseEstimate>) {
        if measured == 0 {
            return;
        }
        let used = estimate.map_or(0, |e| e.steps);
        self.noise_steps = Some(used);
        self.noise_skipped = Some(measured - used);
        if let Some(e) = estimate {
            self.grad_sq = Some(e.grad_sq);
            self.trace_sigma = Some(e.trace_sigma);
            self.b_simple = e.b_simple;
            self.b_simple_low = e.interval.map(|i| i.0);
            self.b_simple_high = e.interval.and_then(|i| i.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{rank_file_name, CsvLog};

    /// The PyTorch recorder (`python/ddpbench_record/columns.py`) writes rank files in
    /// exactly these columns: its list, read from its source, is this header.
    #[test]
    fn the_python_recorders_columns_are_this_header() {
        let source = include_str!("../../python/ddpbench_record/columns.py");
        let list = source
            .split("# BEGIN COLUMNS")
            .nth(1)
            .and_then(|rest| rest.split("# END COLUMNS").next())
            .expect("columns.py marks its list with # BEGIN COLUMNS and # END COLUMNS");
        let python: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        assert_eq!(python, StepRow::columns());
        let phases = source
            .split("PHASES = (")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .expect("columns.py has PHASES");
        let python_phases: Vec<&str> = phases.split('"').skip(1).step_by(2).collect();
        assert_eq!(python_phases, Phase::ALL.map(Phase::column));
    }

    #[test]
    fn phases_are_named_by_their_columns_and_index_in_order() {
        let names: Vec<String> = Phase::ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            names,
            [
                "data_s",
                "batch_copy_s",
                "forward_s",
                "backward_s",
                "comm_exposed_s",
                "optimizer_s",
                "other_s"
            ]
        );
        for (i, p) in Phase::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
    }

    /// Each phase counts in one part of the step's breakdown: the batch's wait and copy
    /// as data, the exposed all-reduce as communication, the rest as compute.
    #[test]
    fn every_phase_has_its_role_in_the_breakdown() {
        use PhaseRole::{Communication, Compute, Data};
        let roles: Vec<PhaseRole> = Phase::ALL.iter().map(|p| p.role()).collect();
        assert_eq!(roles, [Data, Data, Compute, Compute, Communication, Compute, Compute]);
    }

    /// results/README.md, the one glossary of the phases (README.md and docs point to
    /// it), has a row for each phase column of the rank file, in the step's order.
    #[test]
    fn the_glossary_defines_every_phase_in_order() {
        let glossary = include_str!("../../results/README.md");
        let start = glossary
            .find("### `rank-NNNNN.csv`")
            .expect("results/README.md has the rank file's section");
        let section = &glossary[start..];
        let section = &section[..section[4..].find("\n### ").map_or(section.len(), |end| end + 4)];
        let rows: Vec<&str> = section.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next()).collect();
        let phases: Vec<&str> = rows
            .iter()
            .copied()
            .filter(|c| Phase::ALL.iter().any(|p| p.column() == *c))
            .collect();
        let all: Vec<&str> = Phase::ALL.iter().map(|p| p.column()).collect();
        assert_eq!(
            phases, all,
            "results/README.md's rank-file glossary: one row per phase, in Phase::ALL's order"
        );
    }

    /// A phase indexes its own entry, and iteration follows the step's order.
    #[test]
    fn phase_arrays_are_indexed_by_phase_in_step_order() {
        let mut a = PhaseArray::from_fn(|p| p.column());
        assert_eq!(a[Phase::Backward], "backward_s");
        a[Phase::Other] = "last";
        assert_eq!(a.0[Phase::COUNT - 1], "last");
        let order: Vec<Phase> = a.iter().map(|(p, _)| p).collect();
        assert_eq!(order, Phase::ALL);
        assert_eq!(a.values().count(), Phase::COUNT);
    }

    fn row() -> StepRow {
        StepRow {
            run_id: "r1".into(),
            rank: 3,
            node_type: "Xeon, 48c".into(),
            epoch: 0,
            step: 1,
            global_step: 1,
            warmup: 1,
            time_utc: "2026-01-01T00:00:00.000000Z".into(),
            step_start_at_s: 0.5,
            samples: 64,
            phases: PhaseArray([0.001, 0.0, 0.01, 0.02, 0.003, 0.004, 0.0005]),
            step_s: 0.0385,
            comm_s: 0.003,
            comm_stage_d2h_s: 0.0,
            comm_stage_h2d_s: 0.0,
            comm_hidden_s: 0.0,
            comm_start_at_s: 0.53,
            comm_last_start_at_s: 8.787e-6,
            loss: 2.3,
            bytes: 4_799_528,
            loss_scale: None,
            step_skipped: 0,
            noise: None,
        }
    }

    #[test]
    fn step_rows_are_written_flat_with_unit_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(rank_file_name(3));
        let row = row();
        let mut log = CsvLog::create(&path).unwrap();
        log.write(&row).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(path.ends_with("rank-00003.csv"));
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), StepRow::columns().join(","));
        // A comma inside a field is quoted (RFC 4180); numbers are plain decimals, each
        // phase in its column.
        assert_eq!(
            lines.next().unwrap(),
            "r1,3,\"Xeon, 48c\",0,1,1,1,2026-01-01T00:00:00.000000Z,0.5,64,\
             0.001,0,0.01,0.02,0.003,0.004,0.0005,\
             0.0385,0.003,0,0,0,0.53,0.000008787,2.3,4799528,,0,,,,"
        );
        for p in Phase::ALL {
            assert_eq!(row.phase(p), row.phases.0[p.index()]);
        }
    }

    /// A squared gradient norm keeps every digit in its cell at any scale (late in
    /// training, or of a small model, it falls below the 9 decimals of a time), and is a
    /// number in JSON.
    #[test]
    fn the_noise_norms_keep_every_digit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(rank_file_name(0));
        let (small, big) = (1.234_567_890_123e-10, 3.0e-12 / 7.0);
        let noisy = StepRow {
            noise: Some(crate::noise_scale::NormPair {
                batch_small: 32.0,
                batch_big: 64.0,
                sq_small: small,
                sq_big: big,
            }),
            ..row()
        };
        let mut log = CsvLog::create(&path).unwrap();
        log.write(&noisy).unwrap();
        let mut r = csv::Reader::from_path(&path).unwrap();
        let h = r.headers().unwrap().clone();
        let rec = r.records().next().unwrap().unwrap();
        let cell = |name: &str| rec[h.iter().position(|c| c == name).unwrap()].to_string();
        assert_eq!(cell("grad_sq_small"), "0.0000000001234567890123");
        assert_eq!(cell("grad_sq_big").parse::<f64>().unwrap(), big);
        assert_eq!((cell("noise_batch_small"), cell("step_s")), ("32".into(), "0.0385".into()));
        let json = serde_json::to_value(EpochRow {
            grad_sq: Some(small),
            trace_sigma: Some(big),
            ..super::epoch_tests::epoch()
        })
        .unwrap();
        assert_eq!((json["grad_sq"].as_f64(), json["trace_sigma"].as_f64()), (Some(small), Some(big)));
    }
}

#[cfg(test)]
pub(super) mod epoch_tests {
    use super::*;

    /// An epoch row without validation or noise scale.
    pub(crate) fn epoch() -> EpochRow {
        EpochRow {
            epoch: 0,
            time_utc: "2026-01-01T00:00:00.000000Z".into(),
            steps: 10,
            epoch_s: 1.5,
            train_loss: 2.3,
            val_loss: f64::NAN,
            val_accuracy: f64::NAN,
            val_samples: 0,
            val_s: 0.0,
            param_l2: 12.5,
            noise_steps: None,
            noise_skipped: None,
            grad_sq: None,
            trace_sigma: None,
            b_simple: None,
            b_simple_low: None,
            b_simple_high: None,
        }
    }

    /// The noise scale's |G|² and tr(Σ) keep every digit in epochs.csv.
    #[test]
    fn an_epochs_noise_figures_keep_every_digit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epochs.csv");
        let row = EpochRow {
            noise_steps: Some(9),
            noise_skipped: Some(0),
            grad_sq: Some(2.5e-11),
            trace_sigma: Some(1.0 / 3.0 * 1e-7),
            b_simple: Some(1333.3333333333333),
            ..epoch()
        };
        let mut log = crate::record::CsvLog::create(&path).unwrap();
        log.write(&row).unwrap();
        let back: EpochRow = csv::Reader::from_path(&path).unwrap().deserialize().next().unwrap().unwrap();
        assert_eq!((back.grad_sq, back.trace_sigma), (row.grad_sq, row.trace_sigma));
        assert!(std::fs::read_to_string(&path).unwrap().contains(",0.000000000025,"));
    }

    #[test]
    fn an_epoch_without_validation_reads_back() {
        let text = "epoch,time_utc,steps,epoch_s,train_loss,val_loss,val_accuracy,val_samples,val_s,param_l2\n0,2026-01-01T00:00:00.000000Z,10,1.5,2.3,,,0,0,12.5\n";
        let row: EpochRow = csv::Reader::from_reader(text.as_bytes()).deserialize().next().unwrap().unwrap();
        assert_eq!((row.steps, row.epoch_s), (10, 1.5));
        assert!(row.val_loss.is_nan() && row.val_accuracy.is_nan());
    }
}
