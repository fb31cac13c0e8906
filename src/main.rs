use clap::Parser;
use ddpbench::cli::{Cli, Command};

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Train(args) => ddpbench::train::main(args),
        Command::Reduce(args) => ddpbench::reduce::main(args),
        Command::Topo(args) => ddpbench::topology::main(args),
    }
}

fn main() {
    if let Err(err) = run() {
        eprintln!("Error: {err:#}");
        std::process::exit(1);
    }
}
