//! Reads a rank's trace file back one line at a time, in either form the writer leaves:
//! the object form of a finished run, or the array form of one that stopped (one event a
//! line, perhaps a half-written last line). Memory is one line, at most
//! [`MAX_LINE_BYTES`], whatever the file's size. Every event is checked before it is
//! used; a line that is not a whole event of this rank is skipped, counted and its
//! reason kept (the first [`REASONS_KEPT`]), and reading goes on. The last line of a file
//! the run did not complete, cut by a rank that died mid-write, is where its trace ends,
//! not a skipped line. Parsing is bounded in depth (serde_json stops at 128 levels), so
//! a deeply nested line is one skipped line, not a stack overflow.

use crate::files;
use crate::trace::files::MAX_FILE_BYTES;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// The longest line read as an event: far above any event ddpbench writes (under 1 KiB).
pub(crate) const MAX_LINE_BYTES: usize = 1 << 20;
/// How many skipped lines' reasons a rank's summary keeps.
pub(crate) const REASONS_KEPT: usize = 3;

/// Lines of one rank's file that were not whole events of that rank.
#[derive(Debug, Default, Clone)]
pub(crate) struct Skipped {
    pub count: usize,
    /// `line N: why`, for the first [`REASONS_KEPT`].
    pub first: Vec<String>,
}

/// What was read from one rank's file (its events went to the caller one by one).
#[derive(Debug)]
pub(crate) struct RankRead {
    pub events: usize,
    /// True when the file ended in the object form (the run finished it).
    pub complete: bool,
    pub skipped: Skipped,
    /// Where the writer stopped at its byte bound: the first step not traced, and the
    /// bound in bytes.
    pub stopped: Option<(usize, u64)>,
}

/// Reads `path`, written for rank `rank`, handing each whole event to `each` in file
/// order. A file that is not a regular file (a FIFO, a device) or is over
/// [`MAX_FILE_BYTES`] is refused before anything is read.
pub(crate) fn each_event(path: &Path, rank: usize, mut each: impl FnMut(Map<String, Value>) -> Result<()>) -> Result<RankRead> {
    let file = files::open_regular(path).with_context(|| format!("cannot read the trace file {}", path.display()))?;
    let len = file.metadata().with_context(|| format!("cannot read {}", path.display()))?.len();
    if len > MAX_FILE_BYTES {
        bail!(
            "{} is {len} bytes, over the {MAX_FILE_BYTES} a trace can reach (its writer stops far below): \
             not a file ddpbench wrote; remove it or trace fewer steps (--trace-steps)",
            path.display()
        );
    }
    let mut input = BufReader::with_capacity(1 << 16, file);
    let mut out = RankRead {
        events: 0,
        complete: false,
        skipped: Skipped::default(),
        stopped: None,
    };
    let (mut buf, mut number) = (Vec::new(), 0usize);
    loop {
        let line = read_line(&mut input, &mut buf).with_context(|| format!("cannot read {}", path.display()))?;
        if line.bytes == 0 {
            break;
        }
        number += 1;
        let event = match event_of(&buf, &line, rank) {
            Line::Structure(closes) => {
                out.complete = closes;
                continue;
            }
            Line::Event(e) => e,
            // A rank that died mid-write: the end of its trace.
            Line::Bad(_) if !line.newline && !out.complete => break,
            Line::Bad(why) => {
                out.skipped.count += 1;
                if out.skipped.first.len() < REASONS_KEPT {
                    out.skipped.first.push(format!("line {number}: {why}"));
                }
                continue;
            }
        };
        out.complete = false;
        if let Some(step) = event
            .get("args")
            .and_then(|a| a.get("trace_stopped_before_step"))
            .and_then(Value::as_u64)
        {
            let bound = event["args"].get("max_bytes").and_then(Value::as_u64).unwrap_or(0);
            out.stopped = Some((step as usize, bound));
        }
        out.events += 1;
        each(event)?;
    }
    Ok(out)
}

/// One line as read: its length in the file, whether a newline ended it, and whether
/// it was longer than [`MAX_LINE_BYTES`] (then only that much of it is kept).
struct LineRead {
    bytes: usize,
    newline: bool,
    too_long: bool,
}

/// Reads one line into `buf` (without its newline), keeping at most
/// [`MAX_LINE_BYTES`] + 1 bytes of it and passing over the rest.
fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<LineRead> {
    buf.clear();
    let mut line = LineRead {
        bytes: 0,
        newline: false,
        too_long: false,
    };
    loop {
        let avail = input.fill_buf()?;
        if avail.is_empty() {
            return Ok(line);
        }
        let (part, newline) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], true),
            None => (avail, false),
        };
        let keep = part.len().min((MAX_LINE_BYTES + 1).saturating_sub(buf.len()));
        buf.extend_from_slice(&part[..keep]);
        line.too_long |= buf.len() > MAX_LINE_BYTES;
        let used = part.len() + usize::from(newline);
        line.bytes += used;
        input.consume(used);
        if newline {
            line.newline = true;
            return Ok(line);
        }
    }
}

