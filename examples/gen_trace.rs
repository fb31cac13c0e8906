//! Makes a large traced run folder out of a small real one, for measuring the merge of
//! `ddpbench trace`:
//!   cargo run --release --example gen_trace -- TEMPLATE_RUN OUT_RUN MB_PER_RANK
//! TEMPLATE_RUN is a finished run of `train --trace`. OUT_RUN gets its top-level files
//! (the manifest, its run id set to OUT_RUN's name, clock.csv, the CSVs) and, per rank, a
//! trace file in the object form that repeats the template's traced events, each copy
//! placed after the previous one on the rank's clock, until the file holds MB_PER_RANK
//! megabytes (10^6 bytes).
use anyhow::{ensure, Context, Result};
use ddpbench::trace::viewer_times;
use serde_json::{json, Value};
use std::io::{BufWriter, Write};
use std::path::Path;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    ensure!(args.len() == 4, "usage: gen_trace TEMPLATE_RUN OUT_RUN MB_PER_RANK");
    let (template, out) = (Path::new(&args[1]), Path::new(&args[2]));
    let target_bytes = args[3].parse::<u64>().context("MB_PER_RANK")? * 1_000_000;
    std::fs::create_dir_all(out.join("trace"))?;
    for entry in std::fs::read_dir(template).with_context(|| format!("cannot read {}", template.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), out.join(entry.file_name()))?;
        }
    }
    let manifest_path = out.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).with_context(|| format!("cannot read {}", manifest_path.display()))?;
    let mut manifest: Value = serde_json::from_str(&text)?;
    manifest["run_id"] = json!(out.file_name().unwrap().to_string_lossy());
    std::fs::write(out.join("manifest.json"), serde_json::to_string_pretty(&manifest)?)?;
    let world = manifest["world_size"].as_u64().context("world_size")? as usize;
    for rank in 0..world {
        let name = format!("rank-{rank:05}.trace.json");
        let path = template.join("trace").join(&name);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let doc: Value = serde_json::from_str(&text)?;
        let events = doc["traceEvents"].as_array().context("traceEvents")?;
        let bytes = repeat(events, &doc["distributedInfo"], &out.join("trace").join(&name), target_bytes)?;
        println!("{name}: {bytes} bytes");
    }
    Ok(())
}

/// Writes `events` (metadata once, the rest again and again, each copy after the last)
/// to `path` until it holds `target_bytes`; returns the bytes written.
fn repeat(events: &[Value], info: &Value, path: &Path, target_bytes: u64) -> Result<u64> {
    let ns = |e: &Value, k: &str| (e[k].as_f64().unwrap_or(0.0) * 1e3).round() as i64;
    let (meta, timed): (Vec<&Value>, Vec<&Value>) = events.iter().partition(|e| e["ph"] == "M");
    let first = timed.iter().map(|e| ns(e, "ts")).min().unwrap_or(0);
    let last = timed.iter().map(|e| ns(e, "ts") + ns(e, "dur")).max().unwrap_or(0);
    let period_ns = last - first + 1_000_000;
    let mut w = Counted(BufWriter::new(std::fs::File::create(path)?), 0);
    w.put(&format!(
        "{{\"distributedInfo\": {info},\n\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n"
    ))?;
    let lines: Vec<String> = meta.iter().map(|e| line(e)).collect();
    w.put(&lines.join(",\n"))?;
    let mut copy = 0i64;
    while w.1 < target_bytes {
        for e in &timed {
            let mut e = (*e).clone();
            let from = ns(&e, "ts") + copy * period_ns;
            let (ts, dur) = viewer_times(from, from + ns(&e, "dur"));
            e["ts"] = json!(ts);
            e["dur"] = json!(dur);
            w.put(",\n")?;
            w.put(&line(&e))?;
        }
        copy += 1;
    }
    w.put("\n]}\n")?;
    w.0.flush()?;
    Ok(w.1)
}

/// `e` on one line with its keys in the order ddpbench's writer puts them (`ph` first).
fn line(e: &Value) -> String {
    const ORDER: [&str; 9] = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "s", "args"];
    let fields: Vec<String> = ORDER.iter().filter_map(|k| e.get(*k).map(|v| format!("\"{k}\":{v}"))).collect();
    format!("{{{}}}", fields.join(","))
}

/// A file being written, and its bytes so far.
struct Counted(BufWriter<std::fs::File>, u64);

impl Counted {
    fn put(&mut self, s: &str) -> Result<()> {
        self.0.write_all(s.as_bytes())?;
        self.1 += s.len() as u64;
        Ok(())
    }
}
