//! The reducer on small run folders written by hand, every figure checked against
//! a value worked out by hand, plus bad and partial input.

mod common;
use common::*;
use ddpbench::record::{CsvLog, Manifest, RankInfo, StepRow};
use ddpbench::reduce::analysis::{rank_summaries, scaling, type_summaries, StepBreakdown};
use ddpbench::reduce::read_run;
use std::path::Path;

/// Per-rank step phases: (node type, [data, fwd, bwd, comm, opt, other]).
type RankSpec<'a> = (&'a str, [f64; 6]);

fn manifest(id: &str, model: &str, ranks: &[RankSpec], batch: usize, status: &str) -> Manifest {
    Manifest {
        schema_version: ddpbench::record::SCHEMA_VERSION,
        run_id: id.into(),
        status: status.into(),
        error: None,
        ddpbench_version: "test".into(),
        libtorch_version: "2.11.0".into(),
        mpi_library: "test".into(),
        command_line: vec![],
        config: serde_json::Value::Null,
        model: model.into(),
        dataset: "synthetic".into(),
        dataset_source: String::new(),
        parameters: 100,
        gradient_bytes: 400,
        comm_backend: "mpi-cpu-staged".into(),
        comm: Default::default(),
        buckets: 1,
        world_size: ranks.len(),
        nodes: ranks.len(),
        batch_size_per_rank: batch,
        global_batch_size: batch * ranks.len(),
        steps_per_epoch: 100,
        start_utc: format!("2026-01-01T00:00:0{}.000000Z", ranks.len()),
        end_utc: None,
        wall_s: Some(10.0),
        final_param_l2: Some(1.0),
        final_val_accuracy: None,
        allreduce_probe: None,
        allreduce_probe_warm: None,
        host_malloc: None,
        clock: None,
        ranks: ranks
            .iter()
            .enumerate()
            .map(|(r, (t, _))| RankInfo {
                rank: r,
                local_rank: 0,
                host: format!("host{r}"),
                node_type: t.to_string(),
                device: "Cpu".into(),
                binding: "auto: 0".into(),
                threads: 1,
                cpu_model: "x".into(),
                gpus: vec![],
                gpu_bus_id: None,
                binding_note: None,
                comm_thread: None,
                launcher_env: vec![],
            })
            .collect(),
    }
}

/// Writes a run: 1 warm-up step then `steps` identical steps per rank; a rank's
/// all-reduce starts after its data + forward + backward.
fn write_run(dir: &Path, id: &str, model: &str, ranks: &[RankSpec], batch: usize, steps: usize) {
    std::fs::create_dir_all(dir).unwrap();
    manifest(id, model, ranks, batch, "completed").write(dir).unwrap();
    for (r, (t, ph)) in ranks.iter().enumerate() {
        let mut log = CsvLog::<StepRow>::create(&dir.join(format!("rank-{r:05}.csv"))).unwrap();
        let step_s: f64 = ph.iter().sum();
        for k in 0..=steps {
            let start = 10.0 * k as f64;
            log.write(&StepRow {
                run_id: String::new(),
                rank: r,
                node_type: t.to_string(),
                epoch: 0,
                step: k,
                global_step: k,
                warmup: u8::from(k == 0),
                time_utc: "2026-01-01T00:00:00.000000Z".into(),
                elapsed_s: start,
                samples: batch,
                data_s: ph[0],
                batch_copy_s: 0.0,
                forward_s: ph[1],
                backward_s: ph[2],
                comm_s: ph[3],
                comm_exposed_s: ph[3],
                comm_stage_d2h_s: 0.0,
                comm_stage_h2d_s: 0.0,
                optimizer_s: ph[4],
                other_s: ph[5],
                step_s,
                comm_hidden_s: 0.0,
                comm_start_s: start + ph[0] + ph[1] + ph[2],
                comm_last_start_s: start + ph[0] + ph[1] + ph[2],
                loss: 1.0,
                bytes: 400,
                loss_scale: None,
                step_skipped: 0,
            })
            .unwrap();
        }
        log.flush().unwrap();
    }
}

