//! report.html: one self-contained page (inline SVG and CSS, no script, nothing
//! fetched) a person reads top to bottom: the verdict and what to run, speedup and
//! efficiency, where the ideal throughput went, each phase's share per rank count, who
//! is late and when (the heatmap), the projection, then every table of report.md with its
//! sentence, and the files beside it. The tables are report.md's own sections, written
//! from the same [`Report`] and turned into HTML ([`markdown_html`]), so the two never
//! disagree.

use super::plots::{heatmap_picture, Picture, HEATMAP_STEM};
use super::sections::{HtmlPlace, Section};
use super::{projection, Report};
use crate::reduce::analysis::heatmap::{HeatmapLimits, StepHeatmap, HEATMAP_LIMITS};
use std::cell::Cell;
use std::fmt::Write;

/// report.html's and study.html's size at most, in bytes, unless the writer is given
/// another ([`PageLimits`]): when the page would be larger, its largest pictures are
/// binned further (heatmaps) or left out (a line says which file holds each), and the
/// page says so at its top.
pub(crate) const PAGE_BYTES_MAX: usize = 5_000_000;

/// Heatmaps drawn on the page at most (the runs with the most ranks); the others are
/// written as files with the plots.
pub(crate) const HEATMAPS_SHOWN: usize = 2;

/// A heatmap is binned further on the page only while it has more cells than this;
/// then it is left out instead.
const HEATMAP_CELLS_MIN: usize = 16;

/// What bounds the pages the writer makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimits {
    /// A page's size at most, in bytes ([`PAGE_BYTES_MAX`]).
    pub bytes_max: usize,
    /// Each heatmap's rows and columns at most, in the page and its file
    /// ([`HEATMAP_LIMITS`]); the page may bin a heatmap further to stay under `bytes_max`.
    pub heatmap: HeatmapLimits,
}

impl Default for PageLimits {
    fn default() -> PageLimits {
        PageLimits {
            bytes_max: PAGE_BYTES_MAX,
            heatmap: HEATMAP_LIMITS,
        }
    }
}

/// A page and what was done to keep it under its bound.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub html: String,
    /// One sentence per picture binned further or left out to keep the page under its
    /// bound, and one when the page is over it even so; empty when the page fits whole.
    pub notes: Vec<String>,
}

/// A picture as the page shows it: inline, or a line naming the file that holds it.
struct Shown {
    stem: String,
    /// Its inline SVG, or the line that stands in its place.
    body: String,
    drawn: bool,
    /// The grid drawn, for a heatmap (which can be binned further).
    heatmap: Option<StepHeatmap>,
    /// Whether the page rendered last put it on the page.
    used: Cell<bool>,
}

const STYLE: &str =
    "body{font-family:'DejaVu Sans',Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.7em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:right}\
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 .2em}\
.verdict{background:#eef5ff;border-left:5px solid #1f77b4;padding:.6em 1em;margin:.8em 0}\
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{font-size:.9em;color:#555}\
.bound{background:#fff6e5;border-left:5px solid #e08a00;padding:.4em 1em}.left-out{color:#555;font-style:italic}";

/// The page of `report`, its pictures inline and kept under `limits.bytes_max`: while
/// it is over, the largest picture on it is binned further (a heatmap of more than
/// [`HEATMAP_CELLS_MIN`] cells: half the rows and columns) or left out for a line that
/// names its file. `with_plots` says whether the plots were also written as files.
pub(crate) fn page(report: &Report, pictures: &[Picture], with_plots: bool, limits: &PageLimits) -> Page {
    let mut shown: Vec<Shown> = pictures
        .iter()
        .map(|p| Shown {
            stem: p.stem.clone(),
            body: strip_prolog(&p.svg).to_string(),
            drawn: true,
            heatmap: p.stem.strip_prefix(HEATMAP_STEM).and_then(|id| {
                let r = report.runs.iter().find(|r| r.run_id == id)?;
                Some(r.heatmap.coarsened(limits.heatmap))
            }),
            used: Cell::new(false),
        })
        .collect();
    let mut notes: Vec<(String, String)> = Vec::new();
    loop {
        let html = render(report, &shown, with_plots, &notes, limits.bytes_max);
        if html.len() <= limits.bytes_max {
            return Page {
                html,
                notes: notes.into_iter().map(|n| n.1).collect(),
            };
        }
        let largest = shown.iter_mut().filter(|s| s.drawn && s.used.get()).max_by_key(|s| s.body.len());
        let Some(picture) = largest else {
            let over = format!(
                "the page is {} bytes with every picture left out, over its bound of {} bytes: its tables alone are larger",
                html.len(),
                limits.bytes_max
            );
            notes.push((String::new(), over));
            return Page {
                html: render(report, &shown, with_plots, &notes, limits.bytes_max),
                notes: notes.into_iter().map(|n| n.1).collect(),
            };
        };
        let note = shrink(picture, with_plots);
        notes.retain(|n| n.0 != picture.stem);
        notes.push((picture.stem.clone(), note));
    }
}

