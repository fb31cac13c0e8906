//! `ddpbench compare A B`: two reports (`reduce`'s report.json, e.g. from two clusters)
//! side by side, per workload and shape: step time, phases, throughput, speedup and bus
//! bandwidth, with ratios B / A and intervals where both sides have repeats; one
//! sentence on the biggest difference; a refusal naming what differs when they share
//! no point. Written: the terminal table, compare.md and compare.csv in a new folder.

mod points;
mod read;
mod write;

use clap::Args;
use std::path::PathBuf;

/// `ddpbench compare --help`'s long text.
pub(crate) const LONG_ABOUT: &str = "Compare two reports side by side, e.g. the same study run on two clusters.\n\n\
A and B are each a folder `ddpbench reduce` wrote (holding report.json) or a report.json itself. \
Runs are matched by workload and shape: their comparison key (model, data set, batch, precision, \
optimizer, backend, overlap, ...) and rank count; threads per rank and data workers may differ, \
since they follow each machine's cores (the table names both sides'). For every point in both: \
step time, phases, throughput, speedup and bus bandwidth of A and of B, and B / A. Where both \
sides have 2 or more repeats, the ratios of throughput, step time and each phase get a 95 % \
t-interval on the logs of the runs' values (Welch), and a direction (B faster or slower) only \
when that interval excludes 1.\n\n\
Reports that share no point are refused with the fields that differ. Exit status 2 for \
every refusal (bad input), with nothing written.\n\n\
Example:\n  ddpbench compare results/v100-report results/a40-report --out results/v100-vs-a40";

/// `ddpbench compare`'s command line.
#[derive(Args, Debug, Clone)]
#[command(long_about = LONG_ABOUT)]
pub struct CompareArgs {
    /// The first report: a folder `ddpbench reduce` wrote, or its report.json (ratios are B / A).
    pub a: PathBuf,
    /// The second report, likewise.
    pub b: PathBuf,
    /// A new folder for compare.md and compare.csv (default: ./compare, or ./compare-2, ...
    /// the first that does not exist). An existing folder is refused: nothing is overwritten.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Clear the --out folder's lock (`.ddpbench.lock`) when the job that took it cannot
    /// be checked from here (another host) and you know it has ended.
    #[arg(long)]
    pub break_lock: bool,
}

/// Bad input (to `compare`, a study file's report keys): said in one line, exit status 2,
/// nothing written.
#[derive(Debug)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// The exit status of a [`Refusal`].
pub const REFUSAL_EXIT: i32 = 2;

/// Runs `ddpbench compare`.
pub fn main(args: CompareArgs) -> anyhow::Result<()> {
    let a = read::side(&args.a)?;
    let b = read::side(&args.b)?;
    let (shared, only) = points::compare(&a.report, &b.report)?;
    // Each side with what it ran on, so that the figures are read against their hardware.
    let labels = (
        format!("{} ({})", a.file.display(), a.report.hardware()),
        format!("{} ({})", b.file.display(), b.report.hardware()),
    );
    let sentence = write::biggest_difference(&shared);
    crate::cleanup::install_report_signals();
    let dir = write::new_folder(args.out.as_deref())?;
    // The folder was made here: it is removed again when nothing can be written, so
    // that the same --out can be given again.
    let mut folder = crate::out_folder::OutFolder::open_created(&dir, "compare folder", args.break_lock, "ddpbench compare", true)?;
    let files = folder.files();
    files.write("compare.md", write::markdown(&labels, &shared, &only, &sentence).as_bytes())?;
    files.write("compare.csv", &write::csv(&shared)?)?;
    folder.commit()?;
    // Models, data sets and labels come from the reports: no control character of theirs reaches the terminal.
    print!("{}", crate::escape::terminal(&write::terminal(&labels, &shared, &only, &sentence)));
    println!(
        "wrote {} and {}",
        dir.join("compare.md").display(),
        dir.join("compare.csv").display()
    );
    Ok(())
}
