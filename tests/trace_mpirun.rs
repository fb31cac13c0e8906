//! `train --trace` and `ddpbench trace`, for real: two ranks on CPU write their trace
//! files, the merge puts them on one clock, and the numbers are read back from the files:
//! well-formed events that nest per track, step slices equal to the CSV rows, offsets
//! equal to clock.csv's, a killed rank's trace kept up to its last whole event, and a
//! straggler made on purpose seen in the merged timeline.

mod common;
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(240);

/// The events of a trace file in either form: the object form's `traceEvents`, or the
/// array form read one event a line up to the first line that is not a whole event.
fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v["traceEvents"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| v.as_array().unwrap().clone());
    }
    text.lines()
        .map(|l| l.trim().trim_end_matches(','))
        .filter(|l| l.starts_with("{\"ph\""))
        .map_while(|l| serde_json::from_str(l).ok())
        .collect()
}

fn f(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap_or_else(|| panic!("{k} of {e}"))
}

fn named<'a>(ev: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    ev.iter().filter(|e| e["name"].as_str().unwrap().starts_with(prefix)).collect()
}

/// Every event has what trace readers need, and on each (pid, tid) the slices nest:
/// a slice that starts inside another ends inside it.
fn assert_well_formed_and_nested(ev: &[Value]) {
    let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in ev {
        for k in ["ph", "name", "cat"] {
            assert!(e[k].is_string(), "{k} missing: {e}");
        }
        for k in ["pid", "tid"] {
            assert!(e[k].is_u64(), "{k} missing: {e}");
        }
        assert!(f(e, "ts").is_finite() && f(e, "dur") >= 0.0, "{e}");
        if e["ph"] == "X" {
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            tracks.entry(key).or_default().push((f(e, "ts"), f(e, "ts") + f(e, "dur")));
        }
    }
    for (track, mut slices) in tracks {
        // Parents first: earlier start, then longer.
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64)> = Vec::new();
        for s in slices {
            while open.last().is_some_and(|p| s.0 >= p.1 - 1e-6) {
                open.pop();
            }
            if let Some(p) = open.last() {
                assert!(s.1 <= p.1 + 1e-6, "track {track:?}: {s:?} overlaps {p:?} without nesting");
            }
            open.push(s);
        }
    }
}