/// `picture` smaller: a heatmap of more than [`HEATMAP_CELLS_MIN`] cells binned to half
/// its rows and columns, anything else replaced by a line naming its file; what was done,
/// in a sentence.
fn shrink(picture: &mut Shown, with_plots: bool) -> String {
    let stem = &picture.stem;
    if let Some(h) = picture.heatmap.as_ref().filter(|h| h.cell_count() > HEATMAP_CELLS_MIN) {
        let coarser = h.coarsened(HeatmapLimits {
            rows: h.cells_s.len().div_ceil(2),
            columns: h.columns().div_ceil(2),
        });
        let run_id = stem.strip_prefix(HEATMAP_STEM).unwrap_or(stem);
        if let Ok(p) = heatmap_picture(run_id, &coarser) {
            let note = format!(
                "{stem} is binned further here ({} rank(s) × {} step(s) a cell, its largest); the file {stem}.svg is the finer grid",
                coarser.ranks_per_row, coarser.steps_per_column
            );
            picture.body = strip_prolog(&p.svg).to_string();
            picture.heatmap = Some(coarser);
            return note;
        }
    }
    let file = crate::files::safe_component(stem);
    let at = if with_plots {
        format!("{file}.svg beside this page")
    } else {
        format!("{file}.svg when `reduce` is run without --no-plots")
    };
    picture.body = format!(
        "<p class=\"left-out\">The picture <code>{}</code> is left out here to keep the page under its size bound: it is <code>{}</code>.</p>",
        esc(stem),
        esc(&at)
    );
    picture.drawn = false;
    picture.heatmap = None;
    format!("{stem} is left out (it is {at})")
}

/// The page of `report` with `shown` pictures and, at its top, `notes` on what was done
/// to keep it under `bytes_max`; marks each picture put on the page as used.
fn render(report: &Report, shown: &[Shown], with_plots: bool, notes: &[(String, String)], bytes_max: usize) -> String {
    for s in shown {
        s.used.set(false);
    }
    let pictures = shown;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddpbench report</title><style>{STYLE}</style></head><body>\n<h1>ddpbench report</h1>\n<p>{} complete run(s), {} incomplete. Steps flagged as warm-up are excluded; times are per step unless said otherwise.</p>\n",
        report.runs.len(),
        report.incomplete.len()
    );
    bound_note(&mut h, notes, bytes_max);
    decision(&mut h, report);
    section(
        &mut h,
        "Speedup and efficiency",
        "Speedup is throughput over the reference's; the bars are its 95 % interval. Efficiency is speedup over the rank ratio.",
    );
    figures(&mut h, pictures, &["speedup", "efficiency"]);
    let mut md = String::new();
    Section::PerWorkload.markdown(&mut md, report);
    h.push_str(&markdown_html(&md));
    section(
        &mut h,
        "Where the ideal throughput went",
        "Each bar is the ideal throughput (the reference × the rank count): the measured part at the bottom, each cause's loss above it.",
    );
    figures(&mut h, pictures, &["waterfall"]);
    let mut md = String::new();
    Section::Waterfall.markdown(&mut md, report);
    h.push_str(&markdown_html(&md));
    section(
        &mut h,
        "Where the step goes, per rank count",
        "Each phase's share of the mean step, one panel per model and batch per rank.",
    );
    figures(&mut h, pictures, &["phase_shares-"]);
    heatmaps(&mut h, report, pictures);
    if let Some(p) = &report.projection {
        section(&mut h, "Projection", "");
        figures(&mut h, pictures, &["projection"]);
        // The page embeds the plot above (where drawn): no link to its file.
        h.push_str(&markdown_html(&projection::markdown(p, false)));
    }
    tables(&mut h, report, pictures);
    links(&mut h, report, with_plots);
    h.push_str("</body></html>\n");
    h
}

