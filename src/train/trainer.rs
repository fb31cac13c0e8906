//! [`Trainer`]: one training run on the ranks of a [`Group`], from set-up to the
//! final manifest. `setup` places the rank, loads the data, builds the model, the
//! optimizer and the all-reduce, and writes the manifest (status "running");
//! `run` trains epoch by epoch (each step in `step.rs`); `finish` writes the outcome.

use super::clock::{self, ClockLog};
use super::communication::{Backend, Communication};
use super::config::{PhaseSync, TrainConfig};
use super::faults::FaultHooks;
use super::params::{broadcast_from_rank0, check_in_sync};
use super::placement::Placement;
use super::run_folder::RunFolder;
use super::signals;
use super::timer::PhaseTimer;
use super::watchdog::{self, Watchdog};
use crate::amp::{AmpMode, Autocast, LossScaler};
use crate::data::{self, Dataset, Loader};
use crate::model::{self, ModelOptions, ModelSpec, Net};
use crate::optim::{self, LrScaling, Optimizer};
use crate::record::{self, ClockSummary, CsvLog, EndRecord, EpochRow, Manifest, RunStatus, StepRow};
use crate::telemetry::GpuSampler;
use crate::world::{agree, gather_strings, Group};
use anyhow::{Context, Result};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use std::time::{Duration, Instant, SystemTime};
use tch::{nn, Tensor};
use tracing::{info, warn};

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

/// One training run on the ranks of a group.
pub struct Trainer<'g> {
    pub(super) g: &'g Group,
    pub(super) cfg: TrainConfig,
    pub(super) folder: RunFolder,
    pub(super) started: Instant,
    pub(super) place: Placement,
    pub(super) dataset: Dataset,
    pub(super) model: ModelState,
    pub(super) opt: Optimizer,
    pub(super) scaler: Option<LossScaler>,
    pub(super) autocast: Option<Autocast>,
    pub(super) comm: Communication,
    /// Gradients are summed by the all-reduce: the loss is pre-divided so the sum is the mean.
    pub(super) loss_factor: f64,
    pub(super) schedule: Schedule,
    pub(super) manifest: Manifest,
    pub(super) steps_log: CsvLog<StepRow>,
    pub(super) epochs_log: Option<CsvLog<EpochRow>>,
    pub(super) faults: FaultHooks,
    pub(super) timer: PhaseTimer,
    /// The common time origin of all ranks (they leave a barrier together).
    pub(super) origin: Instant,
    pub(super) global_step: usize,
    /// Rank 0's `clock.csv` and what the estimates add up to.
    pub(super) clock_log: Option<ClockLog>,
    pub(super) clock: ClockSummary,
    /// Each rank's first offset estimate (rank 0), for the drift.
    pub(super) first_offsets: Vec<f64>,
    pub(super) last_l2: f64,
    pub(super) last_accuracy: Option<f64>,
    pub(super) watchdog: &'g Watchdog,
    /// Step times after warm-up, until the watchdog's limit is set from their median.
    pub(super) early_steps: Vec<f64>,
    /// The watchdog's limit for steps (None until warm-up is over, when not fixed).
    pub(super) step_limit_s: Option<f64>,
    /// Per bucket, over the timed steps: the sum of the fractions of backward elapsed
    /// when it was handed to the all-reduce, and how many steps were added.
    pub(super) bucket_ready: (Vec<f64>, u64),
}

