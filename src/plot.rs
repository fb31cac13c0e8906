//! Plots as SVG written by hand (no plotting dependency), rasterised to PNG with
//! resvg. Each chart is a self-contained SVG document a browser or LibreOffice opens.

use anyhow::{Context, Result};
use std::fmt::Write;
use std::path::Path;

const W: f64 = 720.0;
const H: f64 = 440.0;
const M_LEFT: f64 = 70.0;
const M_RIGHT: f64 = 190.0;
const M_TOP: f64 = 40.0;
const M_BOTTOM: f64 = 55.0;
pub const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    pub markers_only: bool,
}

/// "Nice" tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

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
        format!("{}", crate::record::format_plain((v * 1e4).round() / 1e4))
    }
}

fn header(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
        (M_LEFT + W - M_RIGHT) / 2.0,
        esc(title)
    )
}

/// Horizontal grid lines with their labels at round values of the y axis.
fn y_grid(svg: &mut String, lo: f64, hi: f64, sy: &dyn Fn(f64) -> f64) {
    for t in ticks(lo, hi) {
        let y = sy(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{M_LEFT}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            W - M_RIGHT,
            M_LEFT - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
}

fn axes(svg: &mut String, x_label: &str, y_label: &str) {
    let (x0, y0, x1, y1) = (M_LEFT, H - M_BOTTOM, W - M_RIGHT, M_TOP);
    let _ = writeln!(svg, "<path d=\"M{x0},{y1} L{x0},{y0} L{x1},{y0}\" fill=\"none\" stroke=\"black\"/>");
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        H - 15.0,
        esc(x_label)
    );
    let _ = writeln!(
        svg,
        "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (y0 + y1) / 2.0,
        esc(y_label)
    );
}

fn legend(svg: &mut String, names: &[(String, &str, bool)]) {
    for (i, (name, color, dashed)) in names.iter().enumerate() {
        let y = M_TOP + 10.0 + 18.0 * i as f64;
        let x = W - M_RIGHT + 15.0;
        let dash = if *dashed { " stroke-dasharray=\"5,4\"" } else { "" };
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{color}\" stroke-width=\"2.5\"{dash}/>",
            x + 22.0
        );
        let short: String = name.chars().take(26).collect();
        let _ = writeln!(svg, "<text x=\"{}\" y=\"{}\">{}</text>", x + 28.0, y + 4.0, esc(&short));
    }
}

/// Lines (or markers) on linear axes, or a log10 x axis.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series], log_x: bool) -> String {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let tx = |x: f64| if log_x { x.max(1e-300).log10() } else { x };
    let (mut xmin, mut xmax) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| (a.0.min(tx(p.0)), a.1.max(tx(p.0))));
    let ymax = pts.iter().fold(0.0f64, |a, p| a.max(p.1)) * 1.1;
    let ymin = pts.iter().fold(0.0f64, |a, p| a.min(p.1));
    if !xmin.is_finite() {
        xmin = 0.0;
        xmax = 1.0;
    }
    if xmax - xmin < 1e-9 {
        xmin -= 0.5;
        xmax += 0.5;
    }
    let ymax = if ymax <= ymin { ymin + 1.0 } else { ymax };
    let sx = |x: f64| M_LEFT + (tx(x) - xmin) / (xmax - xmin) * (W - M_LEFT - M_RIGHT);
    let sy = |y: f64| H - M_BOTTOM - (y - ymin) / (ymax - ymin) * (H - M_TOP - M_BOTTOM);
    let mut svg = header(title);
    y_grid(&mut svg, ymin, ymax, &sy);
    let xt: Vec<f64> = if log_x {
        (xmin.floor() as i32..=xmax.ceil() as i32)
            .map(|e| 10f64.powi(e))
            .filter(|v| tx(*v) >= xmin - 1e-9 && tx(*v) <= xmax + 1e-9)
            .collect()
    } else {
        ticks(xmin, xmax)
    };
    for t in xt {
        let x = sx(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            M_TOP,
            H - M_BOTTOM,
            H - M_BOTTOM + 16.0,
            fmt_tick(t)
        );
    }
    axes(&mut svg, x_label, y_label);
    let mut names = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let color = if s.dashed { "#555" } else { PALETTE[i % PALETTE.len()] };
        let mut p: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !s.markers_only && p.len() > 1 {
            let d: Vec<String> = p.iter().map(|&(x, y)| format!("{:.2},{:.2}", sx(x), sy(y))).collect();
            let dash = if s.dashed { " stroke-dasharray=\"5,4\"" } else { "" };
            let _ = writeln!(
                svg,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
                d.join(" ")
            );
        }
        if !s.dashed {
            for &(x, y) in &p {
                let _ = writeln!(svg, "<circle cx=\"{:.2}\" cy=\"{:.2}\" r=\"4\" fill=\"{color}\"/>", sx(x), sy(y));
            }
        }
        names.push((s.name.clone(), color, s.dashed));
    }
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

