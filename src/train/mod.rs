//! `ddpbench train`: the timed data-parallel loop, one process per rank.
//!
//! [`TrainConfig`] is what was asked (validated before MPI starts); a [`Trainer`] runs
//! it on the ranks of a [`Group`]: `setup` (placement, data, model, optimizer,
//! all-reduce, manifest), `run` (epochs of steps, each timed phase by phase through
//! one [`timer::PhaseClock`]: next batch → copy to device → forward → backward →
//! wait for the all-reduce → optimizer; the step returns what it measured and the
//! epoch loop records it), `finish` (the manifest's outcome).
//!
//! It runs as an MPI job ([`crate::job::run_job`]): errors during set-up are agreed
//! across ranks ([`crate::world::agree`]) so every rank exits non-zero with the same
//! message; an error on one rank during training aborts the job so no rank waits
//! forever in a collective.

pub(crate) mod clock;
mod communication;
pub(crate) mod config;
mod faults;
mod file_model;
pub(crate) mod guard;
pub(crate) mod host_memory;
mod manifest;
mod noise;
mod nonfinite;
mod params;
mod placement;
mod recording;
mod run_folder;
mod state;
mod step;
mod target;
pub(crate) mod timer;
mod trainer;
mod validation;

pub(crate) use config::TrainConfig;
pub(crate) use run_folder::RunFolder;
pub(crate) use trainer::Trainer;

use crate::job::{self, watchdog, watchdog::Watchdog, JobOptions};
use crate::world::{AgreedError, Group};
use anyhow::Result;
use std::time::SystemTime;

/// Entry point of `ddpbench train`.
pub fn main(cfg: TrainConfig) -> Result<()> {
    job::check_before_mpi(cfg.validate())?;
    let malloc = host_memory::apply(cfg.placement.malloc);
    let options = JobOptions {
        watchdog_limit_s: cfg.output.watchdog_s.unwrap_or(watchdog::SETUP_LIMIT_S),
        teardown_limit_s: cfg.output.watchdog_s.unwrap_or(watchdog::TEARDOWN_LIMIT_S),
        flags: cfg.launch_flags(),
    };
    job::run_job(options, |job| {
        tracing::debug!("{malloc}");
        train(job.group, &cfg, &malloc, job.watchdog)
    })
}

/// One run on the ranks of `g`, in its own run folder.
/// `malloc` says how the host allocator was set up ([`host_memory::apply`]); `watchdog`
/// watches the collectives (its limits are set as training goes).
pub(crate) fn train(g: &Group, cfg: &TrainConfig, malloc: &str, watchdog: &Watchdog) -> Result<()> {
    let started = SystemTime::now();
    let folder = RunFolder::prepare(g, cfg, started)?;
    watchdog.set_run(watchdog::WatchdogRun {
        dir: folder.dir.clone(),
        run_id: folder.run_id.clone(),
    });
    let mut trainer = match Trainer::setup(g, cfg, folder.clone(), started, malloc, watchdog) {
        Ok(t) => t,
        Err(e) => {
            folder.abandon(g, &e);
            return Err(e);
        }
    };
    match trainer.run() {
        Ok(stopped) => trainer.finish(stopped),
        Err(e) => {
            // The step it stopped in is no longer watched (a study goes on to its next point).
            crate::flight::phase(None);
            trainer.record_failure(&e, e.downcast_ref::<AgreedError>().is_some());
            Err(e)
        }
    }
}
