//! One rank's trace file, `trace/rank-NNNNN.trace.json`. Steps are appended as they end
//! in the trace format's array form (`[` then one event a line, each followed by a
//! comma; readers accept it without the closing bracket), flushed per step, so a rank
//! that dies keeps every step it finished. When the run ends the file is rewritten in
//! the object form with `distributedInfo` on its own line (`"rank": N`, a space after
//! the colon, as Holistic Trace Analysis's rank pattern wants).
//!
//! A file never passes [`MAX_RANK_BYTES`]: the first step whose events would take it
//! past the bound is not written, a process-wide instant says where the trace stops
//! (`args.trace_stopped_before_step`), the rank logs it once, and the run goes on
//! untraced, so the file stays whole and readable.
//!
//! The trace times nothing itself: it draws the marks the step's phase clock recorded
//! and the all-reduce's own readings, on the rank's clock (nanoseconds since the run's
//! start, the clock of `step_start_at_s` in the rank's CSV).

use super::event::{ns, tid, Event};
use super::files::{file_name, MAX_FILE_BYTES, TRACE_DIR};
use super::window::StepWindow;
use crate::comm::CommStats;
use crate::data::loader::BatchSpan;
use crate::record::Phase;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The most bytes a rank's trace file takes: where tracing stops. Below the reader's
/// [`MAX_FILE_BYTES`], so every file a run writes is read back.
pub(crate) const MAX_RANK_BYTES: u64 = 512 << 20;
const _: () = assert!(MAX_RANK_BYTES < MAX_FILE_BYTES);
/// A test hook: a lower per-rank bound in bytes (never a higher one than
/// [`MAX_RANK_BYTES`]), read once when the trace opens.
pub(crate) const MAX_BYTES_ENV: &str = "DDPBENCH_TRACE_MAX_BYTES";
/// The bytes kept below the bound for what follows the last step written: the instant
/// that says where the trace stops and the object form's first and last lines (plus the
/// backend's name, which the first line holds).
const CLOSING_BYTES: u64 = 1024;

/// Who wrote a trace.
#[derive(Debug, Clone)]
pub(crate) struct RankIdentity {
    pub rank: usize,
    pub world_size: usize,
    pub host: String,
    pub node_type: String,
    /// The all-reduce's backend, as the manifest names it.
    pub backend: String,
}

/// One finished step, as the trace draws it.
pub(crate) struct TracedStep<'a> {
    pub global_step: usize,
    pub epoch: usize,
    pub warmup: bool,
    /// The step's `Start` on the host clock.
    pub start: Instant,
    /// Each phase slice: the phase and its start and end, in seconds since `start`.
    pub phases: &'a [(Phase, f64, f64)],
    pub comm: &'a CommStats,
    /// When the last backward ended: a bucket's all-reduce before it was hidden.
    pub backward_end: Option<Instant>,
    pub loss: f64,
    pub samples: usize,
}

/// A rank's trace file, open while the run goes.
pub(crate) struct RankTrace {
    id: RankIdentity,
    window: StepWindow,
    origin: Instant,
    path: PathBuf,
    out: BufWriter<File>,
    /// The workers whose thread is named in the file already.
    named_workers: Vec<bool>,
    /// The file's bound in bytes ([`MAX_RANK_BYTES`], or lower through [`MAX_BYTES_ENV`]).
    max_bytes: u64,
    /// Bytes in the file so far.
    written: u64,
    /// The last global step written whole.
    last_step: Option<usize>,
    /// The step before which tracing stopped at the bound.
    stopped_before: Option<usize>,
}

/// The per-rank bound: [`MAX_RANK_BYTES`], or the lower one the test hook sets.
fn max_bytes_from_env() -> Result<u64> {
    let Ok(text) = std::env::var(MAX_BYTES_ENV) else {
        return Ok(MAX_RANK_BYTES);
    };
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 4 * CLOSING_BYTES => Ok(n.min(MAX_RANK_BYTES)),
        _ => bail!(
            "{MAX_BYTES_ENV}={text:?} is not a whole number of bytes of at least {}, the least that holds a \
             trace's metadata and closing lines; unset it, or give e.g. 65536",
            4 * CLOSING_BYTES
        ),
    }
}

