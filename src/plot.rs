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
pub(crate) enum XScale {
    /// Rank counts: log2, a tick at each power of two labelled as an integer.
    Ranks,
    /// Log10, a tick at each power of ten.
    Log10,
}

/// One measured value and, when the report has one, its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub x: f64,
    pub y: f64,
    pub interval: Option<(f64, f64)>,
}

impl Point {
    pub(crate) fn new(x: f64, y: f64) -> Point {
        Point { x, y, interval: None }
    }

    /// The point with the interval `low..high`, kept only when both ends are finite.
    pub(crate) fn with_interval(self, low: f64, high: f64) -> Point {
        let interval = (low.is_finite() && high.is_finite()).then_some((low.min(high), low.max(high)));
        Point { interval, ..self }
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeriesKind {
    /// A line through the points, a mark on each.
    Line,
    /// Marks only.
    Markers,
    /// The reference a reader compares with: a thin line in [`IDEAL`], no marks.
    Ideal,
    /// Values computed, not measured: a line through the points, an open circle on each
    /// (a measured point is a filled one).
    Projected,
}

#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<Point>,
    pub kind: SeriesKind,
    /// A palette index, to match a band or another series; None takes the next colour.
    pub colour: Option<usize>,
}

impl Series {
    /// The ideal line from 1 rank to `max_ranks`, `at(ranks)` high.
    pub(crate) fn ideal(name: &str, max_ranks: f64, at: impl Fn(f64) -> f64) -> Series {
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
pub(crate) struct Band {
    /// Its legend entry (none when empty).
    pub name: String,
    pub points: Vec<(f64, f64, f64)>,
    /// Its palette index (drawn lighter).
    pub colour: usize,
}

/// A chart of lines, marks, error bars and bands.
#[derive(Debug, Clone)]
pub(crate) struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: XScale,
    pub series: Vec<Series>,
    pub bands: Vec<Band>,
}

/// Where a line chart's legend goes; never on the plotting area, where it would hide
/// a line or a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LegendAt {
    /// Right of the plotting area, on the picture, with room kept for it.
    #[default]
    Right,
    /// Under the x axis, one entry a line in a box with a [`LEGEND_BORDER`] edge, the
    /// picture made taller for it and the names given the picture's width.
    Below,
}

/// The edge of a legend drawn under the plotting area, `#999999` in the SVG.
pub(crate) const LEGEND_BORDER: RGBColor = RGBColor(0x99, 0x99, 0x99);

/// How a line chart is laid out beyond its data.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChartLayout {
    pub legend: LegendAt,
    /// Text of x ticks in place of the scale's own, by the value the tick stands at
    /// (rank count 8 written as the shape `2 × 4`).
    pub x_tick_text: Vec<(f64, String)>,
    /// Legend entries after the series', each saying what a kind of mark means (a
    /// [`SeriesKind::Markers`] dot: measured), drawn in [`IDEAL`]'s grey.
    pub key: Vec<(SeriesKind, String)>,
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

/// How far above the largest value an interval may stretch the y axis: beyond, its
/// whisker is clipped at the axis top and marked with a triangle.
const WHISKER_REACH: f64 = 1.5;

/// The legend's words for the triangle of a clipped whisker.
pub(crate) const CLIPPED_KEY: &str = "interval clipped at the axis top";

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
    legend: (LegendAt, u32),
) -> Result<ChartWithKeys<'a, 'b>> {
    let err = fail(labels.title);
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let (legend, below_px) = legend;
    let mut ctx = ChartBuilder::on(root)
        .caption(labels.title, (FONT, 19))
        .margin(12)
        .margin_right(if legend == LegendAt::Right { LEGEND_W_PX } else { 24 })
        .margin_bottom(12 + below_px)
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
    if legend == LegendAt::Below {
        // The plotting area as a rectangle of its own: what the legend stays out of.
        ctx.plotting_area().fill(&WHITE).map_err(|e| err(e.to_string()))?;
    }
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
    /// A line with an open circle on it: a projection.
    OpenMarkLine(RGBColor),
    Fill(RGBAColor),
    /// The triangle a whisker clipped at the axis top ends in.
    Clipped(RGBColor),
}

/// Width of a legend entry's swatch and the gap after it, in pixels.
const SWATCH_PX: i32 = 28;
/// Height of a legend entry, in pixels.
const ENTRY_PX: i32 = 18;
/// DejaVu Sans at 14 px averages under 8 px a character.
const CHAR_PX: i32 = 8;

