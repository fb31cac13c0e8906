//! Panics in a job, and the one way a job is aborted.

/// Ends every rank of the job with exit status `code`: the hook below, a rank's own
/// error and the watchdog's verdict all end a job here, once this rank's queued lines
/// are written (waiting [`crate::stderr::DRAIN_WAIT`] at most: a full stderr must not
/// keep the job alive). Once MPI_Finalize has returned, MPI can no longer abort: the
/// rank exits with `code`, and the launcher ends the job's other ranks (`mpirun` does
/// when a rank exits non-zero; `srun` with `--kill-on-bad-exit`).
pub fn abort_job(code: i32) -> ! {
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

/// A panic on one rank (libtorch reports most of its errors, out of memory among them,
/// as one) must not leave the others blocked in a collective: the rank says what went
/// wrong in one line and aborts the job.
pub(super) fn abort_on_panic(rank: usize, host: &str) {
    let host = host.to_string();
    std::panic::set_hook(Box::new(move |info| {
        crate::stderr::say(&format!(
            "Error on rank {rank} ({host}): {}. Aborting the job.",
            panic_message(info)
        ));
        abort_job(2)
    }));
}

/// A panic's message in one line for a user: libtorch's error without its C++ trace, an
/// allocation failure with what to lower, and where in ddpbench it happened.
pub fn panic_message(info: &std::panic::PanicHookInfo) -> String {
    let payload = info
        .payload()
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| info.payload().downcast_ref::<&str>().copied())
        .unwrap_or("unknown error");
    let first = payload
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Exception raised from"))
        .unwrap_or(payload)
        .trim_start_matches("called `Result::unwrap()` on an `Err` value: ")
        .to_string();
    let lower = first.to_lowercase();
    let hint = if lower.contains("out of memory") || lower.contains("can't allocate memory") || lower.contains("cannot allocate memory") {
        ": memory ran out; lower --batch-size (or --workers, --synthetic-samples), or use fewer ranks per node"
    } else {
        ""
    };
    let place = info
        .location()
        .map(|l| format!(" (in ddpbench at {}:{})", l.file(), l.line()))
        .unwrap_or_default();
    format!("{first}{hint}{place}")
}
