//! The MPI job harness: what `train`, `study` and `allreduce` share around their own work.
//!
//! [`run_job`] starts MPI ([`World::init`]), logging with the rank ([`logging`]), the
//! hook that turns a panic into one line and an aborted job ([`panic`](mod@panic)), the stop-signal
//! handlers ([`signals`]), the flight recorder ([`crate::flight`]) and the collective
//! [`watchdog`]; it refuses a job whose ranks were started with different flags
//! ([`same_flags`]), then runs the command on a [`Job`] and ends the job one way for
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
//! The watchdog watches the teardown too (closing files, MPI_Finalize, and every rank
//! past MPI_Finalize): a rank that stalls there is named and the job ends ([`end_job`]).
//!
//! The last records a stop signal writes are armed by the command once it has a run
//! folder ([`crate::record::last_gasp`]); the handlers installed here fire them.

mod abort;
pub(crate) mod logging;
mod panic;
pub(crate) mod same_flags;
pub(crate) mod signals;
pub(crate) mod watchdog;

pub(crate) use abort::abort_job;
pub use panic::panic_message;

use crate::world::{AgreedError, Group, World};
use anyhow::Result;
use mpi::collective::CommunicatorCollectives;
use same_flags::LaunchFlags;
use watchdog::Watchdog;

/// What differs between the commands run as an MPI job.
#[derive(Debug, Clone)]
pub(crate) struct JobOptions {
    /// The watchdog's first limit: seconds a collective may take before the job is
    /// declared hung (the command may change it as it goes).
    pub watchdog_limit_s: f64,
    /// The watchdog's limit in the job's teardown (MPI_Finalize and every rank past it).
    pub teardown_limit_s: f64,
    /// The command and flags this rank was started with, compared across ranks first.
    pub flags: LaunchFlags,
}

/// What a command runs on: every rank of the job, and the watchdog watching them.
pub(crate) struct Job<'a> {
    pub group: &'a Group,
    pub watchdog: &'a Watchdog,
}

/// A check made before MPI starts, whose answer every rank finds alike (the command
/// line, a study file): on an error rank 0 returns it for `main` to print, and the other
/// ranks exit 1 at once, so it is printed once.
pub(crate) fn check_before_mpi<T>(checked: Result<T>) -> Result<T> {
    match checked {
        Ok(v) => Ok(v),
        Err(e) if crate::world::launcher_rank().unwrap_or(0) == 0 => Err(e),
        Err(_) => std::process::exit(1),
    }
}

/// The exit status of every rank after an agreed error.
pub(crate) const AGREED_ERROR_EXIT: i32 = 1;

/// Runs `command` as an MPI job on every rank (see the module's documentation for how
/// it ends). Returns Ok on every rank when the command did; on an error it ends the
/// process.
pub(crate) fn run_job(options: JobOptions, command: impl FnOnce(&Job) -> Result<()>) -> Result<()> {
    // The recorder's clock starts with the job, before any collective.
    crate::flight::recorder();
    let world = World::init()?;
    let g = &world.group;
    logging::init(g.rank);
    panic::abort_on_panic(g.rank, &g.host);
    signals::install();
    let _span = tracing::info_span!("rank", r = g.rank).entered();
    let watchdog = Watchdog::start(g, options.watchdog_limit_s);
    let ran = same_flags::check_same_on_every_rank(g, &options.flags).and_then(|()| {
        command(&Job {
            group: g,
            watchdog: &watchdog,
        })
    });
    let Err(err) = ran else {
        end_job(world, watchdog, options.teardown_limit_s);
        return Ok(());
    };
    match err.downcast_ref::<AgreedError>() {
        // Rank 0 speaks: naming itself would add nothing.
        Some(agreed) if agreed.rank == 0 => end_agreed(world, watchdog, options.teardown_limit_s, err),
        Some(agreed) => {
            let origin = agreed.rank;
            end_agreed(
                world,
                watchdog,
                options.teardown_limit_s,
                err.context(format!("rank {origin} reported")),
            )
        }
        None => {
            crate::stderr::say(&format!("Error on rank {} ({}): {err:#}. Aborting the job.", g.rank, g.host));
            abort_job(1)
        }
    }
}

/// The job's teardown, watched: MPI_Finalize as a collective, then every rank past it
/// ([`Watchdog::meet_at_exit`]), within `limit_s`. A rank that does not come is named and
/// the job ends with exit status 3; what the command recorded stays as it is.
fn end_job(world: World, watchdog: Watchdog, limit_s: f64) {
    let rank = world.group.rank;
    // Whatever phase the command left (an error mid-step) is over.
    crate::flight::phase(None);
    watchdog.records_final();
    watchdog.set_limit(limit_s);
    crate::flight::recorder().begin_teardown();
    if stop_at_exit(rank) {
        // SAFETY: raise only signals this process.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
    {
        let _f = crate::flight::enter("MPI_Finalize", "");
        drop(world);
    }
    crate::flight::recorder().mark_finalized();
    watchdog.meet_at_exit();
}

/// `DDPBENCH_STOP_AT_EXIT=RANK`: a test's rank that stalls in teardown, after its
/// records are final and before MPI_Finalize (it stops itself with SIGSTOP, as a rank
/// stuck closing files on a shared file system would stay).
fn stop_at_exit(rank: usize) -> bool {
    std::env::var("DDPBENCH_STOP_AT_EXIT").is_ok_and(|r| r.parse() == Ok(rank))
}

/// Ends every rank after an error every rank holds (each calls this): the ranks' queued
/// log lines first, then rank 0's one message, then MPI_Finalize and the same exit
/// status everywhere. Rank 0 speaks before finalising: `mpirun` kills the ranks still
/// running a few seconds after one has exited non-zero, and Open MPI's MPI_Finalize
/// returns on no rank before every rank has entered it.
fn end_agreed(world: World, watchdog: Watchdog, limit_s: f64, err: anyhow::Error) -> ! {
    crate::stderr::drain();
    {
        let _f = crate::flight::enter("barrier", "before the agreed error is said");
        world.group.comm.barrier();
    }
    if world.group.rank == 0 {
        crate::stderr::say(&format!("Error: {err:#}"));
    }
    end_job(world, watchdog, limit_s);
    crate::stderr::finish();
    std::process::exit(AGREED_ERROR_EXIT)
}