impl<'g> Trainer<'g> {
    /// Everything before the first step. Errors are agreed across the group, so every
    /// rank returns the same one.
    pub fn setup(
        g: &'g Group,
        cfg: &TrainConfig,
        folder: RunFolder,
        started: SystemTime,
        malloc: &str,
        watchdog: &'g Watchdog,
    ) -> Result<Trainer<'g>> {
        let started_at = Instant::now();
        let mut place = Placement::establish(g, cfg)?;
        let options = cfg.workload.model_options();
        let spec = agree(g, cfg.workload.model_spec())?;
        let dataset = agree(g, data::load(cfg, &spec))?;
        // The workers, resolved for this data set and binding, are what the manifest records.
        let resolved = {
            let (workers, note) = place.workers_for(cfg.placement.workers, dataset.train.files.is_some());
            if let Some(n) = note.as_ref().filter(|_| g.local_rank == 0) {
                warn!("{n}");
            }
            place.workers_note = note;
            let mut c = cfg.clone();
            c.placement.workers = Some(workers);
            c
        };
        let cfg = &resolved;
        let model = build_model(g, cfg, &place, &options, spec)?;
        if let Some(script) = model.net.script() {
            super::file_model::check_script(g, cfg, script, &model.spec, &dataset, place.device)?;
        }
        let opt = agree(
            g,
            Optimizer::new(
                cfg.optim.optimizer,
                &model.vs,
                &model.param_tensors,
                cfg.learning_rate(),
                cfg.optim.momentum,
                cfg.optim.weight_decay,
            ),
        )?;
        let comm = Communication::setup(g, cfg, &place, model.net.as_ref(), &model.spec, &model.param_tensors)?;
        let autocast = agree(g, Autocast::new(cfg.optim.amp, place.device))?;
        let schedule = schedule(g, cfg, &dataset);
        let mut manifest = super::manifest::initial(g, cfg, &folder, started, &place, &dataset, &model, &comm, &schedule)?;
        manifest.host_malloc = Some(malloc.to_string());
        let wrote = if g.rank == 0 { manifest.write(&folder.dir) } else { Ok(()) };
        agree(g, wrote)?;
        let steps_log = agree(g, CsvLog::create(&folder.path(&record::rank_file_name(g.rank))))?;
        let epochs_log = agree(g, (g.rank == 0).then(|| CsvLog::create(&folder.path("epochs.csv"))).transpose())?;
        let trainer = Trainer {
            g,
            loss_factor: 1.0 / (ranks_summed(g, &comm) * cfg.schedule.grad_accum) as f64,
            scaler: (cfg.optim.amp == AmpMode::Fp16).then(LossScaler::default),
            faults: FaultHooks::from_env(g.rank),
            timer: PhaseTimer::new(place.device, cfg.placement.phase_sync == PhaseSync::On),
            cfg: cfg.clone(),
            folder,
            started: started_at,
            place,
            dataset,
            model,
            opt,
            autocast,
            comm,
            schedule,
            manifest,
            steps_log,
            epochs_log,
            origin: started_at,
            global_step: 0,
            clock_log: None,
            clock: ClockSummary::default(),
            first_offsets: Vec::new(),
            last_l2: 0.0,
            last_accuracy: None,
            watchdog,
            early_steps: Vec::new(),
            step_limit_s: cfg.output.watchdog_s,
            bucket_ready: (Vec::new(), 0),
        };
        trainer.log_setup();
        Ok(trainer)
    }

    /// Trains every epoch: the ranks leave a barrier together (the common time origin
    /// of every `elapsed_s`), GPU telemetry starts, then epoch after epoch. Returns the
    /// stop signal when one ended the run early ([`signals`]).
    pub fn run(&mut self) -> Result<Option<i32>> {
        let f = crate::flight::enter("barrier", "start of training");
        self.g.comm.barrier();
        drop(f);
        self.origin = Instant::now();
        if self.g.rank == 0 {
            self.clock_log = Some(ClockLog::create(&self.folder.path("clock.csv"))?);
        }
        self.sync_clocks(0)?;
        let telemetry = self.start_telemetry();
        let mut stopped = None;
        for epoch in 0..self.schedule.epochs {
            stopped = self.run_epoch(epoch)?;
            if stopped.is_some() {
                break;
            }
        }
        if let Some(t) = telemetry {
            log_telemetry(t);
        }
        Ok(stopped)
    }

    /// After the last epoch, or a stop signal: each rank's end record, the final
    /// parameters (`--save-model`) and the manifest's outcome, then a barrier so no rank
    /// leaves before rank 0 wrote them.
    pub fn finish(mut self, stopped: Option<i32>) -> Result<()> {
        let (status, error) = match stopped {
            None => (RunStatus::Completed, None),
            Some(sig) => (
                RunStatus::Interrupted,
                Some(format!("{} after step {}", signals::name(sig), self.global_step)),
            ),
        };
        self.steps_log.sync()?;
        self.end_record(status, error.clone()).write(&self.folder.dir)?;
        // Every rank's GPU clocks after the last step (a collective: every rank sends
        // "null" or its reading).
        let mine = serde_json::to_string(&self.place.gpu_clocks())?;
        let ends = gather_strings(&self.g, &mine);
        if self.g.rank == 0 {
            for (info, text) in self.manifest.ranks.iter_mut().zip(ends.unwrap_or_default()) {
                info.gpu_clocks_end = serde_json::from_str(&text).ok().flatten();
            }
            if self.cfg.output.save_model && stopped.is_none() {
                self.save_model()?;
            }
            let m = &mut self.manifest;
            m.status = status.as_str().into();
            m.error = error.clone();
            m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
            m.wall_s = Some(self.started.elapsed().as_secs_f64());
            m.final_param_l2 = Some(self.last_l2);
            let (sums, steps) = &self.bucket_ready;
            if *steps > 0 {
                m.comm.bucket_ready_fraction = sums.iter().map(|s| s / *steps as f64).collect();
            }
            m.final_val_accuracy = self.last_accuracy;
            m.clock = Some(self.clock.clone());
            m.write(&self.folder.dir)?;
            match &error {
                None => info!(
                    "done: {} (reduce with: ddpbench reduce {})",
                    self.folder.dir.display(),
                    self.folder.dir.display()
                ),
                Some(e) => warn!("interrupted by {e}: every row so far is in {}", self.folder.dir.display()),
            }
        }
        let _f = crate::flight::enter("barrier", "end of the run");
        self.g.comm.barrier();
        Ok(())
    }

    /// The final parameters in the run folder: model.safetensors, or for a TorchScript
    /// model model.pt, the module with its trained weights (and rank 0's buffers).
    fn save_model(&self) -> Result<()> {
        match self.model.net.script() {
            Some(script) => script.save(&self.folder.path("model.pt")),
            None => self
                .model
                .vs
                .save(self.folder.path("model.safetensors"))
                .context("cannot save model.safetensors"),
        }
    }

    /// Records that the run failed with `err` on this rank: its end record, and the
    /// manifest's status and error (written by rank 0 when every rank knows the error,
    /// by this rank when only it does, since its peers are about to be aborted).
    pub fn record_failure(&mut self, err: &anyhow::Error, agreed: bool) {
        let text = format!("rank {} ({}) at step {}: {err:#}", self.g.rank, self.g.host, self.global_step);
        let _ = self.steps_log.sync();
        let _ = self.end_record(RunStatus::Failed, Some(text.clone())).write(&self.folder.dir);
        if self.g.rank == 0 || !agreed {
            let m = &mut self.manifest;
            m.status = RunStatus::Failed.as_str().into();
            m.error = Some(text);
            m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
            m.wall_s = Some(self.started.elapsed().as_secs_f64());
            let _ = m.write(&self.folder.dir);
        }
    }

    fn end_record(&self, status: RunStatus, error: Option<String>) -> EndRecord {
        EndRecord {
            run_id: self.folder.run_id.clone(),
            rank: self.g.rank,
            host: self.g.host.clone(),
            status,
            error,
            steps: self.global_step,
            time_utc: record::rfc3339_utc(SystemTime::now()),
        }
    }

    /// Whether any rank received a stop signal: one small all-reduce between steps, so
    /// every rank stops after the same step.
    fn stop_signal(&self) -> Option<i32> {
        let mine = signals::received().unwrap_or(0);
        let mut any = 0i32;
        let _f = crate::flight::enter("all-reduce", "stop check");
        self.g.comm.all_reduce_into(&mine, &mut any, SystemOperation::max());
        (any != 0).then_some(any)
    }

    /// One epoch: its steps, then the cross-rank parameter check and validation.
    /// Returns the stop signal when one came (the epoch then ends after that step).
    fn run_epoch(&mut self, epoch: usize) -> Result<Option<i32>> {
        let epoch_start = Instant::now();
        self.watchdog.set_limit(self.step_limit_s.unwrap_or(watchdog::WARMUP_LIMIT_S));
        let steps = self.schedule.steps_per_epoch.min(self.schedule.total_steps - self.global_step);
        let mut loader = self.epoch_loader(epoch, steps)?;
        let mut loss_sum = 0.0;
        for step in 0..steps {
            let row = self.step(&mut loader, epoch, step)?;
            self.steps_log.write(&row)?;
            if !row.loss.is_finite() {
                anyhow::bail!("loss became {} at epoch {epoch} step {step}: lower --lr", row.loss);
            }
            loss_sum += row.loss;
            self.global_step += 1;
            self.watchdog.set_steps(self.global_step);
            self.adjust_watchdog(row.warmup == 1, row.step_s);
            self.log_progress(epoch, step, &row);
            if let Some(sig) = self.stop_signal() {
                return Ok(Some(sig));
            }
        }
        self.steps_log.sync()?;
        // Epoch end (checks, validation): set-up's limit, since ranks may differ there.
        self.watchdog
            .set_limit(self.cfg.output.watchdog_s.unwrap_or(watchdog::SETUP_LIMIT_S));
        self.end_epoch(epoch, steps, loss_sum, epoch_start)?;
        Ok(None)
    }

    /// After warm-up, the watchdog's limit becomes 50 median steps (at least 60 s), from
    /// the first 20 steps after warm-up; a limit given with --watchdog-s stays.
    fn adjust_watchdog(&mut self, warmup: bool, step_s: f64) {
        if warmup || self.step_limit_s.is_some() {
            return;
        }
        self.early_steps.push(step_s);
        if self.early_steps.len() == 20 {
            let median = crate::stats::median(&self.early_steps);
            let limit = (watchdog::STEPS_LIMIT * median).max(watchdog::MIN_LIMIT_S);
            self.step_limit_s = Some(limit);
            self.watchdog.set_limit(limit);
        }
    }

    /// This epoch's batches on this rank: its shard of a shuffled index list, or its
    /// range of a streamed data set.
    fn epoch_loader(&self, epoch: usize, steps: usize) -> Result<Loader> {
        let (g, s) = (self.g, &self.cfg.schedule);
        match &self.dataset.stream {
            Some(src) => Ok(Loader::stream(
                src,
                g.rank,
                g.size,
                s.batch_size,
                steps * s.grad_accum,
                2 * self.cfg.placement.workers.unwrap_or(0).max(2),
            )),
            None => {
                let indices = data::shard_indices(self.dataset.train.len(), g.size, g.rank, s.seed, epoch, true);
                let micro: Vec<Vec<i64>> = indices.chunks(s.batch_size).map(<[i64]>::to_vec).collect();
                Loader::new(
                    &self.dataset.train,
                    micro.into_iter().take(steps * s.grad_accum).collect(),
                    self.cfg.placement.workers.unwrap_or(0),
                    self.place.device,
                )
            }
        }
    }

    /// The epoch's end: the slowest rank's epoch time, the mean training loss, the
    /// parameter check across ranks, and validation with rank 0's BatchNorm statistics
    /// (as DDP's broadcast_buffers).
    fn end_epoch(&mut self, epoch: usize, steps: usize, loss_sum: f64, epoch_start: Instant) -> Result<()> {
        let g = self.g;
        crate::flight::recorder().set_position(Some(epoch), None);
        let f = crate::flight::enter("all-reduce", "epoch time and loss");
        let mut epoch_s = 0.0;
        g.comm
            .all_reduce_into(&epoch_start.elapsed().as_secs_f64(), &mut epoch_s, SystemOperation::max());
        let mut train = [0f64; 2];
        g.comm
            .all_reduce_into(&[loss_sum, steps as f64][..], &mut train[..], SystemOperation::sum());
        drop(f);
        self.last_l2 = if self.comm.backend == Backend::None {
            // Without an all-reduce every rank's model is its own.
            super::params::param_l2(&self.model.params)
        } else {
            check_in_sync(g, &self.model.params, epoch)?
        };
        broadcast_from_rank0(g, &model::ordered_buffers(&self.model.vs));
        let val_start = Instant::now();
        let (val_loss, val_acc, val_n) = super::validation::evaluate(
            g,
            self.model.net.as_ref(),
            &self.dataset,
            self.place.device,
            self.cfg.schedule.val_samples,
            self.cfg.schedule.batch_size,
        )?;
        self.last_accuracy = val_acc.is_finite().then_some(val_acc);
        self.sync_clocks(epoch + 1)?;
        let row = EpochRow {
            epoch,
            time_utc: record::rfc3339_utc(SystemTime::now()),
            steps,
            epoch_s,
            train_loss: train[0] / train[1].max(1.0),
            val_loss,
            val_accuracy: val_acc,
            val_samples: val_n,
            val_s: val_start.elapsed().as_secs_f64(),
            param_l2: self.last_l2,
        };
        if let Some(log) = self.epochs_log.as_mut() {
            log.write(&row)?;
            log.sync()?;
            info!(
                "epoch {epoch}: {steps} steps in {epoch_s:.2} s, train loss {:.4}, val loss {val_loss:.4}, val accuracy {:.2} %",
                row.train_loss,
                val_acc * 100.0
            );
        }
        Ok(())
    }

    /// Estimates every rank's clock offset to rank 0; rank 0 writes them to clock.csv.
    fn sync_clocks(&mut self, sync: usize) -> Result<()> {
        let rows = clock::estimate(self.g, self.origin, sync);
        let Some(log) = self.clock_log.as_mut() else { return Ok(()) };
        log.write(&rows)?;
        if self.first_offsets.is_empty() {
            self.first_offsets = rows.iter().map(|r| r.offset_s).collect();
        }
        let c = &mut self.clock;
        c.syncs += 1;
        for (r, first) in rows.iter().zip(&self.first_offsets) {
            c.max_error_s = c.max_error_s.max(r.error_s);
            c.max_abs_offset_s = c.max_abs_offset_s.max(r.offset_s.abs());
            c.max_drift_s = c.max_drift_s.max((r.offset_s - first).abs());
        }
        Ok(())
    }

    fn log_progress(&self, epoch: usize, step: usize, row: &StepRow) {
        let every = self.cfg.output.log_every;
        if self.g.rank == 0 && every > 0 && self.global_step % every == 0 {
            info!(
                "epoch {epoch} step {step}/{} loss {:.4} step {:.1} ms",
                self.schedule.steps_per_epoch,
                row.loss,
                row.step_s * 1e3
            );
        }
    }

    /// NVML sampling of this rank's GPU into `rank-NNNNN.gpu.csv`, when there is one.
    fn start_telemetry(&self) -> Option<GpuSampler> {
        let bus = self.place.gpu_bus_id.as_ref()?;
        let ms = self.cfg.output.telemetry_ms;
        if ms == 0 {
            return None;
        }
        let path = self.folder.path(&record::gpu_file_name(self.g.rank));
        let started = crate::telemetry::NvmlGpu::open(bus)
            .and_then(|gpu| GpuSampler::start_with(gpu, self.g.rank, &path, Duration::from_millis(ms), self.origin));
        match started {
            Ok(s) => Some(s),
            Err(e) => {
                if self.g.local_rank == 0 {
                    warn!("GPU telemetry off: {e:#}");
                }
                None
            }
        }
    }

    fn log_setup(&self) {
        let (g, m) = (self.g, &self.manifest);
        for n in &self.comm.notes {
            info!("{n}");
        }
        info!(
            "all-reduce: {}, overlap {}, gradients as {:?} on the wire, amp {:?}",
            m.comm_backend,
            if m.comm.overlap {
                format!("on ({} backward stages)", m.comm.backward_stages)
            } else {
                "off".into()
            },
            self.cfg.comm.grad_dtype,
            self.cfg.optim.amp
        );
        info!(
            "run {}: {} ranks on {} node(s), {:?}, {} params in {} bucket(s), batch {}×{}, {} steps/epoch, {} epoch(s) → {}",
            m.run_id,
            g.size,
            g.nodes,
            self.place.device,
            m.parameters,
            m.buckets,
            self.cfg.schedule.batch_size,
            g.size,
            self.schedule.steps_per_epoch,
            self.schedule.epochs,
            self.folder.dir.display()
        );
        if let Some(p) = &m.allreduce_probe {
            info!(
                "raw MPI_Allreduce of {} B: median {:.3} ms, busbw {:.2} GB/s with caches flushed ({:.2} GB/s warm)",
                p.bytes,
                p.median_s * 1e3,
                p.busbw_bytes_per_s / 1e9,
                m.allreduce_probe_warm.as_ref().map_or(f64::NAN, |w| w.busbw_bytes_per_s / 1e9)
            );
        }
    }
}

