//! The state the loop's files share: the model being trained, the run's length in
//! steps, and where a step sits in the run.

use crate::model::{ModelSpec, Net};
use crate::optim;
use tch::{nn, Tensor};

/// The network, its parameters in one fixed order, and the store that owns them.
pub(super) struct ModelState {
    pub vs: nn::VarStore,
    pub net: Box<dyn Net>,
    pub spec: ModelSpec,
    pub params: Vec<(String, Tensor)>,
    pub param_tensors: Vec<Tensor>,
}

/// How long the run is, in steps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    pub steps_per_epoch: usize,
    pub total_steps: usize,
    pub epochs: usize,
    /// Steps of linear learning-rate warm-up.
    pub warmup_lr_steps: usize,
    /// Factor on the learning rate (`--lr-scaling`).
    pub lr_scale: f64,
}

impl Schedule {
    /// The learning rate of global step `step`.
    pub(super) fn lr(&self, base: f64, step: usize) -> f64 {
        optim::learning_rate(base, self.lr_scale, step, self.warmup_lr_steps)
    }
}

/// Where a step sits in the run.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepAt {
    pub epoch: usize,
    /// Step within the epoch.
    pub step: usize,
    pub global_step: usize,
    /// One of the first `--warmup-steps` steps.
    pub warmup: bool,
}
