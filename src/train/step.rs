//! One training step, timed phase by phase. [`StepMachine::step`] reads as the
//! sentence it measures: next batch → copy to device → forward → backward (staged
//! buckets launched) → wait for the all-reduce → its bookkeeping → optimizer, each boundary one
//! [`StepEvent`] on the [`PhaseClock`], and the watchdog told which [`Activity`] the rank
//! is in (a phase that never ends is named). It returns what it measured ([`StepMeasured`]);
//! the epoch loop records it.
//!
//! Nothing here waits for the device: the loss, and with fp16 AMP the loss scale and
//! whether the step was skipped, are copied to host memory behind the step's work and
//! read when the clock gives the step's marks, which for device events is when the next
//! step ends ([`StepMachine::step`] then returns the step before, and
//! [`StepMachine::flush`] the last one).

use super::communication::Communication;
use super::state::{ModelState, StepAt};
use super::timer::{PhaseClock, StepEvent, StepTimes};
use crate::amp::{Autocast, LossScaler};
use crate::comm::noise::{squared_norm, NoisePath, NoiseScaleMode, NormsTaken};
use crate::comm::overlap::StagedPass;
use crate::comm::CommStats;
use crate::data::Loader;
use crate::flight::{self, Activity};
use crate::noise_scale::NormPair;
use crate::optim::Optimizer;
use crate::record::MemoryFormat;
use anyhow::Result;
use std::collections::VecDeque;
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
    /// The batch's layout on the device (`--memory-format`).
    pub memory_format: MemoryFormat,
    /// Micro-batches per step (`--grad-accum`).
    pub micro_batches: usize,
    /// Steps run whose marks the clock has not given yet, oldest first (at most two).
    pub unread: VecDeque<StepMeasured>,
    /// A test's straggler or busy machine: sleep this long in every forward pass
    /// (`DDPBENCH_SLOW_FORWARD`, `DDPBENCH_TEST_BUSY_FORWARD`).
    pub slow_forward: Option<std::time::Duration>,
    /// Which steps take the gradient noise scale's norms (`--noise-scale`).
    pub noise_mode: NoiseScaleMode,
    /// Where its two batch sizes come from; None when the run has one batch size.
    pub noise_path: Option<NoisePath>,
    /// Ranks whose gradients the all-reduce sums (1 without an all-reduce).
    pub ranks_summed: usize,
}

/// What one step measured on this rank.
#[derive(Debug)]
pub(super) struct StepMeasured {
    /// Which step it was.
    pub at: StepAt,
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
    /// The gradient noise scale's two squared norms (None when the step took none).
    pub noise: Option<NormPair>,
    /// The same as the device had them, read into `noise` with the loss.
    noise_taken: Option<NormsTaken>,
    /// The micro-batches' loss sum in host memory (its copy queued behind the step's
    /// work), and how many there were; read into `loss` once the step's marks are final.
    loss_sum: Option<Tensor>,
    micro_count: usize,
    /// fp16 AMP's scale during the step and its `found_inf` (1 when the step was
    /// skipped), in host memory behind the step's work; read with the loss.
    amp: Option<(Tensor, Tensor)>,
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
    /// On the micro-batch path of the noise scale: the first micro-batch's squared
    /// gradient norm (its copy to host queued) and its samples.
    first_norm: Option<(Tensor, usize)>,
}

