//! What a run accepted but warns of: each warning is printed once by rank 0, kept in
//! the manifest's `warnings`, and carried into report.md; one that invalidates the
//! run's figures (`invalidates_direction`) keeps `reduce` from claiming a direction for
//! any point the run belongs to, or is the reference of.

use serde::{Deserialize, Serialize};

/// Which misconfiguration a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// `--amp fp16` on a CPU: autocast to float16 there is many times slower than fp32
    /// or bf16, so the run measures the emulation.
    Fp16OnCpu,
    /// Fewer measured steps (after warm-up) than `--min-measured-steps`: the throughput
    /// is a few samples of a noisy figure.
    TooFewMeasuredSteps,
    /// A node has more GPUs visible than ranks on it: the idle GPUs are not in the
    /// figures a GPU-count study compares.
    IdleGpus,
    /// Two or more ranks of a node train on one GPU: they time-slice it.
    SharedGpu,
    /// A rank is bound to fewer cores than the launcher allocated it (e.g. `srun` without
    /// `--cpus-per-task`): the run measures a starved trainer.
    FewerCoresThanAllocated,
    /// A target accuracy on synthetic data: its labels are random, so the validation
    /// accuracy stays near chance and the samples to reach it say nothing of training.
    TargetOnRandomLabels,
    /// A code this version does not know (from a newer writer); its
    /// `invalidates_direction` is read as written.
    #[serde(other)]
    Unknown,
}

impl WarningCode {
    /// Whether a run carrying this warning measured something other than the point it
    /// is labelled as: too few steps to say anything, or GPUs that sat idle or were
    /// shared in a study of GPU counts.
    pub(crate) fn invalidates_direction(self) -> bool {
        match self {
            WarningCode::TooFewMeasuredSteps | WarningCode::IdleGpus | WarningCode::SharedGpu => true,
            WarningCode::Fp16OnCpu | WarningCode::FewerCoresThanAllocated | WarningCode::TargetOnRandomLabels | WarningCode::Unknown => {
                false
            }
        }
    }

    /// The code as written in the manifest.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WarningCode::Fp16OnCpu => "fp16_on_cpu",
            WarningCode::TooFewMeasuredSteps => "too_few_measured_steps",
            WarningCode::IdleGpus => "idle_gpus",
            WarningCode::SharedGpu => "shared_gpu",
            WarningCode::FewerCoresThanAllocated => "fewer_cores_than_allocated",
            WarningCode::TargetOnRandomLabels => "target_on_random_labels",
            WarningCode::Unknown => "unknown",
        }
    }
}

/// One warning a run carries: its code, the sentence printed (with the fix), and
/// whether it keeps `reduce` from claiming a direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunWarning {
    pub code: WarningCode,
    pub message: String,
    pub invalidates_direction: bool,
}

impl RunWarning {
    pub fn new(code: WarningCode, message: impl Into<String>) -> RunWarning {
        RunWarning {
            code,
            message: message.into(),
            invalidates_direction: code.invalidates_direction(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_written_with_its_code_and_whether_it_invalidates() {
        let w = RunWarning::new(WarningCode::TooFewMeasuredSteps, "1 measured step");
        let text = serde_json::to_string(&w).unwrap();
        assert_eq!(
            text,
            r#"{"code":"too_few_measured_steps","message":"1 measured step","invalidates_direction":true}"#
        );
        assert_eq!(serde_json::from_str::<RunWarning>(&text).unwrap(), w);
        let fp16 = RunWarning::new(WarningCode::Fp16OnCpu, "slow");
        assert!(!fp16.invalidates_direction);
        assert_eq!(serde_json::to_value(fp16.code).unwrap(), WarningCode::Fp16OnCpu.as_str());
    }

    #[test]
    fn a_newer_code_is_read_with_the_writers_verdict() {
        let w: RunWarning = serde_json::from_str(r#"{"code":"spread_on_one_node","message":"m","invalidates_direction":true}"#).unwrap();
        assert_eq!((w.code, w.invalidates_direction), (WarningCode::Unknown, true));
    }
}
