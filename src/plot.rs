//! Plots drawn with plotters' SVG backend and rasterised to PNG with resvg. The SVG
//! backend writes text as `<text>` elements and measures it with an estimate, so writing
//! a plot needs no font; resvg draws the text of the PNG with the system fonts
//! (DejaVu Sans, which job-scripts/setup.sh installs).
//!
//! Rank axes are log2 with a tick at each power of two, labelled as an integer; error
//! bars are drawn wherever a point carries an interval; bands are filled polygons.

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const W_PX: u32 = 820;
const H_PX: u32 = 460;
/// Room right of the plotting area for the legend.
const LEGEND_W_PX: u32 = 260;
/// The SVG backend copies this into every `<text>`'s font-family.
const FONT: &str = "DejaVu Sans, Arial, sans-serif";
/// Pixel width of an error bar's caps.
pub const ERROR_CAP_PX: u32 = 8;
/// The ideal line's colour, `#444444` in the SVG.
pub const IDEAL: RGBColor = RGBColor(0x44, 0x44, 0x44);
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];
/// Beyond this many power-of-two ticks only every other one is labelled.
const MAX_RANK_TICKS: usize = 12;

/// How the x axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XScale {
    /// Rank counts: log2, a tick at each power of two labelled as an integer.
    Ranks,
    /// Log10, a tick at each power of ten.
    Log10,
}

/// One measured value and, when the report has one, its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub interval: Option<(f64, f64)>,
}

impl Point {
    pub fn new(x: f64, y: f64) -> Point {
        Point { x, y, interval: None }
    }

    /// The point with the interval `low..high`, kept only when both ends are finite.
    pub fn with_interval(self, low: f64, high: f64) -> Point {
        let interval = (low.is_finite() && high.is_finite()).then_some((low.min(high), low.max(high)));
        Point { interval, ..self }
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesKind {
    /// A line through the points, a mark on each.
    Line,
    /// Marks only.
    Markers,
    /// The reference a reader compares with: a thin line in [`IDEAL`], no marks.
    Ideal,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
    pub kind: SeriesKind,
    /// A palette index, to match a band or another series; None takes the next colour.
    pub colour: Option<usize>,
}

impl Series {
    /// The ideal line from 1 rank to `max_ranks`, `at(ranks)` high.
    pub fn ideal(name: &str, max_ranks: f64, at: impl Fn(f64) -> f64) -> Series {
        Series {
            name: name.into(),
            points: vec![Point::new(1.0, at(1.0)), Point::new(max_ranks, at(max_ranks))],
            kind: SeriesKind::Ideal,
            colour: None,
        }
    }
}

/// A filled range: (x, low, high) per point, as a projection's uncertainty.
#[derive(Debug, Clone)]
pub struct Band {
    pub name: String,
    pub points: Vec<(f64, f64, f64)>,
    /// Its palette index (drawn lighter).
    pub colour: usize,
}

/// A chart of lines, marks, error bars and bands.
#[derive(Debug, Clone)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: XScale,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
}

fn fail(title: &str) -> impl Fn(String) -> anyhow::Error + '_ {
    move |e| anyhow!("cannot draw the plot {title:?}: {e}")
}

/// Compact tick text: plain integers, k/M/G above 10 000, at most 4 decimals below.
fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v == v.trunc() {
        format!("{v:.0}")
    } else {
        crate::record::format_plain((v * 1e4).round() / 1e4)
    }
}

