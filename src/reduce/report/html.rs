//! report.html: one self-contained page (inline SVG and CSS, no script, nothing
//! fetched) a person reads top to bottom: the verdict and what to run, speedup and
//! efficiency, where the ideal throughput went, each phase's share per rank count, who
//! is late and when (the heatmap), the projection, then every table of report.md with its
//! sentence, and the files beside it. The tables are report.md's own sections, written
//! from the same [`Report`] and turned into HTML ([`markdown_html`]), so the two never
//! disagree.

use super::plots::Picture;
use super::{communication, compute_comm_grid, efficiency, nodes, projection, speedup, times, Report};
use std::fmt::Write;

/// Pages over this many bytes are a fault: the heatmaps are binned
/// ([`crate::reduce::analysis::heatmap::HEATMAP_LIMITS`]) and at most
/// [`HEATMAPS_SHOWN`] are drawn, so a page stays under it whatever the rows.
pub const PAGE_BYTES_MAX: usize = 5_000_000;

/// Heatmaps drawn on the page at most (the runs with the most ranks); the others are
/// written as files with the plots.
pub const HEATMAPS_SHOWN: usize = 2;

const STYLE: &str =
    "body{font-family:'DejaVu Sans',Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.7em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:right}\
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 .2em}\
.verdict{background:#eef5ff;border-left:5px solid #1f77b4;padding:.6em 1em;margin:.8em 0}\
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{font-size:.9em;color:#555}";

/// The page of `report`, its pictures inline; `with_plots` says whether the plots were
/// also written as files (the page names them then).
pub fn page(report: &Report, pictures: &[Picture], with_plots: bool) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddpbench report</title><style>{STYLE}</style></head><body>\n<h1>ddpbench report</h1>\n<p>{} complete run(s), {} incomplete. Steps flagged as warm-up are excluded; times are per step unless said otherwise.</p>\n",
        report.runs.len(),
        report.incomplete.len()
    );
    verdict(&mut h, report);
    let f = &report.findings;
    section(
        &mut h,
        "Speedup and efficiency",
        "Speedup is throughput over the reference's; the bars are its 95 % interval. Efficiency is speedup over the rank ratio.",
    );
    figures(&mut h, pictures, &["speedup", "efficiency"]);
    let mut md = String::new();
    speedup::per_workload(&mut md, &report.scaling, &report.workloads);
    h.push_str(&markdown_html(&md));
    section(
        &mut h,
        "Where the ideal throughput went",
        "Each bar is the ideal throughput (the reference × the rank count): the measured part at the bottom, each cause's loss above it.",
    );
    figures(&mut h, pictures, &["waterfall"]);
    let mut md = String::new();
    efficiency::waterfall(&mut md, &report.scaling, &f.waterfall);
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
        h.push_str(&markdown_html(&projection::markdown(p)));
    }
    tables(&mut h, report, pictures);
    links(&mut h, report, with_plots);
    h.push_str("</body></html>\n");
    h
}

/// study.html: study.md as a page (its image lines left out), each workload's speedup
/// curve inline after it, and a link to the report of the study's runs beside it.
pub fn study_page<'a>(study_md: &str, curves: impl Iterator<Item = &'a str>) -> String {
    let md: String = study_md
        .lines()
        .filter(|l| !l.trim_start().starts_with("!["))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut h = format!("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ddpbench study</title><style>{STYLE}</style></head><body>\n");
    h.push_str(&markdown_html(&md).replacen("<h3>", "<h1>", 1).replacen("</h3>", "</h1>", 1));
    section(&mut h, "Speedup per workload", "");
    for svg in curves {
        let _ = writeln!(h, "<figure>{}</figure>", strip_prolog(svg));
    }
    h.push_str(
        "<p>Every figure of the study's runs, with pictures and tables: <a href=\"report.html\">report.html</a>.</p>\n</body></html>\n",
    );
    h
}

