//! [`Trainer`]: one training run on the ranks of a [`Group`], from set-up to the
//! final manifest. `setup` places the rank, loads the data, builds the model, the
//! optimizer and the all-reduce, and writes the manifest (status "running");
//! `run` trains epoch by epoch (each step in `step.rs` returns what it measured, the
//! epoch loop records it through `recording.rs`); `finish` writes the outcome.
//!
//! Its state is grouped by lifetime: [`RunFacts`] (what set-up established),
//! [`StepMachine`] (what a step runs on), [`Records`] (what the run writes) and
//! [`Progress`] (where the run is).

use super::clock;
use super::communication::Communication;
use super::config::TrainConfig;
use super::faults::FaultHooks;
use super::nonfinite::LossWatch;
use super::params::{broadcast_from_rank0, check_in_sync};
use super::placement::Placement;
use super::recording::{BucketReady, ClockRecord, Records, RowIdentity};
use super::run_folder::RunFolder;
use super::state::{ModelState, Schedule, StepAt};
use super::step::{StepMachine, StepMeasured};
use super::target::{StepDone, TargetWatch};
use super::timer;
use crate::amp::{Autocast, LossScaler};
use crate::comm::noise::{NoisePath, NoiseScaleMode};
use crate::data::{self, Dataset, Loader};
use crate::flight::Activity;
use crate::job::signals;
use crate::job::watchdog::{self, Watchdog};
use crate::model::{self, ModelOptions, ModelSpec};
use crate::optim::{LrScaling, Optimizer};
use crate::record::clock::ClockLog;
use crate::record::last_gasp::{self, LastGasp, Template};
use crate::record::reserve::{self, Reserve};
use crate::record::AmpMode;
use crate::record::Backend;
use crate::record::{self, CsvLog, EndRecord, EpochRow, Manifest, RunStatus, StepRow};
use crate::telemetry::GpuSampler;
use crate::trace::{RankIdentity, RankTrace};
use crate::world::{agree, gather_strings, Group};
use anyhow::{Context, Result};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use std::time::{Duration, Instant, SystemTime};
use tch::nn;
use tracing::{info, warn};

/// What set-up established, fixed for the whole run.
pub(super) struct RunFacts {
    /// The configuration as run (`--workers` resolved).
    pub cfg: TrainConfig,
    pub folder: RunFolder,
    /// When set-up began (the manifest's `wall_s` counts from here).
    pub started: Instant,
    pub place: Placement,
    pub dataset: Dataset,
    pub schedule: Schedule,
    pub faults: FaultHooks,
}

/// Where the run is.
pub(super) struct Progress {
    /// The common time origin of all ranks (they leave a barrier together).
    pub origin: Instant,
    /// The origin on `CLOCK_MONOTONIC`, and this kernel's boot id, for exact offsets.
    pub clock_origin: clock::Origin,
    pub boot_id: u64,
    /// Steps done since the start of the run.
    pub global_step: usize,
    /// The losses so far, to explain one that is not finite.
    pub losses: LossWatch,
    /// This rank's first loss that was not finite, explained, until the ranks agree on it
    /// between steps ([`Trainer::between_steps`]).
    pub loss_failed: Option<anyhow::Error>,
    /// The parameters' L2 norm and the validation accuracy at the last epoch's end.
    pub last_l2: f64,
    pub last_accuracy: Option<f64>,
    pub step_limit: StepLimit,
    /// The gradient noise scale's norms of this epoch's steps that took them.
    pub epoch_norms: Vec<crate::noise_scale::NormPair>,
    /// The smoothed loss `--target-loss` watches, when given.
    pub target: Option<TargetWatch>,
}

/// The watchdog's limit for steps: fixed by `--watchdog-s`, or set from the first
/// steps after warm-up.
pub(super) struct StepLimit {
    /// Step times after warm-up, until the limit is set from their median.
    early_steps: Vec<f64>,
    /// None until warm-up is over, when not fixed.
    limit_s: Option<f64>,
}

impl StepLimit {
    /// The limit for steps now: during warm-up, the generous warm-up limit.
    fn current_s(&self) -> f64 {
        self.limit_s.unwrap_or(watchdog::WARMUP_LIMIT_S)
    }

    /// Adds a step's time. After warm-up the limit becomes 50 median steps (at least
    /// 60 s), from the first 20 steps after warm-up; returns it when it was just set. A
    /// limit given with --watchdog-s stays.
    fn add(&mut self, warmup: bool, step_s: f64) -> Option<f64> {
        if warmup || self.limit_s.is_some() {
            return None;
        }
        self.early_steps.push(step_s);
        if self.early_steps.len() < 20 {
            return None;
        }
        let median = crate::stats::median(&self.early_steps);
        let limit = (watchdog::STEPS_LIMIT * median).max(watchdog::MIN_LIMIT_S);
        self.limit_s = Some(limit);
        Some(limit)
    }
}