/// The x axis in axis units (log2 or log10 of the value), its ticks in those units,
/// and the text of each tick.
struct XAxis {
    scale: XScale,
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl XAxis {
    fn to_axis(&self, x: f64) -> f64 {
        match self.scale {
            XScale::Ranks => x.log2(),
            XScale::Log10 => x.log10(),
        }
    }

    fn usable(&self, x: f64) -> bool {
        x.is_finite() && x > 0.0
    }

    fn label(&self, v: f64) -> String {
        match self.scale {
            XScale::Ranks => format!("{}", 2f64.powf(v.round()) as u64),
            XScale::Log10 => fmt_tick(10f64.powf(v.round())),
        }
    }

    /// Covers `xs` with whole powers of two (or ten) on log axes.
    fn new(scale: XScale, xs: &[f64]) -> XAxis {
        let mut axis = XAxis {
            scale,
            range: 0.0..1.0,
            ticks: Vec::new(),
        };
        let vs: Vec<f64> = xs.iter().filter(|x| axis.usable(**x)).map(|x| axis.to_axis(*x)).collect();
        let (lo, hi) = vs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, v| (a.0.min(*v), a.1.max(*v)));
        let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
        let (first, last) = (lo.floor() as i64, (hi.ceil() as i64).max(lo.floor() as i64 + 1));
        let every = if scale == XScale::Ranks && (last - first + 1) as usize > MAX_RANK_TICKS {
            2
        } else {
            1
        };
        axis.ticks = (first..=last).step_by(every).map(|e| e as f64).collect();
        axis.range = first as f64 - 0.25..last as f64 + 0.25;
        axis
    }
}

/// The y range: from 0 (or the lowest value) to 10 % above the highest.
fn y_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((0.0f64, f64::NEG_INFINITY), |a, v| (a.0.min(v), a.1.max(v)));
    let hi = if hi.is_finite() && hi > lo { hi } else { lo + 1.0 };
    lo..hi + (hi - lo) * 0.1
}

/// An f64 axis whose ticks are given (powers of two, categories) rather than chosen by
/// plotters, which would put them at round decimals such as 1.2 ranks.
struct Ticked {
    inner: RangedCoordf64,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }
}

/// A chart whose x axis has explicit ticks.
type ChartWithKeys<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Ticked, RangedCoordf64>>;

/// A chart's caption and axis titles.
struct Labels<'s> {
    title: &'s str,
    x: &'s str,
    y: &'s str,
}

/// The plotting area with its caption, labelled axes and grid; the x axis shows `x_ticks`
/// (in its own units) as `x_text` writes them.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    labels: &Labels<'_>,
    x_range: std::ops::Range<f64>,
    x_ticks: Vec<f64>,
    x_text: &dyn Fn(f64) -> String,
    y: std::ops::Range<f64>,
) -> Result<ChartWithKeys<'a, 'b>> {
    let err = fail(labels.title);
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut ctx = ChartBuilder::on(root)
        .caption(labels.title, (FONT, 19))
        .margin(12)
        .margin_right(LEGEND_W_PX)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            Ticked {
                inner: x_range.into(),
                ticks: x_ticks,
            },
            y,
        )
        .map_err(|e| err(e.to_string()))?;
    ctx.configure_mesh()
        .x_desc(labels.x)
        .y_desc(labels.y)
        .x_label_formatter(&|v| x_text(*v))
        .y_label_formatter(&|v| fmt_tick(*v))
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 15))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .draw()
        .map_err(|e| err(e.to_string()))?;
    Ok(ctx)
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Swatch {
    Line(RGBColor, u32),
    Mark(RGBColor),
    Fill(RGBAColor),
}

/// The legend, drawn on the whole picture right of the plotting area (plotters' own
/// legend is clipped to the plotting area).
fn legend(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    plot_right_px: i32,
    top_px: i32,
    entries: &[(String, Swatch)],
    title: &str,
) -> Result<()> {
    let x = plot_right_px + 14;
    for (i, (name, swatch)) in entries.iter().enumerate() {
        let y = top_px + 8 + 18 * i as i32;
        let shape: DynElement<'static, SVGBackend<'_>, (i32, i32)> = match *swatch {
            Swatch::Line(c, w) => PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(w.max(2))).into_dyn(),
            Swatch::Mark(c) => Circle::new((x + 11, y), 4, c.filled()).into_dyn(),
            Swatch::Fill(c) => Rectangle::new([(x, y - 5), (x + 22, y + 5)], c.filled()).into_dyn(),
        };
        let short: String = if name.chars().count() > 40 {
            name.chars().take(39).chain(['…']).collect()
        } else {
            name.clone()
        };
        let text = Text::new(
            short,
            (x + 28, y),
            TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        );
        root.draw(&shape)
            .and_then(|_| root.draw(&text))
            .map_err(|e| fail(title)(e.to_string()))?;
    }
    Ok(())
}