const BASE: [RankSpec; 1] = [("A", [0.1, 0.3, 0.5, 0.0, 0.1, 0.0])];
// Rank 0 (A) enters the all-reduce at +0.9 s, rank 1 (B) at +1.2 s: A waits 0.3 s,
// the transfer after B's entry takes 0.1 s for both. Both steps last 1.5 s.
const TWO: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 0.4, 0.1, 0.1]), ("B", [0.1, 0.5, 0.6, 0.1, 0.1, 0.1])];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn every_figure_matches_hand_values() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO, 10, 4);
    let base = read_run(&d.path().join("base")).unwrap();
    let two = read_run(&d.path().join("two")).unwrap();
    assert!(base.complete() && two.complete(), "{:?} {:?}", base.problems, two.problems);
    assert_eq!((two.steps, two.warmup_steps, two.samples), (4, 1, 80));

    let s = type_summaries(&two);
    assert_eq!(s.len(), 2);
    let (a, b) = (&s[0], &s[1]);
    assert_eq!((a.node_type.as_str(), a.ranks, a.steps, a.nodes), ("A", 1, 4, 1));
    assert!(close(a.step_s_median, 1.5) && close(a.step_s_p95, 1.5) && close(a.step_s_max, 1.5));
    // Rank 0 alone: 10 samples per 1.5 s.
    assert!(close(a.samples_per_s, 10.0 / 1.5));
    assert!(close(a.comm_exposed_s_median, 0.4) && close(a.comm_exposed_share, 0.4 / 1.5));
    // R = (0.3 + 0.5) / 0.4 = 2 for A; (0.5 + 0.6) / 0.1 = 11 for B.
    assert!(close(a.compute_comm_ratio, 2.0) && close(b.compute_comm_ratio, 11.0));
    // A waits 0.3 s for B; the transfer takes 0.1 s: busbw = 2·(2−1)/2 · 400 B / 0.1 s.
    assert!(close(a.comm_wait_s_mean, 0.3) && close(b.comm_wait_s_mean, 0.0));
    assert!(close(a.comm_transfer_s_median, 0.1) && close(b.comm_transfer_s_median, 0.1));
    assert!(close(a.comm_exposed_transfer_s_mean, 0.1));
    assert!(close(a.busbw_bytes_per_s, 4000.0) && close(a.algbw_bytes_per_s, 4000.0));
    // B is last into every all-reduce: it gates the job.
    assert!(close(b.last_arrival_share, 1.0) && close(a.last_arrival_share, 0.0));
    assert_eq!((a.gating, b.gating), (0, 1));
    let ranks = rank_summaries(&two);
    assert!(close(ranks[0].comm_wait_s_mean, 0.3) && close(ranks[1].last_arrival_share, 1.0));

    let rows = scaling(&[&base, &two], 0);
    let (r0, r1) = (&rows[0], &rows[1]);
    assert_eq!(r0.scaling_mode, "baseline");
    assert!(close(r0.samples_per_s, 10.0) && close(r0.speedup, 1.0));
    assert_eq!(r1.scaling_mode, "weak");
    assert_eq!(r1.gating_node_type, "B");
    // 20 samples per 1.5 s = 13.33/s: speedup 4/3, efficiency 2/3, Karp–Flatt (3/4 − 1/2)/(1/2) = 1/2.
    assert!(close(r1.samples_per_s, 20.0 / 1.5));
    assert!(close(r1.speedup, 4.0 / 3.0) && close(r1.efficiency, 2.0 / 3.0) && close(r1.karp_flatt, 0.5));
    // Amdahl through (1, 1) and (2, 4/3): 1 / (f + (1 − f)/2) = 4/3 gives f = 1/2.
    assert!((r1.amdahl_serial_fraction - 0.5).abs() < 1e-6);
    // Constant step times: the bootstrap interval collapses onto the speedup, outside the noise.
    assert!(close(r1.speedup_ci_low, 4.0 / 3.0) && close(r1.speedup_ci_high, 4.0 / 3.0));
    assert_eq!(r1.within_noise, 0);

    // Waterfall: ideal 20/s, measured 13.33/s, 6.67/s lost. Extra time per step over the
    // ideal 1.0 s: transfer 0.1, data 0, waiting 0.15 (0.3 on one rank of two), compute
    // (1.0 + 1.3)/2 − 0.9 = 0.25; total 0.5.
    let br = StepBreakdown::of(&two);
    assert!(close(br.total(), 1.5) && close(br.wait_s, 0.15) && close(br.transfer_s, 0.1) && close(br.compute_s, 1.15));
    assert!(close(r1.ideal_samples_per_s, 20.0));
    let lost = 20.0 - 20.0 / 1.5;
    assert!(close(r1.loss_comm_samples_per_s, lost * 0.2));
    assert!(close(r1.loss_data_samples_per_s, 0.0));
    assert!(close(r1.loss_straggler_samples_per_s, lost * 0.3));
    assert!(close(r1.loss_other_samples_per_s, lost * 0.5));
    let sum = r1.loss_comm_samples_per_s + r1.loss_data_samples_per_s + r1.loss_straggler_samples_per_s + r1.loss_other_samples_per_s;
    assert!(close(sum, r1.ideal_samples_per_s - r1.samples_per_s));
}

