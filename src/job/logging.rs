//! Log lines on stderr through `tracing`: rank 0 at `info`, the other ranks at `warn`
//! (so a job of many ranks prints each fact once), `DDPBENCH_LOG` to change either;
//! each line written whole between redraws of the progress bars ([`crate::progress`]),
//! coloured only on a terminal that allows it ([`crate::progress::colours_allowed`]).
//! Lines reach stderr through a queue that never holds up the caller
//! ([`crate::stderr`]): a line that finds it full is dropped and counted.

use tracing_subscriber::EnvFilter;

/// Starts logging for the process of rank `rank` (0 outside MPI). A second call keeps
/// the first set-up.
pub(crate) fn init(rank: usize) {
    let default = if rank == 0 { "info" } else { "warn" };
    let filter = EnvFilter::try_from_env("DDPBENCH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    crate::stderr::set_label(&format!("ddpbench rank {rank}"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && crate::progress::colours_allowed())
        .with_writer(crate::progress::LogWriter)
        .try_init();
}