/// One training run on the ranks of a group.
pub(crate) struct Trainer<'g> {
    g: &'g Group,
    watchdog: &'g Watchdog,
    facts: RunFacts,
    machine: StepMachine,
    records: Records,
    progress: Progress,
}

impl<'g> Trainer<'g> {
    /// Everything before the first step. Errors are agreed across the group, so every
    /// rank returns the same one.
    pub(crate) fn setup(
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
        let dataset = agree(g, data::load(&cfg.data_spec(), &spec))?;
        // The workers, resolved for this data set and binding, are what the manifest records.
        let resolved = {
            let (workers, note) = place.workers_for(cfg.placement.workers, dataset.train.files.is_some());
            if let Some(n) = note.as_ref().filter(|_| g.local_rank == 0) {
                warn!("{n}");
            }
            place.workers_note = note;
            let mut c = cfg.clone();
            c.placement.workers = Some(workers);
            c.placement.phase_sync = Some(cfg.phase_sync_on(place.device));
            c.workload.memory_format = Some(cfg.memory_format_on(place.device));
            c
        };
        let cfg = &resolved;
        let model = build_model(g, cfg, &place, &options, spec)?;
        if let Some(script) = model.net.script() {
            super::file_model::check_script(g, cfg, script, &model.spec, &dataset, place.device)?;
        }
        let mut opt = Optimizer::new(
            cfg.optim.optimizer,
            &model.param_tensors,
            cfg.learning_rate(),
            cfg.optim.momentum,
            cfg.optim.weight_decay,
        );
        let mut comm = Communication::setup(g, cfg, &place, model.net.as_ref(), &model.spec, &model.param_tensors)?;
        if let Some(layout) = comm.reducer.layout() {
            opt.use_flat_buckets(&layout);
        }
        let autocast = agree(g, Autocast::new(cfg.optim.amp, place.device))?;
        let schedule = schedule(g, cfg, &dataset);
        let every = agree(g, super::target::validate_every_steps(cfg, &schedule))?;
        let mut manifest = super::manifest::initial(g, cfg, &folder, started, &place, &dataset, &model, &comm, &schedule)?;
        manifest.host_malloc = Some(malloc.to_string());
        manifest.warnings = super::guard::run_warnings(g, cfg, &place, &schedule);
        for w in &manifest.warnings {
            warn!("{}", w.message);
        }
        let records = open_records(g, &folder, &place.node_type, manifest)?;
        let micro_batches = cfg.schedule.grad_accum;
        let clock = agree(g, timer::clock_for(cfg.phase_sync_on(place.device), place.device, micro_batches))?;
        let faults = FaultHooks::from_env(g.rank);
        comm.reducer.defer_device_times(clock.reads_device_late());
        let machine = StepMachine {
            slow_forward: faults.forward_sleep(),
            loss_factor: 1.0 / (ranks_summed(g, &comm) * micro_batches) as f64,
            noise_mode: cfg.comm.noise_scale,
            noise_path: NoisePath::of(ranks_summed(g, &comm), micro_batches),
            ranks_summed: ranks_summed(g, &comm),
            scaler: (cfg.optim.amp == AmpMode::Fp16).then(|| LossScaler::new(place.device)),
            clock,
            memory_format: cfg.memory_format_on(place.device),
            device: place.device,
            micro_batches,
            unread: Default::default(),
            model,
            opt,
            autocast,
            comm,
        };
        let target = cfg.target_goal().map(|goal| {
            let lr = super::target::LrFollowed {
                rule: super::target::lr_rule(cfg, &schedule),
                warmup_steps: schedule.warmup_lr_steps,
                peak: super::target::peak_lr(cfg, &schedule),
            };
            TargetWatch::new(goal, every, lr)
        });
        let trainer = Trainer {
            g,
            watchdog,
            facts: RunFacts {
                cfg: cfg.clone(),
                folder,
                started: started_at,
                place,
                dataset,
                schedule,
                faults,
            },
            machine,
            records,
            progress: Progress {
                origin: started_at,
                clock_origin: clock::Origin::now(),
                boot_id: clock::boot_id_hash(),
                global_step: 0,
                losses: LossWatch::default(),
                loss_failed: None,
                last_l2: 0.0,
                last_accuracy: None,
                epoch_norms: Vec::new(),
                target,
                step_limit: StepLimit {
                    early_steps: Vec::new(),
                    limit_s: cfg.output.watchdog_s,
                },
            },
        };
        trainer.log_setup();
        Ok(trainer)
    }

