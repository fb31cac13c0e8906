//! `ddpbench allreduce` under real `mpirun`: the sweep's columns, the checked sums (and
//! a deliberately corrupted rank caught), the fitted model, bad arguments; and `reduce`
//! projecting real training runs with the model.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

fn sweep(ranks: usize, args: &[&str], env: &[(&str, &str)]) -> Job {
    let mut cmd = mpirun_cmd_with_env(ranks, env);
    cmd.arg(BIN).arg("allreduce").args(args);
    run_with_limit(cmd, LIMIT)
}

#[test]
fn the_sweep_times_and_checks_every_size_and_fits_the_model() {
    let d = tmp();
    let out = path_str(&d.path().join("sw"));
    // Three ranks, so busbw = algbw × 2(n−1)/n differs from algbw (4/3).
    let job = sweep(
        3,
        &[
            "--min-bytes",
            "8",
            "--max-bytes",
            "128K",
            "--factor",
            "4",
            "--iters",
            "6",
            "--warmup-iters",
            "2",
            // The sweep's name before schema 4 for MPI on device memory: read as mpi,
            // which on CPU is MPI on host memory.
            "--backends",
            "staged",
            "--out",
            &out,
        ],
        &[],
    );
    job.assert_ok();
    assert!(
        job.stdout.contains("out-of-place") && job.stdout.contains("in-place") && job.stdout.contains("#wrong"),
        "{}",
        job.stdout
    );
    let (h, rows) = read_csv(&d.path().join("sw/allreduce.csv"));
    // 8, 32, …, 128 KiB: 8 sizes, each out of place and in place.
    let bytes = col(&h, &rows, "bytes");
    let want: Vec<f64> = (0..8).flat_map(|k| [8.0 * 4f64.powi(k); 2]).collect();
    assert_eq!(bytes, want);
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let placements: Vec<&str> = rows.iter().map(|r| r[at("buffer")].as_str()).collect();
    assert!(placements.chunks(2).all(|p| p == ["out-of-place", "in-place"]), "{placements:?}");
    assert!(rows
        .iter()
        .all(|r| r[at("level")] == "intra-node" && r[at("backend")] == "mpi" && r[at("memory")] == "host" && r[at("dtype")] == "float"));
    let count = col(&h, &rows, "count");
    let ranks = col(&h, &rows, "ranks");
    let time_s = col(&h, &rows, "time_s");
    let algbw = col(&h, &rows, "algbw_bytes_per_s");
    let busbw = col(&h, &rows, "busbw_bytes_per_s");
    let iters = col(&h, &rows, "iters");
    let p10 = col(&h, &rows, "iter_p10_s");
    let p90 = col(&h, &rows, "iter_p90_s");
    for i in 0..rows.len() {
        assert_eq!(count[i], bytes[i] / 4.0);
        assert_eq!(ranks[i], 3.0);
        assert!(time_s[i] > 0.0 && (3.0..=6.0).contains(&iters[i]), "row {i}");
        let alg = bytes[i] / time_s[i];
        // time_s is written to the nanosecond: a few microseconds keep 4 digits.
        assert!((algbw[i] / alg - 1.0).abs() < 1e-3, "row {i}: algbw {} vs {alg}", algbw[i]);
        assert!(
            (busbw[i] / (algbw[i] * 4.0 / 3.0) - 1.0).abs() < 1e-9,
            "row {i}: busbw {} algbw {}",
            busbw[i],
            algbw[i]
        );
        assert!(p10[i] <= p90[i]);
    }
    assert!(col(&h, &rows, "wrong").iter().all(|&w| w == 0.0));
    // The model: one intra-node fit over 3 ranks, valid over the sizes swept.
    // The α–β fits are the link model, under its own name; no file keeps the old one.
    assert!(!d.path().join("sw/allreduce_model.json").exists());
    let m = json(&d.path().join("sw/link_model.json"));
    let model = &m["models"][0];
    assert_eq!(
        (&model["backend"], &model["memory"]),
        (&serde_json::json!("mpi"), &serde_json::json!("host"))
    );
    let intra = &model["intra"];
    assert_eq!(intra["ranks"], 3);
    assert_eq!((intra["min_bytes"].as_u64(), intra["max_bytes"].as_u64()), (Some(8), Some(131072)));
    assert!(intra["alpha_s"].as_f64().unwrap() >= 0.0 && intra["beta_s_per_byte"].as_f64().unwrap() >= 0.0);
    assert_eq!(intra["residuals"].as_array().unwrap().len(), 8);
    assert!(model["inter"].is_null());
    assert!(
        job.stdout.contains("mpi on host memory, intra-node link model over 3 ranks"),
        "{}",
        job.stdout
    );
    let j = json(&d.path().join("sw/allreduce.json"));
    assert_eq!(j["rows"].as_array().unwrap().len(), rows.len());
    // A second sweep into the same folder is refused rather than mixed in.
    let again = sweep(2, &["--max-bytes", "64", "--out", &out], &[]);
    assert!(!again.ok() && again.all().contains("already holds a sweep"), "{}", again.all());
}

