use clap::Parser;
use ddpbench::cli::{Cli, Command};

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Train(args) => ddpbench::train::main(args),
        Command::Reduce(args) => ddpbench::reduce::main(args),
        Command::Diagnose(args) => ddpbench::diagnose::main(&args.run),
        Command::Topo(args) => ddpbench::topology::main(args),
        Command::GenBigmnist(args) => ddpbench::data::bigmnist::generate(args),
        Command::Models(args) => {
            ddpbench::model::list(&ddpbench::model::ModelOptions {
                seq_len: args.seq_len as i64,
                vocab: args.vocab_size as i64,
                dropout: true,
            });
            Ok(())
        }
    }
}

fn main() {
    if let Err(err) = run() {
        eprintln!("Error: {err:#}");
        std::process::exit(1);
    }
}