    /// Trains every epoch: the ranks leave a barrier together (the common time origin
    /// of every `step_start_at_s`), GPU telemetry starts, then epoch after epoch. Returns the
    /// stop signal when one ended the run early ([`signals`]).
    pub(crate) fn run(&mut self) -> Result<Option<i32>> {
        let f = crate::flight::enter("barrier", "start of training");
        self.g.comm.barrier();
        drop(f);
        self.progress.clock_origin = clock::Origin::now();
        self.progress.origin = self.progress.clock_origin.instant;
        if self.g.rank == 0 {
            self.records.offsets.log = Some(ClockLog::create(&self.facts.folder.path("clock.csv"))?);
        }
        self.sync_clocks(0)?;
        self.open_trace()?;
        let telemetry = self.start_telemetry();
        let mut stopped = None;
        for epoch in 0..self.facts.schedule.epochs {
            stopped = self.run_epoch(epoch)?;
            if stopped.is_some() || self.progress.target.as_ref().is_some_and(TargetWatch::reached) {
                break;
            }
        }
        if let Some(t) = self.progress.target.as_ref().filter(|_| self.g.rank == 0) {
            if t.reached() {
                info!("{}", t.line(self.progress.global_step));
            } else {
                warn!("{}", t.line(self.progress.global_step));
            }
        }
        if let Some(t) = telemetry {
            log_telemetry(t);
        }
        Ok(stopped)
    }

    /// After the last epoch, or a stop signal: each rank's end record, the final
    /// parameters (`--save-model`) and the manifest's outcome, then a barrier so no rank
    /// leaves before rank 0 wrote them, then the run's files closed. All of it is the
    /// run's teardown, watched ([`crate::flight::Activity`]); once past the barrier the
    /// records are final, and a stall later leaves them as they are.
    pub(crate) fn finish(mut self, stopped: Option<i32>) -> Result<()> {
        crate::flight::recorder().begin_teardown();
        crate::flight::phase(Some(Activity::LastRecords));
        let (status, error) = match stopped {
            None => (RunStatus::Completed, None),
            Some(sig) => (
                RunStatus::Interrupted,
                Some(format!("{} after step {}", signals::name(sig), self.progress.global_step)),
            ),
        };
        self.records.steps_log.sync()?;
        let trace_stopped = match self.records.trace.take() {
            Some(t) => {
                let stopped = t.stopped_before();
                t.finish()?;
                stopped
            }
            None => None,
        };
        self.end_record(status, error.clone()).write(&self.facts.folder.dir)?;
        // Every rank's GPU clocks after the last step and the step its trace stopped
        // before, if it did (a collective: every rank sends its pair, nulls or not).
        let mine = serde_json::to_string(&(self.facts.place.gpu_clocks(), trace_stopped))?;
        let ends = gather_strings(self.g, &mine);
        if self.g.rank == 0 {
            for (info, text) in self.records.manifest.ranks.iter_mut().zip(ends.unwrap_or_default()) {
                let (clocks, stopped): (Option<crate::record::GpuClocks>, Option<usize>) = serde_json::from_str(&text).unwrap_or_default();
                info.gpu_clocks_end = clocks;
                info.trace_stopped_before_step = stopped;
            }
            if self.facts.cfg.output.save_model && stopped.is_none() {
                self.save_model()?;
            }
            let m = &mut self.records.manifest;
            m.status = status.as_str().into();
            m.error = error.clone();
            m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
            m.wall_s = Some(self.facts.started.elapsed().as_secs_f64());
            m.final_param_l2 = Some(self.progress.last_l2);
            if let Some(means) = self.records.bucket_ready.means() {
                m.comm.bucket_ready_fraction = means;
            }
            m.final_val_accuracy = self.progress.last_accuracy;
            m.target = self.progress.target.as_ref().map(|t| t.outcome().clone());
            m.clock = Some(self.records.offsets.summary.clone());
            m.log_lines_dropped = crate::stderr::lines_dropped();
            m.write(&self.facts.folder.dir)?;
            match &error {
                None => info!(
                    "done: {} (reduce with: ddpbench reduce {})",
                    self.facts.folder.dir.display(),
                    self.facts.folder.dir.display()
                ),
                Some(e) => warn!("interrupted by {e}: every row so far is in {}", self.facts.folder.dir.display()),
            }
        }
        {
            let _f = crate::flight::enter("barrier", "end of the run");
            self.g.comm.barrier();
        }
        self.watchdog.records_final();
        crate::flight::phase(Some(Activity::ClosingFiles));
        drop(self);
        crate::flight::phase(None);
        Ok(())
    }