/// `clock.csv`'s offset of `rank` at its time `t_s`, interpolated as the merge says: the
/// exact offset (`exact_offset_s`, ranks on rank 0's kernel) where a row has one, else
/// the round-trip estimate (`offset_s`).
fn offset_s(clock: &(Vec<String>, Vec<Vec<String>>), rank: usize, t_s: f64) -> f64 {
    let (h, rows) = clock;
    let (ranks, at, off) = (col(h, rows, "rank"), col(h, rows, "rank0_at_s"), col(h, rows, "offset_s"));
    let exact = h.iter().position(|c| c == "exact_offset_s").expect("clock.csv has exact_offset_s");
    let best = |i: usize| rows[i][exact].parse::<f64>().unwrap_or(off[i]);
    let mut pts: Vec<(f64, f64)> = (0..rows.len())
        .filter(|&i| ranks[i] as usize == rank)
        .map(|i| (at[i], best(i)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let i = pts.partition_point(|p| p.0 <= t_s);
    if i == 0 {
        pts[0].1
    } else if i == pts.len() {
        pts[i - 1].1
    } else {
        let ((t0, o0), (t1, o1)) = (pts[i - 1], pts[i]);
        o0 + (o1 - o0) * (t_s - t0) / (t1 - t0)
    }
}

/// The largest error `clock.csv` states for `rank`'s offsets, in µs: the merged timeline
/// places that rank's events to within it (the exact offset's where a row has one).
fn offset_error_us(clock: &(Vec<String>, Vec<Vec<String>>), rank: usize) -> f64 {
    let (h, rows) = clock;
    let (ranks, err) = (col(h, rows, "rank"), col(h, rows, "error_s"));
    let exact = h.iter().position(|c| c == "exact_error_s").expect("clock.csv has exact_error_s");
    (0..rows.len())
        .filter(|&i| ranks[i] as usize == rank)
        .map(|i| rows[i][exact].parse::<f64>().unwrap_or(err[i]))
        .fold(0.0, f64::max)
        * 1e6
}

/// `train` on 2 ranks into `out`: 12 steps (2 warm-up), steps 3..11 traced, and `extra`.
fn train_window_3_to_11(out: &Path, extra: &[&str]) {
    train_window_3_to_11_with_env(out, extra, &[]).assert_ok();
}

/// [`train_window_3_to_11`] with `env` exported to every rank; the job, whatever its end.
fn train_window_3_to_11_with_env(out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Job {
    let o = path_str(out);
    let mut args = vec![
        "--max-steps",
        "12",
        "--warmup-steps",
        "2",
        "--trace-steps",
        "3:11",
        "--val-samples",
        "100",
    ];
    args.extend_from_slice(extra);
    args.extend(["--out", o.as_str()]);
    let mut cmd = mpirun_cmd_with_env(2, env);
    cmd.arg(BIN).arg("train").args(&args);
    run_with_limit(cmd, LIMIT)
}

/// A copy, at `d/run`, of one traced run ([`train_window_3_to_11`], nothing added) that
/// this test process trains once, under Cargo's test scratch folder: the tests that
/// only read a traced run, or damage their own copy of it, share one training.
fn traced_run_copy(d: &Path) -> std::path::PathBuf {
    static RUN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let src = RUN.get_or_init(|| {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        // Runs of earlier test processes that have ended.
        for e in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("trace-fixture-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let out = scratch.join(format!("trace-fixture-{}", std::process::id())).join("run");
        let _ = std::fs::remove_dir_all(&out);
        train_window_3_to_11(&out, &[]);
        out
    });
    let to = d.join("run");
    let cp = std::process::Command::new("cp").arg("-a").arg(src).arg(&to).status().unwrap();
    assert!(cp.success(), "cp -a {} {}", src.display(), to.display());
    to
}

#[test]
fn traced_steps_are_well_formed_match_the_csv_and_merge_on_clock_csv_offsets() {
    let d = tmp();
    let out = traced_run_copy(d.path());
    let o = path_str(&out);
    for rank in 0..2usize {
        let path = out.join(format!("trace/rank-{rank:05}.trace.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        // The object form, with the rank where HTA's pattern finds it.
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["distributedInfo"]["rank"], rank as u64);
        assert_eq!(v["distributedInfo"]["world_size"], 2);
        assert!(text.contains(&format!("\"rank\": {rank}")));
        let ev = v["traceEvents"].as_array().unwrap().clone();
        assert_well_formed_and_nested(&ev);
        assert!(ev.iter().all(|e| e["pid"] == rank as u64));
        // Steps 3..11 only, each as ProfilerStep#N, equal to its CSV row within 1 µs.
        let steps = named(&ev, "ProfilerStep#");
        let (h, rows) = read_csv(&out.join(format!("rank-{rank:05}.csv")));
        let (gs, el, st) = (
            col(&h, &rows, "global_step"),
            col(&h, &rows, "step_start_at_s"),
            col(&h, &rows, "step_s"),
        );
        assert_eq!(steps.len(), 8, "steps traced on rank {rank}");
        for s in &steps {
            let n: usize = s["name"].as_str().unwrap()["ProfilerStep#".len()..].parse().unwrap();
            assert!((3..11).contains(&n), "{s}");
            let i = gs.iter().position(|&g| g as usize == n).unwrap();
            assert!(
                (f(s, "ts") - el[i] * 1e6).abs() <= 1.0,
                "step {n}: {} vs {}",
                f(s, "ts"),
                el[i] * 1e6
            );
            assert!(
                (f(s, "dur") - st[i] * 1e6).abs() <= 1.0,
                "step {n}: {} vs {}",
                f(s, "dur"),
                st[i] * 1e6
            );
        }
        // Every phase of every step; one all-reduce per bucket and step; a loss per step;
        // validation after the epoch.
        for p in ["data", "batch_copy", "forward", "backward", "comm_exposed", "optimizer"] {
            assert_eq!(ev.iter().filter(|e| e["name"] == p).count(), 8, "phase {p}");
        }
        // `other` is two slices a step: the all-reduce's bookkeeping after its end, and
        // the step's end after the optimizer.
        assert_eq!(ev.iter().filter(|e| e["name"] == "other").count(), 16, "phase other");
        assert_eq!(named(&ev, "all-reduce bucket").len(), 8);
        assert_eq!(ev.iter().filter(|e| e["ph"] == "C" && e["name"] == "loss").count(), 8);
        assert_eq!(ev.iter().filter(|e| e["name"] == "validation").count(), 1);
    }

    // reduce merges a traced run's timeline too; trace writes it again, the same.
    ddpbench(&["reduce", "--no-plots", &o]).assert_ok();
    let by_reduce = std::fs::read(out.join("timeline.json")).expect("reduce wrote timeline.json");
    let job = ddpbench(&["trace", &o]);
    job.assert_ok();
    assert_eq!(std::fs::read(out.join("timeline.json")).unwrap(), by_reduce);
    let merged = json(&out.join("timeline.json"));
    let mev = merged["traceEvents"].as_array().unwrap().clone();
    assert_well_formed_and_nested(&mev);
    let clock = read_csv(&out.join("clock.csv"));
    // Both ranks run on this host's kernel: rank 1's offsets are exact, and differ from
    // the round-trip estimates the merge must not use in their place.
    let exact = col(&clock.0, &clock.1, "rank")
        .iter()
        .zip(&clock.1)
        .filter(|(r, _)| **r == 1.0)
        .map(|(_, row)| row[clock.0.iter().position(|c| c == "exact_offset_s").unwrap()].clone())
        .collect::<Vec<_>>();
    assert!(
        !exact.is_empty() && exact.iter().all(|e| e.parse::<f64>().is_ok()),
        "rank 1's exact offsets: {exact:?}"
    );
    let host = json(&out.join("manifest.json"))["ranks"][1]["host"].as_str().unwrap().to_string();
    for rank in 0..2u64 {
        let own = events(&out.join(format!("trace/rank-{rank:05}.trace.json")));
        let mine = |ev: &[Value]| -> Vec<Value> { ev.iter().filter(|e| e["pid"] == rank && e["ph"] == "X").cloned().collect() };
        let (a, b) = (mine(&own), mine(&mev));
        assert_eq!(a.len(), b.len(), "rank {rank}: every slice merged");
        for (x, y) in a.iter().zip(&b) {
            let want = offset_s(&clock, rank as usize, f(x, "ts") / 1e6) * 1e6;
            assert!(
                ((f(y, "ts") - f(x, "ts")) - want).abs() < 0.01,
                "rank {rank}: {x} -> {y}, offset {want} µs"
            );
        }
        let pname = mev.iter().find(|e| e["pid"] == rank && e["name"] == "process_name").unwrap();
        let label = pname["args"]["name"].as_str().unwrap();
        assert!(label.starts_with(&format!("rank {rank} · {host} · ")), "{label}");
    }
}

#[test]
fn data_workers_batches_are_on_their_own_tracks_one_per_batch_of_the_window() {
    let d = tmp();
    let out = d.path().join("run");
    train_window_3_to_11(&out, &["--workers", "2"]);
    for rank in 0..2u64 {
        let ev = events(&out.join(format!("trace/rank-{rank:05}.trace.json")));
        assert_well_formed_and_nested(&ev);
        let batches = named(&ev, "batch ");
        // One micro-batch a step (no --grad-accum), steps 3..11 of epoch 0: batches 3..11,
        // batch b prepared by worker b mod 2.
        assert_eq!(batches.len(), 8, "rank {rank}: one span per batch the window's steps used");
        let mut seen: Vec<u64> = batches.iter().map(|b| b["args"]["batch"].as_u64().unwrap()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (3..11).collect::<Vec<u64>>(), "rank {rank}");
        for b in &batches {
            let (batch, worker) = (b["args"]["batch"].as_u64().unwrap(), b["args"]["worker"].as_u64().unwrap());
            assert_eq!(worker, batch % 2, "{b}");
            assert_eq!(b["tid"], 16 + worker, "{b}");
            assert_eq!(b["args"]["step"], batch, "{b}");
            // Inside the run, and prepared before the step that used it had its data.
            let step = ev
                .iter()
                .find(|e| e["name"] == format!("ProfilerStep#{batch}"))
                .unwrap_or_else(|| panic!("step {batch} traced"));
            let data_end = ev
                .iter()
                .filter(|e| e["name"] == "data" && f(e, "ts") >= f(step, "ts") && f(e, "ts") <= f(step, "ts") + f(step, "dur"))
                .map(|e| f(e, "ts") + f(e, "dur"))
                .next()
                .expect("the step's data phase");
            assert!(
                f(b, "ts") >= 0.0 && f(b, "ts") + f(b, "dur") <= data_end + 1e-3,
                "{b} ends after {data_end}"
            );
        }
        for w in 0..2u64 {
            let meta = ev
                .iter()
                .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 16 + w)
                .unwrap_or_else(|| panic!("rank {rank}: worker {w}'s track is not named"));
            assert_eq!(meta["args"]["name"], format!("data worker {w}: batch preparation"));
        }
    }
}

/// Starts `mpirun -n 2 ddpbench train --trace-steps 0:2000 ...`, output to files in `d`.
fn spawn_traced(d: &Path, out: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN)
        .arg("train")
        .args(["--max-steps", "2000", "--trace-steps", "0:2000", "--out", &path_str(out)])
        .stdout(Stdio::from(std::fs::File::create(d.join("log")).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(d.join("err")).unwrap()))
        .process_group(0);
    cmd.spawn().expect("mpirun")
}

#[test]
fn a_killed_rank_leaves_a_trace_the_merge_reads_to_its_last_whole_event() {
    let d = tmp();
    let out = d.path().join("run");
    let mut job = spawn_traced(d.path(), &out);
    let csv1 = out.join("rank-00001.csv");
    let start = Instant::now();
    while std::fs::read_to_string(&csv1).map_or(0, |t| t.lines().count()) < 8 {
        assert!(start.elapsed() < LIMIT, "rank 1 never wrote 8 rows");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = std::process::Command::new("pgrep")
        .args(["-f", &format!("train .*{}", path_str(&out))])
        .output()
        .unwrap();
    let rank1 = String::from_utf8(pids.stdout)
        .unwrap()
        .lines()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .find(|p| std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == b"OMPI_COMM_WORLD_RANK=1")))
        .expect("rank 1's process");
    // SAFETY: a process of the job this test started.
    unsafe { libc::kill(rank1, libc::SIGKILL) };
    let start = Instant::now();
    while job.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            // SAFETY: the job's process group, started by this test.
            unsafe { libc::kill(-(job.id() as i32), libc::SIGKILL) };
            panic!("the job did not end");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let path = out.join("trace/rank-00001.trace.json");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("[\n"), "the killed rank's trace stays in the array form");
    // A write cut in the middle of a line, as a kill during a write leaves it.
    let cut = text.len() - 40;
    std::fs::write(&path, &text.as_bytes()[..cut]).unwrap();
    let whole = events(&path);
    let steps_kept = named(&whole, "ProfilerStep#").len();
    let rows1 = read_csv(&out.join("rank-00001.csv")).1.len();
    assert!(steps_kept >= 7 && steps_kept <= rows1, "{steps_kept} steps traced, {rows1} rows");

    let merge = ddpbench(&["trace", &path_str(&out)]);
    merge.assert_ok();
    // Rank 0 was stopped by Open MPI after its peer died: both files are partial.
    assert!(merge.stderr.contains("rank(s) [0, 1] stopped before"), "{}", merge.all());
    let merged = json(&out.join("timeline.json"));
    let mev = merged["traceEvents"].as_array().unwrap();
    let rank1_events = mev.iter().filter(|e| e["pid"] == 1).count();
    assert_eq!(rank1_events, whole.len(), "rank 1's events up to its last whole one");
}

/// Rank 1 sleeps [`SLOW_MS`] in every forward: far more than a loaded 2-core machine
/// deschedules a process for, so every traced step shows the straggler's structure.
const SLOW_MS: u64 = 400;

#[test]
fn a_slowed_rank_starts_its_allreduce_last_and_its_peer_waits_exposed() {
    let d = tmp();
    let out = d.path().join("run");
    let o = path_str(&out);
    let args = [
        "--max-steps",
        "7",
        "--warmup-steps",
        "1",
        "--trace-steps",
        "1:7",
        "--val-samples",
        "100",
        "--out",
        &o,
    ];
    let slow = format!("1:{SLOW_MS}");
    let mut cmd = mpirun_cmd_with_env(2, &[("DDPBENCH_SLOW_FORWARD", slow.as_str())]);
    cmd.arg(BIN).arg("train").args(args);
    run_with_limit(cmd, LIMIT).assert_ok();
    ddpbench(&["trace", &o]).assert_ok();
    let mev = json(&out.join("timeline.json"))["traceEvents"].as_array().unwrap().clone();
    // Per (step, rank): the first and the last start of a bucket's all-reduce, on the
    // common clock.
    let mut starts: BTreeMap<(u64, u64), (f64, f64)> = BTreeMap::new();
    for e in named(&mev, "all-reduce bucket ") {
        let k = (e["args"]["step"].as_u64().unwrap(), e["pid"].as_u64().unwrap());
        let s = starts.entry(k).or_insert((f64::MAX, f64::MIN));
        *s = (s.0.min(f(e, "ts")), s.1.max(f(e, "ts")));
    }
    // Per rank, its exposed waits (comm_exposed), one a step, in step order.
    let exposed = |rank: u64| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = mev
            .iter()
            .filter(|e| e["pid"] == rank && e["name"] == "comm_exposed")
            .map(|e| (f(e, "ts"), f(e, "ts") + f(e, "dur")))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let (wait0, wait1) = (exposed(0), exposed(1));
    // Rank 1's events sit on rank 0's clock to within the offset's stated error: on one
    // kernel, how far apart its origin's two clock readings were (a preemption between
    // them on a loaded machine makes it large).
    let slack = offset_error_us(&read_csv(&out.join("clock.csv")), 1);
    let steps: Vec<u64> = (1..7).collect();
    assert_eq!(
        (wait0.len(), wait1.len()),
        (steps.len(), steps.len()),
        "one comm_exposed a step and rank"
    );
    for (i, s) in steps.iter().enumerate() {
        let (first0, _) = starts[&(*s, 0)];
        let (first1, last1) = starts[&(*s, 1)];
        // The slowed rank starts its all-reduce last, in every step.
        assert!(first1 > first0, "step {s}: rank 1 started at {first1} µs, rank 0 at {first0} µs");
        // Its peer is already waiting, exposed, when it starts its last bucket, and still
        // waits after: rank 0's exposed slice spans rank 1's last start.
        let (from, to) = wait0[i];
        assert!(
            from - slack <= last1 && last1 <= to + slack,
            "step {s}: rank 0 waited {from}..{to} µs, rank 1 started its last bucket at {last1} µs \
             (clock error {slack} µs)"
        );
        // The slowed rank finds its peer there: it waits less than its peer.
        assert!(
            wait1[i].1 - wait1[i].0 < to - from,
            "step {s}: rank 1 waited {:?} µs, rank 0 {from}..{to} µs",
            wait1[i]
        );
    }
}

/// The test venv's python with Holistic Trace Analysis, installed once from PyPI.
fn python_with_hta() -> String {
    let py = std::env::var("DDPBENCH_PYTHON")
        .expect("DDPBENCH_PYTHON is unset: source job-scripts/setup.sh, which makes the test venv and exports it");
    let has = |py: &str| {
        std::process::Command::new(py)
            .args(["-c", "import hta"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(&py) {
        let pip = std::process::Command::new(&py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "HolisticTraceAnalysis"])
            .status()
            .expect("pip");
        assert!(pip.success() && has(&py), "could not install HolisticTraceAnalysis into {py}");
    }
    py
}

#[test]
fn holistic_trace_analysis_loads_both_ranks_with_their_events() {
    let py = python_with_hta();
    let d = tmp();
    let out = d.path().join("run");
    let o = path_str(&out);
    let args = [
        "--max-steps",
        "8",
        "--warmup-steps",
        "1",
        "--trace",
        // The data workers' tracks too.
        "--workers",
        "2",
        "--val-samples",
        "100",
        "--out",
        &o,
    ];
    train(2, &args, LIMIT).assert_ok();
    let script = "import json, sys\n\
from hta.trace_analysis import TraceAnalysis\n\
a = TraceAnalysis(trace_dir=sys.argv[1])\n\
print(json.dumps({str(r): {'rows': len(df), 'iterations': [int(i) for i in a.t.get_iterations(r)]} for r, df in a.t.traces.items()}))\n";
    let mut cmd = std::process::Command::new(&py);
    cmd.args(["-c", script, &path_str(&out.join("trace"))]);
    let job = run_with_limit(cmd, LIMIT);
    job.assert_ok();
    let got: Value = serde_json::from_str(job.stdout.lines().last().unwrap()).unwrap_or_else(|e| panic!("{e}: {}", job.all()));
    assert_eq!(got.as_object().unwrap().keys().collect::<Vec<_>>(), ["0", "1"], "{got}");
    for rank in 0..2 {
        let ev = events(&out.join(format!("trace/rank-{rank:05}.trace.json")));
        // HTA keeps every event before the last ProfilerStep (its default), keyed by step.
        let steps = named(&ev, "ProfilerStep#");
        assert_eq!(steps.len(), 7, "steps 1..8 traced after one warm-up step");
        let last = steps.iter().map(|s| f(s, "ts")).fold(f64::MIN, f64::max);
        let kept = ev.iter().filter(|e| f(e, "ts") < last).count();
        let r = &got[rank.to_string()];
        assert_eq!(r["rows"], kept as u64, "rank {rank}: {r}");
        assert_eq!(r["iterations"], serde_json::json!([1, 2, 3, 4, 5, 6]), "rank {rank}: {r}");
    }
}

/// The text of the number under `key` at the top level of the JSON object `obj` (one
/// event a line), as written: a viewer parses this text, not serde_json's reading of it.
fn top_level_number<'a>(obj: &'a str, key: &str) -> Option<&'a str> {
    let (b, want) = (obj.as_bytes(), format!("\"{key}\":"));
    let (mut depth, mut i) = (0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'"' => {
                if depth == 1 && obj[i..].starts_with(&want) {
                    let rest = obj[i + want.len()..].trim_start();
                    let n = rest
                        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
                        .unwrap_or(rest.len());
                    return Some(&rest[..n]);
                }
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// What a viewer such as speedscope does with the complete slices of `path` (one event a
/// line): each `ts` and `dur` parsed to the nearest f64 and `ts + dur` added in f64;
/// then on each (pid, tid) every slice that starts inside another ends at or before its
/// end, which is also every slice ending at or before its next sibling's start (one
/// that ends past it makes the sibling its child and ends after the sibling). No
/// tolerance: the sums are compared as the viewer compares them. Returns the slices seen.
fn assert_nests_as_a_viewer_adds(path: &Path) -> usize {
    type Slice = (f64, f64, String);
    let text = std::fs::read_to_string(path).unwrap();
    let mut tracks: BTreeMap<(u64, u64), Vec<Slice>> = BTreeMap::new();
    for line in text.lines() {
        let l = line.trim().trim_end_matches(',');
        let Ok(e) = serde_json::from_str::<Value>(l) else { continue };
        if e.get("ph") != Some(&Value::from("X")) {
            continue;
        }
        let num = |k: &str| -> f64 {
            top_level_number(l, k)
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("{k} of {l}"))
        };
        let (ts, dur) = (num("ts"), num("dur"));
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let name = format!("{} at ts {}", e["name"], top_level_number(l, "ts").unwrap());
        tracks.entry(key).or_default().push((ts, ts + dur, name));
    }
    let mut seen = 0;
    for (track, mut slices) in tracks {
        seen += slices.len();
        slices.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<Slice> = Vec::new();
        for s in slices {
            while open.last().is_some_and(|p| s.0 >= p.1) {
                open.pop();
            }
            if let Some(p) = open.last() {
                assert!(
                    s.1 <= p.1,
                    "{}, track {track:?}: {} ends at {:?}, after {} that holds it ends at {:?}",
                    path.display(),
                    s.2,
                    s.1,
                    p.2,
                    p.1
                );
            }
            open.push(s);
        }
    }
    seen
}

#[test]
fn slices_nest_when_a_viewer_adds_ts_and_dur_in_f64_in_rank_files_and_timeline() {
    let d = tmp();
    let out = traced_run_copy(d.path());
    ddpbench(&["trace", &path_str(&out)]).assert_ok();
    for file in ["trace/rank-00000.trace.json", "trace/rank-00001.trace.json", "timeline.json"] {
        // At least ten slices for each of the 8 traced steps of each rank in the file.
        let slices = assert_nests_as_a_viewer_adds(&out.join(file));
        let ranks = if file == "timeline.json" { 2 } else { 1 };
        assert!(slices >= 80 * ranks, "{file}: {slices} slices");
    }
}

/// The test hook that lowers the per-rank trace bound, and the bound it sets: room for
/// the metadata and a few steps of the window 3..11 (about 1.5 kB each), not for all.
const LOW_BOUND: (&str, &str) = ("DDPBENCH_TRACE_MAX_BYTES", "9000");

/// The step N in `"trace of rank R stops at step N"`, from `text`.
fn stop_step(text: &str, rank: usize) -> Option<usize> {
    let at = format!("trace of rank {rank} stops at step ");
    let rest = &text[text.find(&at)? + at.len()..];
    rest[..rest.find(|c: char| !c.is_ascii_digit())?].parse().ok()
}

#[test]
fn a_trace_that_reaches_its_byte_bound_stops_whole_and_says_at_which_step() {
    let d = tmp();
    let out = d.path().join("run");
    let o = path_str(&out);
    let job = train_window_3_to_11_with_env(&out, &[], &[LOW_BOUND]);
    job.assert_ok();
    // Rank 0 says it once, while the run goes on.
    let said = stop_step(&job.stderr, 0).unwrap_or_else(|| panic!("no warning:\n{}", job.all()));
    assert_eq!(job.stderr.matches("trace of rank 0 stops at step").count(), 1, "{}", job.stderr);
    let bound: u64 = LOW_BOUND.1.parse().unwrap();
    for rank in 0..2usize {
        let path = out.join(format!("trace/rank-{rank:05}.trace.json"));
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= bound, "rank {rank}: {len} bytes over the bound {bound}");
        // A whole JSON document, completed by the run.
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("rank {rank}'s trace is not JSON: {e}"));
        let ev = v["traceEvents"].as_array().unwrap().clone();
        assert_well_formed_and_nested(&ev);
        let stop = ev
            .iter()
            .find(|e| e["args"]["trace_stopped_before_step"].is_u64())
            .unwrap_or_else(|| panic!("rank {rank}: no stop marker"));
        let n = stop["args"]["trace_stopped_before_step"].as_u64().unwrap() as usize;
        assert_eq!(stop["args"]["max_bytes"], bound, "{stop}");
        if rank == 0 {
            assert_eq!(n, said, "the warning and the file name the same step");
        }
        let manifest = json(&out.join("manifest.json"));
        assert_eq!(
            manifest["ranks"][rank]["trace_stopped_before_step"], n as u64,
            "the manifest names the step of rank {rank}: {}",
            manifest["ranks"][rank]
        );
        assert!(
            (4..11).contains(&n),
            "rank {rank}: stopped before step {n}, not within the window 3..11"
        );
        // Every step before it whole, none from it on.
        let mut steps: Vec<usize> = named(&ev, "ProfilerStep#")
            .iter()
            .map(|s| s["name"].as_str().unwrap()["ProfilerStep#".len()..].parse().unwrap())
            .collect();
        steps.sort_unstable();
        assert_eq!(steps, (3..n).collect::<Vec<_>>(), "rank {rank}");
        assert_eq!(ev.iter().filter(|e| e["name"] == "optimizer").count(), n - 3, "rank {rank}");
    }
    // `trace` and `reduce` read both files and say where each stops.
    for cmd in [vec!["trace", o.as_str()], vec!["reduce", "--no-plots", o.as_str()]] {
        let job = ddpbench(&cmd);
        job.assert_ok();
        assert_eq!(stop_step(&job.all(), 0), Some(said), "{cmd:?}: {}", job.all());
        assert!(stop_step(&job.all(), 1).is_some(), "{cmd:?}: {}", job.all());
        let merged = json(&out.join("timeline.json"));
        assert_eq!(
            merged["otherData"]["trace_stopped_before_step"]["0"], said as u64,
            "{}",
            merged["otherData"]
        );
    }
}

#[test]
fn bad_lines_in_a_rank_trace_are_skipped_counted_and_named_and_the_rest_is_kept() {
    let d = tmp();
    let out = traced_run_copy(d.path());
    let path = out.join("trace/rank-00001.trace.json");
    let before = events(&path).len();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let some_event = lines.iter().find(|l| l.contains("\"name\":\"forward\"")).unwrap();
    let deep = format!(
        "{{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"deep\",\"pid\":1,\"tid\":1,\"ts\":1.000,\"dur\":1.000,\"args\":{}{}}},",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let bad = [
        some_event.replace("\"pid\":1,", "\"pid\":99,"),
        "{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"forward\",\"pid\":1,\"tid\":1,\"ts\":NaN,\"dur\":1.000},".to_string(),
        deep,
    ];
    let middle = lines.len() / 2;
    let mut damaged: Vec<String> = lines[..middle].iter().map(|l| l.to_string()).collect();
    damaged.extend(bad.iter().cloned());
    damaged.extend(lines[middle..].iter().map(|l| l.to_string()));
    std::fs::write(&path, damaged.join("\n") + "\n").unwrap();

    let job = ddpbench(&["reduce", "--no-plots", &path_str(&out)]);
    job.assert_ok();
    let all = job.all();
    assert!(all.contains("rank 1: 3 line(s) of "), "{all}");
    for why in ["pid 99", "not JSON", "nested"] {
        assert!(all.contains(why), "the reason {why:?} is not named:\n{all}");
    }
    assert!(all.contains(&format!("line {}", middle + 1)), "the first bad line's number:\n{all}");
    let merged = json(&out.join("timeline.json"));
    let kept = merged["traceEvents"].as_array().unwrap().iter().filter(|e| e["pid"] == 1).count();
    assert_eq!(kept, before, "every other event of rank 1 is merged");
    assert_eq!(merged["otherData"]["skipped_lines"]["1"]["count"], 3, "{}", merged["otherData"]);
}

#[test]
fn a_fifo_in_place_of_a_trace_file_is_refused_at_once_by_trace_and_reduce() {
    let d = tmp();
    let out = traced_run_copy(d.path());
    let path = out.join("trace/rank-00001.trace.json");
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path_str(&path)).unwrap();
    // SAFETY: a C string this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    for args in [vec!["trace", "RUN"], vec!["reduce", "--no-plots", "RUN"]] {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(args.iter().map(|a| if *a == "RUN" { path_str(&out) } else { a.to_string() }));
        let job = run_with_limit(cmd, Duration::from_secs(30));
        assert!(!job.timed_out, "{args:?} waited on the FIFO");
        assert_ne!(job.status, Some(0), "{args:?}: {}", job.all());
        assert!(
            job.stderr.contains(&path_str(&path)) && job.stderr.contains("FIFO"),
            "{args:?}: {}",
            job.all()
        );
    }
    assert!(!out.join("timeline.json.tmp").exists());
}

