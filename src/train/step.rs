//! One training step, timed phase by phase. [`StepMachine::step`] reads as the
//! sentence it measures: next batch → copy to device → forward → backward (staged
//! buckets launched) → wait for the all-reduce → optimizer, each boundary one
//! [`StepEvent`] on the [`PhaseClock`]. It returns what it measured ([`Measured`]);
//! the epoch loop records it.

use super::communication::Communication;
use super::timer::{PhaseClock, StepEvent, StepTimes};
use super::trainer::ModelState;
use crate::amp::{Autocast, LossScaler};
use crate::comm::overlap::StagedPass;
use crate::comm::CommStats;
use crate::data::Loader;
use crate::optim::Optimizer;
use anyhow::Result;
use std::time::{Instant, SystemTime};
use tch::{Device, Tensor};

/// What a step runs on: the network, the optimizer, the all-reduce and the clock.
pub(super) struct StepMachine {
    pub model: ModelState,
    pub opt: Optimizer,
    pub scaler: Option<LossScaler>,
    pub autocast: Option<Autocast>,
    pub comm: Communication,
    /// Gradients are summed by the all-reduce: the loss is pre-divided so the sum is the mean.
    pub loss_factor: f64,
    pub clock: Box<dyn PhaseClock>,
    /// Where the batches are trained.
    pub device: Device,
    /// Micro-batches per step (`--grad-accum`).
    pub micro_batches: usize,
    /// A test's straggler: sleep this long in every forward pass (`DDPBENCH_SLOW_FORWARD`).
    pub slow_forward: Option<std::time::Duration>,
}

/// What one step measured on this rank.
#[derive(Debug)]
pub(super) struct Measured {
    /// The wall clock at the step's start.
    pub started_utc: SystemTime,
    pub times: StepTimes,
    pub comm: CommStats,
    /// The mean of the micro-batches' losses (NaN without any).
    pub loss: f64,
    pub samples: usize,
    /// fp16 AMP's loss scale during the step (None without `--amp fp16`).
    pub loss_scale: Option<f64>,
    /// False when fp16 AMP found inf/NaN gradients and skipped the optimizer step.
    pub stepped: bool,
    /// When the last backward started and ended (None when no batch came).
    pub backward: Option<(Instant, Instant)>,
}

/// What the micro-batches of one step produced.
#[derive(Default)]
struct MicroBatches {
    samples: usize,
    /// Sum of the micro-batches' losses, on the device (read back once per step).
    loss_sum: Option<Tensor>,
    count: usize,
    /// When the last backward started and ended.
    backward_start: Option<Instant>,
    backward_end: Option<Instant>,
}

impl StepMachine {
    /// One step at learning rate `lr`.
    pub fn step(&mut self, loader: &mut Loader, lr: f64) -> Result<Measured> {
        self.opt.set_lr(lr);
        let loss_scale = self.scaler.as_ref().map(|sc| sc.scale);
        let started_utc = SystemTime::now();

        self.clock.record(StepEvent::Start);
        let micro = self.micro_batches(loader, loss_scale.unwrap_or(1.0))?;
        let backward_end = micro.backward_end.unwrap_or_else(Instant::now);
        let comm = self.comm.reducer.finish(&self.model.param_tensors, backward_end)?;
        self.clock.record(StepEvent::CommDone);
        let stepped = self.opt.step_unscaled(self.comm.reducer.reduced(), self.scaler.as_mut());
        self.comm.reducer.zero_grads();
        self.clock.record(StepEvent::OptimizerDone);
        let loss = micro.loss_sum.as_ref().map_or(f64::NAN, |l| l.double_value(&[])) / micro.count.max(1) as f64;
        self.clock.record(StepEvent::End);

        Ok(Measured {
            started_utc,
            times: self.clock.marks().times(),
            comm,
            loss,
            samples: micro.samples,
            loss_scale,
            stepped,
            backward: micro.backward_start.zip(micro.backward_end),
        })
    }

    /// The step's micro-batches, each: next batch → copy to device → forward → backward.
    /// Gradients accumulate in the flat buckets; only the last micro-batch's backward
    /// hands buckets to the all-reduce.
    fn micro_batches(&mut self, loader: &mut Loader, amp_scale: f64) -> Result<MicroBatches> {
        let mut micro = MicroBatches::default();

        while micro.count < self.micro_batches {
            let Some(batch) = loader.next_batch() else { break };
            let (x, y) = batch?;
            self.clock.record(StepEvent::DataReady);
            let (x, y) = to_device(x, y, self.device);
            self.clock.record(StepEvent::CopyDone);
            let last = micro.count + 1 == self.micro_batches;
            let mut staged = self.comm.launch.as_ref().filter(|_| last).map(StagedPass::new);
            let loss = self.forward(&x, &y, staged.as_mut());
            micro.backward_start = Some(self.clock.record(StepEvent::ForwardDone));
            let scaled = scale(&loss, self.loss_factor * amp_scale);
            match staged {
                Some(pass) => pass.backward(&scaled, self.comm.reducer.as_mut())?,
                None => scaled.backward(),
            }
            micro.backward_end = Some(self.clock.record(StepEvent::BackwardDone));
            micro.samples += y.size()[0] as usize;
            micro.loss_sum = Some(match micro.loss_sum.take() {
                None => loss.detach(),
                Some(sum) => sum + loss.detach(),
            });
            micro.count += 1;
        }
        Ok(micro)
    }

    /// The forward pass and the loss, under autocast with `--amp`, cut into stages when
    /// backward will overlap the all-reduce.
    fn forward(&self, x: &Tensor, y: &Tensor, staged: Option<&mut StagedPass>) -> Tensor {
        if let Some(d) = self.slow_forward {
            std::thread::sleep(d);
        }
        let net = self.model.net.as_ref();
        let run = || match staged {
            Some(pass) => pass.forward(net, x, true),
            None => net.forward_t(x, true),
        };
        let out = match &self.autocast {
            Some(ac) => ac.run(run),
            None => run(),
        };
        out.nll_loss(y)
    }
}

/// The batch on the training device (as it is on CPU). The copy is queued on the
/// device's stream ahead of the forward pass: from page-locked memory the host does not
/// wait for it, and from pageable memory libtorch stages it synchronously.
fn to_device(x: Tensor, y: Tensor, device: Device) -> (Tensor, Tensor) {
    if device == Device::Cpu {
        (x, y)
    } else {
        (
            x.to_device_(device, x.kind(), true, false),
            y.to_device_(device, y.kind(), true, false),
        )
    }
}

/// `loss × factor`, or the loss itself when the factor is 1.
fn scale(loss: &Tensor, factor: f64) -> Tensor {
    if factor != 1.0 {
        loss * factor
    } else {
        loss.shallow_clone()
    }
}
