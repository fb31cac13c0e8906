//! What `compare` writes: the terminal table, compare.md, compare.csv, the sentence on
//! the biggest difference, and the new folder they go into.

use super::points::{Compared, METRICS, THROUGHPUT};
use super::Refusal;
use crate::reduce::analysis::interval::Direction;
use std::path::{Path, PathBuf};

/// The metrics that are phases of a step (between step_s and samples_per_s in [`METRICS`]).
const PHASES: std::ops::Range<usize> = 1..8;

/// Creates the output folder: `out`, which must not exist, or the first of ./compare,
/// ./compare-2, ... that does not.
pub fn new_folder(out: Option<&Path>) -> Result<PathBuf, Refusal> {
    if let Some(dir) = out {
        return match std::fs::create_dir(dir) {
            Ok(()) => Ok(dir.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Refusal(format!(
                "--out {} exists already: name a new folder (compare never overwrites)",
                dir.display()
            ))),
            Err(e) => Err(Refusal(format!("cannot create --out {}: {e}", dir.display()))),
        };
    }
    for n in 1..=1000 {
        let dir = PathBuf::from(if n == 1 { "compare".to_string() } else { format!("compare-{n}") });
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Refusal(format!("cannot create {}: {e}", dir.display()))),
        }
    }
    Err(Refusal("./compare to ./compare-1000 all exist: give --out".into()))
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

fn point_title(c: &Compared) -> String {
    format!("{} on {}, {} ranks × {} per rank", c.model, c.dataset, c.ranks, c.batch_per_rank)
}

/// The throughput ratio's interval and direction, in words.
fn interval_words(c: &Compared) -> String {
    match c.direction {
        Direction::NoInterval => format!(
            "no interval ({} vs {} runs: an interval needs 2 or more on each side)",
            c.b.run_ids.len(),
            c.a.run_ids.len()
        ),
        Direction::Faster => format!("95 % interval {:.3}–{:.3}: B is faster", c.throughput_low, c.throughput_high),
        Direction::Slower => format!("95 % interval {:.3}–{:.3}: B is slower", c.throughput_low, c.throughput_high),
        _ => format!("95 % interval {:.3}–{:.3}: within noise", c.throughput_low, c.throughput_high),
    }
}

/// The point whose step time differs most (by its ratio's logarithm), the phase whose
/// seconds differ most there, and their figures.
pub fn biggest_difference(points: &[Compared]) -> String {
    let far = |c: &Compared| c.ratio(0).ln().abs();
    let Some(c) = points
        .iter()
        .filter(|c| far(c).is_finite())
        .max_by(|x, y| far(x).total_cmp(&far(y)))
    else {
        return "No point has a step time on both sides.".into();
    };
    let mut text = format!(
        "The biggest difference is {}: a step takes {} s in B against {} s in A (B / A {:.3}); throughput B / A {:.3}, {}.",
        point_title(c),
        num(c.b.values[0]),
        num(c.a.values[0]),
        c.ratio(0),
        c.ratio(THROUGHPUT),
        interval_words(c)
    );
    let gap = |i: &usize| (c.b.values[*i] - c.a.values[*i]).abs();
    if let Some(i) = PHASES.filter(|i| gap(i).is_finite()).max_by(|x, y| gap(x).total_cmp(&gap(y))) {
        text += &format!(
            " The phase that differs most is {}: {} s in B against {} s in A.",
            METRICS[i].0,
            num(c.b.values[i]),
            num(c.a.values[i])
        );
    }
    text
}

/// compare.md: the two files, the sentence, then per point its table.
pub fn markdown(labels: &(String, String), points: &[Compared], only: &[String], sentence: &str) -> String {
    let mut md = format!("# Comparison\n\nA: `{}`  \nB: `{}`\n\n{sentence}\n", labels.0, labels.1);
    for c in points {
        md += &format!(
            "\n## {}\n\nA: {} ({}; runs {}). B: {} ({}; runs {}). Throughput B / A: {}.\n\n| figure | A | B | B / A |\n|---|---:|---:|---:|\n",
            point_title(c),
            c.a.run_ids.len(),
            c.machine_a,
            c.a.run_ids.join(" "),
            c.b.run_ids.len(),
            c.machine_b,
            c.b.run_ids.join(" "),
            interval_words(c)
        );
        for (i, (_, what)) in METRICS.iter().enumerate() {
            md += &format!(
                "| {what} | {} | {} | {} |\n",
                num(c.a.values[i]),
                num(c.b.values[i]),
                num(c.ratio(i))
            );
        }
    }
    if !only.is_empty() {
        md += "\n## Not compared (in one report only)\n\n";
        for o in only {
            md += &format!("- {o}\n");
        }
    }
    md
}

/// The terminal's table: per point, one line per figure.
pub fn terminal(labels: &(String, String), points: &[Compared], only: &[String], sentence: &str) -> String {
    let mut out = format!("A: {}\nB: {}\n", labels.0, labels.1);
    for c in points {
        out += &format!("\n{}\n  {:<34} {:>14} {:>14} {:>9}\n", point_title(c), "figure", "A", "B", "B / A");
        for (i, (_, what)) in METRICS.iter().enumerate() {
            out += &format!(
                "  {what:<34} {:>14} {:>14} {:>9}\n",
                num(c.a.values[i]),
                num(c.b.values[i]),
                num(c.ratio(i))
            );
        }
        out += &format!("  throughput B / A: {}\n", interval_words(c));
    }
    for o in only {
        out += &format!("\n{o}");
    }
    out + &format!("\n{sentence}\n")
}

fn cell(v: f64) -> String {
    if v.is_finite() {
        v.to_string()
    } else {
        String::new()
    }
}

/// compare.csv: one row per point; per figure its A, B and B / A columns.
pub fn csv(points: &[Compared]) -> anyhow::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = ["model", "dataset", "ranks", "batch_per_rank", "runs_a", "runs_b"]
        .map(String::from)
        .to_vec();
    for (m, _) in METRICS {
        header.extend([format!("{m}_a"), format!("{m}_b"), format!("{m}_ratio")]);
    }
    header.extend(["samples_per_s_ratio_low", "samples_per_s_ratio_high", "direction"].map(String::from));
    w.write_record(&header)?;
    for c in points {
        let mut row = vec![
            c.model.clone(),
            c.dataset.clone(),
            c.ranks.to_string(),
            c.batch_per_rank.to_string(),
            c.a.run_ids.len().to_string(),
            c.b.run_ids.len().to_string(),
        ];
        for i in 0..METRICS.len() {
            row.extend([cell(c.a.values[i]), cell(c.b.values[i]), cell(c.ratio(i))]);
        }
        let direction = serde_json::to_value(c.direction)?.as_str().unwrap_or_default().to_string();
        row.extend([cell(c.throughput_low), cell(c.throughput_high), direction]);
        w.write_record(&row)?;
    }
    Ok(w.into_inner()?)
}
