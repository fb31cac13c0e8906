//! The merged `timeline.json` of a run: every rank's trace on rank 0's clock, corrected
//! by the offsets of `clock.csv` as `reduce` reads them ([`ClockOffsets`]: the exact
//! offset where a rank shares rank 0's kernel, else the round-trip estimate), one
//! process per rank named `rank R · host · node type`, sorted so the ranks of a node sit
//! together. Chrome's trace viewer and Perfetto open it.
//!
//! The merge streams: each rank's file is read one event at a time and each event
//! written as it is read, rank after rank (each rank is its own process in the output,
//! so no event of one rank waits for another's), so memory does not grow with the
//! files. The merge holds the run folder's lock ([`crate::record::lock`]), so two merges
//! of one run take turns with each other and with the run: the second is refused with who
//! holds it. The file is written to a temporary file of a name no other process uses
//! (`.timeline.json.PID.RANDOM.tmp`, created exclusively) and renamed into place once
//! whole; on any error the temporary file is removed and the previous timeline stays.

use super::read::{each_event, RankRead, Skipped};
use crate::record::Manifest;
use crate::reduce::read::ClockOffsets;
use crate::trace::event::viewer_times;
use crate::trace::files::{file_name, TRACE_DIR};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The merged file's name, in the run folder.
pub(crate) const TIMELINE: &str = "timeline.json";

/// What a merge read and wrote.
#[derive(Debug)]
pub(crate) struct Merged {
    pub path: PathBuf,
    pub ranks: usize,
    pub events: usize,
    /// Ranks whose file stopped before the run completed it (a rank that died).
    pub partial: Vec<usize>,
    /// Ranks without a trace file.
    pub missing: Vec<usize>,
    /// Ranks whose writer stopped at its byte bound: rank, first step not traced, bound.
    pub stopped: Vec<(usize, usize, u64)>,
    /// Ranks with lines that were not whole events of theirs, left out.
    pub skipped: Vec<(usize, Skipped)>,
    /// The merged file's size in bytes.
    pub bytes: u64,
}

/// Merges `run_dir/trace/rank-*.trace.json` into `run_dir/timeline.json`.
/// `break_lock` clears a lock whose holder cannot be checked from here
/// ([`crate::record::lock::BREAK_FLAG`]).
pub(crate) fn merge(run_dir: &Path, break_lock: bool) -> Result<Merged> {
    merge_seeing(run_dir, break_lock, &mut |_, _| {})
}

/// [`merge`], handing `see` each event as written (on rank 0's clock) with its rank.
pub(crate) fn merge_seeing(run_dir: &Path, break_lock: bool, see: &mut dyn FnMut(usize, &Map<String, Value>)) -> Result<Merged> {
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
    let file_of = |rank: usize| run_dir.join(TRACE_DIR).join(file_name(rank));
    let mut merged = Merged {
        path: run_dir.join(TIMELINE),
        ranks: 0,
        events: 0,
        partial: Vec::new(),
        missing: (0..world).filter(|r| !file_of(*r).exists()).collect(),
        stopped: Vec::new(),
        skipped: Vec::new(),
        bytes: 0,
    };
    if merged.missing.len() == world {
        bail!("{}/{TRACE_DIR} holds no rank's trace file", run_dir.display());
    }
    // Taken before anything is written: another merge of this run, or the run itself,
    // keeps the folder until it ends.
    let _lock = crate::record::lock::FolderLock::take(run_dir, "run folder", break_lock)?;
    let path = merged.path.clone();
    let tmp = run_dir.join(format!(".{TIMELINE}.{}.{}.tmp", std::process::id(), crate::files::random_hex(8)));
    let cannot_write = |e: std::io::Error| anyhow::anyhow!("cannot write {}: {e}", path.display());
    // Created where nothing is (never through a link) under a name no other merge uses.
    let written = crate::files::create_exclusive(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))
        .and_then(|f| {
            let mut out = Out {
                w: BufWriter::new(f),
                bytes: 0,
                path: &path,
            };
            write_timeline(&mut out, (&order, &file_of, see), &manifest, &offsets, &mut merged)?;
            out.w.flush().map_err(cannot_write)?;
            merged.bytes = out.bytes;
            Ok(())
        })
        .and_then(|()| std::fs::rename(&tmp, &path).map_err(cannot_write));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("no timeline merged ({} unchanged)", path.display())));
    }
    Ok(merged)
}

