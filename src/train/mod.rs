//! `ddpbench train`: the timed data-parallel loop, one process per rank.
//!
//! [`TrainConfig`] is what was asked (validated before MPI starts); a [`Trainer`] runs
//! it on the ranks of a [`Group`]: `setup` (placement, data, model, optimizer,
//! all-reduce, manifest), `run` (epochs of steps, each timed phase by phase through
//! one [`timer::PhaseTimer`]: next batch → copy to device → forward → backward →
//! wait for the all-reduce → optimizer), `finish` (the manifest's outcome).
//!
//! Errors during set-up are agreed across ranks ([`crate::world::agree`]) so every rank
//! exits non-zero with the same message; an error on one rank during training takes
//! the job down with MPI_Abort so no rank waits forever in a collective.

pub mod clock;
mod communication;
pub mod config;
mod faults;
mod file_model;
pub mod host_memory;
mod manifest;
mod params;
mod placement;
mod run_folder;
pub mod signals;
mod step;
pub mod timer;
mod trainer;
mod validation;
pub mod watchdog;

pub use communication::shared_gpu;
pub use config::TrainConfig;
pub use run_folder::RunFolder;
pub use trainer::Trainer;

use crate::world::{AgreedError, Group, World};
use anyhow::Result;
use std::time::SystemTime;
use watchdog::Watchdog;

/// Entry point of `ddpbench train`.
pub fn main(cfg: TrainConfig) -> Result<()> {
    if let Err(e) = cfg.validate() {
        // Every rank finds the same error before MPI starts: rank 0 says it.
        if crate::world::launcher_rank().unwrap_or(0) == 0 {
            return Err(e);
        }
        std::process::exit(1);
    }
    let malloc = host_memory::apply(cfg.placement.malloc);
    let world = World::init()?;
    let g = &world.group;
    init_logging(g.rank);
    install_abort_on_panic(g.rank, &g.host);
    signals::install();
    let _span = tracing::info_span!("rank", r = g.rank).entered();
    tracing::debug!("{malloc}");
    let watchdog = Watchdog::start(g, cfg.output.watchdog_s.unwrap_or(watchdog::SETUP_LIMIT_S));
    match train(g, &cfg, &malloc, &watchdog) {
        Ok(()) => Ok(()),
        Err(err) => match err.downcast_ref::<AgreedError>() {
            Some(agreed) => {
                let (rank, origin) = (g.rank, agreed.rank);
                drop(watchdog);
                drop(world); // MPI_Finalize: every rank reached this point.
                if rank == 0 {
                    Err(err.context(format!("rank {origin} reported")))
                } else {
                    std::process::exit(1)
                }
            }
            None => {
                drop(watchdog);
                eprintln!("Error on rank {} ({}): {err:#}. Aborting the job.", g.rank, g.host);
                mpi::topology::Communicator::abort(&g.comm, 1)
            }
        },
    }
}

/// One run on the ranks of `g`, in its own run folder.
/// `malloc` says how the host allocator was set up ([`host_memory::apply`]); `watchdog`
/// watches the collectives (its limits are set as training goes).
pub fn train(g: &Group, cfg: &TrainConfig, malloc: &str, watchdog: &Watchdog) -> Result<()> {
    let started = SystemTime::now();
    let folder = RunFolder::prepare(g, cfg, started)?;
    watchdog.set_run(watchdog::RunFiles {
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
            trainer.record_failure(&e, e.downcast_ref::<AgreedError>().is_some());
            Err(e)
        }
    }
}

pub(crate) fn init_logging(rank: usize) {
    use tracing_subscriber::EnvFilter;
    let default = if rank == 0 { "info" } else { "warn" };
    let filter = EnvFilter::try_from_env("DDPBENCH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// A panic on one rank (libtorch reports most of its errors, out of memory among them,
/// as one) must not leave the others blocked in a collective: the rank says what went
/// wrong in one line and aborts the job.
pub(crate) fn install_abort_on_panic(rank: usize, host: &str) {
    let host = host.to_string();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!("Error on rank {rank} ({host}): {}. Aborting the job.", crate::panic_message(info));
        // SAFETY: MPI is initialised (the hook is installed after World::init).
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 2);
        }
    }));
}