#[test]
fn a_corrupted_rank_makes_wrong_sums_that_are_counted_and_fail_the_job() {
    let d = tmp();
    let out = path_str(&d.path().join("bad"));
    let job = sweep(
        2,
        &[
            "--max-bytes",
            "1K",
            "--factor",
            "8",
            "--dtype",
            "fp16",
            "--iters",
            "3",
            "--out",
            &out,
        ],
        &[("DDPBENCH_TEST_CORRUPT_RANK", "1")],
    );
    assert!(!job.ok(), "{}", job.all());
    assert!(job.all().contains("were wrong"), "{}", job.all());
    let (h, rows) = read_csv(&d.path().join("bad/allreduce.csv"));
    // Element 0 of every sum is off, on both ranks: 2 wrong elements per measurement.
    assert!(col(&h, &rows, "wrong").iter().all(|&w| w == 2.0), "{rows:?}");
    // fp16: 2 bytes per element.
    let (bytes, count) = (col(&h, &rows, "bytes"), col(&h, &rows, "count"));
    assert!(bytes.iter().zip(&count).all(|(b, c)| *c == b / 2.0));
}

#[test]
fn bad_sweep_arguments_are_refused_with_a_reason() {
    for (args, says) in [
        (vec!["--min-bytes", "1K", "--max-bytes", "8"], "larger than --max-bytes"),
        (vec!["--backends", "nccl", "--device", "cpu"], "needs GPU buffers"),
        (vec!["--min-bytes", "12Q"], "not a size in bytes"),
        (vec!["--budget-s", "-1"], "positive number of seconds"),
        (vec!["--idle-ms", "-1"], "is not `auto` or milliseconds"),
        (vec!["--idle-ms", "soon"], "is not `auto` or milliseconds"),
        (vec!["--watchdog-s", "0"], "positive number of seconds"),
        // Below one element of the dtype there is nothing to all-reduce.
        (
            vec!["--min-bytes", "1", "--max-bytes", "3"],
            "smaller than one float element (4 bytes)",
        ),
        // More memory than any machine here has: refused before any buffer is made.
        (vec!["--min-bytes", "100000G", "--max-bytes", "100000G"], "lower --max-bytes"),
    ] {
        let d = tmp();
        let out = path_str(&d.path().join("x"));
        let mut a = args.clone();
        a.extend(["--out", &out]);
        let job = sweep(2, &a, &[]);
        assert!(!job.ok() && job.all().contains(says), "{args:?}: {}", job.all());
        assert!(!job.timed_out);
        // Every rank finds the same error: it is printed once, and the job ends without
        // an MPI_ABORT banner.
        assert_eq!(job.all().matches(says).count(), 1, "{args:?}: {}", job.all());
        assert!(!job.all().contains("MPI_ABORT"), "{args:?}: {}", job.all());
    }
}