    /// The final parameters in the run folder: model.safetensors, or for a TorchScript
    /// model model.pt, the module with its trained weights (and rank 0's buffers). Saved
    /// into a file of a random name created exclusively, then given its name only where
    /// nothing is ([`crate::files::rename_new`]): no file is overwritten, no link followed.
    fn save_model(&self) -> Result<()> {
        let script = self.machine.model.net.script();
        let name = if script.is_some() { "model.pt" } else { "model.safetensors" };
        let path = self.facts.folder.path(name);
        let tmp = self.facts.folder.path(&format!(".{name}.{}.tmp", crate::files::random_hex(8)));
        crate::files::create_exclusive(&tmp).with_context(|| format!("cannot save {}", path.display()))?;
        let saved = match script {
            Some(script) => script.save(&tmp),
            None => model::save(&self.machine.model.vs, &tmp).with_context(|| format!("cannot save {}", path.display())),
        }
        .and_then(|()| crate::files::rename_new(&tmp, &path).with_context(|| format!("cannot save {}", path.display())));
        let _ = std::fs::remove_file(&tmp);
        saved
    }

    /// Records that the run failed with `err` on this rank: its end record, and the
    /// manifest's status and error (written by rank 0 when every rank knows the error,
    /// by this rank when only it does, since its peers are about to be aborted).
    pub(crate) fn record_failure(&mut self, err: &anyhow::Error, agreed: bool) {
        let text = format!(
            "rank {} ({}) at step {}: {err:#}",
            self.g.rank, self.g.host, self.progress.global_step
        );
        let _ = self.records.steps_log.sync();
        let _ = self.end_record(RunStatus::Failed, Some(text.clone())).write(&self.facts.folder.dir);
        if self.g.rank == 0 || !agreed {
            // Only rank 0's copy holds every rank's placement: another rank updates the file.
            if self.g.rank != 0 {
                if let Ok(on_disk) = Manifest::read(&self.facts.folder.dir) {
                    self.records.manifest = on_disk;
                }
            }
            let m = &mut self.records.manifest;
            m.status = RunStatus::Failed.as_str().into();
            m.error = Some(text);
            m.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
            m.wall_s = Some(self.facts.started.elapsed().as_secs_f64());
            m.log_lines_dropped = crate::stderr::lines_dropped();
            let _ = m.write(&self.facts.folder.dir);
        }
    }

    fn end_record(&self, status: RunStatus, error: Option<String>) -> EndRecord {
        EndRecord {
            run_id: self.facts.folder.run_id.clone(),
            rank: self.g.rank,
            host: self.g.host.clone(),
            status,
            error,
            steps: self.progress.global_step,
            time_utc: record::rfc3339_utc(SystemTime::now()),
        }
    }

    /// Whether any rank received a stop signal, or saw a loss that was not finite: one
    /// small all-reduce between steps, so every rank stops after the same step. A loss
    /// that failed on any rank ends the run on every rank with one agreed error.
    fn between_steps(&mut self) -> Result<Option<i32>> {
        let mine = [signals::received().unwrap_or(0), i32::from(self.progress.loss_failed.is_some())];
        let mut any = [0i32; 2];
        {
            let _f = crate::flight::enter("all-reduce", "stop check");
            self.g.comm.all_reduce_into(&mine[..], &mut any[..], SystemOperation::max());
        }
        if any[1] != 0 {
            self.agree_on_loss()?;
        }
        Ok((any[0] != 0).then_some(any[0]))
    }

    /// Every rank at once: the lowest rank's explanation of a loss that was not finite,
    /// as an agreed error, when any rank holds one.
    fn agree_on_loss(&mut self) -> Result<()> {
        let mine = self.progress.loss_failed.take().map_or(Ok(()), Err);
        crate::world::agree(self.g, mine)
    }