/// What was done to keep the page under `bytes_max`, when anything was.
fn bound_note(h: &mut String, notes: &[(String, String)], bytes_max: usize) {
    if notes.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<p class=\"bound\"><strong>This page is kept under {bytes_max} bytes</strong>, so not every picture is drawn in full here:</p>\n<ul class=\"bound\">"
    );
    for (_, n) in notes {
        let _ = writeln!(h, "<li>{}</li>", inline(n));
    }
    h.push_str("</ul>\n");
}

/// study.html: study.md as a page (its image lines left out), each workload's speedup
/// curve (`(stem, svg)`) inline after it, and a link to the report of the study's runs
/// beside it; kept under `bytes_max` as [`page`] keeps report.html, the largest curves
/// left out first.
pub(crate) fn study_page(study_md: &str, curves: &[(String, String)], with_plots: bool, bytes_max: usize) -> Page {
    let md: String = study_md
        .lines()
        .filter(|l| !l.trim_start().starts_with("!["))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut shown: Vec<Shown> = curves
        .iter()
        .map(|(stem, svg)| Shown {
            stem: stem.clone(),
            body: strip_prolog(svg).to_string(),
            drawn: true,
            heatmap: None,
            used: Cell::new(true),
        })
        .collect();
    let mut notes: Vec<(String, String)> = Vec::new();
    loop {
        let mut h = format!("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddpbench study</title><style>{STYLE}</style></head><body>\n");
        let body = markdown_html(&md).replacen("<h3>", "<h1>", 1).replacen("</h3>", "</h1>", 1);
        // The note goes under the study's title, which is the first line of the body.
        let title_end = body.find('\n').map_or(0, |at| at + 1);
        h.push_str(&body[..title_end]);
        bound_note(&mut h, &notes, bytes_max);
        h.push_str(&body[title_end..]);
        section(&mut h, "Speedup per workload", "");
        for s in &shown {
            let _ = writeln!(h, "<figure>{}</figure>", s.body);
        }
        h.push_str(
            "<p>Every figure of the study's runs, with pictures and tables: <a href=\"report.html\">report.html</a>.</p>\n</body></html>\n",
        );
        let largest = shown.iter_mut().filter(|s| s.drawn).max_by_key(|s| s.body.len());
        match largest {
            Some(curve) if h.len() > bytes_max => {
                let note = shrink(curve, with_plots);
                notes.push((curve.stem.clone(), note));
            }
            _ => {
                let mut notes: Vec<String> = notes.into_iter().map(|n| n.1).collect();
                if h.len() > bytes_max {
                    notes.push(format!(
                        "the page is {} bytes with every picture left out, over its bound of {bytes_max} bytes: its tables alone are larger",
                        h.len()
                    ));
                }
                return Page { html: h, notes };
            }
        }
    }
}

/// The first screen: each workload's decision (report.md's first section), one box each.
fn decision(h: &mut String, report: &Report) {
    section(h, "What to run", "");
    if report.decisions.is_empty() {
        let mut md = String::new();
        Section::Decision.markdown(&mut md, report);
        let body = markdown_html(&md);
        let text = body.split_once('\n').map_or("", |(_, rest)| rest);
        let _ = writeln!(h, "<div class=\"verdict\">{text}</div>");
    }
    for d in &report.decisions {
        let mut md = String::new();
        super::decision::workload_markdown(&mut md, d);
        let _ = writeln!(h, "<div class=\"verdict\">{}</div>", markdown_html(&md));
    }
}