/// Sizes are whole elements: those that round to the same number of elements are one
/// size, swept once.
#[test]
fn sizes_below_one_element_are_swept_once() {
    let d = tmp();
    let out = path_str(&d.path().join("small"));
    let job = sweep(
        2,
        &[
            "--min-bytes",
            "1",
            "--max-bytes",
            "16",
            "--iters",
            "1",
            "--warmup-iters",
            "0",
            "--out",
            &out,
        ],
        &[],
    );
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("small/allreduce.csv"));
    assert_eq!(col(&h, &rows, "bytes"), [4.0, 4.0, 8.0, 8.0, 16.0, 16.0], "{rows:?}");
    assert_eq!(col(&h, &rows, "count"), [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]);
}

#[test]
fn reduce_projects_real_runs_with_the_fitted_model_and_checks_the_measured_point() {
    let d = tmp();
    let p = |n: &str| path_str(&d.path().join(n));
    let args = [
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "2048",
        "--max-steps",
        "20",
        "--val-samples",
        "0",
        "--batch-size",
        "32",
        "--threads",
        "1",
        "--bucket-mb",
        "0.5",
    ];
    for (ranks, name) in [(1, "n1"), (2, "n2")] {
        let o = p(name);
        let mut a = args.to_vec();
        a.extend(["--out", &o]);
        train(ranks, &a, LIMIT).assert_ok();
    }
    // Each bucket's hand-over as a fraction of backward, recorded for the projection: the
    // 1-rank run overlaps (a spare core), so buckets leave during backward, in order, and
    // the last one at its end.
    let m1 = json(&d.path().join("n1/manifest.json"));
    let ready: Vec<f64> = m1["comm"]["bucket_ready_fraction"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(ready.len(), m1["comm"]["bucket_bytes"].as_array().unwrap().len());
    if m1["comm"]["overlap"] == true {
        assert!(ready.windows(2).all(|w| w[0] <= w[1]) && ready[0] < 1.0, "{ready:?}");
    }
    assert_eq!(*ready.last().unwrap(), 1.0);
    let sw = p("sweep");
    sweep(2, &["--max-bytes", "4M", "--iters", "5", "--budget-s", "0.3", "--out", &sw], &[]).assert_ok();
    let job = ddpbench(&[
        "reduce",
        "--no-plots",
        "--project-to",
        "64",
        &path_str(d.path()),
        "--out",
        &path_str(d.path()),
    ]);
    job.assert_ok();
    assert!(job.stdout.contains("Projection"), "{}", job.stdout);
    let (h, rows) = read_csv(&d.path().join("projection.csv"));
    let ranks = col(&h, &rows, "ranks");
    // 1, 2, 4, …, 64 ranks on one node (the sweep saw one node of 2 ranks per node: no
    // inter-node fit, so beyond one node there is nothing to project; one node holds 2).
    assert!(ranks.starts_with(&[1.0, 2.0]), "{ranks:?}");
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let own = col(&h, &rows, "own_work_s");
    let comm = col(&h, &rows, "comm_s");
    let step = col(&h, &rows, "step_s");
    let (lo, hi) = (col(&h, &rows, "step_low_s"), col(&h, &rows, "step_high_s"));
    // Cells carry 9 decimals (±5e-10 each): a sum of three cells is good to 1.5e-9.
    let tol = 1.5e-9;
    for i in 0..rows.len() {
        // Between the rank's own work alone and own work plus the whole all-reduce (a
        // 1-rank row that is the measured 1-rank point is that measurement instead).
        let (s, o, c) = (step[i], own[i], comm[i]);
        assert!(
            rows[i][at("step_basis")] == "measured" || (s >= o - tol && s <= o + c + tol),
            "row {i}: step {s}, own work {o}, all-reduce {c}"
        );
        assert!(
            lo[i] <= s + tol && s <= hi[i] + tol,
            "row {i}: step {s} outside [{}, {}]",
            lo[i],
            hi[i]
        );
    }
    // The 1-rank point has no all-reduce. Its speedup and efficiency are 1 by definition.
    assert_eq!(comm[0], 0.0);
    let eff = col(&h, &rows, "efficiency");
    for (i, r) in rows.iter().enumerate().filter(|(_, r)| r[at("ranks")] == "1") {
        assert_eq!(eff[i], 1.0, "{r:?}");
        assert_eq!(r[at("speedup")], "1", "{r:?}");
        if r[at("speedup_against")] == "measured 1-rank run" {
            // The row is the measured 1-rank point: its step that point's (the geometric
            // mean of its runs' mean steps), no error of its own.
            let m: f64 = r[at("measured_step_s")].parse().unwrap();
            assert!((step[i] - m).abs() <= 1e-9 * m.max(1.0) && r[at("error_pct")].is_empty(), "{r:?}");
            assert_eq!(r[at("step_basis")], "measured", "{r:?}");
        }
    }
    assert!(rows.iter().any(|r| r[at("speedup_against")] == "measured 1-rank run"));
    // The measured 2-rank run is compared with its projection.
    let two = rows
        .iter()
        .position(|r| r[at("ranks")] == "2" && !r[at("measured_step_s")].is_empty())
        .unwrap();
    let measured: f64 = rows[two][at("measured_step_s")].parse().unwrap();
    let err: f64 = rows[two][at("error_pct")].parse().unwrap();
    // Both steps are cells of 9 decimals (±5e-10 s each): the percentage recomputed from
    // them is good to about 100 × 1e-9 / measured × (1 + step / measured) points.
    let tol = 100.0 * 1e-9 / measured * (1.0 + step[two] / measured) + 1e-9;
    let recomputed = (step[two] - measured) / measured * 100.0;
    assert!((err - recomputed).abs() <= tol, "error_pct {err} against {recomputed} (±{tol})");
    // Strong scaling of the reference's global batch (2 × 32): per-rank batch 64 / N;
    // only 32 was measured on its 2 ranks, so the other batches are marked extrapolated,
    // and at 2 ranks the strong and the weak projection are the same step.
    let scaling: Vec<&str> = rows.iter().map(|r| r[at("scaling")].as_str()).collect();
    // (The 1-rank run overlaps and the 2-rank run cannot, one core each: two workloads.)
    let strong: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| r[at("scaling")] == "strong" && r[at("from_runs")] == "n2")
        .collect();
    assert!(scaling.contains(&"weak") && !strong.is_empty(), "{scaling:?}");
    for r in &strong {
        let n: f64 = r[at("ranks")].parse().unwrap();
        let b: f64 = r[at("batch_per_rank")].parse().unwrap();
        let g: f64 = r[at("global_batch")].parse().unwrap();
        assert_eq!((g, b), (64.0, 64.0 / n), "{r:?}");
        assert_eq!(r[at("compute_extrapolated")] == "true", b != 32.0, "{r:?}");
    }
    let strong2 = strong.iter().find(|r| r[at("ranks")] == "2").unwrap();
    let weak2 = rows
        .iter()
        .position(|r| r[at("ranks")] == "2" && r[at("scaling")] == "weak" && r[at("from_runs")] == "n2")
        .unwrap();
    assert!((strong2[at("step_s")].parse::<f64>().unwrap() - step[weak2]).abs() < 1e-12);
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    assert!(
        report.contains("## Projection beyond the allocation")
            && report.contains("- At 1 node(s) × 2 (2 ranks): efficiency ")
            && report.contains(". What if: "),
        "{report}"
    );
    assert!(
        report.contains("strong G64") && report.contains("Strong scaling: the global batch 64"),
        "{report}"
    );
    // The 2-rank run is the reference (one node, most ranks); the sweep's note says
    // what is missing beyond one node.
    assert!(job.all().contains("no inter-node fit"), "{}", job.all());
}