#[test]
fn a_full_disk_leaves_no_temporary_timeline_and_the_error_names_the_path() {
    let d = tmp();
    let run = traced_run_copy(d.path());
    let mnt = d.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    // In a mount namespace of its own, so the tmpfs goes with the shell: copy the run
    // in, fill the file system, merge, and list what the merge left.
    let script = format!(
        "mount -t tmpfs -o size=256k tmpfs '{m}' || exit 77; cp -a '{r}' '{m}/run' || exit 78; \
         cat /dev/zero > '{m}/filler' 2>/dev/null; '{BIN}' trace '{m}/run'; echo \"trace-exit $?\"; ls -a '{m}/run'",
        m = path_str(&mnt),
        r = path_str(&run)
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &script]);
    let job = run_with_limit(cmd, Duration::from_secs(60));
    if matches!(job.status, Some(77)) || job.stderr.contains("unshare failed") {
        eprintln!("skipped: a tmpfs in a mount namespace needs root: {}", job.all());
        return;
    }
    assert!(job.stdout.contains("trace-exit 1"), "{}", job.all());
    // The merge takes the run folder's lock first: on a full disk that is what fails,
    // naming the folder (or, with room for the lock, the timeline it could not write).
    let folder = format!("{}/run", path_str(&mnt));
    assert!(job.stderr.contains(&folder), "the error names the folder:\n{}", job.all());
    assert!(job.stderr.contains("No space left"), "{}", job.all());
    let names: Vec<&str> = job.stdout.lines().skip_while(|l| !l.starts_with("trace-exit")).skip(1).collect();
    assert!(names.contains(&"trace") && names.contains(&"manifest.json"), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("timeline") || n.starts_with(".timeline") || n.starts_with(".ddpbench.lock")),
        "the merge left {names:?}"
    );
}