/// The legend, drawn on the whole picture (plotters' own legend is clipped to the
/// plotting area) from `x`, its first entry centred 8 px below `top_px`; names longer
/// than `max_chars` are cut with an ellipsis.
fn legend(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    (x, top_px): (i32, i32),
    entries: &[(String, Swatch)],
    max_chars: usize,
    title: &str,
) -> Result<()> {
    for (i, (name, swatch)) in entries.iter().enumerate() {
        let y = top_px + 8 + ENTRY_PX * i as i32;
        let shapes: Vec<DynElement<'static, SVGBackend<'_>, (i32, i32)>> = match *swatch {
            Swatch::Line(c, w) => vec![PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(w.max(2))).into_dyn()],
            Swatch::Mark(c) => vec![Circle::new((x + 11, y), 4, c.filled()).into_dyn()],
            Swatch::OpenMarkLine(c) => {
                let mut line = vec![PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(2)).into_dyn()];
                line.extend(open_mark((x + 11, y), c));
                line
            }
            Swatch::Fill(c) => vec![Rectangle::new([(x, y - 5), (x + 22, y + 5)], c.filled()).into_dyn()],
            Swatch::Clipped(c) => vec![TriangleMarker::new((x + 11, y), 6, c.filled()).into_dyn()],
        };
        let short: String = if name.chars().count() > max_chars {
            name.chars().take(max_chars.saturating_sub(1)).chain(['…']).collect()
        } else {
            name.clone()
        };
        let text = Text::new(
            short,
            (x + SWATCH_PX, y),
            TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        );
        shapes
            .iter()
            .try_for_each(|s| root.draw(s))
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

/// Lines, marks, error bars and bands on one set of axes, as an SVG document, the
/// legend right of the plotting area.
pub(crate) fn line_chart(chart: &LineChart) -> Result<String> {
    line_chart_laid_out(chart, &ChartLayout::default())
}

/// [`line_chart`] laid out as `layout` says: where the legend goes, the x ticks' text.
pub(crate) fn line_chart_laid_out(chart: &LineChart, layout: &ChartLayout) -> Result<String> {
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.x))
        .chain(chart.bands.iter().flat_map(|b| b.points.iter().map(|p| p.0)))
        .collect();
    let axis = XAxis::new(chart.x_scale, &xs);
    let shown = || chart.series.iter().flat_map(|s| s.points.iter()).filter(|p| axis.usable(p.x));
    // The axis fits the values; an interval reaches at most WHISKER_REACH × the largest
    // value into it, and one past the axis top is clipped there and marked.
    let largest = shown().map(|p| p.y).filter(|y| y.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    let reach = if largest > 0.0 { WHISKER_REACH * largest } else { f64::INFINITY };
    let ys = shown()
        .flat_map(|p| [p.y, p.interval.map_or(p.y, |i| i.1.min(reach))])
        .chain(chart.bands.iter().flat_map(|b| b.points.iter().flat_map(|p| [p.1, p.2])));
    let ys = y_range(ys);
    let y_top = ys.end;
    let clipped = shown().any(|p| p.interval.is_some_and(|i| i.1 > y_top));
    let named = chart.bands.iter().filter(|b| !b.name.is_empty()).count()
        + chart.series.iter().filter(|s| !s.name.is_empty()).count()
        + layout.key.len();
    let below_px = if layout.legend == LegendAt::Below {
        legend_below_px(named)
    } else {
        0
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W_PX, H_PX + below_px)).into_drawing_area();
        let labels = Labels {
            title: &chart.title,
            x: &chart.x_label,
            y: &chart.y_label,
        };
        let tick_text = |v: f64| {
            let given = layout
                .x_tick_text
                .iter()
                .find(|(x, _)| axis.usable(*x) && (axis.to_axis(*x) - v).abs() < 1e-9);
            given.map_or_else(|| axis.label(v), |(_, t)| t.clone())
        };
        let mut ctx = frame(
            &root,
            &labels,
            axis.range.clone(),
            axis.ticks.clone(),
            &tick_text,
            ys,
            (layout.legend, below_px),
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
            if let Some(e) = draw_series(&mut ctx, &chart.title, s, c, &axis, y_top)? {
                entries.push((s.name.clone(), e));
            }
        }
        if clipped {
            entries.push((CLIPPED_KEY.into(), Swatch::Clipped(IDEAL)));
        }
        entries.extend(layout.key.iter().map(|(kind, name)| {
            let swatch = match kind {
                SeriesKind::Markers => Swatch::Mark(IDEAL),
                SeriesKind::Projected => Swatch::OpenMarkLine(IDEAL),
                SeriesKind::Line | SeriesKind::Ideal => Swatch::Line(IDEAL, 2),
            };
            (name.clone(), swatch)
        }));
        match layout.legend {
            LegendAt::Right => {
                let (right, top) = plot_corner(&ctx);
                legend(&root, (right + 14, top), &entries, 40, &chart.title)?;
            }
            LegendAt::Below => legend_below(&root, &ctx, &entries, &chart.title)?,
        }
        root.present().map_err(|e| fail(&chart.title)(e.to_string()))?;
    }
    Ok(svg)
}