#[test]
fn a_study_sweeps_first_and_its_report_projects_its_points() {
    let d = tmp();
    let out = d.path().join("study");
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).args([
        "study",
        "--name",
        "proj",
        "--ranks",
        "1,2",
        "--models",
        "mnist-cnn",
        "--datasets",
        "synthetic",
    ]);
    cmd.args(["--repeats", "1", "--allreduce-sweep", "--out"]).arg(&out);
    cmd.args([
        "--",
        "--max-steps",
        "15",
        "--synthetic-samples",
        "1024",
        "--val-samples",
        "0",
        "--bucket-mb",
        "0.5",
    ]);
    let job = run_with_limit(cmd, LIMIT);
    job.assert_ok();
    // The sweep ran on the whole allocation before the points, and the report used it.
    let m = json(&out.join("allreduce/link_model.json"));
    assert_eq!(m["models"][0]["intra"]["ranks"], 2);
    let (h, rows) = read_csv(&out.join("report/projection.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    // The reference is the point with the most ranks on one node (2); the 1-rank point
    // is a check of the projection, the 2-rank point the reference's own shape.
    let two = rows.iter().find(|r| r[at("ranks")] == "2").expect("a 2-rank projection");
    let one = rows.iter().find(|r| r[at("ranks")] == "1").expect("a 1-rank projection");
    assert!(
        two[at("from_runs")].contains("-r2-") && two[at("is_reference")] == "true",
        "{two:?}"
    );
    assert!(
        !one[at("measured_step_s")].is_empty() && one[at("is_reference")] == "false",
        "{one:?}"
    );
    // The 1-rank row is the measured 1-rank point (every speedup is against it): it
    // checks nothing, and the report says so rather than calling it a check.
    assert!(one[at("step_basis")] == "measured" && one[at("error_pct")].is_empty(), "{one:?}");
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(report.contains("The 1-rank row is the measured 1-rank point itself"), "{report}");
}

#[test]
fn fewer_iterations_than_the_minimum_are_taken_as_asked() {
    let d = tmp();
    let out = path_str(&d.path().join("one"));
    sweep(2, &["--max-bytes", "64", "--iters", "1", "--out", &out], &[]).assert_ok();
    let (h, rows) = read_csv(&d.path().join("one/allreduce.csv"));
    assert!(col(&h, &rows, "iters").iter().all(|&i| i == 1.0), "{rows:?}");
    assert!(col(&h, &rows, "wrong").iter().all(|&w| w == 0.0));
}

/// `--idle-ms`: every rank sleeps before each timed all-reduce, and the sleep is in no
/// time column. 1 size × 2 buffers × 5 iterations × 0.4 s idle: the job cannot end
/// in under 4 s if it idles, while every iteration of an 8-byte all-reduce is timed
/// far below 0.4 s if the idle is left out of the time. `0` records back to back;
/// `auto` an idle of at most 0.05 s, kept in the link model's residuals.
#[test]
fn the_sweep_idles_the_link_before_each_timed_all_reduce_and_times_only_the_all_reduce() {
    let d = tmp();
    let run = |name: &str, idle: &str, max_bytes: &str| {
        let out = path_str(&d.path().join(name));
        let t0 = std::time::Instant::now();
        let args = [
            "--min-bytes",
            "8",
            "--max-bytes",
            max_bytes,
            "--iters",
            "5",
            "--warmup-iters",
            "2",
            "--budget-s",
            "100",
        ];
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--idle-ms", idle, "--out", &out]);
        sweep(2, &a, &[]).assert_ok();
        let (h, rows) = read_csv(&d.path().join(name).join("allreduce.csv"));
        (t0.elapsed().as_secs_f64(), h, rows)
    };
    let (wall_s, h, rows) = run("paced", "400", "8");
    assert!(wall_s >= 4.0, "10 timed all-reduces after 0.4 s idle each ended in {wall_s:.2} s");
    assert_eq!(col(&h, &rows, "idle_before_s"), [0.4, 0.4], "{rows:?}");
    assert_eq!(col(&h, &rows, "iters"), [5.0, 5.0]);
    for c in ["iter_p10_s", "iter_median_s", "time_s"] {
        assert!(col(&h, &rows, c).iter().all(|&t| t > 0.0 && t < 0.4), "{c}: {rows:?}");
    }
    let (_, h, rows) = run("back-to-back", "0", "8");
    assert_eq!(col(&h, &rows, "idle_before_s"), [0.0, 0.0], "{rows:?}");
    // Four sizes, so that a link model is fitted.
    let (_, h, rows) = run("auto", "auto", "64");
    assert!(col(&h, &rows, "idle_before_s").iter().all(|&s| s > 0.0 && s <= 0.05), "{rows:?}");
    let model = std::fs::read_to_string(d.path().join("auto/link_model.json")).unwrap();
    assert!(model.contains("\"idle_before_s\""), "the link model records the idle: {model}");
}
