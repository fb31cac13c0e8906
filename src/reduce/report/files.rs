//! The files written from a [`Report`]: the CSV tables, report.json, report.md, the plots.

use super::{markdown::markdown, plots, projection, Report};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;

/// Writes every file of `report` into `out` (created when absent): summary.csv,
/// scaling.csv, ranks.csv, projection.csv (when something was projected), report.md,
/// report.json and, with `with_plots`, the SVG and PNG plots.
pub fn write(report: &Report, out: &Path, with_plots: bool) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_csv(&out.join("summary.csv"), &report.summary)?;
    write_csv(&out.join("scaling.csv"), &report.scaling)?;
    write_csv(&out.join("ranks.csv"), &report.ranks)?;
    let projected = report.projection.as_ref().filter(|p| !p.rows.is_empty());
    if let Some(p) = projected {
        write_csv(&out.join("projection.csv"), &p.rows)?;
    }
    let md = out.join("report.md");
    std::fs::write(&md, markdown(report, with_plots)).with_context(|| format!("cannot write {}", md.display()))?;
    let json = out.join("report.json");
    let text = serde_json::to_string_pretty(report).context("cannot format report.json")? + "\n";
    std::fs::write(&json, text).with_context(|| format!("cannot write {}", json.display()))?;
    if with_plots {
        if let Some(p) = projected {
            projection::projection_plot(out, &p.rows)?;
        }
        plots::plots(out, report)?;
    }
    Ok(())
}

/// A CSV file of `rows`, each cell as [`crate::record::Cells`] writes it (plain
/// decimals, lists joined).
fn write_csv<R: Serialize>(path: &Path, rows: &[R]) -> Result<()> {
    let mut log = crate::record::CsvLog::create(path)?;
    for r in rows {
        log.write(r)?;
    }
    log.flush()
}
