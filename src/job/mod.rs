//! The MPI job harness: what `train`, `study` and `allreduce` share around their own work.
//!
//! [`run_job`] starts MPI ([`World::init`]), logging with the rank ([`logging`]), the
//! hook that turns a panic into one line and an aborted job ([`panic`]), the stop-signal
//! handlers ([`signals`]), the flight recorder ([`crate::flight`]) and the collective
//! [`watchdog`]; it then runs the command on a [`Job`] and ends the job one way for
//! every command:
//!
//! - an [`AgreedError`] (every rank holds it, see [`crate::world::agree`]): every rank
//!   writes out its queued log lines, rank 0 then prints the error once, every rank
//!   finalises MPI and exits [`AGREED_ERROR_EXIT`] ([`end_agreed`]). No `MPI_Abort`: the
//!   launcher adds only its notice of a non-zero exit, and the message is the last line
//!   ddpbench prints;
//! - any other error (only this rank knows it): the rank prints one line naming itself
//!   and its host, and aborts the whole job ([`abort_job`]), so no rank waits forever in
//!   a collective.
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
use mpi::collective::CommunicatorCollectives;
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

/// The exit status of every rank after an agreed error.
pub const AGREED_ERROR_EXIT: i32 = 1;

/// Runs `command` as an MPI job on every rank (see the module's documentation for how
/// it ends). Returns Ok on every rank when the command did; on an error it ends the
/// process.
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
        // Rank 0 speaks: naming itself would add nothing.
        Some(agreed) if agreed.rank == 0 => end_agreed(world, err),
        Some(agreed) => {
            let origin = agreed.rank;
            end_agreed(world, err.context(format!("rank {origin} reported")))
        }
        None => {
            crate::stderr::say(&format!("Error on rank {} ({}): {err:#}. Aborting the job.", g.rank, g.host));
            abort_job(1)
        }
    }
}

/// Ends every rank after an error every rank holds (each calls this): the ranks' queued
/// log lines first, then rank 0's one message, then MPI_Finalize and the same exit
/// status everywhere. Rank 0 speaks before finalising: `mpirun` kills the ranks still
/// running a few seconds after one has exited non-zero, and Open MPI's MPI_Finalize
/// returns on no rank before every rank has entered it.
fn end_agreed(world: World, err: anyhow::Error) -> ! {
    let g = &world.group;
    crate::stderr::drain();
    {
        let _f = crate::flight::enter("barrier", "before the agreed error is said");
        g.comm.barrier();
    }
    if g.rank == 0 {
        crate::stderr::say(&format!("Error: {err:#}"));
    }
    drop(world);
    crate::stderr::finish();
    std::process::exit(AGREED_ERROR_EXIT)
}