#[test]
fn a_link_planted_as_the_temporary_timeline_is_not_written_through() {
    let d = tmp();
    let out = traced_run_copy(d.path());
    let victim = d.path().join("victim.txt");
    std::fs::write(&victim, "keep me\n").unwrap();
    std::os::unix::fs::symlink(&victim, out.join("timeline.json.tmp")).unwrap();
    ddpbench(&["trace", &path_str(&out)]).assert_ok();
    let kept = std::fs::read_to_string(&victim).unwrap();
    assert!(kept == "keep me\n", "the link's target was written: {} bytes", kept.len());
    assert!(!out.join("timeline.json").is_symlink(), "timeline.json is a link");
    assert!(json(&out.join("timeline.json"))["traceEvents"]
        .as_array()
        .is_some_and(|e| !e.is_empty()));
    // The merge writes a temporary file of its own name, created exclusively: the planted
    // link is not its file, and is left as it was.
    assert_eq!(std::fs::read_link(out.join("timeline.json.tmp")).unwrap(), victim);
}

/// A PNG's width and height from its IHDR chunk, which the format puts first.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "the first chunk is not IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The bands (first and last pixel row, top to bottom) of consecutive rows of `png`
/// holding at least `min_px` pixels of `colour`.
fn bands_of(png: &resvg::tiny_skia::Pixmap, colour: (u8, u8, u8), min_px: usize) -> Vec<(u32, u32)> {
    let w = png.width() as usize;
    let mut bands: Vec<(u32, u32)> = Vec::new();
    for (y, row) in png.pixels().chunks(w).enumerate() {
        let n = row.iter().filter(|p| (p.red(), p.green(), p.blue()) == colour).count();
        if n < min_px {
            continue;
        }
        match bands.last_mut() {
            Some(b) if b.1 + 1 == y as u32 => b.1 = y as u32,
            _ => bands.push((y as u32, y as u32)),
        }
    }
    bands
}

