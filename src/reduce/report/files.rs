//! The files written from a [`Report`]: the CSV tables, report.json, report.md, the plots.
//! They replace a previous report all together or not at all ([`OutFolder`]): the folder
//! is locked while they are staged and put in place, a full disk or any other error on
//! the way leaves every file of the folder as it was, and the files of the previous
//! report that this one does not write again are removed.

use super::{html, markdown::markdown, plots, Report};
use crate::files::StagedFiles;
use crate::out_folder::OutFolder;
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;

/// Writes every file of `report` into `out` (created when absent): summary.csv,
/// scaling.csv, ranks.csv, times.csv, compute_comm_grid.csv, projection.csv (when something was projected),
/// report.md, report.html, report.json and, with `with_plots`, the SVG and PNG plots; each file is replaced only
/// once all of them are written. report.html is kept under [`html::PAGE_BYTES_MAX`]
/// ([`write_within`]). Returns what was done to keep it there (empty when nothing was);
/// Err names the file that could not be written.
pub fn write(report: &Report, out: &Path, with_plots: bool) -> Result<Vec<String>> {
    write_within(report, out, with_plots, &html::PageLimits::default())
}

/// [`write`](fn@write) with report.html and the heatmaps bounded by `limits`.
pub fn write_within(report: &Report, out: &Path, with_plots: bool, limits: &html::PageLimits) -> Result<Vec<String>> {
    write_locked(report, out, with_plots, limits, false, false)
}

/// [`write_within`], clearing a lock of `out` whose holder cannot be checked from here
/// when `break_lock` (`--break-lock`).
/// `created`: `out` is a folder this process just made for the report and armed for the
/// stop signals' handler (removed again when nothing is written).
pub(crate) fn write_locked(
    report: &Report,
    out: &Path,
    with_plots: bool,
    limits: &html::PageLimits,
    break_lock: bool,
    created: bool,
) -> Result<Vec<String>> {
    let mut folder = if created {
        OutFolder::open_created(out, "report folder", break_lock, "ddpbench reduce", true)?
    } else {
        OutFolder::open(out, "report folder", break_lock, "ddpbench reduce")?
    };
    let notes = stage_within(report, folder.files(), with_plots, limits).with_context(|| not_written(out))?;
    folder.commit().with_context(|| not_written(out))?;
    Ok(notes)
}

/// The files [`stage_within`] writes besides projection.csv and the plots: the one list
/// that the terminal's "wrote" line and `reduce --out`'s help are checked against.
pub(crate) const REPORT_FILES: [&str; 8] = [
    "summary.csv",
    "scaling.csv",
    "ranks.csv",
    "times.csv",
    "compute_comm_grid.csv",
    "report.md",
    "report.json",
    "report.html",
];

/// Written when a workload was projected.
pub(crate) const PROJECTION_FILE: &str = "projection.csv";

/// Stages every file of `report` into `files` ([`write`](fn@write)'s files), for a caller that
/// commits them with files of its own (a study's summary beside its report); returns
/// what was done to keep report.html under its bound.
pub fn stage(report: &Report, files: &mut StagedFiles, with_plots: bool) -> Result<Vec<String>> {
    stage_within(report, files, with_plots, &html::PageLimits::default())
}

/// [`stage`] with report.html and the heatmaps bounded by `limits`.
pub fn stage_within(report: &Report, files: &mut StagedFiles, with_plots: bool, limits: &html::PageLimits) -> Result<Vec<String>> {
    let [summary, scaling, ranks, times, grid, md, json, page_file] = REPORT_FILES;
    files.write(summary, &csv_bytes(&report.summary)?)?;
    files.write(scaling, &csv_bytes(&report.scaling)?)?;
    files.write(ranks, &csv_bytes(&report.ranks)?)?;
    files.write(times, &csv_bytes(&super::times::rows(&report.runs))?)?;
    files.write(grid, &csv_bytes(&super::compute_comm_grid::cells(&report.runs))?)?;
    let projected = report.projection.as_ref().filter(|p| !p.rows.is_empty());
    if let Some(p) = projected {
        files.write(PROJECTION_FILE, &csv_bytes(&p.rows)?)?;
    }
    files.write(md, markdown(report, with_plots).as_bytes())?;
    let text = serde_json::to_string_pretty(report).context("cannot format report.json")? + "\n";
    files.write(json, text.as_bytes())?;
    let pictures = plots::pictures(report, limits.heatmap)?;
    let page = html::page(report, &pictures, with_plots, limits);
    files.write(page_file, page.html.as_bytes())?;
    if with_plots {
        plots::plots(&crate::plot::Rasteriser::new(), files, &pictures)?;
    }
    Ok(page.notes)
}

/// What an error while staging leaves: the folder's files as they were.
pub(crate) fn not_written(out: &Path) -> String {
    format!(
        "the report was not written: every file in {} is as it was (free some space, or give another --out)",
        out.display()
    )
}

/// A CSV file of `rows`, each cell as [`crate::record::Cells`] writes it (plain
/// decimals, lists joined): a header and a line per row, nothing without rows.
pub(crate) fn csv_bytes<R: Serialize>(rows: &[R]) -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(crate::record::Cells(r)).context("cannot format a table row")?;
    }
    w.into_inner().map_err(|e| anyhow::anyhow!("cannot format a table: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reduce --out`'s help names every file the report writes.
    #[test]
    fn the_out_help_names_every_report_file() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        let reduce = cmd.find_subcommand("reduce").expect("the reduce command");
        let out = reduce.get_arguments().find(|a| a.get_id() == "out").expect("--out");
        let help = out.get_help().expect("--out's help").to_string();
        for name in REPORT_FILES.iter().chain([&PROJECTION_FILE]) {
            assert!(help.contains(name), "--out's help lacks {name}: {help}");
        }
    }
}
