//! `ddpbench trace RUN_DIR`, and `reduce` on a traced run: every rank's trace file
//! (`train --trace` writes them) merged on rank 0's clock into `timeline.json` ([`merge`]),
//! corrected by the same [`super::read::ClockOffsets`] that `reduce` compares the
//! ranks' CSV times with (exact offsets where ranks share rank 0's kernel).

pub(crate) mod merge;
pub(crate) mod picture;
pub(crate) mod read;

use crate::trace::files::TRACE_DIR;
use crate::trace::StepWindow;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// `ddpbench trace RUN_DIR`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A run folder written by `ddpbench train --trace`: its trace/rank-*.trace.json files
    /// are merged into RUN_DIR/timeline.json on rank 0's clock (open it in Perfetto UI or
    /// chrome://tracing). Each file is read a line at a time, so memory does not grow with
    /// it; a line that is not a whole event of its rank is skipped, and stderr says how
    /// many and why, per rank, as it says where a rank's trace stopped at its size bound.
    /// timeline.json is replaced only once written whole; only regular files are read.
    pub run_dir: PathBuf,

    /// Also draw the timeline as a PNG, to FILE (default RUN_DIR/timeline.png; give
    /// --png after RUN_DIR): one lane per rank, the phases of each step coloured in its
    /// upper row, the all-reduce in its lower row (blue while backward still runs, pink
    /// once exposed), time in ms on rank 0's clock, a legend under the axis. At most 64
    /// ranks (ranks 0-63) and 20 steps are drawn: the first 20 of --png-steps, or of the
    /// trace; stderr says how many traced steps were left out. The picture is 1400 px
    /// wide and 150 px plus 36 px a rank high (16 px a rank beyond 16 ranks). FILE is
    /// never overwritten: an existing FILE (or a link, a FIFO) is refused before the merge.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub png: Option<Option<PathBuf>>,

    /// The global steps the PNG draws, A to B (B excluded), as --trace-steps counts them;
    /// the first 20 are drawn. Default: the first 20 steps the trace holds.
    #[arg(long, value_name = "A:B", requires = "png", value_parser = png_steps)]
    pub png_steps: Option<StepWindow>,

    /// Clear the run folder's lock (`.ddpbench.lock`) when the job that took it cannot be
    /// checked from here (another host) and you know it has ended. A merge holds the lock
    /// while it writes timeline.json, so two merges of one run never write it at once.
    #[arg(long)]
    pub break_lock: bool,
}

/// `--png-steps A:B`, read as `--trace-steps` is.
fn png_steps(s: &str) -> Result<StepWindow, String> {
    s.parse::<StepWindow>().map_err(|e| e.replace("--trace-steps", "--png-steps"))
}

/// Entry point of `ddpbench trace`.
pub fn main(args: TraceArgs) -> Result<()> {
    let Some(png) = &args.png else {
        report(&merge::merge(&args.run_dir, args.break_lock)?);
        return Ok(());
    };
    let path = png.clone().unwrap_or_else(|| args.run_dir.join("timeline.png"));
    // Created first, so a path that cannot be written is refused before the merge.
    let file = crate::files::create_exclusive(&path).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
            "something is there already, and it is never overwritten: remove it or give another FILE".to_string()
        } else {
            format!("{e}: give a FILE in a folder you can write")
        };
        anyhow::anyhow!("cannot create the PNG {}: {why}", path.display())
    })?;
    let drawn = draw(&args, file);
    if drawn.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    let (first, last, left_out) = drawn.with_context(|| format!("no PNG drawn ({} removed)", path.display()))?;
    println!("{}: steps {first}-{last} drawn", path.display());
    if left_out > 0 {
        eprintln!(
            "{left_out} traced step(s) of the window not drawn: a picture shows at most {} steps; \
             choose others with --png-steps A:B",
            picture::MAX_STEPS_DRAWN
        );
    }
    Ok(())
}

/// Merges the timeline, drawing the steps asked for into `file`: the steps drawn, first
/// and last, and how many traced steps of the window were left out.
fn draw(args: &TraceArgs, mut file: std::fs::File) -> Result<(usize, usize, usize)> {
    let mut pic = picture::Picture::new(args.png_steps);
    let m = merge::merge_seeing(&args.run_dir, args.break_lock, &mut |rank, e| pic.see(rank, e))?;
    report(&m);
    let run = args.run_dir.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned());
    let bytes = crate::plot::Rasteriser::new().png(&pic.svg(&run)?)?;
    std::io::Write::write_all(&mut file, &bytes).context("cannot write the PNG")?;
    let (first, last) = pic.drawn().unwrap_or_default();
    Ok((first, last, pic.left_out()))
}

/// After `reduce`: merges the timeline of every run folder given that holds traces.
pub(crate) fn merge_traced(runs: &[PathBuf]) -> Result<()> {
    for dir in runs.iter().filter(|d| d.join(TRACE_DIR).is_dir()) {
        report(&merge::merge(dir, false)?);
    }
    Ok(())
}

/// Most ranks named one per line in what a merge says; the rest are counted, and
/// timeline.json's `otherData` lists every one.
const RANKS_NAMED: usize = 8;
/// About what Perfetto's UI loads in one browser tab.
const PERFETTO_TAB_BYTES: u64 = 2_000_000_000;

/// Logs what a merge wrote, which ranks' files were cut short or absent, where a rank's
/// trace stops at its byte bound, and what lines were skipped.
pub(crate) fn report(m: &merge::Merged) {
    println!("{}: {} events of {} rank(s) on one clock", m.path.display(), m.events, m.ranks);
    if !m.partial.is_empty() {
        eprintln!(
            "rank(s) {:?} stopped before the run completed their trace: their events up to the last whole one are merged",
            m.partial
        );
    }
    if !m.missing.is_empty() {
        eprintln!("rank(s) {:?} left no trace file", m.missing);
    }
    for (rank, step, bound) in m.stopped.iter().take(RANKS_NAMED) {
        eprintln!(
            "trace of rank {rank} stops at step {step}: its file reached the per-rank bound of {bound} bytes; \
             the steps before are merged whole"
        );
    }
    for (rank, s) in m.skipped.iter().take(RANKS_NAMED) {
        eprintln!(
            "rank {rank}: {} line(s) of {}/{} skipped, not whole events of this rank ({}{})",
            s.count,
            TRACE_DIR,
            crate::trace::files::file_name(*rank),
            s.first.join("; "),
            if s.count > s.first.len() { "; ..." } else { "" }
        );
    }
    let more = m.stopped.len().saturating_sub(RANKS_NAMED) + m.skipped.len().saturating_sub(RANKS_NAMED);
    if more > 0 {
        eprintln!("... and {more} more as above: otherData in {} names every rank", m.path.display());
    }
    if m.bytes > PERFETTO_TAB_BYTES {
        eprintln!(
            "{} is {:.1} GB, more than Perfetto's UI holds in one tab (about 2 GB): trace fewer steps \
             (--trace-steps A:B) or open it with Perfetto's trace_processor",
            m.path.display(),
            m.bytes as f64 / 1e9
        );
    }
}