/// The heatmaps of the runs with the most ranks, at most [`HEATMAPS_SHOWN`].
fn heatmaps(h: &mut String, report: &Report, pictures: &[Shown]) {
    let mut runs: Vec<&super::RunReport> = report.runs.iter().filter(|r| r.ranks > 1).collect();
    if runs.is_empty() {
        return;
    }
    section(h, "Who is late, and when", "Each rank's own work per step: its step time less the time it spent in the exposed all-reduce, which is what the other ranks wait for. A late rank is a dark row; a slow stretch of the run is a dark column. Large runs are binned: a cell then holds several ranks and steps and shows the largest of them.");
    runs.sort_by_key(|r| std::cmp::Reverse(r.ranks));
    for r in runs.iter().take(HEATMAPS_SHOWN) {
        figures(h, pictures, &[&format!("{HEATMAP_STEM}{}", r.run_id)]);
    }
    if runs.len() > HEATMAPS_SHOWN {
        let _ = writeln!(
            h,
            "<p>{} more run(s) have a heatmap in <code>heatmap-RUN.svg</code> when the plots are written.</p>",
            runs.len() - HEATMAPS_SHOWN
        );
    }
}

/// Every table of report.md with its sentence, and the bandwidth and step-time plots.
fn tables(h: &mut String, report: &Report, pictures: &[Shown]) {
    section(h, "Tables", "The tables of report.md, each with what the report found in it.");
    for s in Section::ALL.into_iter().filter(|s| s.html_place() == HtmlPlace::Tables) {
        let mut md = String::new();
        s.markdown(&mut md, report);
        h.push_str(&markdown_html(&md));
        if s == Section::Bandwidth {
            figures(h, pictures, &["bandwidth"]);
        }
    }
}

/// The files beside the page, and each run's timeline with how to open it.
fn links(h: &mut String, report: &Report, with_plots: bool) {
    section(h, "Files", "");
    h.push_str("<ul>\n");
    for (file, what) in [
        ("summary.csv", "one row per run and node type"),
        ("scaling.csv", "one row per compared point and mode"),
        ("ranks.csv", "one row per rank"),
        ("times.csv", "one row per run: an epoch's training and validation, the whole run"),
        (
            "compute_comm_grid.csv",
            "one row per workload, configuration and batch per rank: compute and communication per epoch",
        ),
        ("report.md", "this report as Markdown"),
        ("report.json", "this report as data (what <code>study</code> and scripts read)"),
    ] {
        let _ = writeln!(h, "<li><a href=\"{file}\">{file}</a>: {what}</li>");
    }
    if report.projection.as_ref().is_some_and(|p| !p.rows.is_empty()) {
        h.push_str("<li><a href=\"projection.csv\">projection.csv</a>: the projection, one row per rank count</li>\n");
    }
    if with_plots {
        h.push_str("<li>every picture above as <code>.svg</code> and <code>.png</code> beside this page</li>\n");
    }
    h.push_str("</ul>\n<p>The timeline of a run trained with <code>--trace</code> is <code>timeline.json</code> in its folder (<code>ddpbench trace RUN_DIR</code> writes it): open it in Perfetto UI (ui.perfetto.dev, \"Open trace file\") or <code>chrome://tracing</code>.</p>\n<ul>\n");
    for r in &report.runs {
        let timeline = r.dir.join("timeline.json");
        let abs = std::path::absolute(&timeline).unwrap_or(timeline.clone());
        if timeline.is_file() {
            let _ = writeln!(
                h,
                "<li>{}: <a href=\"file://{}\">{}</a></li>",
                esc(&r.run_id),
                esc(&abs.to_string_lossy()),
                esc(&abs.to_string_lossy())
            );
        } else {
            let _ = writeln!(
                h,
                "<li>{}: no timeline (not traced, or <code>ddpbench trace</code> not run)</li>",
                esc(&r.run_id)
            );
        }
    }
    h.push_str("</ul>\n");
}