    /// One epoch: its steps, then the cross-rank parameter check and validation.
    /// Returns the stop signal when one came (the epoch then ends after that step).
    fn run_epoch(&mut self, epoch: usize) -> Result<Option<i32>> {
        let epoch_start = Instant::now();
        self.watchdog.set_limit(self.progress.step_limit.current_s());
        let schedule = self.facts.schedule;
        let steps = schedule.steps_per_epoch.min(schedule.total_steps - self.progress.global_step);
        let mut loader = self.epoch_loader(epoch, steps)?;
        let first = self.progress.global_step;
        if self.records.trace.as_ref().is_some_and(|t| t.overlaps(first, first + steps)) {
            loader.record_spans();
        }
        let bar = crate::progress::Bar::epoch(epoch, schedule.epochs, steps);
        let mut loss_sum = 0.0;
        let mut done = steps;
        for step in 0..steps {
            let at = StepAt {
                epoch,
                step,
                global_step: self.progress.global_step,
                warmup: self.progress.global_step < self.facts.cfg.schedule.warmup_steps,
            };
            self.inject_faults(at)?;
            let lr = schedule.lr(self.facts.cfg.learning_rate(), at.global_step);
            let measured = self.machine.step(&mut loader, lr, at)?;
            crate::flight::phase(Some(Activity::StepRecords));
            if let Some(t) = self.records.trace.as_mut() {
                t.batches(at.global_step, &loader.take_spans())?;
            }
            self.progress.global_step += 1;
            self.watchdog.set_steps(self.progress.global_step);
            last_gasp::set_steps(self.progress.global_step);
            if let Some(m) = measured {
                loss_sum += self.after_step(&m, &bar)?;
            }
            if let Some(sig) = self.between_steps()? {
                if let Some(m) = self.machine.flush() {
                    self.after_step(&m, &bar)?;
                }
                self.agree_on_loss()?;
                return Ok(Some(sig));
            }
            let global_step = self.progress.global_step;
            if self.progress.target.as_ref().is_some_and(|t| t.validates_after(global_step)) {
                if let Some(m) = self.machine.flush() {
                    loss_sum += self.after_step(&m, &bar)?;
                }
                self.agree_on_loss()?;
                self.validate_for_target(epoch, step)?;
            }
            if self.progress.target.as_ref().is_some_and(TargetWatch::reached) {
                done = step + 1;
                break;
            }
        }
        if let Some(m) = self.machine.flush() {
            loss_sum += self.after_step(&m, &bar)?;
        }
        self.agree_on_loss()?;
        // The epoch's end is collectives and validation, each watched on its own.
        crate::flight::phase(None);
        drop(bar);
        self.records.steps_log.sync()?;
        // Epoch end (checks, validation): set-up's limit, since ranks may differ there.
        self.watchdog
            .set_limit(self.facts.cfg.output.watchdog_s.unwrap_or(watchdog::SETUP_LIMIT_S));
        self.end_epoch(epoch, done, loss_sum, epoch_start)?;
        Ok(None)
    }

    /// Before step `at`: the flight recorder's position, and the failures a test asked
    /// for ([`FaultHooks`]), at the same point of the step on every run.
    fn inject_faults(&mut self, at: StepAt) -> Result<()> {
        crate::flight::recorder().set_position(Some(at.epoch), Some(at.step));
        let faults = self.facts.faults;
        if faults.fail_at_step == Some(at.global_step) {
            anyhow::bail!("fault injected by DDPBENCH_FAULT at step {}", at.global_step);
        }
        if faults.amp_overflow_at_step == Some(at.global_step) {
            let _ = self.machine.model.param_tensors[0].grad().fill_(f64::INFINITY);
        }
        Ok(())
    }

    /// A step whose times are final: its row, the loss check, the watchdog's step limit
    /// and the progress line and bar. Returns its loss.
    fn after_step(&mut self, m: &StepMeasured, bar: &crate::progress::Bar) -> Result<f64> {
        let at = m.at;
        let row = self.record_step(m, at)?;
        self.watch_target(at, row.loss);
        let params = &self.machine.model.params;
        if let Err(e) = self.progress.losses.check(at, row.loss, params, self.facts.cfg.optim.amp) {
            // Every rank's loss fails within a step of another's (the all-reduced gradient
            // carries it): the ranks agree on it between steps and end with one message.
            self.progress.loss_failed.get_or_insert(e);
        }
        if let Some(limit) = self.progress.step_limit.add(at.warmup, row.step_s) {
            self.watchdog.set_limit(limit);
        }
        self.log_progress(at.epoch, at.step, &row);
        bar.step(at.step + 1, (m.samples * self.g.size) as u64, row.loss);
        Ok(row.loss)
    }