/// Where the plotting area ends on the right, and where it starts at the top, in pixels.
fn plot_corner(ctx: &ChartWithKeys<'_, '_>) -> (i32, i32) {
    let (x, y) = ctx.plotting_area().get_pixel_range();
    (x.end, y.start)
}

/// Lines, marks, error bars and bands on one set of axes, as an SVG document.
pub fn line_chart(chart: &LineChart) -> Result<String> {
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.x))
        .chain(chart.bands.iter().flat_map(|b| b.points.iter().map(|p| p.0)))
        .collect();
    let axis = XAxis::new(chart.x_scale, &xs);
    let ys = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| axis.usable(p.x))
        .flat_map(|p| [p.y, p.interval.map_or(p.y, |i| i.1)])
        .chain(chart.bands.iter().flat_map(|b| b.points.iter().flat_map(|p| [p.1, p.2])));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W_PX, H_PX)).into_drawing_area();
        let labels = Labels {
            title: &chart.title,
            x: &chart.x_label,
            y: &chart.y_label,
        };
        let mut ctx = frame(
            &root,
            &labels,
            axis.range.clone(),
            axis.ticks.clone(),
            &|v| axis.label(v),
            y_range(ys),
        )?;
        let mut entries = draw_bands(&mut ctx, chart, &axis)?;
        let mut colour = 0;
        for s in &chart.series {
            let c = match (s.kind, s.colour) {
                (SeriesKind::Ideal, _) => IDEAL,
                (_, Some(k)) => PALETTE[k % PALETTE.len()],
                (_, None) => {
                    colour += 1;
                    PALETTE[(colour - 1) % PALETTE.len()]
                }
            };
            if let Some(e) = draw_series(&mut ctx, &chart.title, s, c, &axis)? {
                entries.push((s.name.clone(), e));
            }
        }
        let (right, top) = plot_corner(&ctx);
        legend(&root, right, top, &entries, &chart.title)?;
        root.present().map_err(|e| fail(&chart.title)(e.to_string()))?;
    }
    Ok(svg)
}

/// Each band as one filled polygon: along its highs, back along its lows.
fn draw_bands(ctx: &mut ChartWithKeys<'_, '_>, chart: &LineChart, axis: &XAxis) -> Result<Vec<(String, Swatch)>> {
    let mut entries = Vec::new();
    for b in &chart.bands {
        let mut pts: Vec<(f64, f64, f64)> = b
            .points
            .iter()
            .copied()
            .filter(|p| axis.usable(p.0) && p.1.is_finite() && p.2.is_finite())
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        if pts.len() < 2 {
            continue;
        }
        let outline: Vec<(f64, f64)> = pts
            .iter()
            .map(|p| (axis.to_axis(p.0), p.2))
            .chain(pts.iter().rev().map(|p| (axis.to_axis(p.0), p.1)))
            .collect();
        let fill = PALETTE[b.colour % PALETTE.len()].mix(0.2);
        ctx.draw_series(std::iter::once(Polygon::new(outline, fill.filled())))
            .map_err(|e| fail(&chart.title)(e.to_string()))?;
        entries.push((b.name.clone(), Swatch::Fill(fill)));
    }
    Ok(entries)
}

