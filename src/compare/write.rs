//! What `compare` writes: the terminal table, compare.md, compare.csv, the sentence on
//! the biggest difference, and the new folder they go into.

use super::points::{shown, step_parts, Compared, RatioInterval, METRICS, THROUGHPUT};
use super::Refusal;
use crate::reduce::analysis::interval::Direction;
use std::path::{Path, PathBuf};

/// Creates the output folder: `out`, which must not exist, or the first of ./compare,
/// ./compare-2, ... that does not.
pub(super) fn new_folder(out: Option<&Path>) -> Result<PathBuf, Refusal> {
    // A stop signal from here on removes the folder again while it is empty.
    let _stops = crate::cleanup::StopsDeferred::begin();
    if let Some(dir) = out {
        return match std::fs::create_dir(dir) {
            Ok(()) => {
                crate::cleanup::arm_created(dir);
                Ok(dir.to_path_buf())
            }
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
            Ok(()) => {
                crate::cleanup::arm_created(&dir);
                return Ok(dir);
            }
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

/// The metrics whose ratio can have an interval (the step, the phases, throughput: a
/// value per run), in [`METRICS`]' order.
fn has_interval(i: usize) -> bool {
    i <= *THROUGHPUT
}

/// The direction B takes, as a word; none where the interval holds 1 or there is none.
fn direction_word(iv: &RatioInterval) -> &'static str {
    match iv.direction {
        Direction::Faster => "B is faster",
        Direction::Slower => "B is slower",
        _ => "",
    }
}

/// The throughput ratio's interval and direction, in words.
fn interval_words(c: &Compared) -> String {
    let iv = c.throughput();
    match iv.direction {
        Direction::NoInterval => format!(
            "no interval ({} vs {} runs: an interval needs 2 or more on each side)",
            c.b.run_ids.len(),
            c.a.run_ids.len()
        ),
        Direction::Faster | Direction::Slower => {
            format!("95 % interval {:.3}–{:.3}: {}", iv.low, iv.high, direction_word(&iv))
        }
        _ => format!("95 % interval {:.3}–{:.3}: within noise", iv.low, iv.high),
    }
}

/// Metric `i`'s interval as a table cell ("–" without one) and its direction
/// ("within noise" where the interval holds 1).
fn interval_cells(c: &Compared, i: usize) -> (String, String) {
    let iv = &c.intervals[i];
    if !has_interval(i) || iv.direction == Direction::NoInterval {
        return ("–".into(), String::new());
    }
    let word = match direction_word(iv) {
        "" => "within noise",
        w => w,
    };
    (format!("{:.3}–{:.3}", iv.low, iv.high), word.into())
}

/// The point whose step time differs most (by its ratio's logarithm), the phase whose
/// seconds differ most there, and their figures.
pub(super) fn biggest_difference(points: &[Compared]) -> String {
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
        c.ratio(*THROUGHPUT),
        interval_words(c)
    );
    let gap = |i: &usize| (c.b.values[*i] - c.a.values[*i]).abs();
    if let Some(i) = step_parts().filter(|i| gap(i).is_finite()).max_by(|x, y| gap(x).total_cmp(&gap(y))) {
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
pub(super) fn markdown(labels: &(String, String), points: &[Compared], only: &[String], sentence: &str) -> String {
    let mut md = format!("# Comparison\n\nA: `{}`  \nB: `{}`\n\n{sentence}\n", labels.0, labels.1);
    for c in points {
        md += &format!(
            "\n## {}\n\nA: {} ({}; runs {}). B: {} ({}; runs {}). Throughput B / A: {}.\n\n| figure | A | B | B / A | 95 % interval of B / A | direction |\n|---|---:|---:|---:|---:|---|\n",
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
            let (interval, direction) = interval_cells(c, i);
            md += &format!(
                "| {what} | {} | {} | {} | {interval} | {direction} |\n",
                num(shown(i, c.a.values[i])),
                num(shown(i, c.b.values[i])),
                num(c.ratio(i))
            );
        }
    }
    if !points.is_empty() {
        md += "\nThe intervals are 95 % t-intervals (Welch) on the logs of each side's per-run values, for the ratio of their geometric means; a figure has one where both sides have 2 or more runs, each with a value above 0 (a phase at 0 is averaged arithmetically and has none). A direction is named only where the interval excludes 1; a time's interval below 1 is B faster.\n";
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
pub(super) fn terminal(labels: &(String, String), points: &[Compared], only: &[String], sentence: &str) -> String {
    let mut out = format!("A: {}\nB: {}\n", labels.0, labels.1);
    for c in points {
        out += &format!(
            "\n{}\n  {:<34} {:>14} {:>14} {:>9} {:>13}  direction\n",
            point_title(c),
            "figure",
            "A",
            "B",
            "B / A",
            "95 % interval"
        );
        for (i, (_, what)) in METRICS.iter().enumerate() {
            let (interval, direction) = interval_cells(c, i);
            out += &format!(
                "  {what:<34} {:>14} {:>14} {:>9} {interval:>13}  {direction}\n",
                num(shown(i, c.a.values[i])),
                num(shown(i, c.b.values[i])),
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

/// compare.csv: one row per point; per figure its A, B and B / A columns, and for the
/// step, the phases and throughput the interval of B / A and its direction.
pub(super) fn csv(points: &[Compared]) -> anyhow::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = ["model", "dataset", "ranks", "batch_per_rank", "runs_a", "runs_b"]
        .map(String::from)
        .to_vec();
    for (i, (m, _)) in METRICS.iter().enumerate() {
        header.extend([format!("{m}_a"), format!("{m}_b"), format!("{m}_ratio")]);
        if has_interval(i) {
            header.extend([format!("{m}_ratio_low"), format!("{m}_ratio_high"), format!("{m}_direction")]);
        }
    }
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
        for (i, iv) in c.intervals.iter().enumerate() {
            row.extend([cell(c.a.values[i]), cell(c.b.values[i]), cell(c.ratio(i))]);
            if has_interval(i) {
                let direction = serde_json::to_value(iv.direction)?.as_str().unwrap_or_default().to_string();
                row.extend([cell(iv.low), cell(iv.high), direction]);
            }
        }
        w.write_record(&row)?;
    }
    Ok(w.into_inner()?)
}
