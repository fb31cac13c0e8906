//! The plots `reduce` writes, read back as SVG: rank axes tick at powers of two labelled
//! as integers, error bars stand exactly where scaling.csv has an interval, the ideal
//! line runs from 1 rank to the largest, the projection's band is drawn where a
//! projection is, and the phases are one panel per batch, one stacked bar per rank count.
//! Inputs: the schema-2 run folders in tests/fixtures/schema2 (see its README).

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2")
}

/// One element of an SVG document: its tag, attributes and text.
#[derive(Debug)]
struct Element {
    tag: String,
    attrs: BTreeMap<String, String>,
    text: String,
}

impl Element {
    fn num(&self, name: &str) -> f64 {
        self.attrs
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{} has no numeric {name}: {:?}", self.tag, self.attrs))
    }
}

/// Every element of `svg` in document order (a reader for what SVG writers emit: no
/// CDATA, no comments, attributes in double quotes).
fn elements(svg: &str) -> Vec<Element> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(start) = rest.find('<') {
        rest = &rest[start + 1..];
        let end = rest.find('>').expect("unclosed tag");
        let inner = &rest[..end];
        rest = &rest[end + 1..];
        if inner.starts_with('/') || inner.starts_with('?') || inner.starts_with('!') {
            continue;
        }
        let tag: String = inner.chars().take_while(|c| !c.is_whitespace() && *c != '/').collect();
        let mut attrs = BTreeMap::new();
        let mut a = &inner[tag.len()..];
        while let Some(eq) = a.find("=\"") {
            let name = a[..eq].trim().to_string();
            let close = a[eq + 2..].find('"').expect("unclosed attribute");
            attrs.insert(name, a[eq + 2..eq + 2 + close].to_string());
            a = &a[eq + 2 + close + 1..];
        }
        let text = if tag == "text" {
            rest[..rest.find("</text>").expect("unclosed text")].trim().to_string()
        } else {
            String::new()
        };
        out.push(Element { tag, attrs, text });
    }
    out
}

fn read_svg(dir: &Path, stem: &str) -> Vec<Element> {
    let path = dir.join(format!("{stem}.svg"));
    let svg = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    elements(&svg)
}

/// The x axis's tick labels, (x, text) from left to right: centred text in the lower
/// part of the picture, not rotated, other than the axis description.
fn x_tick_labels(els: &[Element], x_desc: &str) -> Vec<(f64, String)> {
    let height = els.iter().find(|e| e.tag == "svg").unwrap().num("height");
    let mut ticks: Vec<(f64, String)> = els
        .iter()
        .filter(|e| e.tag == "text" && e.attrs.get("text-anchor").map(String::as_str) == Some("middle"))
        .filter(|e| !e.attrs.contains_key("transform") && e.num("y") > 0.6 * height)
        .filter(|e| !e.text.starts_with(x_desc))
        .map(|e| (e.num("x"), e.text.clone()))
        .collect();
    ticks.sort_by(|a, b| a.0.total_cmp(&b.0));
    ticks
}

/// Rank tick labels must be integers and powers of two, in increasing order.
fn assert_power_of_two_ticks(ticks: &[(f64, String)], plot: &str) {
    assert!(ticks.len() >= 2, "{plot}: too few rank ticks: {ticks:?}");
    let values: Vec<u64> = ticks
        .iter()
        .map(|(_, t)| {
            t.parse::<u64>()
                .unwrap_or_else(|_| panic!("{plot}: rank tick {t:?} is not an integer ({ticks:?})"))
        })
        .collect();
    for v in &values {
        assert!(v.is_power_of_two(), "{plot}: rank tick {v} is not a power of two ({values:?})");
    }
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{plot}: {values:?}");
}

/// Error bars as plotters draws them: a vertical line with a short horizontal cap
/// centred on each end. Returns each bar's x.
fn error_bars(els: &[Element]) -> Vec<f64> {
    let lines: Vec<[f64; 4]> = els
        .iter()
        .filter(|e| e.tag == "line")
        .map(|e| [e.num("x1"), e.num("y1"), e.num("x2"), e.num("y2")])
        .collect();
    let cap_at = |x: f64, y: f64| {
        lines
            .iter()
            .any(|c| c[1] == c[3] && c[1] == y && (c[0] + c[2]) / 2.0 == x && (c[2] - c[0]).abs() == ddpbench::plot::ERROR_CAP_PX as f64)
    };
    lines
        .iter()
        .filter(|l| l[0] == l[2] && l[1] != l[3] && cap_at(l[0], l[1]) && cap_at(l[0], l[3]))
        .map(|l| l[0])
        .collect()
}