fn section(h: &mut String, title: &str, lead: &str) {
    let _ = writeln!(h, "<h2>{}</h2>", esc(title));
    if !lead.is_empty() {
        let _ = writeln!(h, "<p>{}</p>", esc(lead));
    }
}

/// The pictures whose stem is one of `stems` or starts with one that ends in `-`,
/// marked as used.
fn figures(h: &mut String, pictures: &[Shown], stems: &[&str]) {
    for stem in stems {
        for p in pictures
            .iter()
            .filter(|p| p.stem == *stem || (stem.ends_with('-') && p.stem.starts_with(stem)))
        {
            p.used.set(true);
            let _ = writeln!(h, "<figure>{}</figure>", p.body);
        }
    }
}

/// An SVG document without its XML declaration, to stand inside HTML.
fn strip_prolog(svg: &str) -> &str {
    match svg.find("<svg") {
        Some(at) => &svg[at..],
        None => svg,
    }
}

/// Text made safe inside HTML.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            _ => out.push(c),
        }
    }
    out
}

/// Escaped text with report.md's inline marks: `code` and **strong**.
fn inline(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in esc(s).split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{part}</code>");
        } else {
            for (j, p) in part.split("**").enumerate() {
                if j % 2 == 1 {
                    let _ = write!(out, "<strong>{p}</strong>");
                } else {
                    out.push_str(p);
                }
            }
        }
    }
    out
}