#[test]
fn strong_scaling_is_detected_and_the_waterfall_uses_the_batch_ratio() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 20, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO, 10, 4);
    let base = read_run(&d.path().join("base")).unwrap();
    let two = read_run(&d.path().join("two")).unwrap();
    let rows = scaling(&[&base, &two], 0);
    assert_eq!(rows[1].scaling_mode, "strong");
    // Baseline 20 samples/s; the 2-rank run 13.33/s: speedup 2/3 (negative scaling).
    assert!(close(rows[1].speedup, (20.0 / 1.5) / 20.0));
    let sum = rows[1].loss_comm_samples_per_s
        + rows[1].loss_data_samples_per_s
        + rows[1].loss_straggler_samples_per_s
        + rows[1].loss_other_samples_per_s;
    assert!(close(sum, rows[1].ideal_samples_per_s - rows[1].samples_per_s));
}

fn reduce(args: &[&str]) -> Job {
    let mut a = vec!["reduce"];
    a.extend_from_slice(args);
    ddpbench(&a)
}

#[test]
fn cli_writes_spreadsheet_ready_files_report_and_plots() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO, 10, 4);
    write_run(&d.path().join("other-model"), "other-model", "transformer", &TWO, 10, 4);
    let job = reduce(&[&path_str(d.path())]);
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    assert_eq!(rows.len(), 3);
    let id = |i: usize| rows[i][h.iter().position(|c| c == "run_id").unwrap()].clone();
    let base_of = |i: usize| rows[i][h.iter().position(|c| c == "baseline_run_id").unwrap()].clone();
    // Runs of another model are never compared with this one: it is its own baseline.
    for i in 0..3 {
        match id(i).as_str() {
            "other-model" => assert_eq!(base_of(i), "other-model"),
            _ => assert_eq!(base_of(i), "base"),
        }
    }
    let speedups = col(&h, &rows, "speedup");
    assert!(speedups.iter().any(|&s| close(s, 4.0 / 3.0)));
    // Every cell is a plain number or empty: no exponents, no NaN, no thousands separators.
    for name in ["scaling.csv", "summary.csv", "ranks.csv"] {
        let text = std::fs::read_to_string(d.path().join(name)).unwrap();
        for line in text.lines().skip(1) {
            for cell in line.split(',') {
                let looks_numeric = cell.starts_with(|c: char| c.is_ascii_digit() || c == '-') && !cell.contains('T');
                if looks_numeric {
                    assert!(
                        cell.parse::<f64>().is_ok() && !cell.contains('e') && !cell.contains('E'),
                        "{name}: {cell:?}"
                    );
                }
                assert!(cell != "NaN" && cell != "inf", "{name}: {cell:?}");
            }
        }
    }
    let ti = h.iter().position(|c| c == "start_utc").unwrap();
    assert!(rows.iter().all(|r| r[ti].ends_with('Z')));
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    for needle in [
        "## Speedup and efficiency: m on synthetic",
        "## Compute vs communication",
        "## All-reduce bandwidth",
        "## Where the efficiency goes",
        "type \"B\"",
        "gates",
    ] {
        assert!(report.contains(needle), "report lacks {needle:?}");
    }
    for plot in ["speedup", "efficiency", "phases", "bandwidth", "step_time_per_rank-two"] {
        let svg = std::fs::read_to_string(d.path().join(format!("{plot}.svg"))).unwrap();
        resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap_or_else(|e| panic!("{plot}.svg: {e}"));
        let png = std::fs::read(d.path().join(format!("{plot}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{plot}.png");
    }
}

#[test]
fn partial_runs_are_reported_and_left_out() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    // Missing rank file.
    write_run(&d.path().join("missing"), "missing", "m", &TWO, 10, 4);
    std::fs::remove_file(d.path().join("missing/rank-00001.csv")).unwrap();
    // A rank that stopped mid-write.
    write_run(&d.path().join("truncated"), "truncated", "m", &TWO, 10, 4);
    let f = d.path().join("truncated/rank-00001.csv");
    let mut text = std::fs::read_to_string(&f).unwrap();
    text.push_str("1,B,0,5,5,0,2026-01-01T00:0");
    std::fs::write(&f, text).unwrap();
    // One rank has fewer steps than the other.
    write_run(&d.path().join("short"), "short", "m", &TWO, 10, 4);
    let f = d.path().join("short/rank-00000.csv");
    let text = std::fs::read_to_string(&f).unwrap();
    let kept: Vec<&str> = text.lines().take(4).collect();
    std::fs::write(&f, kept.join("\n") + "\n").unwrap();
    // An unfinished job.
    write_run(&d.path().join("running"), "running", "m", &TWO, 10, 4);
    let mut m = Manifest::read(&d.path().join("running")).unwrap();
    m.status = "running".into();
    m.write(&d.path().join("running")).unwrap();
    // Not CSV at all.
    write_run(&d.path().join("garbage"), "garbage", "m", &TWO, 10, 4);
    std::fs::write(d.path().join("garbage/rank-00000.csv"), b"\x00\x01 not a csv\n").unwrap();

    let expect = [
        ("missing", "rank-00001.csv is missing"),
        ("truncated", "last row is truncated"),
        ("short", "different numbers of steps (rank 0: 3, rank 1: 5)"),
        ("running", "status is \"running\""),
        ("garbage", "not a ddpbench rank file"),
    ];
    for (name, problem) in expect {
        let run = read_run(&d.path().join(name)).unwrap();
        assert!(!run.complete(), "{name} should be incomplete");
        assert!(run.problems.iter().any(|p| p.contains(problem)), "{name}: {:?}", run.problems);
    }
    let job = reduce(&[&path_str(d.path())]);
    job.assert_ok();
    for (name, problem) in expect {
        assert!(
            job.stderr.contains(&format!("incomplete run {}", path_str(&d.path().join(name)))),
            "{}",
            job.stderr
        );
        assert!(job.stderr.contains(problem));
    }
    // Only the complete run is in the figures; the report lists the others.
    let (_, rows) = read_csv(&d.path().join("scaling.csv"));
    assert_eq!(rows.len(), 1);
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    assert!(report.contains("## Incomplete runs") && report.contains("rank-00001.csv is missing"));

    // Nothing usable: non-zero exit with the reason.
    let job = reduce(&[&path_str(&d.path().join("missing")), &path_str(&d.path().join("running"))]);
    assert_ne!(job.status, Some(0));
    assert!(job.stderr.contains("no usable run among 2 folder(s)"), "{}", job.stderr);
    let job = reduce(&["/nonexistent/runs"]);
    assert_ne!(job.status, Some(0));
    assert!(job.stderr.contains("/nonexistent/runs: no such folder"));
}