/// The merged file as it is written, and its bytes so far.
struct Out<'a> {
    w: BufWriter<File>,
    bytes: u64,
    /// The file the temporary one becomes, which errors name.
    path: &'a Path,
}

impl Out<'_> {
    fn put(&mut self, text: &str) -> Result<()> {
        self.w
            .write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.bytes += text.len() as u64;
        Ok(())
    }
}

/// Writes every present rank's events, in `order`, then what the merge found.
fn write_timeline(
    out: &mut Out<'_>,
    (order, file_of, see): (
        &[(String, usize)],
        &dyn Fn(usize) -> PathBuf,
        &mut dyn FnMut(usize, &Map<String, Value>),
    ),
    m: &Manifest,
    offsets: &ClockOffsets,
    merged: &mut Merged,
) -> Result<()> {
    out.put("{\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n")?;
    for (sort_index, (_, rank)) in order.iter().enumerate() {
        let rank = *rank;
        if merged.missing.contains(&rank) {
            continue;
        }
        let (host, node_type) = host_of(m, rank);
        let label = format!("rank {rank} · {host} · {node_type}");
        let read: RankRead = each_event(&file_of(rank), rank, |e| {
            let e = placed(e, rank, sort_index, &label, offsets);
            see(rank, &e);
            let line = serde_json::to_string(&e)?;
            out.put(if merged.events == 0 { "" } else { ",\n" })?;
            merged.events += 1;
            out.put(&line)
        })?;
        merged.ranks += 1;
        if !read.complete {
            merged.partial.push(rank);
        }
        if let Some((step, bound)) = read.stopped {
            merged.stopped.push((rank, step, bound));
        }
        if read.skipped.count > 0 {
            merged.skipped.push((rank, read.skipped));
        }
    }
    out.put("\n],\n")?;
    out.put(&format!("\"otherData\": {}\n}}\n", other_data(m, offsets, merged)))
}

/// The run, the clock, and where each rank's trace stops or was skipped.
fn other_data(m: &Manifest, offsets: &ClockOffsets, merged: &Merged) -> Value {
    let offsets_s: Vec<f64> = (0..m.world_size).map(|r| offsets.correct(r, 0.0)).collect();
    let stopped: Map<String, Value> = merged.stopped.iter().map(|(r, step, _)| (r.to_string(), json!(step))).collect();
    let skipped: Map<String, Value> = merged
        .skipped
        .iter()
        .map(|(r, s)| (r.to_string(), json!({ "count": s.count, "first": s.first })))
        .collect();
    json!({
        "run_id": m.run_id,
        "world_size": m.world_size,
        "clock": "rank 0's, corrected by clock.csv",
        "offset_at_start_s": offsets_s,
        "trace_stopped_before_step": stopped,
        "skipped_lines": skipped,
    })
}

/// `(host, node type)` of rank `r` as the manifest records it.
fn host_of(m: &Manifest, r: usize) -> (String, String) {
    m.ranks
        .iter()
        .find(|i| i.rank == r)
        .map_or(("?".into(), "?".into()), |i| (i.host.clone(), i.node_type.clone()))
}

/// One event of `rank` on rank 0's clock, its process renamed `label` and sorted by node.
fn placed(mut e: Map<String, Value>, rank: usize, sort_index: usize, label: &str, offsets: &ClockOffsets) -> Map<String, Value> {
    match e.get("name").and_then(Value::as_str) {
        Some("process_name") if e.get("ph").and_then(Value::as_str) == Some("M") => {
            e.insert("args".into(), json!({ "name": label }));
        }
        Some("process_sort_index") => {
            e.insert("args".into(), json!({ "sort_index": sort_index }));
        }
        _ if e.get("ph").and_then(Value::as_str) != Some("M") => {
            // Both ends are corrected, in whole nanoseconds, so slices that nest on the
            // rank's clock nest on rank 0's (the offset drifts within a long slice), and
            // written on the trace's exact time grid, so they nest on screen too.
            let ts_us = e.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
            let dur_us = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0);
            let at_ns = |us: f64| (offsets.correct(rank, us / 1e6) * 1e9).round() as i64;
            let (ts, dur) = viewer_times(at_ns(ts_us), at_ns(ts_us + dur_us));
            e.insert("ts".into(), json!(ts));
            e.insert("dur".into(), json!(dur));
        }
        _ => {}
    }
    e
}
