//! `ddpbench reduce`: from per-rank CSV files to per-node-type summaries, scaling
//! across runs, an efficiency waterfall, a report and plots.
//!
//! Runs with holes (missing rank files, truncated rows, unfinished jobs) are
//! reported as incomplete with what is missing and left out of every figure:
//! nothing is averaged over a hole. The reducer fails only when no run is usable.

pub mod analysis;
pub mod metrics;
pub mod read;
mod report;

pub use analysis::{read_run, RunStats};

use crate::cli::ReduceArgs;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A folder `ddpbench allreduce` wrote.
fn is_sweep(p: &Path) -> bool {
    p.join("allreduce_model.json").is_file()
}

/// The sweep folders among `paths` and their direct subfolders.
pub fn discover_sweeps(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if is_sweep(p) {
            out.push(p.clone());
        } else if let Ok(rd) = std::fs::read_dir(p) {
            let mut inner: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|d| is_sweep(d)).collect();
            inner.sort();
            out.append(&mut inner);
        }
    }
    out
}

/// Run folders named by `paths`: a run folder itself, or the run folders inside.
/// Sweep folders (`ddpbench allreduce`) are not runs and are passed over.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut runs = Vec::new();
    for p in paths {
        if p.join("manifest.json").is_file() {
            runs.push(p.clone());
            continue;
        }
        if is_sweep(p) {
            continue;
        }
        if !p.is_dir() {
            bail!("{}: no such folder", p.display());
        }
        let mut inner: Vec<PathBuf> = std::fs::read_dir(p)
            .with_context(|| format!("cannot list {}", p.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|d| d.join("manifest.json").is_file())
            .collect();
        if inner.is_empty() {
            bail!("{}: neither a run folder (no manifest.json) nor a folder of runs", p.display());
        }
        inner.sort();
        runs.append(&mut inner);
    }
    runs.dedup();
    Ok(runs)
}

fn default_out(args: &ReduceArgs, runs: &[PathBuf]) -> PathBuf {
    if let Some(o) = &args.out {
        return o.clone();
    }
    if args.runs.len() == 1 {
        return args.runs[0].clone();
    }
    let mut common: PathBuf = runs[0].parent().map(Path::to_path_buf).unwrap_or_default();
    while !runs.iter().all(|r| r.starts_with(&common)) {
        if !common.pop() {
            break;
        }
    }
    if common.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        common
    }
}

pub fn write_csv<R: Serialize>(path: &Path, rows: &[R]) -> Result<()> {
    let mut log = crate::record::CsvLog::create(path)?;
    for r in rows {
        log.write(r)?;
    }
    log.flush()
}

/// The run `--baseline` names, among the complete runs.
fn explicit_baseline<'a>(runs: &[&'a RunStats], path: Option<&Path>) -> Result<Option<&'a RunStats>> {
    let Some(p) = path else { return Ok(None) };
    let canon = p
        .canonicalize()
        .with_context(|| format!("--baseline {}: no such folder", p.display()))?;
    let found = runs.iter().find(|r| r.dir.canonicalize().map(|d| d == canon).unwrap_or(false));
    Ok(Some(*found.with_context(|| {
        format!("--baseline {} is not among the complete runs being reduced", p.display())
    })?))
}

/// Entry point of `ddpbench reduce`.
pub fn main(args: ReduceArgs) -> Result<()> {
    let dirs = discover(&args.runs)?;
    let out = default_out(&args, &dirs);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    let mut all = Vec::new();
    for d in &dirs {
        match read_run(d) {
            Ok(r) => all.push(r),
            Err(e) => eprintln!("skipped {}: {e}", d.display()),
        }
    }
    for r in all.iter().filter(|r| !r.complete()) {
        eprintln!("incomplete run {} (left out of every figure):", r.dir.display());
        for p in &r.problems {
            eprintln!("  - {p}");
        }
    }
    let complete: Vec<&RunStats> = all.iter().filter(|r| r.complete()).collect();
    if complete.is_empty() {
        bail!("no usable run among {} folder(s): see the problems listed above", dirs.len());
    }

    let summaries: Vec<analysis::TypeSummary> = complete.iter().flat_map(|r| analysis::type_summaries(r)).collect();
    let ranks: Vec<analysis::RankSummary> = complete.iter().flat_map(|r| analysis::rank_summaries(r)).collect();
    let scaling = analysis::scaling(&complete, explicit_baseline(&complete, args.baseline.as_deref())?);
    write_csv(&out.join("summary.csv"), &summaries)?;
    write_csv(&out.join("scaling.csv"), &scaling)?;
    write_csv(&out.join("ranks.csv"), &ranks)?;
    let incomplete: Vec<&RunStats> = all.iter().filter(|r| !r.complete()).collect();
    let mut md = report::markdown(&complete, &incomplete, &summaries, &scaling, !args.no_plots);
    let projection = project(&args, &dirs, &complete, &out)?;
    if let Some((_, section)) = &projection {
        md.push_str(section);
    }
    std::fs::write(out.join("report.md"), &md).with_context(|| format!("cannot write {}", out.join("report.md").display()))?;
    if !args.no_plots {
        report::plots(&out, &complete, &summaries, &scaling)?;
    }
    report::print_tables(&summaries, &scaling);
    let projected = projection.as_ref().is_some_and(|(rows, _)| !rows.is_empty());
    if let Some((rows, _)) = projection.as_ref().filter(|_| projected) {
        report::print_projection(rows);
    }
    println!(
        "\nwrote {}/{{summary.csv, scaling.csv, ranks.csv, report.md{}{}}}",
        out.display(),
        if projected { ", projection.csv" } else { "" },
        if args.no_plots { "" } else { ", *.svg, *.png" }
    );
    Ok(())
}

/// The projection to more ranks, when an interconnect model is given or found: writes
/// projection.csv (and its plot); returns its rows and report.md's section (no rows,
/// and a section saying why, when the model is refused).
fn project(
    args: &ReduceArgs,
    dirs: &[PathBuf],
    complete: &[&RunStats],
    out: &Path,
) -> Result<Option<(Vec<analysis::projection::ProjectionRow>, String)>> {
    let sweep = match &args.interconnect {
        Some(p) => p.clone(),
        None => {
            let mut found = discover_sweeps(&args.runs);
            found.retain(|s| !dirs.contains(s));
            match found.len() {
                0 => return Ok(None),
                1 => found.remove(0),
                _ => bail!(
                    "{} interconnect sweeps among the folders given ({}): name one with --interconnect",
                    found.len(),
                    found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
    };
    // A model that cannot be read or holds values no link has takes the projection out,
    // not the report: the rest stands without it.
    let models = match crate::allreduce::ModelFile::read(&sweep) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("projection left out: {e:#}");
            return Ok(Some((Vec::new(), report::projection_left_out(&format!("{e:#}")))));
        }
    };
    let (rows, notes) = analysis::projection::projections(complete, &models, args.project_to as usize);
    for n in &notes {
        eprintln!("projection: {n}");
    }
    if rows.is_empty() {
        eprintln!("projection: no workload could be projected with {}", sweep.display());
        return Ok(None);
    }
    write_csv(&out.join("projection.csv"), &rows)?;
    let md = report::projection_markdown(&rows, &notes, complete, &models, &sweep);
    if !args.no_plots {
        report::projection_plot(out, &rows)?;
    }
    Ok(Some((rows, md)))
}