impl StepMachine {
    /// Runs step `at` at learning rate `lr`. Returns the oldest step run whose times are
    /// final: this one with a clock that reads as it marks, the one before with device
    /// events read a step late (None after the first step).
    pub(super) fn step(&mut self, loader: &mut Loader, lr: f64, at: StepAt) -> Result<Option<StepMeasured>> {
        self.opt.set_lr(lr);
        let started_utc = SystemTime::now();

        self.clock.record(StepEvent::Start);
        // The scale this step multiplies its loss by, as the device has it now.
        let scale_host = self.scaler.as_ref().map(|sc| to_host(sc.scale()));
        let amp_scale = self.scaler.as_ref().map(|sc| sc.scale().shallow_clone());
        let measure = self.noise_path.is_some() && self.noise_mode.measures(at.global_step);
        let mut micro = self.micro_batches(loader, amp_scale.as_ref(), measure)?;
        // Queued before the optimizer, so the step's last event is behind the copy.
        let loss_sum = micro.loss_sum.as_ref().map(to_host);
        let backward_end = micro.backward_end.unwrap_or_else(Instant::now);
        flight::phase(Some(Activity::AllReduceWait));
        let comm = self.comm.reducer.finish(&self.model.param_tensors, backward_end)?;
        if comm.done_on_stream {
            // The device orders this mark after the all-reduce's completion event.
            self.clock.record(StepEvent::CommDone);
        } else {
            // The exposed all-reduce ends when the last all-reduce completed; finishing
            // the buckets' records after it is bookkeeping, not communication.
            self.clock.record_at(StepEvent::CommDone, comm.exposed_end(backward_end));
        }
        self.clock.record(StepEvent::CommRecorded);
        flight::phase(Some(Activity::Optimizer));
        // Before the optimizer, which may unscale the reduced gradients in place.
        let noise_taken = if measure { self.take_norms(&mut micro) } else { None };
        let found_inf = self.opt.step_unscaled(self.comm.reducer.reduced(), self.scaler.as_mut());
        let found_inf_host = found_inf.as_ref().map(to_host);
        self.comm.reducer.zero_grads();
        self.clock.record(StepEvent::OptimizerDone);
        self.clock.record(StepEvent::End);

        self.unread.push_back(StepMeasured {
            at,
            started_utc,
            times: self.clock.marks().times(),
            comm,
            loss: f64::NAN,
            samples: micro.samples,
            loss_scale: None,
            stepped: true,
            backward: micro.backward_start.zip(micro.backward_end),
            loss_sum,
            micro_count: micro.count,
            amp: scale_host.zip(found_inf_host),
            noise: None,
            noise_taken,
        });
        Ok(self.read(false))
    }

    /// The last step run, when [`StepMachine::step`] has not returned it yet (waits for
    /// the device to finish it).
    pub(super) fn flush(&mut self) -> Option<StepMeasured> {
        self.read(true)
    }