/// The model with the same seed on every rank, then rank 0's parameters win; dropout
/// masks then differ per rank, as in a PyTorch job where each process draws its own.
/// A TorchScript file must be the same file on every rank; its buffers (BatchNorm
/// statistics) are rank 0's too. Errors are agreed across the group.
fn build_model(g: &Group, cfg: &TrainConfig, place: &Placement, options: &ModelOptions, spec: ModelSpec) -> Result<ModelState> {
    let seed = cfg.schedule.seed as i64;
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(place.device);
    let net = agree(
        g,
        model::build_choice(&cfg.workload.model, &vs.root(), options, &spec, cfg.workload.loss),
    )?;
    if let Some(script) = net.script() {
        agree(g, super::file_model::same_file_everywhere(g, &script.file().sha256))?;
        broadcast_from_rank0(g, &model::ordered_buffers(&vs));
    }
    let params = model::ordered_parameters(&vs);
    broadcast_from_rank0(g, &params);
    tch::manual_seed(seed + 1 + g.rank as i64);
    let param_tensors = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    Ok(ModelState {
        vs,
        net,
        spec,
        params,
        param_tensors,
    })
}

/// Steps per epoch (the same on every rank), the total, and the learning-rate schedule.
fn schedule(g: &Group, cfg: &TrainConfig, dataset: &Dataset) -> Schedule {
    let s = &cfg.schedule;
    let steps_per_epoch = match &dataset.stream {
        // Streams yield full batches only (equal ranges on every rank).
        Some(src) => {
            let (a, b) = data::bigmnist::rank_range(&src.index, g.rank, g.size);
            ((b - a) as usize / s.batch_size / s.grad_accum).max(1)
        }
        None => {
            let per_rank = data::shard_indices(dataset.train.len(), g.size, g.rank, s.seed, 0, true).len();
            data::steps_per_epoch(per_rank, cfg.samples_per_step())
        }
    };
    let total_steps = (steps_per_epoch * s.epochs).min(s.max_steps.unwrap_or(usize::MAX));
    Schedule {
        steps_per_epoch,
        total_steps,
        epochs: total_steps.div_ceil(steps_per_epoch),
        warmup_lr_steps: (cfg.optim.warmup_epochs * steps_per_epoch as f64).round() as usize,
        lr_scale: match cfg.optim.lr_scaling {
            LrScaling::None => 1.0,
            LrScaling::Linear => (g.size * s.grad_accum) as f64,
        },
    }
}