/// Rewrites every rank file of `dir` with `hidden_s` of all-reduce work hidden behind
/// backward: comm_s grows, comm_exposed_s (the phase) stays.
fn hide_comm(dir: &Path, hidden_s: f64) {
    for f in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("rank-") && name.ends_with(".csv")) {
            continue;
        }
        let mut r = csv::Reader::from_path(&f).unwrap();
        let h = r.headers().unwrap().clone();
        let (c, e) = (
            h.iter().position(|x| x == "comm_s").unwrap(),
            h.iter().position(|x| x == "comm_exposed_s").unwrap(),
        );
        let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
        let mut w = csv::Writer::from_path(&f).unwrap();
        w.write_record(&h).unwrap();
        for row in rows {
            let mut v: Vec<String> = row.iter().map(String::from).collect();
            v[c] = (v[e].parse::<f64>().unwrap() + hidden_s).to_string();
            w.write_record(&v).unwrap();
        }
    }
}

#[test]
fn overlapped_communication_and_gpu_telemetry() {
    let d = tmp();
    let dir = d.path().join("two");
    write_run(&dir, "two", "m", &TWO, 10, 4);
    hide_comm(&dir, 0.2);
    std::fs::write(
        dir.join("rank-00000.gpu.csv"),
        "rank,time_utc,elapsed_s,gpu_util_pct,mem_util_pct,mem_used_bytes,sm_clock_mhz,power_w,temperature_c\n\
         0,2026-01-01T00:00:00Z,0.1,50,,1000,1410,100,60\n\
         0,2026-01-01T00:00:01Z,1.1,70,,3000,1410,,61\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("rank-00001.gpu.csv"),
        "rank,time_utc,elapsed_s,gpu_util_pct,mem_util_pct,mem_used_bytes,sm_clock_mhz,power_w,temperature_c\n\
         1,2026-01-01T00:00:00Z,0.1,90,,,,,\n",
    )
    .unwrap();
    let run = read_run(&dir).unwrap();
    assert!(run.complete(), "{:?}", run.problems);
    let s = type_summaries(&run);
    let (a, b) = (&s[0], &s[1]);
    // The phase is the exposed part; all of the work is comm_total.
    assert!(close(a.comm_exposed_s_median, 0.4) && close(a.comm_s_median, 0.6));
    // R uses all of the work: (0.3 + 0.5) / 0.6.
    assert!(close(a.compute_comm_ratio, 0.8 / 0.6));
    // A waited 0.3 s of its 0.4 s exposed for B; the transfer is the work minus that wait.
    assert!(close(a.comm_wait_s_mean, 0.3) && close(a.comm_exposed_transfer_s_mean, 0.1));
    assert!(close(a.comm_transfer_s_median, 0.3) && close(b.comm_transfer_s_median, 0.3));
    // Telemetry: means over the samples that have a value, peak memory.
    assert!(close(a.gpu_util_pct_mean, 60.0) && close(a.gpu_mem_used_max_bytes, 3000.0) && close(a.gpu_power_w_mean, 100.0));
    assert!(close(b.gpu_util_pct_mean, 90.0) && b.gpu_mem_used_max_bytes.is_nan() && b.gpu_power_w_mean.is_nan());
}