    /// A validation for `--target-accuracy` after the optimizer steps done so far,
    /// between steps (the last step's times are final before it): rank 0's BatchNorm
    /// statistics, as at an epoch's end, then validation on `--val-samples` test samples
    /// (default: the whole test split) under set-up's time limit, drawn in the trace.
    fn validate_for_target(&mut self, epoch: usize, step: usize) -> Result<()> {
        let g = self.g;
        crate::flight::phase(None);
        self.watchdog
            .set_limit(self.facts.cfg.output.watchdog_s.unwrap_or(watchdog::SETUP_LIMIT_S));
        let test_len = self.facts.dataset.test.len();
        let samples = self.facts.cfg.schedule.val_samples.unwrap_or(test_len);
        let done = self.progress.global_step;
        let (_, accuracy, _, _) = self.validate(samples, done.saturating_sub(1))?;
        let at = self.step_done(done);
        let target = self.progress.target.as_mut().expect("validate_for_target runs with a target");
        let reached = crate::world::agree(g, target.add_accuracy(accuracy, at))?;
        if g.rank == 0 {
            info!(
                "epoch {epoch} step {step}: validation accuracy {accuracy:.4} on {} samples after {done} steps{}",
                samples.min(test_len),
                if reached { " (target reached)" } else { "" }
            );
        }
        self.watchdog.set_limit(self.progress.step_limit.current_s());
        Ok(())
    }

    /// Validation on the first `samples` test samples with rank 0's BatchNorm statistics
    /// (as DDP's broadcast_buffers), drawn in the trace when it covers the steps from
    /// `first_step` to now: loss, accuracy, samples validated, and when it started.
    fn validate(&mut self, samples: usize, first_step: usize) -> Result<(f64, f64, usize, Instant)> {
        let g = self.g;
        broadcast_from_rank0(g, &model::ordered_buffers(&self.machine.model.vs));
        let start = Instant::now();
        let (loss, accuracy, n) = super::validation::evaluate(
            g,
            self.machine.model.net.as_ref(),
            &self.facts.dataset,
            self.facts.place.device,
            samples,
            self.facts.cfg.schedule.batch_size,
        )?;
        let done = self.progress.global_step;
        if let Some(t) = self.records.trace.as_mut().filter(|t| t.overlaps(first_step, done)) {
            t.span("validation", start, Instant::now())?;
        }
        Ok((loss, accuracy, n, start))
    }

    /// The figures of a reach after `steps` optimizer steps: now, at this run's global batch.
    fn step_done(&self, steps: usize) -> StepDone {
        StepDone {
            steps,
            global_batch: self.facts.cfg.samples_per_step() * self.g.size,
            elapsed_s: self.progress.origin.elapsed().as_secs_f64(),
        }
    }

    /// Adds a measured step's loss to `--target-loss`'s window: a collective, which every
    /// rank makes for the same steps.
    fn watch_target(&mut self, at: StepAt, loss: f64) {
        let done = self.step_done(at.global_step + 1);
        if let Some(t) = self.progress.target.as_mut() {
            t.add(self.g, loss, done);
        }
    }

    /// Writes a measured step's row and, after warm-up, adds when each bucket was handed
    /// to the all-reduce.
    fn record_step(&mut self, measured: &StepMeasured, at: StepAt) -> Result<StepRow> {
        let row = self.records.rows.step_row(measured, at, self.progress.origin);
        self.progress.epoch_norms.extend(measured.noise);
        self.records.steps_log.write(&row)?;
        if let Some(t) = self.records.trace.as_mut() {
            super::recording::trace_step(t, measured, self.machine.clock.marks().marks(), at)?;
        }
        if !at.warmup {
            self.records.bucket_ready.add(&measured.comm.launches, measured.backward);
        }
        Ok(row)
    }