/// Vertical stacked bars: one bar per category, one segment per stack.
pub fn stacked_bars(title: &str, y_label: &str, categories: &[String], stacks: &[(String, Vec<f64>)]) -> String {
    let totals: Vec<f64> = (0..categories.len())
        .map(|c| stacks.iter().map(|s| s.1[c].max(0.0)).sum())
        .collect();
    let ymax = totals.iter().copied().fold(0.0, f64::max).max(1e-12) * 1.1;
    let sy = |y: f64| H - M_BOTTOM - y / ymax * (H - M_TOP - M_BOTTOM);
    let mut svg = header(title);
    y_grid(&mut svg, 0.0, ymax, &sy);
    let slot = (W - M_LEFT - M_RIGHT) / categories.len().max(1) as f64;
    for (c, name) in categories.iter().enumerate() {
        let x = M_LEFT + slot * c as f64 + slot * 0.15;
        let mut base = 0.0;
        for (k, (_, v)) in stacks.iter().enumerate() {
            let h = v[c].max(0.0);
            let height = sy(base) - sy(base + h);
            // A segment thinner than the printed precision would be a zero-height rect,
            // which SVG renderers reject with a warning.
            if height >= 0.005 {
                let _ = writeln!(
                    svg,
                    "<rect x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{height:.2}\" fill=\"{}\"/>",
                    sy(base + h),
                    slot * 0.7,
                    PALETTE[k % PALETTE.len()]
                );
            }
            base += h;
        }
        let short: String = name.chars().take(18).collect();
        let _ = writeln!(
            svg,
            "<text x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            x + slot * 0.35,
            H - M_BOTTOM + 14.0,
            esc(&short)
        );
    }
    axes(&mut svg, "", y_label);
    let names: Vec<(String, &str, bool)> = stacks
        .iter()
        .enumerate()
        .map(|(k, s)| (s.0.clone(), PALETTE[k % PALETTE.len()], false))
        .collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
}