/// A run folder as schema 1 wrote it (no schema_version; copy_d2h_s/copy_h2d_s; no
/// batch_copy_s, the copy being inside data_s) reduces with the same definitions.
#[test]
fn schema_1_run_folders_still_reduce() {
    let d = tmp();
    let dir = d.path().join("v1");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        r#"{"run_id":"v1","status":"completed","error":null,"ddpbench_version":"0.1.0","libtorch_version":"2.11.0",
        "mpi_library":"Open MPI v4.1.4","command_line":["ddpbench","train"],"config":{},"model":"mnist-cnn",
        "dataset":"fashion-mnist","dataset_source":"/usr/share/datasets/fashion-mnist","parameters":1199882,
        "gradient_bytes":4799528,"comm_backend":"mpi-cpu-staged","buckets":1,"world_size":1,"nodes":1,
        "batch_size_per_rank":64,"global_batch_size":64,"steps_per_epoch":938,"start_utc":"2026-11-01T00:00:00.000000Z",
        "end_utc":"2026-11-01T00:01:00.000000Z","wall_s":60.0,"final_param_l2":1.0,"final_val_accuracy":0.5,
        "allreduce_probe":null,"ranks":[{"rank":0,"local_rank":0,"host":"a","node_type":"T","device":"Cpu",
        "binding":"auto: 0","threads":1,"cpu_model":"x","gpus":[],"launcher_env":[]}]}"#,
    )
    .unwrap();
    let header = "rank,node_type,epoch,step,global_step,warmup,time_utc,elapsed_s,samples,data_s,forward_s,backward_s,comm_s,comm_exposed_s,copy_d2h_s,copy_h2d_s,optimizer_s,other_s,step_s,comm_start_s,loss,bytes,loss_scale,step_skipped";
    let row = |step: usize, warm: u8, data: f64, fwd: f64| {
        let step_s = data + fwd + 0.2 + 0.05 + 0.01 + 0.04;
        format!("0,T,0,{step},{step},{warm},2026-11-01T00:00:0{step}.000000Z,{step},64,{data},{fwd},0.2,0.05,0.05,0,0,0.01,0.04,{step_s},{step},2.3,4799528,,0")
    };
    let text = [
        header.to_string(),
        row(0, 1, 9.0, 9.0),
        row(1, 0, 0.1, 0.3),
        row(2, 0, 0.3, 0.5),
        row(3, 0, 0.2, 0.4),
    ]
    .join("\n")
        + "\n";
    std::fs::write(dir.join("rank-00000.csv"), text).unwrap();
    let run = read_run(&dir).unwrap();
    assert!(run.complete(), "{:?}", run.problems);
    assert_eq!((run.steps, run.warmup_steps), (3, 1));
    let s = &type_summaries(&run)[0];
    assert!(close(s.data_s_median, 0.2) && close(s.forward_s_median, 0.4));
    assert_eq!(s.batch_copy_s_median, 0.0, "schema 1 has no batch copy column: it is 0");
    assert!(close(s.comm_exposed_s_median, 0.05) && close(s.comm_s_median, 0.05));
    assert!(close(s.step_s_median, 0.2 + 0.4 + 0.3));
    assert_eq!(s.schema_version, 2, "summary.csv is written in the reducer's schema");
}