/// Each workload's verdict, then what the projection says to run, if there is one.
fn verdict(h: &mut String, report: &Report) {
    section(h, "Verdict", "");
    if report.workloads.is_empty() {
        h.push_str("<p class=\"verdict\">No point was compared with a reference: scaling needs runs of the same workload at two or more rank counts (a 1-rank run is the reference).</p>\n");
    }
    for w in &report.workloads {
        let _ = writeln!(
            h,
            "<div class=\"verdict\"><strong>{} on {}</strong> ({}): {}</div>",
            esc(&w.model),
            esc(&w.dataset),
            esc(&w.comparison),
            inline(&w.verdict)
        );
    }
    // Only the answers stand here; how each projection was checked is under "Projection".
    let answers: Vec<(&str, &String)> = report
        .projection
        .iter()
        .flat_map(|p| &p.workloads)
        .flat_map(|w| w.answers.iter().map(move |a| (w.name.as_str(), a)))
        .collect();
    if answers.is_empty() {
        return;
    }
    h.push_str("<h3>What to run (from the projection)</h3>\n<ul>\n");
    for (name, a) in answers {
        let _ = writeln!(h, "<li><strong>{}</strong>: {}</li>", esc(name), inline(a));
    }
    h.push_str("</ul>\n");
}

/// The heatmaps of the runs with the most ranks, at most [`HEATMAPS_SHOWN`].
fn heatmaps(h: &mut String, report: &Report, pictures: &[Picture]) {
    let mut runs: Vec<&super::RunReport> = report.runs.iter().filter(|r| r.ranks > 1).collect();
    if runs.is_empty() {
        return;
    }
    section(h, "Who is late, and when", "Each rank's own work per step: its step time less the time it spent in the exposed all-reduce, which is what the other ranks wait for. A late rank is a dark row; a slow stretch of the run is a dark column. Large runs are binned: a cell then holds several ranks and steps and shows the largest of them.");
    runs.sort_by_key(|r| std::cmp::Reverse(r.ranks));
    for r in runs.iter().take(HEATMAPS_SHOWN) {
        figures(h, pictures, &[&format!("heatmap-{}", r.run_id)]);
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
fn tables(h: &mut String, report: &Report, pictures: &[Picture]) {
    section(h, "Tables", "The tables of report.md, each with what the report found in it.");
    let f = &report.findings;
    let mut md = String::new();
    speedup::runs_table(&mut md, &report.runs, &report.summary);
    communication::compute_vs_comm(&mut md, &report.runs, &f.compute_vs_comm);
    compute_comm_grid::markdown(&mut md, &report.runs);
    communication::bandwidth(&mut md, &report.runs, &report.summary, &f.bandwidth);
    h.push_str(&markdown_html(&md));
    figures(h, pictures, &["bandwidth"]);
    let mut md = String::new();
    efficiency::epoch_times(&mut md, &report.runs);
    times::markdown(&mut md, &report.runs);
    nodes::node_types(&mut md, &report.summary, &f.node_types);
    nodes::stalls(&mut md, &report.runs);
    nodes::incomplete(&mut md, &report.incomplete);
    h.push_str(&markdown_html(&md));
    for d in &report.duplicates {
        let _ = writeln!(h, "<p>{}</p>", esc(&d.sentence()));
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

/// The pictures whose stem is one of `stems` or starts with one that ends in `-`.
fn figures(h: &mut String, pictures: &[Picture], stems: &[&str]) {
    for stem in stems {
        for p in pictures
            .iter()
            .filter(|p| p.stem == *stem || (stem.ends_with('-') && p.stem.starts_with(stem)))
        {
            let _ = writeln!(h, "<figure>{}</figure>", strip_prolog(&p.svg));
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
pub fn esc(s: &str) -> String {
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

/// The Markdown report.md's sections use (headings, tables, lists, paragraphs, inline
/// code and strong) as HTML; headings go down one level under the page's sections.
pub fn markdown_html(md: &str) -> String {
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
            let cells: Vec<&str> = t.trim_matches('|').split('|').map(str::trim).collect();
            if cells.iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':'))) {
                continue;
            }
            let tag = if table_row == 0 { "th" } else { "td" };
            if table_row == 0 {
                h.push_str("<table>\n");
            }
            h.push_str("<tr>");
            for c in cells {
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
    fn svg_prolog_is_dropped() {
        assert_eq!(strip_prolog("<?xml version=\"1.0\"?>\n<svg width=\"1\"/>"), "<svg width=\"1\"/>");
    }
}