    /// This epoch's batches on this rank: its shard of a shuffled index list, or its
    /// range of a streamed data set.
    fn epoch_loader(&self, epoch: usize, steps: usize) -> Result<Loader> {
        let (g, s) = (self.g, &self.facts.cfg.schedule);
        match &self.facts.dataset.stream {
            Some(src) => Ok(Loader::stream(
                src,
                g.rank,
                g.size,
                s.batch_size,
                steps * s.grad_accum,
                2 * self.facts.cfg.placement.workers.unwrap_or(0).max(2),
            )),
            None => {
                let shard = data::Shard::new(self.facts.dataset.train.len(), g.size, g.rank, s.seed, epoch);
                Loader::new(
                    &self.facts.dataset.train,
                    data::Batches::new(shard, s.batch_size, steps * s.grad_accum),
                    self.facts.cfg.placement.workers.unwrap_or(0),
                    self.facts.place.device,
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
        self.progress.last_l2 = if self.machine.comm.backend == Backend::None {
            // Without an all-reduce every rank's model is its own.
            super::params::param_l2(&self.machine.model.params)
        } else {
            check_in_sync(g, &self.machine.model.params, epoch)?
        };
        let cfg = &self.facts.cfg;
        let trained = steps * cfg.samples_per_step() * g.size;
        let test_len = self.facts.dataset.test.len();
        let (val_samples, why) = super::validation::samples_to_validate(cfg.schedule.val_samples, trained, test_len);
        if val_samples > 0 {
            info!("epoch {epoch}: validating on {val_samples} of {test_len} test samples ({why})");
        }
        let done = self.progress.global_step;
        let (val_loss, val_acc, val_n, val_start) = self.validate(val_samples, done - steps)?;
        self.progress.last_accuracy = val_acc.is_finite().then_some(val_acc);
        self.sync_clocks(epoch + 1)?;
        let norms = std::mem::take(&mut self.progress.epoch_norms);
        let norms = (self.facts.cfg.comm.noise_scale != NoiseScaleMode::Off)
            .then(|| super::noise::gather_epoch(g, &norms))
            .flatten()
            .unwrap_or_default();
        let mut row = EpochRow {
            epoch,
            time_utc: record::rfc3339_utc(SystemTime::now()),
            steps,
            epoch_s,
            train_loss: train[0] / train[1].max(1.0),
            val_loss,
            val_accuracy: val_acc,
            val_samples: val_n,
            val_s: val_start.elapsed().as_secs_f64(),
            param_l2: self.progress.last_l2,
            noise_steps: None,
            noise_skipped: None,
            grad_sq: None,
            trace_sigma: None,
            b_simple: None,
            b_simple_low: None,
            b_simple_high: None,
        };
        row.set_noise(norms.len(), crate::noise_scale::estimate(&norms).as_ref());
        if let Some(log) = self.records.epochs_log.as_mut() {
            log.write(&row)?;
            log.sync()?;
            info!("{}", epoch_line(&row));
        }
        Ok(())
    }

    /// Opens this rank's trace when `--trace` asked for one (an error on any rank stops
    /// every rank before the first step).
    fn open_trace(&mut self) -> Result<()> {
        let Some(window) = self.facts.cfg.trace_window() else {
            return Ok(());
        };
        let id = RankIdentity {
            rank: self.g.rank,
            world_size: self.g.size,
            host: self.g.host.clone(),
            node_type: self.facts.place.node_type.clone(),
            backend: self.records.manifest.comm_backend.name().into(),
        };
        let opened = RankTrace::create(&self.facts.folder.dir, id, window, self.progress.origin);
        self.records.trace = Some(agree(self.g, opened)?);
        Ok(())
    }

    /// Estimates every rank's clock offset to rank 0; rank 0 writes them to clock.csv.
    fn sync_clocks(&mut self, sync: usize) -> Result<()> {
        let rows = clock::estimate(self.g, &self.progress.clock_origin, self.progress.boot_id, sync);
        self.records.offsets.add(&rows)
    }

    fn log_progress(&self, epoch: usize, step: usize, row: &StepRow) {
        let every = self.facts.cfg.output.log_every;
        if self.g.rank == 0 && every > 0 && (row.global_step + 1) % every == 0 {
            info!(
                "epoch {epoch} step {step}/{} loss {:.4} step {:.1} ms",
                self.facts.schedule.steps_per_epoch,
                row.loss,
                row.step_s * 1e3
            );
        }
    }

    /// NVML sampling of this rank's GPU into `rank-NNNNN.gpu.csv`, when there is one.
    fn start_telemetry(&self) -> Option<GpuSampler> {
        let bus = self.facts.place.gpu_bus_id.as_ref()?;
        let ms = self.facts.cfg.output.telemetry_ms;
        if ms == 0 {
            return None;
        }
        let path = self.facts.folder.path(&record::gpu_file_name(self.g.rank));
        let started = crate::telemetry::NvmlGpu::open(bus)
            .and_then(|gpu| GpuSampler::start_with(gpu, self.g.rank, &path, Duration::from_millis(ms), self.progress.origin));
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
        let (g, m) = (self.g, &self.records.manifest);
        for n in &self.machine.comm.notes {
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
            self.facts.cfg.comm.grad_dtype,
            self.facts.cfg.optim.amp
        );
        let opt = &self.machine.opt;
        info!(
            "optimizer: {:?}, {}",
            self.facts.cfg.optim.optimizer,
            match opt.flat_buckets() {
                0 => "updated parameter by parameter".to_string(),
                n => format!("updated bucket by bucket over {n} of {} flat gradient bucket(s)", m.buckets),
            }
        );
        info!(
            "run {}: {} ranks on {} node(s), {:?}, {} params in {} bucket(s), batch {}×{}, {} steps/epoch, {} epoch(s) → {}",
            m.run_id,
            g.size,
            g.nodes,
            self.facts.place.device,
            m.parameters,
            m.buckets,
            self.facts.cfg.schedule.batch_size,
            g.size,
            self.facts.schedule.steps_per_epoch,
            self.facts.schedule.epochs,
            self.facts.folder.dir.display()
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

/// The run's records: rank 0 keeps room for the last ones and writes the manifest;
/// every rank opens its rows and arms its last gasp. Errors are agreed.
fn open_records(g: &Group, folder: &RunFolder, node_type: &str, manifest: Manifest) -> Result<Records> {
    let reserve = agree(g, (g.rank == 0).then(|| reserve_and_write(&manifest, &folder.dir)).transpose())?;
    let steps_log = agree(g, CsvLog::create_new(&folder.path(&record::rank_file_name(g.rank))))?;
    let epochs_log = agree(g, (g.rank == 0).then(|| CsvLog::create_new(&folder.path("epochs.csv"))).transpose())?;
    let last_gasp = agree(g, arm_last_gasp(g, folder, &manifest)).inspect_err(|_| {
        // Training will not start: no rank's record may say it is running.
        let _ = std::fs::remove_file(folder.path(&record::end_file_name(g.rank)));
    })?;
    Ok(Records {
        manifest,
        steps_log,
        epochs_log,
        offsets: ClockRecord::default(),
        bucket_ready: BucketReady::default(),
        rows: RowIdentity {
            run_id: folder.run_id.clone(),
            rank: g.rank,
            node_type: node_type.to_string(),
            communicates: g.size > 1,
        },
        _reserve: reserve,
        _last_gasp: last_gasp,
        trace: None,
    })
}

/// Rank 0 keeps room for the run's last records ([`reserve`]), then writes the manifest.
fn reserve_and_write(manifest: &Manifest, dir: &std::path::Path) -> Result<Reserve> {
    let bytes = serde_json::to_string_pretty(manifest)?.len() as u64;
    let kept = Reserve::make(dir, bytes)?;
    manifest.write(dir)?;
    Ok(kept)
}

/// The records a stop signal's handler writes ([`last_gasp`]): this rank's end record,
/// written `running` now, and on rank 0 the manifest.
fn arm_last_gasp(g: &Group, folder: &RunFolder, manifest: &Manifest) -> Result<LastGasp> {
    let running = EndRecord {
        run_id: folder.run_id.clone(),
        rank: g.rank,
        host: g.host.clone(),
        status: RunStatus::Running,
        error: None,
        steps: 0,
        time_utc: record::rfc3339_utc(SystemTime::now()),
    };
    running.write(&folder.dir)?;
    let mut targets = vec![(folder.path(&record::end_file_name(g.rank)), Template::end_record(&running)?)];
    if g.rank == 0 {
        targets.push((folder.path("manifest.json"), Template::manifest(manifest)?));
    }
    LastGasp::arm(targets, &folder.path(reserve::RESERVE_FILE), folder.lock())
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
    model::set_memory_format(&vs, cfg.memory_format_on(place.device));
    let params = model::ordered_parameters(&vs);
    let trainable = super::params::check_dtypes(&params, cfg.optim.amp);
    agree(
        g,
        trainable.map_err(|e| anyhow::anyhow!("--model {}: {e}", cfg.workload.model.name())),
    )?;
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
            let per_rank = data::Shard::new(dataset.train.len(), g.size, g.rank, s.seed, 0).len();
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

/// The log line of an epoch: its steps, time and training loss, and its validation, or
/// that there was none (`--val-samples 0`), never a NaN loss for validation that did not run.
fn epoch_line(row: &EpochRow) -> String {
    let head = format!(
        "epoch {}: {} steps in {:.2} s, train loss {:.4}",
        row.epoch, row.steps, row.epoch_s, row.train_loss
    );
    if row.val_samples == 0 {
        format!("{head}, no validation (--val-samples 0)")
    } else {
        format!(
            "{head}, val loss {:.4}, val accuracy {:.2} %",
            row.val_loss,
            row.val_accuracy * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validation that did not run (`--val-samples 0`) is said, not logged as a NaN loss.
    #[test]
    fn an_epoch_without_validation_says_so() {
        let row = EpochRow {
            steps: 30,
            epoch_s: 7.36,
            train_loss: 3.8111,
            ..crate::record::epoch_row_example()
        };
        let line = epoch_line(&row);
        assert_eq!(
            line,
            "epoch 0: 30 steps in 7.36 s, train loss 3.8111, no validation (--val-samples 0)"
        );
        let validated = EpochRow {
            val_loss: 0.5,
            val_accuracy: 0.875,
            val_samples: 64,
            ..row
        };
        assert!(epoch_line(&validated).ends_with("val loss 0.5000, val accuracy 87.50 %"));
    }
}