/// What `ddpbench trace RUN --png ...` did, for a check of its refusals.
fn trace_png(run: &Path, png: &[&str]) -> Job {
    let mut cmd = std::process::Command::new(BIN);
    cmd.arg("trace").arg(run).arg("--png").args(png);
    run_with_limit(cmd, Duration::from_secs(60))
}

#[test]
fn trace_png_draws_one_lane_per_rank_with_each_step_phases() {
    let d = tmp();
    let run = traced_run_copy(d.path());
    let job = trace_png(&run, &[]);
    job.assert_ok();
    // The trace holds steps 3 to 10 (--trace-steps 3:11), all drawn.
    assert!(job.stdout.contains("steps 3-10 drawn"), "{}", job.all());
    let bytes = std::fs::read(run.join("timeline.png")).unwrap();
    // 1400 px wide, 150 px plus 36 px a rank high, as --help states.
    assert_eq!(png_size(&bytes), (1400, 150 + 2 * 36));
    let png = resvg::tiny_skia::Pixmap::decode_png(&bytes).unwrap();
    // Forward (orange) in one band of rows per rank, wider than the legend's swatch.
    let forward = bands_of(&png, (0xff, 0x7f, 0x0e), 40);
    assert_eq!(forward.len(), 2, "bands of forward rows: {forward:?}");
    // Backward (green) in the same lanes: a lane holds every phase of its rank.
    let backward = bands_of(&png, (0x2c, 0xa0, 0x2c), 40);
    assert_eq!(backward, forward, "backward rows {backward:?}, forward rows {forward:?}");
    // A window asked for: its first steps, to another file.
    let other = d.path().join("steps-5-6.png");
    let job = trace_png(&run, &[&path_str(&other), "--png-steps", "5:7"]);
    job.assert_ok();
    assert!(job.stdout.contains("steps 5-6 drawn"), "{}", job.all());
    assert_eq!(png_size(&std::fs::read(&other).unwrap()), (1400, 222));
}