/// Pixels of height a legend of `entries` entries takes under the x axis.
fn legend_below_px(entries: usize) -> u32 {
    if entries == 0 {
        0
    } else {
        (ENTRY_PX * entries as i32 + 6 + 2 * LEGEND_GAP_PX) as u32
    }
}

/// Pixels between the x axis's description and a legend under it, and under the legend.
const LEGEND_GAP_PX: i32 = 8;

/// The legend on a white box under the x axis (its description included), from the
/// plotting area's left edge; names cut to the picture's width.
fn legend_below(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    ctx: &ChartWithKeys<'_, '_>,
    entries: &[(String, Swatch)],
    title: &str,
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let (xs, ys) = ctx.plotting_area().get_pixel_range();
    const PAD: i32 = 8;
    let room_chars = ((W_PX as i32 - 12 - xs.start - 2 * PAD - SWATCH_PX) / CHAR_PX).max(4) as usize;
    let longest = entries.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0);
    let max_chars = longest.min(room_chars);
    let (w, h) = (
        PAD + SWATCH_PX + max_chars as i32 * CHAR_PX + PAD,
        ENTRY_PX * entries.len() as i32 + 6,
    );
    // The x axis's labels and description take the 44 px under the plotting area.
    let (x0, y0) = (xs.start, ys.end + 44 + LEGEND_GAP_PX);
    let err = fail(title);
    root.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], WHITE.filled()))
        .and_then(|_| root.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], LEGEND_BORDER.stroke_width(1))))
        .map_err(|e| err(e.to_string()))?;
    legend(root, (x0 + PAD, y0 + 4), entries, max_chars, title)
}

/// An open circle at `at`: white inside, a ring in `c`.
fn open_mark<'b, C: Clone + 'static>(at: C, c: RGBColor) -> [DynElement<'static, SVGBackend<'b>, C>; 2] {
    [
        Circle::new(at.clone(), 4, WHITE.filled()).into_dyn(),
        Circle::new(at, 4, c.stroke_width(2)).into_dyn(),
    ]
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
        if !b.name.is_empty() {
            entries.push((b.name.clone(), Swatch::Fill(fill)));
        }
    }
    Ok(entries)
}

