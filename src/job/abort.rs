//! The one way a job is aborted. It imports nothing of `job` itself, so the watchdog,
//! the panic hook and `run_job` all reach it from below.

/// Ends every rank of the job with exit status `code`: the panic hook, a rank's own
/// error and the watchdog's verdict all end a job here, once this rank's queued lines
/// are written (waiting [`crate::stderr::DRAIN_WAIT`] at most: a full stderr must not
/// keep the job alive). Once MPI_Finalize has returned, MPI can no longer abort: the
/// rank exits with `code`, and the launcher ends the job's other ranks (`mpirun` does
/// when a rank exits non-zero; `srun` with `--kill-on-bad-exit`).
pub(crate) fn abort_job(code: i32) -> ! {
    // The scratch folder and the folder locks this process holds go first.
    crate::cleanup::on_abort();
    crate::stderr::finish();
    if crate::flight::recorder().finalized() {
        std::process::exit(code)
    }
    // SAFETY: MPI is initialised (every caller runs inside `run_job`, after World::init);
    // MPI_Abort ends every rank of the job, which a rank that cannot go on needs, since
    // its peers may be waiting in a collective.
    unsafe {
        mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}
