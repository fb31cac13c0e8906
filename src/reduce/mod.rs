//! `ddpbench reduce`: from per-rank CSV files to per-node-type summaries, scaling
//! across runs, an efficiency waterfall, a report and plots.
//!
//! [`run`] reads the folders a [`ReduceRequest`] names into one typed [`Report`];
//! every file (the CSV tables, report.md, report.json, the plots) is written from that
//! value ([`write`](fn@write)), and `ddpbench study` takes the same value for its own tables.
//! Runs with holes (missing rank files, truncated rows, unfinished jobs) are
//! reported as incomplete with what is missing and left out of every figure:
//! nothing is averaged over a hole. The reducer fails only when no run is usable.
//! A run whose rank 0 died before writing the outcome gets it first, from the ranks'
//! end records ([`crate::record::settle`]).

pub(crate) mod analysis;
mod args;
pub(crate) mod metrics;
pub(crate) mod read;
pub(crate) mod report;
pub mod timeline;

pub use analysis::heatmap::HeatmapLimits;
pub use analysis::{rank_summaries, scaling, type_summaries, Direction, ScalingMode, StepBreakdown};
pub use analysis::{read_run, RunStats};
pub use args::{parse_price, parse_target_efficiency, ReduceArgs, ReduceRequest};
pub use metrics::karp_flatt;
pub use report::html::PageLimits;
pub use report::{stage, stage_within, write, write_within, Report};

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// A folder `ddpbench allreduce` wrote.
fn is_sweep(p: &Path) -> bool {
    crate::link::link_model_path(p).is_some()
}

/// The sweep folders among `paths` and their direct subfolders.
pub(crate) fn discover_sweeps(paths: &[PathBuf]) -> Vec<PathBuf> {
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

/// Whether `dir` holds a `manifest.json` of any kind: a run folder, or one whose
/// manifest is damaged (a FIFO, a dangling link), which reading it names.
fn holds_manifest(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join("manifest.json")).is_ok()
}

/// Run folders named by `paths`: a run folder itself, or the run folders inside.
/// Sweep folders (`ddpbench allreduce`) are not runs and are passed over.
pub(crate) fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut runs = Vec::new();
    for p in paths {
        if holds_manifest(p) {
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
            .filter(|d| holds_manifest(d))
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

/// Entry point of `ddpbench reduce`: the report of the folders given, its files
/// written, its tables printed.
pub fn main(args: ReduceArgs) -> Result<()> {
    crate::cleanup::install_report_signals();
    let report = run(&args.request())?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => new_report_folder(&args.default_out_parent())?,
    };
    let created = args.out.is_none();
    let page_notes = report::write_locked(&report, &out, !args.no_plots, &PageLimits::default(), args.break_lock, created)?;
    report::print(&report, &out, !args.no_plots);
    for n in &page_notes {
        eprintln!("report.html: {n}");
    }
    // Each traced run's timeline, merged where it was not yet.
    timeline::merge_traced(&args.runs)
}

/// A new folder `report-<UTC time>` in `parent` (`-2`, `-3`, … after the time when that
/// name is taken: a second reduce in the same second never writes into the first's).
fn new_report_folder(parent: &Path) -> Result<PathBuf> {
    let stamp: String = crate::record::rfc3339_utc(std::time::SystemTime::now())
        .chars()
        .take(19)
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    report_folder_of(parent, &stamp)
}

/// [`new_report_folder`] at a given second `stamp`: the first of `report-<stamp>Z`,
/// `…-2`, … that `create_dir` makes anew. Any entry already at a name, a symlink
/// included (dangling or not), is passed over and left as it is.
fn report_folder_of(parent: &Path, stamp: &str) -> Result<PathBuf> {
    for n in 1..=100 {
        let name = if n == 1 {
            format!("report-{stamp}Z")
        } else {
            format!("report-{stamp}Z-{n}")
        };
        let dir = parent.join(name);
        // A stop signal from here on removes the folder again while it is empty.
        let _stops = crate::cleanup::StopsDeferred::begin();
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                crate::cleanup::arm_created(&dir);
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}: give --out a folder you can write", dir.display())),
        }
    }
    bail!(
        "100 report folders of this second already exist in {}: give --out",
        parent.display()
    )
}