fn reduce_fixture(out: &Path, with_projection: bool) {
    let f = fixtures();
    let (single, runs, sweep) = (f.join("single"), f.join("study/runs"), f.join("sweep"));
    let mut args = vec!["reduce".to_string(), path_str(&single), path_str(&runs)];
    if with_projection {
        args.extend(["--interconnect".into(), path_str(&sweep)]);
    }
    args.extend(["--out".into(), path_str(out)]);
    ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>()).assert_ok();
}

/// Rows of scaling.csv that carry an interval, by rank count.
fn intervals_by_ranks(out: &Path) -> BTreeMap<u64, usize> {
    let (h, rows) = read_csv(&out.join("scaling.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let (ranks, low, high, speedup) = (at("ranks"), at("speedup_low"), at("speedup_high"), at("speedup"));
    let mut by = BTreeMap::new();
    for r in &rows {
        let finite = |i: usize| r[i].parse::<f64>().is_ok_and(f64::is_finite);
        if finite(low) && finite(high) && finite(speedup) {
            *by.entry(r[ranks].parse::<u64>().unwrap()).or_default() += 1;
        }
    }
    by
}

#[test]
fn scaling_plots_tick_powers_of_two_and_draw_an_error_bar_per_interval() {
    let d = tmp();
    reduce_fixture(d.path(), false);
    let expected = intervals_by_ranks(d.path());
    assert!(!expected.is_empty(), "the fixture has intervals: {expected:?}");
    for plot in ["speedup", "efficiency"] {
        let els = read_svg(d.path(), plot);
        let ticks = x_tick_labels(&els, "ranks");
        assert_power_of_two_ticks(&ticks, plot);
        // One bar per interval, each at its rank count's tick.
        let bars = error_bars(&els);
        assert_eq!(
            bars.len(),
            expected.values().sum::<usize>(),
            "{plot}: bars at {bars:?}, intervals {expected:?}"
        );
        let tick_x = |ranks: u64| ticks.iter().find(|t| t.1 == ranks.to_string()).map(|t| t.0);
        for (ranks, n) in &expected {
            let x = tick_x(*ranks).unwrap_or_else(|| panic!("{plot}: no tick for {ranks} ranks: {ticks:?}"));
            assert_eq!(
                bars.iter().filter(|b| (**b - x).abs() < 1.0).count(),
                *n,
                "{plot}: bars at {ranks} ranks"
            );
        }
        // The ideal line: a polyline in the ideal colour from the 1-rank tick to the largest.
        let ideal = format!(
            "#{:02X}{:02X}{:02X}",
            ddpbench::plot::IDEAL.0,
            ddpbench::plot::IDEAL.1,
            ddpbench::plot::IDEAL.2
        );
        let line = els
            .iter()
            .find(|e| e.tag == "polyline" && e.attrs.get("stroke") == Some(&ideal))
            .unwrap_or_else(|| panic!("{plot}: no ideal line in {ideal}"));
        let xs: Vec<f64> = line.attrs["points"]
            .split_whitespace()
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        let max_ranks = *expected.keys().max().unwrap();
        assert_eq!(xs.first().copied(), tick_x(1), "{plot}: ideal starts at 1 rank");
        assert_eq!(xs.last().copied(), tick_x(max_ranks), "{plot}: ideal ends at {max_ranks} ranks");
        assert!(
            els.iter().any(|e| e.tag == "text" && e.text.starts_with("ideal")),
            "{plot}: no legend entry for ideal"
        );
    }
    // No projection without an interconnect model, so no band.
    assert!(!d.path().join("projection.svg").exists());
}

#[test]
fn projection_plot_fills_one_band_per_projected_workload() {
    let d = tmp();
    reduce_fixture(d.path(), true);
    let (h, rows) = read_csv(&d.path().join("projection.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let workloads: BTreeSet<(String, String)> = rows
        .iter()
        .map(|r| (r[at("from_runs")].clone(), r[at("scaling")].clone()))
        .collect();
    assert!(!workloads.is_empty());
    let els = read_svg(d.path(), "projection");
    let bands = els.iter().filter(|e| e.tag == "polygon").count();
    assert_eq!(bands, workloads.len(), "one band per projected workload: {workloads:?}");
}

/// The projected workloads of projection.csv: (reference run, scaling).
fn workloads_of(h: &[String], rows: &[Vec<String>]) -> BTreeSet<(String, String)> {
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    rows.iter()
        .map(|r| (r[at("from_runs")].clone(), r[at("scaling")].clone()))
        .collect()
}

/// The projection plot as the issue asks for it: the x ticks are the shapes projected
/// (nodes × ranks per node, their products powers of two), every measured mark is drawn
/// after every projected line (so over it), projected points are open circles and
/// measured ones filled dots (and the legend says which is which), the legend lies under
/// the plotting area, clear of it and of every line and mark, and at 1 rank the
/// projected line and the measured mark stand at efficiency 1 exactly.
#[test]
fn the_projection_plot_names_shapes_marks_projected_apart_and_keeps_its_legend_off_the_data() {
    let d = tmp();
    reduce_fixture(d.path(), true);
    let (h, rows) = read_csv(&d.path().join("projection.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    // 1 rank: efficiency and speedup 1 by definition; where a 1-rank point was measured
    // the row is that point (no error of its own), elsewhere the projection there.
    let one: Vec<&Vec<String>> = rows.iter().filter(|r| r[at("ranks")] == "1").collect();
    assert!(!one.is_empty());
    for r in &one {
        assert_eq!((r[at("efficiency")].as_str(), r[at("speedup")].as_str()), ("1", "1"), "{r:?}");
        assert!(r[at("step_basis")] != "measured" || r[at("error_pct")].is_empty(), "{r:?}");
    }
    assert!(one.iter().any(|r| r[at("step_basis")] == "measured"), "{one:?}");

    let els = read_svg(d.path(), "projection");
    let ticks = x_tick_labels(&els, "nodes × ranks per node");
    let ranks: Vec<u64> = ticks
        .iter()
        .map(|(_, t)| {
            let shapes: Vec<u64> = t
                .split(", ")
                .map(|s| {
                    let (m, p) = s.split_once(" × ").unwrap_or_else(|| panic!("tick {t:?} is no shape ({ticks:?})"));
                    m.parse::<u64>().unwrap() * p.parse::<u64>().unwrap()
                })
                .collect();
            assert!(shapes.windows(2).all(|w| w[0] == w[1]), "{t:?}: one rank count per tick");
            shapes[0]
        })
        .collect();
    assert!(ranks.len() >= 2 && ranks.iter().all(|r| r.is_power_of_two()), "{ticks:?}");
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
    assert_eq!(ticks[0].1, "1 × 1");

    let palette: Vec<String> = ddpbench::plot::PALETTE
        .iter()
        .map(|c| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2))
        .collect();
    let in_palette = |e: &Element, a: &str| e.attrs.get(a).is_some_and(|c| palette.contains(c));
    // Measured: a dot filled in a workload's colour. Projected: a ring in a workload's
    // colour, nothing filled in it.
    let dot = |e: &Element| e.tag == "circle" && in_palette(e, "fill");
    let ring = |e: &Element| e.tag == "circle" && in_palette(e, "stroke") && e.attrs.get("fill").map(String::as_str) == Some("none");
    // Lines (polylines) and marks in document order, up to the legend's box (its
    // swatches follow it): every line first, then the measured dots.
    let legend_at = els
        .iter()
        .position(|e| e.tag == "rect" && e.attrs.get("stroke").map(String::as_str) == Some("#999999"))
        .unwrap_or_else(|| panic!("no legend box"));
    let data = &els[..legend_at];
    let last_line = data.iter().rposition(|e| e.tag == "polyline").unwrap();
    let measured = rows.iter().filter(|r| !r[at("measured_step_s")].is_empty()).count();
    assert!(measured > 0);
    let dots: Vec<usize> = (0..data.len()).filter(|&i| dot(&data[i])).collect();
    assert_eq!(dots.len(), measured, "one filled dot per measured point");
    assert!(dots.iter().all(|&i| i > last_line), "a measured dot under a line: {dots:?}");
    let rings = data.iter().filter(|e| ring(e)).count();
    assert_eq!(rings, rows.len(), "one open circle per projected point");
    assert!(data.iter().all(|e| !(ring(e) && dot(e))));

    // The legend: a box edged #999999 under the plotting area (the second white
    // rectangle, after the picture's), every line and mark inside the area, every legend
    // text inside the box.
    let white: Vec<&Element> = els
        .iter()
        .filter(|e| e.tag == "rect" && e.attrs.get("fill").map(String::as_str) == Some("#FFFFFF"))
        .collect();
    let area = white.get(1).unwrap_or_else(|| panic!("no plotting area: {white:?}"));
    let (ax, ay, aw, ah) = (area.num("x"), area.num("y"), area.num("width"), area.num("height"));
    let picture = els.iter().find(|e| e.tag == "svg").unwrap();
    assert!(aw < picture.num("width") && ah < picture.num("height"), "{area:?}");
    let edge = &els[legend_at];
    let (lx, ly, lw, lh) = (edge.num("x"), edge.num("y"), edge.num("width"), edge.num("height"));
    assert!(ly > ay + ah, "legend {edge:?} overlaps the plotting area {area:?}");
    assert!(
        lx + lw <= picture.num("width") && ly + lh <= picture.num("height"),
        "legend {edge:?} off the picture"
    );
    for e in data.iter().filter(|e| dot(e) || ring(e)) {
        let (x, y) = (e.num("cx"), e.num("cy"));
        assert!(
            x >= ax && x <= ax + aw && y >= ay && y <= ay + ah,
            "mark {e:?} off the plotting area"
        );
    }
    for e in data.iter().filter(|e| e.tag == "polyline" && in_palette(e, "stroke")) {
        for p in e.attrs["points"].split_whitespace() {
            let (_, y) = p.split_once(',').unwrap();
            assert!(y.parse::<f64>().unwrap() <= ay + ah, "line {e:?} under the plotting area");
        }
    }
    // One entry per projected workload, named by it, and one each for what the open
    // circles and the dots mean.
    let names: Vec<&Element> = els[legend_at..].iter().filter(|e| e.tag == "text").collect();
    assert_eq!(names.len(), workloads_of(&h, &rows).len() + 2, "{names:?}");
    assert!(names.iter().any(|t| t.text.starts_with("projected: open circles")), "{names:?}");
    assert!(names.iter().any(|t| t.text.starts_with("measured: filled dots")), "{names:?}");
    for t in names {
        let (x, y) = (t.num("x"), t.num("y"));
        assert!(
            x > lx && x < lx + lw && y > ly && y < ly + lh,
            "legend text {t:?} outside its box {edge:?}"
        );
    }

    // At 1 rank the projected line and the measured mark stand where efficiency 1 is:
    // both at one pixel height, the 1-rank tick's x.
    let x1 = ticks[0].0;
    let first_point = |e: &Element| -> (f64, f64) {
        let p = e.attrs["points"].split_whitespace().next().unwrap();
        let (x, y) = p.split_once(',').unwrap();
        (x.parse().unwrap(), y.parse().unwrap())
    };
    let line_starts: Vec<(f64, f64)> = data
        .iter()
        .filter(|e| e.tag == "polyline" && in_palette(e, "stroke"))
        .map(first_point)
        .filter(|p| (p.0 - x1).abs() < 1.0)
        .collect();
    let marks_at_1: Vec<f64> = data
        .iter()
        .filter(|e| (dot(e) || ring(e)) && (e.num("cx") - x1).abs() < 1.0)
        .map(|e| e.num("cy"))
        .collect();
    assert!(!line_starts.is_empty() && !marks_at_1.is_empty(), "{line_starts:?} {marks_at_1:?}");
    let y1 = line_starts[0].1;
    assert!(
        line_starts.iter().all(|p| p.1 == y1) && marks_at_1.iter().all(|&y| y == y1),
        "{line_starts:?} {marks_at_1:?}"
    );
}

/// The phases are one panel per model and batch per rank (phases-MODEL-bBATCH.svg,
/// its title naming both), one stacked bar per rank count there: a batch's step is
/// never set beside another batch's on one axis.
#[test]
fn phases_are_one_panel_per_batch_and_one_bar_per_rank_count() {
    let d = tmp();
    reduce_fixture(d.path(), false);
    let (h, rows) = read_csv(&d.path().join("summary.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let mut panels: BTreeMap<(String, u64), BTreeSet<u64>> = BTreeMap::new();
    for r in &rows {
        panels
            .entry((r[at("model")].clone(), r[at("batch_per_rank")].parse().unwrap()))
            .or_default()
            .insert(r[at("ranks")].parse().unwrap());
    }
    assert!(panels.len() >= 2, "the fixtures hold two batches: {panels:?}");
    assert!(!d.path().join("phases.svg").exists(), "no panel mixing the batches");
    let forward = format!(
        "#{:02X}{:02X}{:02X}",
        ddpbench::plot::PALETTE[1].0,
        ddpbench::plot::PALETTE[1].1,
        ddpbench::plot::PALETTE[1].2
    );
    for ((model, batch), ranks) in &panels {
        let els = read_svg(d.path(), &format!("phases-{model}-b{batch}"));
        let title = format!("Mean time per step by phase: {model}, batch {batch}/rank");
        assert!(
            els.iter().any(|e| e.tag == "text" && e.text == title),
            "{model} b{batch}: no title {title:?}"
        );
        let labels: Vec<String> = x_tick_labels(&els, "ranks (").into_iter().map(|t| t.1).collect();
        let want: Vec<String> = ranks.iter().map(|r| format!("{r} ranks")).collect();
        assert_eq!(labels, want, "{model} b{batch}");
        // Every bar has one forward segment (the second colour): the runs of a rank
        // count are averaged into one bar; the legend's swatch is one more.
        let rects = els
            .iter()
            .filter(|e| e.tag == "rect" && e.attrs.get("fill") == Some(&forward))
            .count();
        assert_eq!(rects, ranks.len() + 1, "{model} b{batch}");
    }
}