/// What one line of a rank file is.
enum Line {
    /// Not an event: the object form's first lines, a bracket, a blank line; true for
    /// the line that closes the object form.
    Structure(bool),
    Event(Map<String, Value>),
    /// Meant as an event and not a whole one of this rank: why.
    Bad(String),
}

fn event_of(buf: &[u8], line: &LineRead, rank: usize) -> Line {
    if line.too_long {
        return Line::Bad(format!("longer than {} KiB", MAX_LINE_BYTES >> 10));
    }
    let Ok(text) = std::str::from_utf8(buf) else {
        return Line::Bad("not UTF-8 text".into());
    };
    let t = text.trim();
    let structure = ["{\"distributedInfo\"", "\"displayTimeUnit\"", "\"traceEvents\""];
    if t.is_empty() || t == "[" || t == "]" || structure.iter().any(|s| t.starts_with(s)) {
        return Line::Structure(false);
    }
    if t == "]}" {
        return Line::Structure(true);
    }
    match serde_json::from_str::<Value>(t.trim_end_matches(',')) {
        Ok(v) => checked(v, rank).map_or_else(Line::Bad, Line::Event),
        Err(e) if e.to_string().contains("recursion limit") => Line::Bad("nested more than 128 levels deep".into()),
        Err(e) => Line::Bad(format!("not JSON ({e})")),
    }
}

/// The event when it has everything a trace reader needs: `ph`, `name`, `cat` strings,
/// this rank's `pid`, a whole `tid`, finite `ts` and `dur ≥ 0`; else what it lacks.
fn checked(v: Value, rank: usize) -> Result<Map<String, Value>, String> {
    let Value::Object(m) = v else {
        return Err("not a JSON object".into());
    };
    if let Some(k) = ["ph", "name", "cat"].into_iter().find(|k| !m.get(*k).is_some_and(Value::is_string)) {
        return Err(format!("no {k} string"));
    }
    match m.get("pid").and_then(Value::as_u64) {
        Some(p) if p == rank as u64 => {}
        Some(p) => return Err(format!("pid {p}, not rank {rank}")),
        None => return Err("no whole pid".into()),
    }
    if m.get("tid").and_then(Value::as_u64).is_none() {
        return Err("no whole tid".into());
    }
    let time = |k: &str, least: f64| m.get(k).and_then(Value::as_f64).filter(|t| (least..1e15).contains(t));
    if time("ts", -1e15).is_none() {
        return Err("ts is not a time in µs".into());
    }
    if time("dur", 0.0).is_none() {
        return Err("dur is not a duration in µs".into());
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str) -> (Vec<Map<String, Value>>, RankRead) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-00001.trace.json");
        std::fs::write(&path, text).unwrap();
        let mut events = Vec::new();
        let read = each_event(&path, 1, |e| {
            events.push(e);
            Ok(())
        })
        .unwrap();
        (events, read)
    }

    const EVENT: &str = r#"{"ph":"X","cat":"cpu_op","name":"forward","pid":1,"tid":1,"ts":1.000,"dur":2.000},"#;

    #[test]
    fn bad_lines_are_skipped_with_reasons_and_the_rest_is_read() {
        let long = format!(r#"{{"ph":"X","name":"{}"}},"#, "x".repeat(MAX_LINE_BYTES));
        let deep = format!(r#"{{"ph":"X","args":{}{}}},"#, "[".repeat(200), "]".repeat(200));
        let text = [
            "[",
            EVENT,
            &EVENT.replace("\"pid\":1", "\"pid\":99"),
            &long,
            &deep,
            &EVENT.replace("1.000", "NaN"),
            &EVENT.replace("2.000", "-1"),
            EVENT,
            "",
        ]
        .join("\n");
        let (events, read) = read_text(&text);
        assert_eq!((events.len(), read.events, read.skipped.count), (2, 2, 5));
        assert_eq!(
            read.skipped.first,
            [
                "line 3: pid 99, not rank 1",
                "line 4: longer than 1024 KiB",
                "line 5: nested more than 128 levels deep"
            ]
        );
        assert!(!read.complete && read.stopped.is_none());
    }

    #[test]
    fn a_cut_last_line_ends_an_array_form_and_the_object_form_is_complete() {
        let (events, read) = read_text(&format!("[\n{EVENT}\n{EVENT}\n{}", &EVENT[..30]));
        assert_eq!((events.len(), read.skipped.count, read.complete), (2, 0, false));
        let stop = r#"{"ph":"i","cat":"user_annotation","name":"stop","pid":1,"tid":1,"ts":9.000,"dur":0.000,"s":"p","args":{"trace_stopped_before_step":7,"max_bytes":9000}}"#;
        let object =
            format!("{{\"distributedInfo\": {{\"rank\": 1}},\n\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n{EVENT}\n{stop}\n]}}\n");
        let (events, read) = read_text(&object);
        assert_eq!((events.len(), read.skipped.count, read.complete), (2, 0, true));
        assert_eq!(read.stopped, Some((7, 9000)));
    }
}