/// One series: its line (unless marks only), its marks (unless ideal), its error bars;
/// returns its legend swatch when it has a name.
fn draw_series(ctx: &mut ChartWithKeys<'_, '_>, title: &str, s: &Series, c: RGBColor, axis: &XAxis) -> Result<Option<Swatch>> {
    let err = fail(title);
    let mut pts: Vec<Point> = s.points.iter().copied().filter(|p| axis.usable(p.x) && p.y.is_finite()).collect();
    pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    let at = |p: &Point| (axis.to_axis(p.x), p.y);
    let width = if s.kind == SeriesKind::Ideal { 1 } else { 2 };
    if s.kind != SeriesKind::Markers {
        ctx.draw_series(LineSeries::new(pts.iter().map(at), c.stroke_width(width)))
            .map_err(|e| err(e.to_string()))?;
    }
    if s.kind != SeriesKind::Ideal {
        ctx.draw_series(pts.iter().map(|p| Circle::new(at(p), 4, c.filled())))
            .map_err(|e| err(e.to_string()))?;
    }
    let bars = pts.iter().filter_map(|p| {
        let (lo, hi) = p.interval?;
        Some(ErrorBar::new_vertical(
            axis.to_axis(p.x),
            lo,
            p.y,
            hi,
            c.stroke_width(1),
            ERROR_CAP_PX,
        ))
    });
    ctx.draw_series(bars).map_err(|e| err(e.to_string()))?;
    Ok((!s.name.is_empty()).then_some(match s.kind {
        SeriesKind::Markers => Swatch::Mark(c),
        _ => Swatch::Line(c, width),
    }))
}

/// The x axis of a chart of categories: category c centred at c + 0.5.
fn category_axis(labels: &[String]) -> (std::ops::Range<f64>, Vec<f64>) {
    let every = labels.len().div_ceil(32).max(1);
    let ticks = (0..labels.len()).step_by(every).map(|c| c as f64 + 0.5).collect();
    (0.0..labels.len().max(1) as f64, ticks)
}

fn category_label(labels: &[String], v: f64) -> String {
    let short = |s: &String| s.chars().take(18).collect::<String>();
    labels.get(v.floor().max(0.0) as usize).map(short).unwrap_or_default()
}

/// Vertical stacked bars: one bar per category, one segment per stack.
pub fn stacked_bars(title: &str, x_label: &str, y_label: &str, categories: &[String], stacks: &[(String, Vec<f64>)]) -> Result<String> {
    let value = |s: &(String, Vec<f64>), c: usize| s.1.get(c).copied().filter(|v| v.is_finite()).unwrap_or(0.0).max(0.0);
    let totals = (0..categories.len()).map(|c| stacks.iter().map(|s| value(s, c)).sum::<f64>());
    let labels = Labels {
        title,
        x: x_label,
        y: y_label,
    };
    let (x_range, x_ticks) = category_axis(categories);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W_PX, H_PX)).into_drawing_area();
        let mut ctx = frame(
            &root,
            &labels,
            x_range,
            x_ticks,
            &|v| category_label(categories, v),
            y_range(totals),
        )?;
        let mut base = vec![0.0; categories.len()];
        let mut entries = Vec::new();
        for (k, stack) in stacks.iter().enumerate() {
            let c = PALETTE[k % PALETTE.len()];
            let mut rects = Vec::new();
            for (i, b) in base.iter_mut().enumerate() {
                let (lo, hi) = (*b, *b + value(stack, i));
                *b = hi;
                let (left, right) = (i as f64 + 0.15, i as f64 + 0.85);
                // A segment under one pixel would be a zero-height rect, which renderers reject.
                if ctx.backend_coord(&(left, lo)).1 > ctx.backend_coord(&(left, hi)).1 {
                    rects.push(Rectangle::new([(left, hi), (right, lo)], c.filled()));
                }
            }
            ctx.draw_series(rects).map_err(|e| fail(title)(e.to_string()))?;
            entries.push((stack.0.clone(), Swatch::Fill(c.to_rgba())));
        }
        let (right, top) = plot_corner(&ctx);
        legend(&root, right, top, &entries, title)?;
        root.present().map_err(|e| fail(title)(e.to_string()))?;
    }
    Ok(svg)
}