impl Schedule {
    /// The learning rate of global step `step`.
    pub fn lr(&self, base: f64, step: usize) -> f64 {
        optim::learning_rate(base, self.lr_scale, step, self.warmup_lr_steps)
    }
}

fn log_telemetry(t: GpuSampler) {
    match t.stop() {
        Ok(sum) => info!(
            "GPU telemetry: {} samples, mean utilisation {} %, peak memory {} MiB, mean power {} W",
            sum.samples,
            sum.mean_gpu_util_pct.map_or("?".into(), |v| format!("{v:.0}")),
            sum.max_mem_used_bytes.map_or("?".into(), |v| (v >> 20).to_string()),
            sum.mean_power_w.map_or("?".into(), |v| format!("{v:.0}"))
        ),
        Err(e) => warn!("GPU telemetry: {e:#}"),
    }
}

/// How many ranks' gradients the all-reduce sums: the loss is divided by it so the sum
/// is the mean.
fn ranks_summed(g: &Group, comm: &Communication) -> usize {
    match comm.backend {
        Backend::None => 1,
        _ => g.size,
    }
}

/// Every rank's placement, gathered on rank 0 (empty elsewhere).
pub(super) fn gathered_rank_infos(g: &Group, place: &Placement, cfg: &TrainConfig) -> Result<Vec<record::RankInfo>> {
    let mine = serde_json::to_string(&place.rank_info(g, cfg.placement.bind)?)?;
    Ok(gather_strings(g, &mine)
        .unwrap_or_default()
        .iter()
        .map(|s| serde_json::from_str(s))
        .collect::<Result<_, _>>()?)
}