/// Box plots: per label [p5, p25, median, p75, p95], coloured by group index.
pub fn box_plot(title: &str, y_label: &str, labels: &[String], boxes: &[[f64; 5]], groups: &[usize], group_names: &[String]) -> String {
    let ymax = boxes.iter().map(|b| b[4]).filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-12) * 1.1;
    let sy = |y: f64| H - M_BOTTOM - y / ymax * (H - M_TOP - M_BOTTOM);
    let mut svg = header(title);
    y_grid(&mut svg, 0.0, ymax, &sy);
    let slot = (W - M_LEFT - M_RIGHT) / labels.len().max(1) as f64;
    for (i, b) in boxes.iter().enumerate() {
        let color = PALETTE[groups.get(i).copied().unwrap_or(0) % PALETTE.len()];
        let cx = M_LEFT + slot * (i as f64 + 0.5);
        let w = (slot * 0.6).min(40.0);
        let _ = writeln!(
            svg,
            "<line x1=\"{cx:.2}\" y1=\"{:.2}\" x2=\"{cx:.2}\" y2=\"{:.2}\" stroke=\"{color}\"/>",
            sy(b[0]),
            sy(b[4])
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{w:.2}\" height=\"{:.2}\" fill=\"{color}\" fill-opacity=\"0.35\" stroke=\"{color}\"/>",
            cx - w / 2.0,
            sy(b[3]),
            (sy(b[1]) - sy(b[3])).max(0.5)
        );
        let _ = writeln!(
            svg,
            "<line x1=\"{:.2}\" y1=\"{:.2}\" x2=\"{:.2}\" y2=\"{:.2}\" stroke=\"black\" stroke-width=\"2\"/>",
            cx - w / 2.0,
            sy(b[2]),
            cx + w / 2.0,
            sy(b[2])
        );
        if labels.len() <= 32 {
            let _ = writeln!(
                svg,
                "<text x=\"{cx:.2}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
                H - M_BOTTOM + 14.0,
                esc(&labels[i])
            );
        }
    }
    axes(&mut svg, "rank (box: p25–p75, line: median, whiskers: p5–p95)", y_label);
    let names: Vec<(String, &str, bool)> = group_names
        .iter()
        .enumerate()
        .map(|(k, n)| (n.clone(), PALETTE[k % PALETTE.len()], false))
        .collect();
    legend(&mut svg, &names);
    svg.push_str("</svg>\n");
    svg
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

    /// Writes `svg` to `stem.svg` and its rendering to `stem.png`.
    pub fn write(&self, svg: &str, stem: &Path) -> Result<()> {
        let svg_path = stem.with_extension("svg");
        std::fs::write(&svg_path, svg).with_context(|| format!("cannot write {}", svg_path.display()))?;
        let tree = resvg::usvg::Tree::from_str(svg, &self.options).context("internal error: invalid SVG")?;
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).context("empty plot")?;
        resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
        let png = stem.with_extension("png");
        pixmap.save_png(&png).with_context(|| format!("cannot write {}", png.display()))
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

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 1.0), vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]);
        assert_eq!(ticks(0.0, 8.0), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
    }

    #[test]
    fn charts_are_valid_svg_and_render_to_png() {
        let s = vec![
            Series {
                name: "speedup".into(),
                points: vec![(1.0, 1.0), (2.0, 1.8), (4.0, 3.1)],
                dashed: false,
                markers_only: false,
            },
            Series {
                name: "ideal".into(),
                points: vec![(1.0, 1.0), (4.0, 4.0)],
                dashed: true,
                markers_only: false,
            },
        ];
        let svg = line_chart("Speedup <&>", "ranks", "speedup", &s, false);
        assert!(svg.contains("Speedup &lt;&amp;&gt;"));
        let dir = tempfile::tempdir().unwrap();
        let r = Rasteriser::new();
        r.write(&svg, &dir.path().join("speedup")).unwrap();
        let png = std::fs::read(dir.path().join("speedup.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let bars = stacked_bars(
            "phases",
            "s",
            &["a".into(), "b".into()],
            &[
                ("x".into(), vec![1.0, 2.0]),
                ("y".into(), vec![0.5, 0.0]),
                ("z".into(), vec![1e-9, 0.0]),
            ],
        );
        r.write(&bars, &dir.path().join("bars")).unwrap();
        // Three bars of 1 and one segment of 0 (and one too thin to draw) give no
        // zero-height rect, which renderers reject.
        assert_eq!(bars.matches("<rect").count(), 1 + 3, "{bars}");
        assert!(!bars.contains("height=\"0.00\""));
        let boxes = box_plot("steps", "s", &["0".into()], &[[1.0, 2.0, 3.0, 4.0, 5.0]], &[0], &["t".into()]);
        resvg::usvg::Tree::from_str(&boxes, &resvg::usvg::Options::default()).unwrap();
    }
}