impl RankTrace {
    /// Creates `RUN_DIR/trace/rank-NNNNN.trace.json` and names the rank's process and
    /// threads; `origin` is the run's start on this rank's clock.
    pub(crate) fn create(run_dir: &Path, id: RankIdentity, window: StepWindow, origin: Instant) -> Result<RankTrace> {
        let dir = run_dir.join(TRACE_DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create the trace folder {}", dir.display()))?;
        let path = dir.join(file_name(id.rank));
        let max_bytes = max_bytes_from_env()?;
        let file = crate::files::create_exclusive(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut t = RankTrace {
            out: BufWriter::new(file),
            path,
            id,
            window,
            origin,
            named_workers: Vec::new(),
            max_bytes,
            written: 2,
            last_step: None,
            stopped_before: None,
        };
        t.out.write_all(b"[\n")?;
        let name = format!("rank {} · {} · {}", t.id.rank, t.id.host, t.id.node_type);
        let mut meta = vec![
            Event::metadata("process_name", 0, json!({ "name": name })),
            Event::metadata("process_sort_index", 0, json!({ "sort_index": t.id.rank })),
        ];
        for (id, name) in [
            (tid::STEP, "training thread: steps and phases"),
            (tid::ALLREDUCE, "all-reduce: buckets (hidden / exposed)"),
            (tid::HAND_OVER, "hand-over: buckets given to the all-reduce"),
            (tid::COUNTERS, "counters"),
        ] {
            meta.push(Event::metadata("thread_name", id, json!({ "name": name })));
            meta.push(Event::metadata("thread_sort_index", id, json!({ "sort_index": id })));
        }
        let first = t.window.first;
        t.write(first, 0, &meta)?;
        Ok(t)
    }

    /// The global step before which tracing stopped at the file's byte bound, if it did.
    pub(crate) fn stopped_before(&self) -> Option<usize> {
        self.stopped_before
    }

    /// Whether global step `global_step` is traced.
    pub(crate) fn wants(&self, global_step: usize) -> bool {
        self.stopped_before.is_none() && self.window.contains(global_step)
    }

    /// Whether global steps `from..to` include a traced one.
    pub(crate) fn overlaps(&self, from: usize, to: usize) -> bool {
        self.stopped_before.is_none() && from < self.window.end && to > self.window.first
    }

    fn since_origin_ns(&self, t: Instant) -> i64 {
        if t >= self.origin {
            ns((t - self.origin).as_secs_f64())
        } else {
            -ns((self.origin - t).as_secs_f64())
        }
    }

    /// Appends one step: its `ProfilerStep#N` slice, its phases, each bucket's hand-over
    /// and all-reduce (split at backward's end into hidden and exposed), and the loss.
    pub(crate) fn step(&mut self, s: &TracedStep) -> Result<()> {
        let start_ns = self.since_origin_ns(s.start);
        let at = |sec: f64| start_ns + ns(sec);
        let end_ns = s.phases.iter().map(|p| at(p.2)).max().unwrap_or(start_ns);
        let mut ev = Vec::with_capacity(s.phases.len() + 4 * s.comm.spans.len() + 2);
        ev.push(
            Event::slice(
                format!("ProfilerStep#{}", s.global_step),
                "user_annotation",
                tid::STEP,
                start_ns,
                end_ns,
            )
            .with_args(json!({ "epoch": s.epoch, "warmup": s.warmup, "samples": s.samples })),
        );
        for &(phase, from, to) in s.phases {
            let name = phase.column().trim_end_matches("_s");
            ev.push(Event::slice(name, "cpu_op", tid::STEP, at(from), at(to)));
        }
        let bwd_end = s.backward_end.map(|t| self.since_origin_ns(t));
        for (b, handed) in s.comm.launches.iter().enumerate() {
            if let Some(h) = handed {
                let h = self.since_origin_ns(*h);
                ev.push(Event::slice(
                    format!("hand-over bucket {b}"),
                    "cpu_instant_event",
                    tid::HAND_OVER,
                    h,
                    h,
                ));
            }
        }
        for span in &s.comm.spans {
            let (from, to) = (self.since_origin_ns(span.start), self.since_origin_ns(span.end));
            let cut = bwd_end.unwrap_or(from).clamp(from, to);
            let handed = s.comm.launches.get(span.bucket).copied().flatten().map(|h| self.since_origin_ns(h));
            ev.push(
                Event::slice(
                    format!("all-reduce bucket {}", span.bucket),
                    "user_annotation",
                    tid::ALLREDUCE,
                    from,
                    to,
                )
                .with_args(json!({
                    "bucket": span.bucket,
                    "step": s.global_step,
                    "handed_over_us": handed.map(|h| h as f64 / 1e3),
                    "hidden_us": (cut - from) as f64 / 1e3,
                    "exposed_us": (to - cut) as f64 / 1e3,
                })),
            );
            if cut > from {
                ev.push(Event::slice("hidden", "cpu_op", tid::ALLREDUCE, from, cut));
            }
            if to > cut {
                ev.push(Event::slice("exposed", "cpu_op", tid::ALLREDUCE, cut, to));
            }
        }
        let mut loss = Event::slice("loss", "counter", tid::COUNTERS, end_ns, end_ns);
        loss.ph = 'C';
        ev.push(loss.with_args(json!({ "loss": if s.loss.is_finite() { json!(s.loss) } else { json!(null) } })));
        if self.write(s.global_step, start_ns, &ev)? {
            self.last_step = Some(s.global_step);
        }
        Ok(())
    }

    /// The batches that global step `global_step` used, each on its worker's thread (named
    /// the first time it appears), when the window holds the step.
    pub(crate) fn batches(&mut self, global_step: usize, batches: &[BatchSpan]) -> Result<()> {
        if !self.wants(global_step) || batches.is_empty() {
            return Ok(());
        }
        let mut ev = Vec::with_capacity(2 * batches.len());
        let mut first_ns = i64::MAX;
        for b in batches {
            let tid = tid::WORKER_FIRST + b.worker as u64;
            if self.named_workers.len() <= b.worker {
                self.named_workers.resize(b.worker + 1, false);
            }
            if !std::mem::replace(&mut self.named_workers[b.worker], true) {
                let name = format!("data worker {}: batch preparation", b.worker);
                ev.push(Event::metadata("thread_name", tid, json!({ "name": name })));
                ev.push(Event::metadata("thread_sort_index", tid, json!({ "sort_index": tid })));
            }
            let (from, to) = (self.since_origin_ns(b.start), self.since_origin_ns(b.end));
            first_ns = first_ns.min(from);
            ev.push(
                Event::slice(format!("batch {}", b.batch), "cpu_op", tid, from, to)
                    .with_args(json!({ "worker": b.worker, "batch": b.batch, "step": global_step })),
            );
        }
        self.write(global_step, first_ns, &ev).map(drop)
    }

    /// A slice of the run outside the steps (validation), on the training thread.
    pub(crate) fn span(&mut self, name: &str, start: Instant, end: Instant) -> Result<()> {
        let (from, to) = (self.since_origin_ns(start), self.since_origin_ns(end));
        let e = Event::slice(name, "user_annotation", tid::STEP, from, to);
        let next = self.last_step.map_or(self.window.first, |s| s + 1);
        self.write(next, from, &[e]).map(drop)
    }

    /// Appends `events`, all of global step `step` (or just before it), when they fit
    /// below the bound with room to close the file; else stops the trace before `step`,
    /// marked at `at_ns`. True when written.
    fn write(&mut self, step: usize, at_ns: i64, events: &[Event]) -> Result<bool> {
        if self.stopped_before.is_some() {
            return Ok(false);
        }
        let mut lines = String::new();
        for e in events {
            lines.push_str(&e.line(self.id.rank));
            lines.push_str(",\n");
        }
        let room = self.max_bytes.saturating_sub(CLOSING_BYTES + self.id.backend.len() as u64);
        if self.written + lines.len() as u64 > room {
            self.stop(step, at_ns)?;
            return Ok(false);
        }
        self.append(&lines)?;
        Ok(true)
    }

    fn append(&mut self, lines: &str) -> Result<()> {
        self.out.write_all(lines.as_bytes())?;
        self.out.flush().with_context(|| format!("cannot write {}", self.path.display()))?;
        self.written += lines.len() as u64;
        Ok(())
    }

    /// Ends tracing before global step `step`: the instant that says so, and one log line
    /// (a warning on rank 0, where the job's log shows it).
    fn stop(&mut self, step: usize, at_ns: i64) -> Result<()> {
        self.stopped_before = Some(step);
        let bound = if self.max_bytes % (1 << 20) == 0 {
            format!("{} MiB", self.max_bytes >> 20)
        } else {
            format!("{} bytes", self.max_bytes)
        };
        let why = format!("its file reached the per-rank bound of {bound}");
        let mark = Event::instant(
            format!("trace stopped before step {step}: {why}"),
            "user_annotation",
            tid::STEP,
            at_ns,
        )
        .with_args(json!({ "trace_stopped_before_step": step, "max_bytes": self.max_bytes }));
        self.append(&(mark.line(self.id.rank) + ",\n"))?;
        let said = format!(
            "trace of rank {} stops at step {step}: {why}; the steps before it are traced whole, the run goes on untraced \
             (trace fewer steps with --trace-steps A:B)",
            self.id.rank
        );
        if self.id.rank == 0 {
            tracing::warn!("{said}");
        } else {
            tracing::info!("{said}");
        }
        Ok(())
    }

    /// Completes the file into the object form with `distributedInfo`, copying the
    /// events through a temporary file a block at a time.
    pub(crate) fn finish(mut self) -> Result<PathBuf> {
        self.out.flush()?;
        drop(self.out);
        let tmp = self.path.with_extension("json.tmp");
        let done = complete(&self.path, &tmp, &self.id, self.written);
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        done.with_context(|| format!("cannot complete {}", self.path.display()))?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("cannot complete {}", self.path.display()))?;
        Ok(self.path)
    }
}

/// Writes `tmp`: the object form's first lines, the `written` bytes of the array form
/// at `path` less its `[` line and last comma, and the closing lines.
fn complete(path: &Path, tmp: &Path, id: &RankIdentity, written: u64) -> Result<()> {
    let mut from = File::open(path)?;
    from.seek(SeekFrom::Start(2))?;
    let body = written.saturating_sub(4);
    let mut w = BufWriter::new(crate::files::create_exclusive(tmp)?);
    writeln!(
        w,
        "{{\"distributedInfo\": {{\"rank\": {}, \"world_size\": {}, \"backend\": {}}},",
        id.rank,
        id.world_size,
        serde_json::Value::String(id.backend.clone())
    )?;
    writeln!(w, "\"displayTimeUnit\": \"ms\",")?;
    writeln!(w, "\"traceEvents\": [")?;
    let copied = std::io::copy(&mut from.take(body), &mut w)?;
    if copied != body {
        bail!("{} holds {copied} bytes of events where {body} were written", path.display());
    }
    w.write_all(b"\n]}\n")?;
    w.flush()?;
    Ok(())
}