/// Box plots: per label [p5, p25, median, p75, p95], coloured by group index.
pub fn box_plot(
    title: &str,
    y_label: &str,
    labels: &[String],
    boxes: &[[f64; 5]],
    groups: &[usize],
    group_names: &[String],
) -> Result<String> {
    let text = Labels {
        title,
        x: "rank (box: p25–p75, line: median, whiskers: p5–p95)",
        y: y_label,
    };
    let (x_range, x_ticks) = category_axis(labels);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W_PX, H_PX)).into_drawing_area();
        let ys = boxes.iter().map(|b| b[4]);
        let mut ctx = frame(&root, &text, x_range, x_ticks, &|v| category_label(labels, v), y_range(ys))?;
        let err = fail(title);
        for (i, b) in boxes.iter().enumerate() {
            if b.iter().any(|v| !v.is_finite()) {
                continue;
            }
            let c = PALETTE[groups.get(i).copied().unwrap_or(0) % PALETTE.len()];
            let (x, half) = (i as f64 + 0.5, 0.3);
            let shapes: [DynElement<'static, SVGBackend<'_>, (f64, f64)>; 5] = [
                PathElement::new(vec![(x, b[0]), (x, b[1])], c.stroke_width(1)).into_dyn(),
                PathElement::new(vec![(x, b[3]), (x, b[4])], c.stroke_width(1)).into_dyn(),
                Rectangle::new([(x - half, b[3]), (x + half, b[1])], c.mix(0.35).filled()).into_dyn(),
                Rectangle::new([(x - half, b[3]), (x + half, b[1])], c.stroke_width(1)).into_dyn(),
                PathElement::new(vec![(x - half, b[2]), (x + half, b[2])], BLACK.stroke_width(2)).into_dyn(),
            ];
            ctx.draw_series(shapes).map_err(|e| err(e.to_string()))?;
        }
        let entries: Vec<(String, Swatch)> = group_names
            .iter()
            .enumerate()
            .map(|(k, name)| (name.clone(), Swatch::Fill(PALETTE[k % PALETTE.len()].mix(0.35))))
            .collect();
        let (right, top) = plot_corner(&ctx);
        legend(&root, right, top, &entries, title)?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    Ok(svg)
}

/// Renders SVG documents to PNG; loads the system fonts once.
pub struct Rasteriser {
    options: resvg::usvg::Options<'static>,
}

impl Rasteriser {
    pub fn new() -> Rasteriser {
        let mut options = resvg::usvg::Options::default();
        options.fontdb_mut().load_system_fonts();
        Rasteriser { options }
    }

    /// `svg` rendered as a PNG file's bytes.
    pub fn png(&self, svg: &str) -> Result<Vec<u8>> {
        let tree = resvg::usvg::Tree::from_str(svg, &self.options).context("internal error: invalid SVG")?;
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).context("empty plot")?;
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        pixmap.encode_png().context("cannot encode a plot as PNG")
    }

    /// Stages `svg` as `<stem>.svg` and its rendering as `<stem>.png` into `files`; the
    /// stem is made a file name of its own ([`crate::files::safe_component`]), so a
    /// run id or a workload in it can never make it a path.
    pub fn stage(&self, files: &mut crate::files::StagedFiles, stem: &str, svg: &str) -> Result<()> {
        let stem = crate::files::safe_component(stem);
        files.write(&format!("{stem}.svg"), svg.as_bytes())?;
        files.write(&format!("{stem}.png"), &self.png(svg)?)?;
        Ok(())
    }
}

impl Default for Rasteriser {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(scale: XScale, xs: &[f64]) -> Vec<String> {
        let axis = XAxis::new(scale, xs);
        axis.ticks.iter().map(|t| axis.label(*t)).collect()
    }

