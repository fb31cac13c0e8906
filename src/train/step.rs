//! One training step, timed phase by phase. It reads as the sentence it measures:
//! next batch → copy to device → forward → backward (staged buckets launched) →
//! wait for the all-reduce → optimizer, each boundary one call of the
//! [`PhaseTimer`](super::timer::PhaseTimer).

use super::trainer::Trainer;
use crate::comm::overlap::StagedPass;
use crate::data::Loader;
use crate::record::{self, Phase, StepRow};
use anyhow::Result;
use std::time::{Instant, SystemTime};
use tch::{Device, Tensor};

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

impl Trainer<'_> {
    /// Runs global step `self.global_step` and returns its row.
    pub(super) fn step(&mut self, loader: &mut Loader, epoch: usize, step: usize) -> Result<StepRow> {
        let at = self.global_step;
        crate::flight::recorder().set_position(Some(epoch), Some(step));
        if self.faults.fail_at_step == Some(at) {
            anyhow::bail!("fault injected by DDPBENCH_FAULT at step {at}");
        }
        if self.faults.amp_overflow_at_step == Some(at) {
            let _ = self.model.param_tensors[0].grad().fill_(f64::INFINITY);
        }
        self.opt.set_lr(self.schedule.lr(self.cfg.learning_rate(), at));
        let amp_scale = self.scaler.as_ref().map_or(1.0, |sc| sc.scale);
        let wall = SystemTime::now();

        self.timer.start_step();
        let micro = self.micro_batches(loader, amp_scale)?;
        let backward_end = micro.backward_end.unwrap_or_else(Instant::now);
        let comm = self.comm.reducer.finish(&self.model.param_tensors, backward_end)?;
        if at >= self.cfg.schedule.warmup_steps {
            self.add_bucket_ready(&comm.launches, micro.backward_start, backward_end);
        }
        self.timer.end(Phase::CommExposed);
        let stepped = self.opt.step_unscaled(self.comm.reducer.reduced(), self.scaler.as_mut());
        self.comm.reducer.zero_grads();
        self.timer.end(Phase::Optimizer);
        let loss = micro.loss_sum.as_ref().map_or(f64::NAN, |l| l.double_value(&[])) / micro.count.max(1) as f64;
        let times = self.timer.finish_step();

        let since_origin = |t: Instant| (t - self.origin).as_secs_f64();
        let mut row = StepRow {
            run_id: self.folder.run_id.clone(),
            rank: self.g.rank,
            node_type: self.place.node_type.clone(),
            epoch,
            step,
            global_step: at,
            warmup: u8::from(at < self.cfg.schedule.warmup_steps),
            time_utc: record::rfc3339_utc(wall),
            elapsed_s: since_origin(times.start),
            samples: micro.samples,
            step_s: times.step_s,
            comm_s: comm.comm_s,
            comm_stage_d2h_s: comm.stage_d2h_s,
            comm_stage_h2d_s: comm.stage_h2d_s,
            comm_start_s: comm.first_launch.map_or(f64::NAN, since_origin),
            comm_last_start_s: comm.last_launch.map_or(f64::NAN, since_origin),
            comm_hidden_s: comm.hidden_s,
            loss,
            bytes: comm.bytes,
            loss_scale: self.scaler.as_ref().map(|_| amp_scale),
            step_skipped: u8::from(!stepped),
            data_s: 0.0,
            batch_copy_s: 0.0,
            forward_s: 0.0,
            backward_s: 0.0,
            comm_exposed_s: 0.0,
            optimizer_s: 0.0,
            other_s: 0.0,
        };
        row.set_phases(&times.phases);
        Ok(row)
    }

    /// Adds each bucket's hand-over, as the fraction of backward elapsed (0 to 1), to the
    /// run's means.
    fn add_bucket_ready(&mut self, launches: &[Option<Instant>], start: Option<Instant>, end: Instant) {
        let Some(start) = start else { return };
        let span = (end - start).as_secs_f64();
        let (sums, steps) = &mut self.bucket_ready;
        sums.resize(launches.len(), 0.0);
        for (sum, launch) in sums.iter_mut().zip(launches) {
            let f = match launch {
                Some(t) if span > 0.0 && *t < end => (t.saturating_duration_since(start).as_secs_f64() / span).clamp(0.0, 1.0),
                _ => 1.0,
            };
            *sum += f;
        }
        *steps += 1;
    }

    /// The step's micro-batches, each: next batch → copy to device → forward → backward.
    /// Gradients accumulate in the flat buckets; only the last micro-batch's backward
    /// hands buckets to the all-reduce.
    fn micro_batches(&mut self, loader: &mut Loader, amp_scale: f64) -> Result<MicroBatches> {
        let mut micro = MicroBatches::default();

        while micro.count < self.cfg.schedule.grad_accum {
            let Some(batch) = loader.next_batch() else { break };
            let (x, y) = batch?;
            self.timer.end(Phase::Data);
            let (x, y) = to_device(x, y, self.place.device);
            self.timer.end(Phase::BatchCopy);
            let last = micro.count + 1 == self.cfg.schedule.grad_accum;
            let mut staged = self.comm.launch.as_ref().filter(|_| last).map(StagedPass::new);
            let loss = self.forward(&x, &y, staged.as_mut())?;
            micro.backward_start = Some(self.timer.end(Phase::Forward));
            let scaled = scale(&loss, self.loss_factor * amp_scale);
            match staged {
                Some(pass) => pass.backward(&scaled, self.comm.reducer.as_mut())?,
                None => scaled.backward(),
            }
            micro.backward_end = Some(self.timer.end(Phase::Backward));
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
    /// backward will overlap the all-reduce. A TorchScript model's forward can fail (an
    /// input it rejects): the error says why.
    fn forward(&self, x: &Tensor, y: &Tensor, staged: Option<&mut StagedPass>) -> Result<Tensor> {
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

/// `loss × factor`, or the loss itself when the factor is 1.
fn scale(loss: &Tensor, factor: f64) -> Tensor {
    if factor != 1.0 {
        loss * factor
    } else {
        loss.shallow_clone()
    }
}
