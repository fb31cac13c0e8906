//! The MPI job harness: what `train`, `study` and `allreduce` share around their own work.
//!
//! [`run_job`] starts MPI ([`World::init`]), logging with the rank ([`logging`]), the
//! hook that turns a panic into one line and an aborted job ([`panic`]), the stop-signal
//! handlers ([`signals`]), the flight recorder ([`crate::flight`]) and the collective
//! [`watchdog`]; it then runs the command on a [`Job`] and ends the job one way for
//! every command:
//!
//! - an [`AgreedError`] (every rank holds it, see [`crate::world::agree`]): MPI is
//!   finalised on every rank, rank 0 returns the error for `main` to print once, and the
//!   other ranks exit 1 without a word;
//! - any other error: the rank prints one line naming itself and its host, and aborts
//!   the whole job ([`abort_job`]), so no rank waits forever in a collective.
//!
//! The last records a stop signal writes are armed by the command once it has a run
//! folder ([`crate::record::last_gasp`]); the handlers installed here fire them.

pub mod logging;
mod panic;
pub mod signals;
pub mod watchdog;

pub use panic::{abort_job, panic_message};

use crate::world::{AgreedError, Group, World};
use anyhow::Result;
use watchdog::Watchdog;

/// What differs between the commands run as an MPI job.
#[derive(Debug, Clone, Copy)]
pub struct JobOptions {
    /// The watchdog's first limit: seconds a collective may take before the job is
    /// declared hung (the command may change it as it goes).
    pub watchdog_limit_s: f64,
}

/// What a command runs on: every rank of the job, and the watchdog watching them.
pub struct Job<'a> {
    pub group: &'a Group,
    pub watchdog: &'a Watchdog,
}

/// A check made before MPI starts, whose answer every rank finds alike (the command
/// line, a study file): on an error rank 0 returns it for `main` to print, and the other
/// ranks exit 1 at once, so it is printed once.
pub fn check_before_mpi<T>(checked: Result<T>) -> Result<T> {
    match checked {
        Ok(v) => Ok(v),
        Err(e) if crate::world::launcher_rank().unwrap_or(0) == 0 => Err(e),
        Err(_) => std::process::exit(1),
    }
}

/// Runs `command` as an MPI job on every rank (see the module's documentation for how
/// it ends). Returns Ok on every rank when the command did, the agreed error on rank 0.
pub fn run_job(options: JobOptions, command: impl FnOnce(&Job) -> Result<()>) -> Result<()> {
    // The recorder's clock starts with the job, before any collective.
    crate::flight::recorder();
    let world = World::init()?;
    let g = &world.group;
    logging::init(g.rank);
    panic::abort_on_panic(g.rank, &g.host);
    signals::install();
    let _span = tracing::info_span!("rank", r = g.rank).entered();
    let watchdog = Watchdog::start(g, options.watchdog_limit_s);
    let Err(err) = command(&Job {
        group: g,
        watchdog: &watchdog,
    }) else {
        return Ok(());
    };
    drop(watchdog);
    match err.downcast_ref::<AgreedError>() {
        Some(agreed) => {
            let (rank, origin) = (g.rank, agreed.rank);
            drop(world); // MPI_Finalize: every rank reached this point.
            match rank {
                // Rank 0 speaks: naming itself would add nothing.
                0 if origin == 0 => Err(err),
                0 => Err(err.context(format!("rank {origin} reported"))),
                _ => std::process::exit(1),
            }
        }
        None => {
            crate::stderr::say(&format!("Error on rank {} ({}): {err:#}. Aborting the job.", g.rank, g.host));
            abort_job(1)
        }
    }
}
