//! The merged `timeline.json` of a run: every rank's trace on rank 0's clock, corrected
//! by the offsets of `clock.csv` as `reduce` reads them ([`ClockOffsets`]: the exact
//! offset where a rank shares rank 0's kernel, else the round-trip estimate), one
//! process per rank named `rank R · host · node type`, sorted so the ranks of a node sit
//! together. Chrome's trace viewer and Perfetto open it.

use super::read::{rank_file, RankEvents};
use crate::record::Manifest;
use crate::reduce::read::ClockOffsets;
use crate::trace::writer::{file_name, TRACE_DIR};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The merged file's name, in the run folder.
pub const TIMELINE: &str = "timeline.json";

/// What a merge read and wrote.
#[derive(Debug)]
pub struct Merged {
    pub path: PathBuf,
    pub ranks: usize,
    pub events: usize,
    /// Ranks whose file stopped before the run completed it (a rank that died).
    pub partial: Vec<usize>,
    /// Ranks without a trace file.
    pub missing: Vec<usize>,
}

/// Merges `run_dir/trace/rank-*.trace.json` into `run_dir/timeline.json`.
pub fn merge(run_dir: &Path) -> Result<Merged> {
    let manifest =
        Manifest::read(run_dir).with_context(|| format!("{} is not a run folder written by `ddpbench train`", run_dir.display()))?;
    let world = manifest.world_size;
    if !run_dir.join(TRACE_DIR).is_dir() {
        bail!(
            "{} has no {TRACE_DIR}/ folder: run `ddpbench train --trace` (or --trace-steps A:B) to trace a run",
            run_dir.display()
        );
    }
    let offsets = ClockOffsets::read(run_dir, world, manifest.wall_s)
        .map_err(|e| anyhow::anyhow!("{e}: clock.csv cannot place the ranks on one clock; restore the file train wrote"))?;
    // Ranks of one host together, in rank order within it.
    let mut order: Vec<(String, usize)> = (0..world).map(|r| (host_of(&manifest, r).0, r)).collect();
    order.sort();
    let (mut out, mut merged) = (
        Vec::new(),
        Merged {
            path: run_dir.join(TIMELINE),
            ranks: 0,
            events: 0,
            partial: Vec::new(),
            missing: Vec::new(),
        },
    );
    for (sort_index, (_, rank)) in order.iter().enumerate() {
        let path = run_dir.join(TRACE_DIR).join(file_name(*rank));
        if !path.exists() {
            merged.missing.push(*rank);
            continue;
        }
        let read = rank_file(&path, *rank)?;
        if !read.complete {
            merged.partial.push(*rank);
        }
        merged.ranks += 1;
        out.extend(placed(read, *rank, sort_index, &manifest, &offsets));
    }
    if merged.ranks == 0 {
        bail!("{}/{TRACE_DIR} holds no rank's trace file", run_dir.display());
    }
    merged.events = out.len();
    write(&merged.path, &out, &manifest, &offsets)?;
    Ok(merged)
}

/// `(host, node type)` of rank `r` as the manifest records it.
fn host_of(m: &Manifest, r: usize) -> (String, String) {
    m.ranks
        .iter()
        .find(|i| i.rank == r)
        .map_or(("?".into(), "?".into()), |i| (i.host.clone(), i.node_type.clone()))
}

/// One rank's events on rank 0's clock, its process renamed and sorted by node.
fn placed(read: RankEvents, rank: usize, sort_index: usize, m: &Manifest, offsets: &ClockOffsets) -> Vec<Map<String, Value>> {
    let (host, node_type) = host_of(m, rank);
    let mut out = Vec::with_capacity(read.events.len());
    for mut e in read.events {
        match e.get("name").and_then(Value::as_str) {
            Some("process_name") if e.get("ph").and_then(Value::as_str) == Some("M") => {
                e.insert("args".into(), json!({ "name": format!("rank {rank} · {host} · {node_type}") }));
            }
            Some("process_sort_index") => {
                e.insert("args".into(), json!({ "sort_index": sort_index }));
            }
            _ if e.get("ph").and_then(Value::as_str) != Some("M") => {
                // Both ends are corrected, in whole nanoseconds, so slices that nest on the
                // rank's clock nest on rank 0's (the offset drifts within a long slice).
                let ts_us = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
                let dur_us = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0);
                let at_ns = |us: f64| (offsets.correct(rank, us / 1e6) * 1e9).round() as i64;
                let (from, to) = (at_ns(ts_us), at_ns(ts_us + dur_us));
                e.insert("ts".into(), json!(from as f64 / 1e3));
                e.insert("dur".into(), json!((to - from).max(0) as f64 / 1e3));
            }
            _ => {}
        }
        out.push(e);
    }
    out
}

fn write(path: &Path, events: &[Map<String, Value>], m: &Manifest, offsets: &ClockOffsets) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut w = BufWriter::new(std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?);
    let offsets_s: Vec<f64> = (0..m.world_size).map(|r| offsets.correct(r, 0.0)).collect();
    writeln!(
        w,
        "{{\"otherData\": {{\"run_id\": {}, \"world_size\": {}, \"clock\": \"rank 0's, corrected by clock.csv\", \"offset_at_start_s\": {}}},",
        Value::String(m.run_id.clone()),
        m.world_size,
        Value::from(offsets_s)
    )?;
    writeln!(w, "\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [")?;
    for (i, e) in events.iter().enumerate() {
        w.write_all(serde_json::to_string(e)?.as_bytes())?;
        w.write_all(if i + 1 < events.len() { b",\n" } else { b"\n" })?;
    }
    w.write_all(b"]}\n")?;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