/// The report of the run folders `req` names. What cannot be used is said on stderr as
/// it is found (and kept in the report); Err when no run is usable, a folder named is
/// none, or `--baseline` is not among the complete runs.
pub fn run(req: &ReduceRequest) -> Result<Report> {
    let (dirs, mut duplicates) = one_path_per_folder(discover(&req.runs)?);
    for d in &dirs {
        crate::record::settle::settle_and_say(d, "reduce");
    }
    let mut all = Vec::new();
    let mut skipped = Vec::new();
    for d in &dirs {
        match read_run(d) {
            Ok(r) => all.push(r),
            Err(e) => {
                eprintln!("skipped {}: {}", d.display(), crate::escape::terminal(&e));
                skipped.push(report::LeftOut {
                    dir: d.clone(),
                    problems: vec![e],
                });
            }
        }
    }
    let (all, same_id) = one_folder_per_run(all);
    duplicates.extend(same_id);
    for d in &duplicates {
        eprintln!("{}", crate::escape::terminal(&d.sentence()));
    }
    let incomplete: Vec<&RunStats> = all.iter().filter(|r| !r.complete()).collect();
    for r in &incomplete {
        eprintln!("incomplete run {} (left out of every figure):", r.dir.display());
        for p in &r.problems {
            eprintln!("  - {}", crate::escape::terminal(p));
        }
    }
    let complete: Vec<&RunStats> = all.iter().filter(|r| r.complete()).collect();
    if complete.is_empty() {
        bail!("no usable run among {} folder(s): see the problems listed above", dirs.len());
    }
    let explicit = explicit_baseline(&complete, req.baseline.as_deref())?;
    let projection = project(req, &dirs, &complete)?;
    Ok(report::build(
        &dirs,
        &complete,
        &incomplete,
        skipped,
        duplicates,
        explicit,
        projection,
    ))
}

/// `dirs` with each folder once (the same folder reached through a symbolic link, `.`
/// or `..` is one folder), and each path left out as a [`report::Duplicate`] of the one
/// kept: the first that reaches it under its own name (not a link's), else the first.
fn one_path_per_folder(dirs: Vec<PathBuf>) -> (Vec<PathBuf>, Vec<report::Duplicate>) {
    let canonical: Vec<Option<PathBuf>> = dirs.iter().map(|d| d.canonicalize().ok()).collect();
    let own_name = |i: usize| canonical[i].as_ref().is_some_and(|c| c.file_name() == dirs[i].file_name());
    let mut kept: Vec<usize> = Vec::new();
    let mut left: Vec<(usize, usize)> = Vec::new();
    for i in 0..dirs.len() {
        let Some(c) = &canonical[i] else {
            kept.push(i);
            continue;
        };
        match kept.iter().position(|&k| canonical[k].as_ref() == Some(c)) {
            None => kept.push(i),
            Some(at) if own_name(i) && !own_name(kept[at]) => {
                left.push((kept[at], i));
                kept[at] = i;
            }
            Some(at) => left.push((i, kept[at])),
        }
    }
    let duplicates = left
        .into_iter()
        .map(|(dup, of)| {
            let final_of = kept.iter().copied().find(|&k| canonical[k] == canonical[of]).unwrap_or(of);
            report::Duplicate {
                dir: dirs[dup].clone(),
                kept: dirs[final_of].clone(),
                why: "the same folder".into(),
            }
        })
        .collect();
    (kept.into_iter().map(|i| dirs[i].clone()).collect(), duplicates)
}

/// `runs` with one folder per run id: of the folders holding one run (a copy beside it,
/// a backup), the first complete one is kept, else the first; the others are
/// [`report::Duplicate`]s of it, said apart when their manifest tells another run that
/// has the same id (another start).
fn one_folder_per_run(runs: Vec<RunStats>) -> (Vec<RunStats>, Vec<report::Duplicate>) {
    let mut by_id: std::collections::HashMap<String, Vec<usize>> = std::collections::HashMap::new();
    for (i, r) in runs.iter().enumerate() {
        by_id.entry(r.manifest.run_id.clone()).or_default().push(i);
    }
    let mut keep = vec![true; runs.len()];
    let mut duplicates = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let group = &by_id[&r.manifest.run_id];
        let kept = group.iter().copied().find(|&k| runs[k].complete()).unwrap_or(group[0]);
        if i == kept {
            continue;
        }
        keep[i] = false;
        let of = &runs[kept];
        let why = if r.manifest.start_utc == of.manifest.start_utc {
            format!("the same run ({:?}, started {})", r.manifest.run_id, r.manifest.start_utc)
        } else {
            format!(
                "another run with the same run id {:?} (started {}, not {}): run ids must differ among the folders reduced; reduce it on its own",
                r.manifest.run_id, r.manifest.start_utc, of.manifest.start_utc
            )
        };
        duplicates.push(report::Duplicate {
            dir: r.dir.clone(),
            kept: of.dir.clone(),
            why,
        });
    }
    let runs = runs.into_iter().zip(keep).filter_map(|(r, k)| k.then_some(r)).collect();
    (runs, duplicates)
}