/// The cells of a Markdown table row: split at each `|` that is not escaped, `\|`
/// read back as a `|` of the cell's text (as report.md's cells escape it).
fn table_cells(row: &str) -> Vec<String> {
    let inner = row.strip_prefix('|').unwrap_or(row);
    let inner = inner.strip_suffix('|').filter(|r| !r.ends_with('\\')).unwrap_or(inner);
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().expect("one cell at least").push('|');
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().expect("one cell at least").push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// The Markdown report.md's sections use (headings, tables, lists, paragraphs, inline
/// code and strong) as HTML; headings go down one level under the page's sections.
pub(crate) fn markdown_html(md: &str) -> String {
    let mut h = String::new();
    let mut table_row = 0;
    let mut in_list = false;
    for line in md.lines() {
        let t = line.trim();
        if !t.starts_with('|') && table_row > 0 {
            h.push_str("</table>\n");
            table_row = 0;
        }
        if !t.starts_with("- ") && in_list {
            h.push_str("</ul>\n");
            in_list = false;
        }
        if let Some(title) = t.strip_prefix("### ") {
            let _ = writeln!(h, "<h4>{}</h4>", inline(title));
        } else if let Some(title) = t.strip_prefix("## ") {
            let _ = writeln!(h, "<h3>{}</h3>", inline(title));
        } else if let Some(title) = t.strip_prefix("# ") {
            let _ = writeln!(h, "<h3>{}</h3>", inline(title));
        } else if t.starts_with('|') {
            let cells = table_cells(t);
            if cells.iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':'))) {
                continue;
            }
            let tag = if table_row == 0 { "th" } else { "td" };
            if table_row == 0 {
                h.push_str("<table>\n");
            }
            h.push_str("<tr>");
            for c in &cells {
                let _ = write!(h, "<{tag}>{}</{tag}>", inline(c));
            }
            h.push_str("</tr>\n");
            table_row += 1;
        } else if let Some(item) = t.strip_prefix("- ") {
            if !in_list {
                h.push_str("<ul>\n");
                in_list = true;
            }
            let _ = writeln!(h, "<li>{}</li>", inline(item));
        } else if !t.is_empty() {
            let _ = writeln!(h, "<p>{}</p>", inline(t));
        }
    }
    if table_row > 0 {
        h.push_str("</table>\n");
    }
    if in_list {
        h.push_str("</ul>\n");
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An escaped `|` stays in its cell, on the page as a `|`; the row keeps its columns.
    #[test]
    fn an_escaped_bar_stays_in_its_table_cell() {
        assert_eq!(table_cells("| a | b \\|G\\|² c | d |"), ["a", "b |G|² c", "d"]);
        assert_eq!(table_cells("|---|---:|"), ["---", "---:"]);
        let page = markdown_html("| x | why |\n|---|---|\n| 1 | – (\\|G\\|² not told apart) |\n");
        assert!(page.contains("<tr><td>1</td><td>– (|G|² not told apart)</td></tr>"), "{page}");
    }

    #[test]
    fn markdown_tables_lists_and_marks_become_html() {
        let md = "## A <b>\n\nSome `x<y` and **z**.\n\n| a | b |\n|---|---:|\n| 1 | 2 |\n\n- one\n- two\n";
        let h = markdown_html(md);
        assert_eq!(
            h,
            "<h3>A &lt;b&gt;</h3>\n<p>Some <code>x&lt;y</code> and <strong>z</strong>.</p>\n<table>\n<tr><th>a</th><th>b</th></tr>\n<tr><td>1</td><td>2</td></tr>\n</table>\n<ul>\n<li>one</li>\n<li>two</li>\n</ul>\n"
        );
    }

    #[test]
    fn a_full_heatmap_keeps_the_page_under_its_bound() {
        use crate::reduce::analysis::heatmap::{StepHeatmap, HEATMAP_LIMITS};
        let ranks = 1024;
        let mut h = StepHeatmap::new(ranks, HEATMAP_LIMITS);
        let own: Vec<f64> = (0..ranks).map(|r| 0.1 + r as f64 * 1e-4).collect();
        for s in 0..1000 {
            h.push(s, &own);
        }
        assert_eq!((h.cells_s.len(), h.columns()), (64, 125));
        let rows: Vec<String> = (0..64).map(|r| h.row_label(r)).collect();
        let cols: Vec<String> = (0..h.columns()).map(|c| h.column_step(c).to_string()).collect();
        let svg = crate::plot::heatmap(("t", "x", "y"), "ms", &rows, &cols, &h.cells_s).unwrap();
        // The heatmaps shown take at most half the page's bound.
        assert!(svg.len() * HEATMAPS_SHOWN * 200 / 125 < PAGE_BYTES_MAX / 2, "{} bytes", svg.len());
    }

    #[test]
    fn study_page_leaves_out_its_largest_curves_to_stay_under_its_bound() {
        let curve = |n: usize| format!("<?xml version=\"1.0\"?>\n<svg width=\"10\" height=\"10\">{}</svg>", "x".repeat(n));
        let curves = vec![
            ("speedup-a".to_string(), curve(1000)),
            ("speedup-b".to_string(), curve(9000)),
            ("speedup-c".to_string(), curve(4000)),
        ];
        let md = "# Study s\n\nSome text.\n";
        let whole = study_page(md, &curves, true, PAGE_BYTES_MAX);
        assert!(whole.notes.is_empty());
        assert_eq!(whole.html.matches("<svg").count(), 3);
        let bound = whole.html.len() - 8000;
        let cut = study_page(md, &curves, true, bound);
        assert!(cut.html.len() <= bound, "{} > {bound}", cut.html.len());
        // b alone is enough, and the others stay drawn.
        assert_eq!(cut.notes, ["speedup-b is left out (it is speedup-b.svg beside this page)"]);
        assert_eq!(cut.html.matches("<svg").count(), 2);
        assert!(cut.html.contains("The picture <code>speedup-b</code> is left out here"));
        assert!(cut.html.contains(&format!("This page is kept under {bound} bytes")));
        // The note stands under the title.
        assert!(cut.html.find("<h1>Study s</h1>").unwrap() < cut.html.find("kept under").unwrap());
        // A bound the text alone is over: every curve left out, and said.
        let tiny = study_page(md, &curves, true, 100);
        assert_eq!(tiny.html.matches("<svg").count(), 0);
        assert!(
            tiny.notes.last().unwrap().contains("its tables alone are larger"),
            "{:?}",
            tiny.notes
        );
    }

    #[test]
    fn svg_prolog_is_dropped() {
        assert_eq!(strip_prolog("<?xml version=\"1.0\"?>\n<svg width=\"1\"/>"), "<svg width=\"1\"/>");
    }
}