    #[test]
    fn rank_ticks_are_whole_powers_of_two() {
        assert_eq!(labels(XScale::Ranks, &[1.0, 2.0]), ["1", "2"]);
        assert_eq!(labels(XScale::Ranks, &[1.0, 3.0, 6.0]), ["1", "2", "4", "8"]);
        assert_eq!(labels(XScale::Ranks, &[2.0, 2.0]), ["2", "4"]);
        // 13 powers of two: every other one.
        assert_eq!(labels(XScale::Ranks, &[1.0, 4096.0]), ["1", "4", "16", "64", "256", "1024", "4096"]);
        // Ranks of 0 cannot be drawn on a log axis and are left out.
        assert_eq!(labels(XScale::Ranks, &[0.0, 4.0]), ["4", "8"]);
        assert_eq!(labels(XScale::Log10, &[1e3, 8e6]), ["1000", "10k", "100k", "1.0M", "10.0M"]);
    }

    #[test]
    fn an_interval_needs_both_ends() {
        assert_eq!(Point::new(2.0, 1.5).with_interval(1.4, 1.6).interval, Some((1.4, 1.6)));
        assert_eq!(Point::new(2.0, 1.5).with_interval(1.6, 1.4).interval, Some((1.4, 1.6)));
        assert_eq!(Point::new(2.0, 1.5).with_interval(f64::NAN, 1.6).interval, None);
    }

    #[test]
    fn charts_are_valid_svg_and_render_to_png() {
        let chart = LineChart {
            title: "Speedup <&>".into(),
            x_label: "ranks".into(),
            y_label: "speedup".into(),
            x_scale: XScale::Ranks,
            series: vec![
                Series {
                    name: "speedup".into(),
                    points: vec![Point::new(1.0, 1.0), Point::new(2.0, 1.8).with_interval(1.7, 1.9)],
                    kind: SeriesKind::Line,
                    colour: None,
                },
                Series {
                    name: "ideal".into(),
                    points: vec![Point::new(1.0, 1.0), Point::new(2.0, 2.0)],
                    kind: SeriesKind::Ideal,
                    colour: None,
                },
            ],
            bands: vec![Band {
                name: "band".into(),
                points: vec![(1.0, 0.9, 1.1), (2.0, 1.6, 2.0)],
                colour: 0,
            }],
        };
        let svg = line_chart(&chart).unwrap();
        assert!(svg.contains("Speedup &lt;&amp;&gt;"), "{svg}");
        assert_eq!(svg.matches("<polygon").count(), 1);
        let dir = tempfile::tempdir().unwrap();
        let r = Rasteriser::new();
        let mut files = crate::files::StagedFiles::new(dir.path()).unwrap();
        r.stage(&mut files, "speedup", &svg).unwrap();
        let stacks = [
            ("x".to_string(), vec![1.0, 2.0]),
            ("y".to_string(), vec![0.5, 0.0]),
            ("z".to_string(), vec![1e-9, f64::NAN]),
        ];
        let bars = stacked_bars("phases", "", "s", &["a".into(), "b".into()], &stacks).unwrap();
        r.stage(&mut files, "bars", &bars).unwrap();
        files.commit().unwrap();
        let png = std::fs::read(dir.path().join("speedup.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(dir.path().join("bars.svg").is_file());
        // The background, three segments over a pixel and three legend swatches; the
        // segments of 0, under a pixel or NaN are not drawn (a zero-height rect is
        // rejected by renderers).
        assert_eq!(bars.matches("<rect").count(), 1 + 3 + 3, "{bars}");
        assert!(!bars.contains("height=\"0\""));
        let boxes = box_plot("steps", "s", &["0".into()], &[[1.0, 2.0, 3.0, 4.0, 5.0]], &[0], &["t".into()]).unwrap();
        resvg::usvg::Tree::from_str(&boxes, &resvg::usvg::Options::default()).unwrap();
    }
}