#[test]
fn trace_png_refuses_an_existing_file_a_fifo_an_unwritable_path_and_a_run_without_trace() {
    let d = tmp();
    let run = traced_run_copy(d.path());
    let refused = |job: &Job, what: &str, says: &[&str]| {
        assert!(!job.timed_out && job.status == Some(1), "{what}: {}", job.all());
        assert_eq!(job.stderr.matches("Error:").count(), 1, "{what}: one message: {}", job.all());
        for s in says {
            assert!(job.stderr.contains(s), "{what}: no {s:?} in {}", job.all());
        }
    };
    let kept = d.path().join("kept.png");
    std::fs::write(&kept, b"not to be overwritten").unwrap();
    let k = path_str(&kept);
    refused(&trace_png(&run, &[&k]), "an existing file", &[&k, "never overwritten"]);
    assert_eq!(std::fs::read(&kept).unwrap(), b"not to be overwritten");
    let fifo = d.path().join("fifo.png");
    let c = std::ffi::CString::new(path_str(&fifo)).unwrap();
    // SAFETY: a C string this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    refused(
        &trace_png(&run, &[&path_str(&fifo)]),
        "a FIFO",
        &[&path_str(&fifo), "never overwritten"],
    );
    let nowhere = d.path().join("no/such/folder/t.png");
    refused(
        &trace_png(&run, &[&path_str(&nowhere)]),
        "a missing folder",
        &[&path_str(&nowhere), "folder you can write"],
    );
    // A run without its trace: refused by the merge, and the PNG created for it removed.
    std::fs::remove_dir_all(run.join("trace")).unwrap();
    refused(&trace_png(&run, &[]), "no trace", &["no trace/ folder", "--trace"]);
    assert!(!run.join("timeline.png").exists(), "an empty PNG was left");
    let job = trace_png(&run, &["--png-steps", "9:3"]);
    assert_eq!(job.status, Some(2), "bad --png-steps: {}", job.all());
    assert!(job.stderr.contains("--png-steps"), "{}", job.all());
}

