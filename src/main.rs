use clap::Parser;
use ddpbench::cli::{Cli, Command};

fn run() -> anyhow::Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Under a launcher every rank parses the same line: rank 0 says what is wrong.
        #[cfg(feature = "train")]
        Err(e) if e.use_stderr() && ddpbench::world::launcher_rank().is_some_and(|r| r != 0) => std::process::exit(e.exit_code()),
        Err(e) => e.exit(),
    };
    match cli.command {
        #[cfg(feature = "train")]
        Command::Train(args) => ddpbench::train::main(args),
        #[cfg(feature = "train")]
        Command::Study(args) => ddpbench::study::main(args),
        #[cfg(feature = "train")]
        Command::Allreduce(args) => ddpbench::allreduce::main(args),
        Command::Reduce(args) => ddpbench::reduce::main(args),
        #[cfg(feature = "train")]
        Command::Loader(args) => ddpbench::data::pipeline::main(args),
        Command::Compare(args) => ddpbench::compare::main(args),
        Command::Diagnose(args) => ddpbench::diagnose::main(args),
        Command::Trace(args) => ddpbench::reduce::timeline::main(args),
        #[cfg(feature = "train")]
        Command::Topo(args) => ddpbench::topology::main(args),
        #[cfg(feature = "train")]
        Command::GenBigmnist(args) => ddpbench::data::bigmnist::generate(args),
        #[cfg(feature = "train")]
        Command::Models(args) => ddpbench::model::main(args),
    }
}

/// A panic's message in one line for a user (with the trainer: libtorch's error without
/// its C++ trace, and what to lower when memory ran out).
fn panic_message(info: &std::panic::PanicHookInfo) -> String {
    #[cfg(feature = "train")]
    return ddpbench::job::panic_message(info);
    #[cfg(not(feature = "train"))]
    {
        let place = info.location().map(|l| format!(" (in ddpbench at {}:{})", l.file(), l.line()));
        format!("{}{}", info.payload_as_str().unwrap_or("unknown error"), place.unwrap_or_default())
    }
}

fn main() {
    // A panic outside an MPI job (where the job's own hook also aborts the job,
    // `ddpbench::job`) is one line for the user, not a trace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("Error: {}. This is a ddpbench bug: please report it", panic_message(info));
    }));
    let code = match run() {
        Ok(()) => 0,
        Err(err) => {
            ddpbench::stderr::say(&format!("Error: {err:#}"));
            // Bad input refused before anything is written is a usage error, as clap's own are.
            if err.is::<ddpbench::compare::Refusal>() {
                ddpbench::compare::REFUSAL_EXIT
            } else {
                1
            }
        }
    };
    // Queued log lines are written (or, when stderr is full, counted) before the end.
    ddpbench::stderr::finish();
    std::process::exit(code)
}
