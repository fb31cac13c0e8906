//! Signals that ask a run to stop: SIGINT (Ctrl-C), SIGTERM (scancel, Slurm's time
//! limit, mpirun passing either on) and SIGUSR1/SIGUSR2 (`sbatch --signal`). The handler
//! only records the signal; the training loop sees it between steps, the ranks agree to
//! stop after the same step, and the run ends as `interrupted` with every row kept.

use std::sync::atomic::{AtomicI32, Ordering};

/// The last stop signal received, 0 for none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // An atomic store is async-signal-safe.
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2];

/// Installs the handler for [`STOP_SIGNALS`] (after MPI_Init, so it replaces any MPI's).
pub fn install() {
    for sig in STOP_SIGNALS {
        // SAFETY: `on_signal` is an extern "C" fn that only stores to an atomic.
        unsafe {
            libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// The stop signal this process received, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `SIGTERM` for 15, and so on.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_is_recorded_not_fatal() {
        install();
        assert_eq!(received(), None);
        // SAFETY: raising a signal whose handler was just installed.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert_eq!(received(), Some(libc::SIGUSR2));
        assert_eq!(name(libc::SIGUSR2), "SIGUSR2");
        RECEIVED.store(0, Ordering::SeqCst);
    }
}
