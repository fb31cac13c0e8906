//! Signals that ask a run to stop: SIGINT (Ctrl-C), SIGTERM (scancel, Slurm's time
//! limit, mpirun passing either on) and SIGUSR1/SIGUSR2 (`sbatch --signal`). The handler
//! records the signal and writes the run's last records ([`crate::record::last_gasp`]),
//! in case the rank is ended before its step does; the training loop sees the signal
//! between steps, the ranks agree to stop after the same step, and the run ends as
//! `interrupted` with every row kept, its records rewritten with that outcome. During the
//! study's dry run the handler also removes the dry run's scratch folder and ends the
//! process ([`crate::cleanup::on_signal`]).

use std::sync::atomic::{AtomicI32, Ordering};

/// The last stop signal received, 0 for none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // An atomic store is async-signal-safe, and so is the last record's write.
    RECEIVED.store(sig, Ordering::SeqCst);
    crate::record::last_gasp::fire(name_bytes(sig));
    // A scratch folder armed (the study's dry run) is removed, and the process ends.
    crate::cleanup::on_signal(sig);
}

/// The signals that stop a run: those above, and SIGHUP (the terminal closed) and SIGQUIT
/// (Ctrl-\), which would otherwise end the process with no record and leave the dry
/// run's scratch folder.
pub(crate) const STOP_SIGNALS: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGHUP,
    libc::SIGQUIT,
];

/// Signals a job may have been started with ignored (`nohup` ignores SIGHUP, a shell's
/// background job SIGQUIT): an ignored one stays ignored, so `nohup mpirun ...` survives
/// the terminal closing as the user asked.
const KEPT_IF_IGNORED: [libc::c_int; 2] = [libc::SIGHUP, libc::SIGQUIT];

/// Installs the handler for [`STOP_SIGNALS`] (after MPI_Init, so it replaces any MPI's).
pub(crate) fn install() {
    for sig in STOP_SIGNALS {
        if KEPT_IF_IGNORED.contains(&sig) && ignored(sig) {
            continue;
        }
        // SAFETY: `on_signal` is an extern "C" fn that only stores to an atomic.
        unsafe {
            libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// Whether `sig` is ignored in this process now.
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The stop signal this process received, if any.
pub(crate) fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `SIGTERM` for 15, and so on.
pub(crate) fn name(sig: i32) -> String {
    match name_bytes(sig) {
        b"a signal" => format!("signal {sig}"),
        known => String::from_utf8_lossy(known).into_owned(),
    }
}

/// The name of a stop signal without allocating (for the handler).
fn name_bytes(sig: i32) -> &'static [u8] {
    match sig {
        libc::SIGINT => b"SIGINT",
        libc::SIGTERM => b"SIGTERM",
        libc::SIGUSR1 => b"SIGUSR1",
        libc::SIGUSR2 => b"SIGUSR2",
        libc::SIGHUP => b"SIGHUP",
        libc::SIGQUIT => b"SIGQUIT",
        _ => b"a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_is_recorded_not_fatal() {
        let _turn = crate::cleanup::test_turn();
        install();
        assert_eq!(received(), None);
        // SAFETY: raising a signal whose handler was just installed.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert_eq!(received(), Some(libc::SIGUSR2));
        assert_eq!(name(libc::SIGUSR2), "SIGUSR2");
        RECEIVED.store(0, Ordering::SeqCst);
    }

    #[test]
    fn an_ignored_hangup_stays_ignored_and_a_default_one_stops_the_run() {
        let _turn = crate::cleanup::test_turn();
        // SAFETY: setting dispositions of this test process, restored below.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        unsafe { libc::signal(libc::SIGQUIT, libc::SIG_DFL) };
        install();
        assert!(ignored(libc::SIGHUP), "nohup's SIGHUP stays ignored");
        // SAFETY: SIGQUIT's handler was just installed.
        unsafe { libc::raise(libc::SIGQUIT) };
        assert_eq!(received(), Some(libc::SIGQUIT));
        assert_eq!(name(libc::SIGQUIT), "SIGQUIT");
        RECEIVED.store(0, Ordering::SeqCst);
        // SAFETY: as above.
        unsafe {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
        }
    }
}