    /// The oldest unread step with its times, loss and AMP figures, once the clock gives
    /// its marks; with device events the all-reduce's device times too.
    fn read(&mut self, flush: bool) -> Option<StepMeasured> {
        let times = self.clock.finished(flush)?.times();
        let mut m = self.unread.pop_front()?;
        m.times = times;
        m.loss = m.loss_sum.take().map_or(f64::NAN, |l| l.double_value(&[])) / m.micro_count.max(1) as f64;
        match self.comm.reducer.read_deferred() {
            Ok(Some((comm_s, hidden_s))) => (m.comm.comm_s, m.comm.hidden_s) = (comm_s, hidden_s),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("all-reduce device times of step {}: {e:#}", m.at.global_step);
                (m.comm.comm_s, m.comm.hidden_s) = (f64::NAN, f64::NAN);
            }
        }
        if let Some((scale, found_inf)) = m.amp.take() {
            m.loss_scale = Some(scale.double_value(&[]));
            m.stepped = found_inf.double_value(&[]) == 0.0;
        }
        m.noise = m.noise_taken.take().map(|t| t.read(self.loss_factor, m.loss_scale.unwrap_or(1.0)));
        Some(m)
    }

    /// The step's micro-batches, each: next batch → copy to device → forward → backward.
    /// Gradients accumulate in the flat buckets; only the last micro-batch's backward
    /// hands buckets to the all-reduce.
    fn micro_batches(&mut self, loader: &mut Loader, amp_scale: Option<&Tensor>, measure: bool) -> Result<MicroBatches> {
        let mut micro = MicroBatches::default();

        while micro.count < self.micro_batches {
            flight::phase(Some(Activity::Data));
            let Some(batch) = loader.next_batch() else { break };
            let (x, y) = batch?;
            self.clock.record(StepEvent::DataReady);
            flight::phase(Some(Activity::Copy));
            let (x, y) = to_device(x, y, self.device);
            let x = crate::model::in_format(&x, self.memory_format);
            self.clock.record(StepEvent::CopyDone);
            flight::phase(Some(Activity::Forward));
            let last = micro.count + 1 == self.micro_batches;
            let mut staged = self.comm.launch.as_ref().filter(|_| last).map(StagedPass::new);
            let loss = self.forward(&x, &y, staged.as_mut())?;
            micro.backward_start = Some(self.clock.record(StepEvent::ForwardDone));
            flight::phase(Some(Activity::Backward));
            let scaled = scale(&loss, self.loss_factor, amp_scale);
            match staged {
                Some(pass) => pass.backward(&scaled, self.comm.reducer.as_mut())?,
                None => scaled.backward(),
            }
            micro.backward_end = Some(self.clock.record(StepEvent::BackwardDone));
            micro.samples += y.size()[0] as usize;
            if measure && micro.count == 0 && self.noise_path == Some(NoisePath::MicroBatches) {
                // Before finish the buckets hold the gradients accumulated so far: the first micro-batch's alone.
                let norm = squared_norm(self.comm.reducer.reduced());
                micro.first_norm = Some((to_host(&norm), y.size()[0] as usize));
            }
            micro.loss_sum = Some(match micro.loss_sum.take() {
                None => loss.detach(),
                Some(sum) => sum + loss.detach(),
            });
            micro.count += 1;
        }
        Ok(micro)
    }

    /// The noise scale's two squared norms of the step just all-reduced, their copies to
    /// host queued; None when a buffer is missing (nothing was reduced, or no batch came).
    fn take_norms(&self, micro: &mut MicroBatches) -> Option<NormsTaken> {
        let reducer = self.comm.reducer.as_ref();
        let (raw_small, batch_small, summed_small, batch_big, summed_big) = match self.noise_path? {
            NoisePath::Ranks => {
                let local = to_host(&squared_norm(reducer.local()?));
                let ranks = self.ranks_summed;
                (local, micro.samples, micro.count, micro.samples * ranks, micro.count * ranks)
            }
            NoisePath::MicroBatches => {
                let (first, samples) = micro.first_norm.take()?;
                (first, samples, 1, micro.samples, micro.count)
            }
        };
        (micro.count > 0).then(|| NormsTaken {
            raw_small,
            raw_big: to_host(&squared_norm(reducer.reduced())),
            batch_small,
            batch_big,
            summed_small,
            summed_big,
        })
    }

    /// The forward pass and the loss, under autocast with `--amp`, cut into stages when
    /// backward will overlap the all-reduce. A TorchScript model's forward can fail (an
    /// input it rejects): the error says why.
    fn forward(&self, x: &Tensor, y: &Tensor, staged: Option<&mut StagedPass>) -> Result<Tensor> {
        if let Some(d) = self.slow_forward {
            std::thread::sleep(d);
        }
        let net = self.model.net.as_ref();
        let run = || match (staged, net.script()) {
            (_, Some(script)) => script.loss(x, y, true),
            (Some(pass), None) => Ok(pass.forward(net, x, true).nll_loss(y)),
            (None, None) => Ok(net.forward_t(x, true).nll_loss(y)),
        };
        match &self.autocast {
            Some(ac) => ac.run(run),
            None => run(),
        }
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

/// A device value's copy into page-locked host memory, queued on the device's stream
/// (libtorch pins the destination of a non-blocking copy to the CPU): reading it once
/// the stream has passed the copy waits for nothing. A CPU tensor is copied too, since
/// the loss scale changes in place later in the step.
fn to_host(t: &Tensor) -> Tensor {
    t.to_device_(Device::Cpu, t.kind(), true, true)
}

/// `loss × factor × amp_scale` (the factor skipped when 1). The AMP scale, a power of
/// two on the device, is a second multiplication: the same bits as multiplying by
/// the product, as it was when the scale was a host number.
fn scale(loss: &Tensor, factor: f64, amp_scale: Option<&Tensor>) -> Tensor {
    let scaled = if factor != 1.0 { loss * factor } else { loss.shallow_clone() };
    match amp_scale {
        Some(s) => scaled * s,
        None => scaled,
    }
}