/// speedscope's built app: `DDPBENCH_SPEEDSCOPE`, else where job-scripts/run-tests.sh
/// installs it from npm (`~/.cache/ddpbench/npm`).
fn speedscope_app() -> std::path::PathBuf {
    let app = std::env::var_os("DDPBENCH_SPEEDSCOPE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/ddpbench/npm/node_modules/speedscope/dist/release")
        });
    assert!(
        app.join("index.html").is_file(),
        "speedscope not found at {} (job-scripts/run-tests.sh installs it: npm install --prefix ~/.cache/ddpbench/npm speedscope@1.25.0)",
        app.display()
    );
    app
}

/// A local HTTP server on 127.0.0.1 for the test's life: `/app/…` from `app`,
/// `/timeline.json` from `timeline`, anything else 404. Returns its port.
fn serve(app: std::path::PathBuf, timeline: std::path::PathBuf) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split(' ').nth(1).unwrap_or("/").split(['?', '#']).next().unwrap_or("/");
            let file = if path == "/timeline.json" {
                Some(timeline.clone())
            } else {
                path.strip_prefix("/app/").filter(|p| !p.contains("..")).map(|p| app.join(p))
            };
            let mut s = &stream;
            match file.and_then(|f| std::fs::read(&f).ok().map(|b| (f, b))) {
                Some((f, body)) => {
                    let kind = match f.extension().and_then(|e| e.to_str()).unwrap_or("") {
                        "html" => "text/html",
                        "js" => "text/javascript",
                        "css" => "text/css",
                        "json" => "application/json",
                        "wasm" => "application/wasm",
                        "png" => "image/png",
                        _ => "application/octet-stream",
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(&body));
                }
                None => {
                    let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                }
            }
        }
    });
    port
}