/// The projection to more ranks, when a link model is given or found, or links are
/// given by specification (`--link`, `--link-intra`); None when none is, or no
/// workload could be projected with it.
fn project(req: &ReduceRequest, dirs: &[PathBuf], complete: &[&RunStats]) -> Result<Option<report::ProjectionReport>> {
    let by_spec = !req.link.is_empty() || req.link_intra.is_some();
    let sweep = match &req.interconnect {
        Some(p) => Some(p.clone()),
        None => {
            let mut found = discover_sweeps(&req.runs);
            found.retain(|s| !dirs.contains(s));
            match found.len() {
                0 if by_spec => None,
                0 => return Ok(None),
                1 => Some(found.remove(0)),
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
    let measured = match &sweep {
        Some(s) => match crate::link::LinkModelFile::read(s) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("projection left out: {e:#}");
                return Ok(Some(report::projection_left_out(s, &format!("{e:#}"))));
            }
        },
        None => None,
    };
    let source = sweep.clone().unwrap_or_default();
    let ladder = analysis::recommend::ladders(&req.project_shape);
    // One projection per inter-node link given (fabrics side by side), else one.
    let specs: Vec<Option<&crate::link::spec::LinkSpec>> = if req.link.is_empty() {
        vec![None]
    } else {
        req.link.iter().map(Some).collect()
    };
    let mut merged: Option<report::ProjectionReport> = None;
    for spec in &specs {
        // Specifications replace the levels they name; a level neither measured nor
        // given comes from the runs' own all-reduce probes where they have one.
        let models = analysis::link_models::with_specs(
            *spec,
            req.link_intra.as_ref(),
            req.project_shape.first().map(|s| s.ranks_per_node),
            measured.clone(),
            complete,
        );
        let (mut rows, mut notes) = analysis::projection::projections_on(complete, &models, req.project_to as usize, &ladder);
        let link = spec.map(|s| s.name.clone()).unwrap_or_default();
        for r in &mut rows {
            r.link = link.clone();
        }
        if specs.len() > 1 {
            notes.iter_mut().for_each(|n| *n = format!("on {link}: {n}"));
        }
        for n in &notes {
            eprintln!("projection: {n}");
        }
        if rows.is_empty() {
            continue;
        }
        let mut section = report::projection_section(rows, notes, &models, &source, req.target_efficiency);
        report::recommendation::attach(&mut section, req, sweep.as_deref(), complete);
        merged = Some(match merged {
            None => section,
            Some(m) => report::merge_projections(m, section),
        });
    }
    if merged.is_none() {
        eprintln!(
            "projection: no workload could be projected with {}",
            report::recommendation::source_words(req, sweep.as_deref())
        );
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symlink planted at the next report folder's name, to a folder or to nothing,
    /// is passed over: the report goes into a new real folder, and neither link nor its
    /// target is touched.
    #[test]
    fn a_symlink_at_the_next_report_name_is_passed_over() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let parent = d.path().join("runs");
        std::fs::create_dir(&parent).unwrap();
        std::os::unix::fs::symlink(&elsewhere, parent.join("report-20261129T120000Z")).unwrap();
        std::os::unix::fs::symlink(d.path().join("nothing"), parent.join("report-20261129T120000Z-2")).unwrap();
        let made = report_folder_of(&parent, "20261129T120000").unwrap();
        assert_eq!(made, parent.join("report-20261129T120000Z-3"));
        assert!(std::fs::symlink_metadata(&made).unwrap().file_type().is_dir());
        for link in ["report-20261129T120000Z", "report-20261129T120000Z-2"] {
            assert!(std::fs::symlink_metadata(parent.join(link)).unwrap().file_type().is_symlink());
        }
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        assert!(!d.path().join("nothing").exists());
    }
}