/// One series: its line (unless marks only), its marks (unless ideal), its error bars;
/// returns its legend swatch when it has a name.
fn draw_series(ctx: &mut ChartWithKeys<'_, '_>, title: &str, s: &Series, c: RGBColor, axis: &XAxis, y_top: f64) -> Result<Option<Swatch>> {
    let err = fail(title);
    let mut pts: Vec<Point> = s.points.iter().copied().filter(|p| axis.usable(p.x) && p.y.is_finite()).collect();
    pts.sort_by(|a, b| a.x.total_cmp(&b.x));
    let at = |p: &Point| (axis.to_axis(p.x), p.y);
    let width = if s.kind == SeriesKind::Ideal { 1 } else { 2 };
    if s.kind != SeriesKind::Markers {
        ctx.draw_series(LineSeries::new(pts.iter().map(at), c.stroke_width(width)))
            .map_err(|e| err(e.to_string()))?;
    }
    match s.kind {
        SeriesKind::Ideal => {}
        SeriesKind::Projected => {
            ctx.draw_series(pts.iter().flat_map(|p| open_mark(at(p), c)))
                .map_err(|e| err(e.to_string()))?;
        }
        SeriesKind::Line | SeriesKind::Markers => {
            ctx.draw_series(pts.iter().map(|p| Circle::new(at(p), 4, c.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    let bars = pts.iter().filter_map(|p| {
        let (lo, hi) = p.interval?;
        Some(ErrorBar::new_vertical(
            axis.to_axis(p.x),
            lo,
            p.y,
            hi.min(y_top),
            c.stroke_width(1),
            ERROR_CAP_PX,
        ))
    });
    ctx.draw_series(bars).map_err(|e| err(e.to_string()))?;
    let clipped = pts
        .iter()
        .filter(|p| p.interval.is_some_and(|i| i.1 > y_top))
        .map(|p| TriangleMarker::new((axis.to_axis(p.x), y_top), 6, c.filled()));
    ctx.draw_series(clipped).map_err(|e| err(e.to_string()))?;
    Ok((!s.name.is_empty()).then_some(match s.kind {
        SeriesKind::Markers => Swatch::Mark(c),
        SeriesKind::Projected => Swatch::OpenMarkLine(c),
        SeriesKind::Line | SeriesKind::Ideal => Swatch::Line(c, width),
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
pub(crate) fn stacked_bars(
    title: &str,
    x_label: &str,
    y_label: &str,
    categories: &[String],
    stacks: &[(String, Vec<f64>)],
) -> Result<String> {
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
            (LegendAt::Right, 0),
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
        legend(&root, (right + 14, top), &entries, 40, title)?;
        root.present().map_err(|e| fail(title)(e.to_string()))?;
    }
    Ok(svg)
}

/// Box plots: per label [p5, p25, median, p75, p95], coloured by group index.
pub(crate) fn box_plot(
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
        let mut ctx = frame(
            &root,
            &text,
            x_range,
            x_ticks,
            &|v| category_label(labels, v),
            y_range(ys),
            (LegendAt::Right, 0),
        )?;
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
        legend(&root, (right + 14, top), &entries, 40, title)?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    Ok(svg)
}

/// The heatmap's colour for `t` in 0..=1: pale yellow (low) to dark red (high).
fn heat(t: f64) -> RGBColor {
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t).round() as u8;
    RGBColor(mix(0xff, 0x80), mix(0xf5, 0x00), mix(0xc0, 0x26))
}

/// About `want` evenly spaced tick positions over `n` categories, each at a
/// category's centre.
fn sparse_ticks(n: usize, want: usize) -> Vec<f64> {
    let every = n.div_ceil(want.max(1)).max(1);
    (0..n).step_by(every).map(|c| c as f64 + 0.5).collect()
}

/// A grid of cells, `cells[row][column]` (NaN: empty, drawn grey), coloured from the
/// smallest value to the largest, with a colour bar whose ends and middle are labelled
/// with their value; rows are labelled with `row_labels` (row 0 at the top), columns
/// with `column_labels`.
pub(crate) fn heatmap(
    labels: (&str, &str, &str),
    value_label: &str,
    row_labels: &[String],
    column_labels: &[String],
    cells: &[Vec<f64>],
) -> Result<String> {
    let (title, x_desc, y_desc) = labels;
    let err = fail(title);
    let (lo, hi) = cells
        .iter()
        .flatten()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |a, v| (a.0.min(*v), a.1.max(*v)));
    let (lo, hi) = if lo.is_finite() { (lo, hi.max(lo + 1e-12)) } else { (0.0, 1.0) };
    let (rows, cols) = (cells.len().max(1), column_labels.len().max(1));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W_PX, H_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(title, (FONT, 19))
            .margin(12)
            .margin_right(LEGEND_W_PX - 120)
            .x_label_area_size(44)
            .y_label_area_size(84)
            .build_cartesian_2d(
                Ticked {
                    inner: (0.0..cols as f64).into(),
                    ticks: sparse_ticks(cols, 8),
                },
                Ticked {
                    inner: (rows as f64..0.0).into(),
                    ticks: sparse_ticks(rows, 16),
                },
            )
            .map_err(|e| err(e.to_string()))?;
        let pick = |names: &[String], v: f64| names.get(v.floor().max(0.0) as usize).cloned().unwrap_or_default();
        ctx.configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| pick(column_labels, *v))
            .y_label_formatter(&|v| pick(row_labels, *v))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .disable_mesh()
            .draw()
            .map_err(|e| err(e.to_string()))?;
        let rects = cells.iter().enumerate().flat_map(|(r, row)| {
            row.iter().enumerate().map(move |(c, v)| {
                let colour = if v.is_finite() {
                    heat((v - lo) / (hi - lo))
                } else {
                    RGBColor(0xdd, 0xdd, 0xdd)
                };
                Rectangle::new([(c as f64, r as f64), (c as f64 + 1.0, r as f64 + 1.0)], colour.filled())
            })
        });
        ctx.draw_series(rects).map_err(|e| err(e.to_string()))?;
        let (xs, ys) = ctx.plotting_area().get_pixel_range();
        let (right, top, bottom) = (xs.end, ys.start, ys.end);
        colour_bar(&root, (right + 24, top, bottom), (lo, hi), value_label).map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    Ok(svg)
}

/// A vertical colour bar at `x` from `top` to `bottom` pixels, its value at the top,
/// middle and bottom written beside it, and `label` above it.
fn colour_bar(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    (x, top, bottom): (i32, i32, i32),
    (lo, hi): (f64, f64),
    label: &str,
) -> Result<(), String> {
    const STEPS: i32 = 24;
    let h = ((bottom - top) / STEPS).max(1);
    for k in 0..STEPS {
        let y = top + k * h;
        let t = 1.0 - (k as f64 + 0.5) / STEPS as f64;
        root.draw(&Rectangle::new([(x, y), (x + 18, y + h)], heat(t).filled()))
            .map_err(|e| e.to_string())?;
    }
    let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let end = top + STEPS * h;
    for (y, v) in [(top, hi), ((top + end) / 2, (lo + hi) / 2.0), (end, lo)] {
        root.draw(&Text::new(fmt_tick((v * 100.0).round() / 100.0), (x + 24, y), style.clone()))
            .map_err(|e| e.to_string())?;
    }
    let above = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Bottom));
    root.draw(&Text::new(label.to_string(), (x - 10, top - 6), above))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Which row of its rank's lane a [`LaneSlice`] is drawn in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneRow {
    /// The upper row: the training thread's phases.
    Phases,
    /// The lower row: the all-reduce.
    Comm,
}

/// One coloured span of a [`lanes`] picture, in ms from the window's start.
#[derive(Debug, Clone)]
pub(crate) struct LaneSlice {
    pub lane: usize,
    pub row: LaneRow,
    pub from_ms: f64,
    pub to_ms: f64,
    pub colour: RGBColor,
}

/// Width of a [`lanes`] picture in pixels.
pub(crate) const LANES_W_PX: u32 = 1400;
/// Height of one lane of a [`lanes`] picture up to [`LANES_TALL_MAX`] lanes.
const LANE_TALL_PX: u32 = 36;
/// Height of one lane beyond [`LANES_TALL_MAX`] lanes.
const LANE_SHORT_PX: u32 = 16;
/// Lanes drawn [`LANE_TALL_PX`] high; more are drawn [`LANE_SHORT_PX`] high.
const LANES_TALL_MAX: usize = 16;
/// Caption, axis and legend around the lanes, in pixels of height.
const LANES_FRAME_PX: u32 = 150;

/// Height of a [`lanes`] picture of `n` lanes, in pixels.
pub(crate) fn lanes_height_px(n: usize) -> u32 {
    let per_lane = if n <= LANES_TALL_MAX { LANE_TALL_PX } else { LANE_SHORT_PX };
    LANES_FRAME_PX + per_lane * n.max(1) as u32
}

/// A timeline of one lane per label (lane 0 at the top), each lane an upper row of
/// [`LaneRow::Phases`] and a lower row of [`LaneRow::Comm`] slices, on an x axis in ms
/// from 0 to `span_ms`, with `legend` (name and colour) in a row under the axis.
pub(crate) fn lanes(
    title: &str,
    lane_labels: &[String],
    span_ms: f64,
    slices: &[LaneSlice],
    legend: &[(String, RGBColor)],
) -> Result<String> {
    let err = fail(title);
    let n = lane_labels.len().max(1);
    let height = lanes_height_px(n);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (LANES_W_PX, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut ctx = ChartBuilder::on(&root)
            .caption(title, (FONT, 19))
            .margin(12)
            .margin_bottom(52)
            .x_label_area_size(44)
            .y_label_area_size(84)
            .build_cartesian_2d(
                0.0..span_ms.max(1e-3),
                Ticked {
                    inner: (n as f64..0.0).into(),
                    ticks: sparse_ticks(n, 32),
                },
            )
            .map_err(|e| err(e.to_string()))?;
        let pick = |v: f64| lane_labels.get(v.floor().max(0.0) as usize).cloned().unwrap_or_default();
        ctx.configure_mesh()
            .x_desc("time from the window's start (ms)")
            .y_desc("rank")
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|v| pick(*v))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .disable_y_mesh()
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        let rects = slices.iter().map(|s| {
            let lane = s.lane as f64;
            let (top, bottom) = match s.row {
                LaneRow::Phases => (lane + 0.08, lane + 0.58),
                LaneRow::Comm => (lane + 0.64, lane + 0.92),
            };
            Rectangle::new([(s.from_ms, top), (s.to_ms, bottom)], s.colour.filled())
        });
        ctx.draw_series(rects).map_err(|e| err(e.to_string()))?;
        let (xs, _) = ctx.plotting_area().get_pixel_range();
        lanes_legend(&root, (xs.start, height as i32 - 24), legend).map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    Ok(svg)
}

/// `entries` in one row from `(x, y)` (the swatches' centre line), each a swatch and
/// its name.
fn lanes_legend(root: &DrawingArea<SVGBackend<'_>, Shift>, (mut x, y): (i32, i32), entries: &[(String, RGBColor)]) -> Result<(), String> {
    let style = TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (name, colour) in entries {
        root.draw(&Rectangle::new([(x, y - 6), (x + 16, y + 6)], colour.filled()))
            .map_err(|e| e.to_string())?;
        root.draw(&Text::new(name.clone(), (x + 22, y), style.clone()))
            .map_err(|e| e.to_string())?;
        // DejaVu Sans at 14 px averages under 8 px a character.
        x += 22 + name.chars().count() as i32 * 8 + 16;
    }
    Ok(())
}

/// Renders SVG documents to PNG; loads the system fonts once.
pub(crate) struct Rasteriser {
    options: resvg::usvg::Options<'static>,
}

impl Rasteriser {
    pub(crate) fn new() -> Rasteriser {
        let mut options = resvg::usvg::Options::default();
        options.fontdb_mut().load_system_fonts();
        Rasteriser { options }
    }

    /// `svg` rendered as a PNG file's bytes.
    pub(crate) fn png(&self, svg: &str) -> Result<Vec<u8>> {
        let tree = resvg::usvg::Tree::from_str(svg, &self.options).context("internal error: invalid SVG")?;
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).context("empty plot")?;
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        pixmap.encode_png().context("cannot encode a plot as PNG")
    }

    /// Stages `svg` as `<stem>.svg` and its rendering as `<stem>.png` into `files`; the
    /// stem is made a file name of its own ([`crate::files::safe_component`]), so a
    /// run id or a workload in it can never make it a path.
    pub(crate) fn stage(&self, files: &mut crate::files::StagedFiles, stem: &str, svg: &str) -> Result<()> {
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

    /// An interval far above the values does not stretch the axis: its whisker is
    /// clipped at the top, marked with a triangle, and the legend says so; an interval
    /// within reach is drawn whole with no such key.
    #[test]
    fn a_wide_interval_is_clipped_at_the_axis_top_and_marked() {
        let chart = |high: f64| LineChart {
            title: "efficiency".into(),
            x_label: "ranks".into(),
            y_label: "efficiency".into(),
            x_scale: XScale::Ranks,
            series: vec![Series {
                name: "weak".into(),
                points: vec![Point::new(1.0, 1.0), Point::new(2.0, 0.9).with_interval(0.5, high)],
                kind: SeriesKind::Line,
                colour: None,
            }],
            bands: Vec::new(),
        };
        let wide = line_chart(&chart(5.0)).unwrap();
        assert!(wide.contains(CLIPPED_KEY), "{wide}");
        // The axis tops out at 1.1 × 1.5 (the reach): no tick at 2 or above.
        for tick in [">2<", ">3<", ">4<", ">5<", ">2.0<", ">4.0<"] {
            assert!(!wide.contains(tick), "{tick} on the axis:\n{wide}");
        }
        let near = line_chart(&chart(1.2)).unwrap();
        assert!(!near.contains(CLIPPED_KEY), "{near}");
        assert_eq!(
            wide.matches("<polygon").count(),
            near.matches("<polygon").count() + 2,
            "a triangle on the chart and in the legend"
        );
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