/// The merged timeline of a 2-rank run (30 steps traced, 1 MiB buckets: many slices
/// per step) opened in a real viewer: speedscope 1.25 in headless Chromium, served over
/// HTTP as the app expects. speedscope computes each slice's end as
/// `(ts − the track's first ts) + dur` and logs "Tried to end X when Y was on the top of
/// the stack" for every slice that then ends past its neighbour's start; it logs none,
/// and it imported the file (its title names it).
#[test]
fn speedscope_opens_the_timeline_without_a_nesting_warning() {
    let app = speedscope_app();
    let d = tmp();
    let out = d.path().join("run");
    let o = path_str(&out);
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("train").args([
        "--max-steps",
        "30",
        "--trace-steps",
        "0:30",
        "--bucket-mb",
        "1",
        "--val-samples",
        "0",
        "--probe-iters",
        "0",
        "--out",
        &o,
    ]);
    run_with_limit(cmd, LIMIT).assert_ok();
    ddpbench(&["trace", &o]).assert_ok();
    let port = serve(app, out.join("timeline.json"));
    let log = d.path().join("chromium.log");
    let status = std::process::Command::new("timeout")
        .args(["120", "chromium", "--headless=new", "--no-sandbox", "--enable-unsafe-swiftshader"])
        .args(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000", "--dump-dom"])
        .arg(format!("--user-data-dir={}", d.path().join("profile").display()))
        .arg(format!(
            "http://127.0.0.1:{port}/app/index.html#profileURL=http://127.0.0.1:{port}/timeline.json"
        ))
        .stdout(std::fs::File::create(d.path().join("dom.html")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .expect("chromium not found: install it (apt-get install chromium; job-scripts/run-tests.sh does)");
    let text = std::fs::read_to_string(&log).unwrap();
    let dom = std::fs::read_to_string(d.path().join("dom.html")).unwrap();
    // An alert (a file speedscope cannot read) keeps --dump-dom from returning: timeout.
    assert!(status.success(), "chromium ended with {status} (an alert open?):\n{text}");
    let console: Vec<&str> = text.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console.iter().any(|l| l.contains("Importing as Trace Event Format profile")),
        "speedscope did not import the timeline:\n{}",
        console.join("\n")
    );
    assert!(dom.contains("timeline.json - speedscope"), "the profile is not open:\n{dom}");
    let nesting: Vec<&&str> = console.iter().filter(|l| l.contains("Tried to end")).collect();
    assert!(
        nesting.is_empty(),
        "{} nesting warnings, e.g.:\n{}",
        nesting.len(),
        nesting[..nesting.len().min(5)]
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
