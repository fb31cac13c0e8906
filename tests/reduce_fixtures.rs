//! The reducer on small run folders written by hand, every figure checked against
//! a value worked out by hand, plus bad and partial input.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

mod common;
use common::*;
use ddpbench::record::{CsvLog, Manifest, Phase, PhaseArray, RankInfo, StepRow};
use ddpbench::reduce::read_run;
use ddpbench::reduce::{rank_summaries, scaling, type_summaries, Direction, ScalingMode, StepBreakdown};
use std::path::Path;

/// Per-rank step phases: (node type, [data, fwd, bwd, comm, opt, other]).
type RankSpec<'a> = (&'a str, [f64; 6]);

/// A run to write: its ranks, per-rank batch, steps after the one warm-up step, a factor
/// on every phase (repeats that differ), and its configuration.
struct Fixture<'a> {
    id: &'a str,
    model: &'a str,
    ranks: &'a [RankSpec<'a>],
    batch: usize,
    steps: usize,
    scale: f64,
    config: serde_json::Value,
}

fn fixture<'a>(id: &'a str, ranks: &'a [RankSpec<'a>], batch: usize) -> Fixture<'a> {
    Fixture {
        id,
        model: "m",
        ranks,
        batch,
        steps: 4,
        scale: 1.0,
        config: serde_json::json!({"optimizer": "sgd", "bucket_mb": 25.0, "grad_accum": 1}),
    }
}

fn manifest(f: &Fixture, status: &str) -> Manifest {
    let n = f.ranks.len();
    Manifest {
        schema_version: ddpbench::record::SCHEMA_VERSION,
        run_id: f.id.into(),
        status: status.into(),
        error: None,
        ddpbench_version: "test".into(),
        libtorch_version: "2.11.0".into(),
        mpi_library: "test".into(),
        command_line: vec![],
        config: f.config.clone(),
        model: f.model.into(),
        dataset: "synthetic".into(),
        dataset_source: String::new(),
        parameters: 100,
        gradient_bytes: 400,
        comm_backend: ddpbench::record::Backend::Mpi,
        comm: Default::default(),
        buckets: 1,
        world_size: n,
        nodes: n,
        batch_size_per_rank: f.batch,
        global_batch_size: f.batch * n,
        steps_per_epoch: 100,
        start_utc: format!("2026-01-01T00:00:0{n}.000000Z"),
        end_utc: None,
        // Step k starts at 10·k s (see `write`) and lasts under 10 s.
        wall_s: Some(10.0 * (f.steps + 1) as f64),
        final_param_l2: Some(1.0),
        final_val_accuracy: None,
        allreduce_probe: None,
        allreduce_probe_warm: None,
        host_malloc: None,
        clock: None,
        comparison_key: None,
        model_file: None,
        log_lines_dropped: 0,
        warnings: Vec::new(),
        target: None,
        study_run: None,
        ranks: f
            .ranks
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
                ..Default::default()
            })
            .collect(),
    }
}

/// Writes a run: 1 warm-up step then `steps` identical steps per rank; a rank enters the
/// all-reduce (first and last bucket) when its data + forward + backward end.
fn write(dir: &Path, f: &Fixture) {
    std::fs::create_dir_all(dir).unwrap();
    manifest(f, "completed").write(dir).unwrap();
    for (r, (t, ph)) in f.ranks.iter().enumerate() {
        let ph = ph.map(|v| v * f.scale);
        let mut log = CsvLog::<StepRow>::create(&dir.join(format!("rank-{r:05}.csv"))).unwrap();
        let step_s: f64 = ph.iter().sum();
        for k in 0..=f.steps {
            let start = 10.0 * k as f64;
            let entry = start + ph[0] + ph[1] + ph[2];
            log.write(&StepRow {
                run_id: f.id.into(),
                rank: r,
                node_type: t.to_string(),
                epoch: 0,
                step: k,
                global_step: k,
                warmup: u8::from(k == 0),
                time_utc: "2026-01-01T00:00:00.000000Z".into(),
                step_start_at_s: start,
                samples: f.batch,
                phases: PhaseArray([ph[0], 0.0, ph[1], ph[2], ph[3], ph[4], ph[5]]),
                comm_s: ph[3],
                comm_stage_d2h_s: 0.0,
                comm_stage_h2d_s: 0.0,
                step_s,
                comm_hidden_s: 0.0,
                comm_start_at_s: entry,
                comm_last_start_at_s: entry,
                loss: 1.0,
                bytes: 400,
                loss_scale: None,
                step_skipped: 0,
                noise: None,
            })
            .unwrap();
        }
    }
}

fn write_run(dir: &Path, id: &str, model: &str, ranks: &[RankSpec], batch: usize, steps: usize) {
    write(
        dir,
        &Fixture {
            model,
            steps,
            ..fixture(id, ranks, batch)
        },
    );
}

const BASE: [RankSpec; 1] = [("A", [0.1, 0.3, 0.5, 0.0, 0.1, 0.0])];
// Rank 0 (A) enters the all-reduce at +0.9 s, rank 1 (B) at +1.2 s: A waits 0.3 s,
// the transfer after B's entry takes 0.1 s for both. Both steps last 1.5 s.
const TWO: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 0.4, 0.1, 0.1]), ("B", [0.1, 0.5, 0.6, 0.1, 0.1, 0.1])];
// The same on two ranks of one node type.
const TWO_A: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 0.4, 0.1, 0.1]), ("A", [0.1, 0.5, 0.6, 0.1, 0.1, 0.1])];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn every_figure_matches_hand_values() {
    let d = tmp();
    write_run(&d.path().join("two"), "two", "m", &TWO, 10, 4);
    let two = read_run(&d.path().join("two")).unwrap();
    assert!(two.complete(), "{:?}", two.problems);
    assert_eq!((two.steps, two.warmup_steps, two.samples), (4, 1, 80));

    let s = type_summaries(&two);
    assert_eq!(s.len(), 2);
    let (a, b) = (&s[0], &s[1]);
    assert_eq!((a.node_type.as_str(), a.ranks, a.rank_steps, a.nodes), ("A", 1, 4, 1));
    assert!(close(a.step_s_median, 1.5) && close(a.step_s_p95, 1.5) && close(a.step_s_max, 1.5));
    // Rank 0 alone: 10 samples per 1.5 s.
    assert!(close(a.samples_per_s, 10.0 / 1.5));
    let exposed = a.phases[Phase::CommExposed];
    assert!(close(exposed.median_s, 0.4) && close(exposed.share, 0.4 / 1.5));
    // Shares are means over the mean step: they add up to 1.
    let shares: f64 = a.phases.values().map(|f| f.share).sum();
    assert!(close(shares, 1.0));
    // A waits 0.3 s for B; the transfer after B's entry takes 0.1 s on both.
    assert!(close(a.comm_wait_s_mean, 0.3) && close(b.comm_wait_s_mean, 0.0));
    assert!(close(a.comm_transfer_s_median, 0.1) && close(b.comm_transfer_s_median, 0.1));
    assert!(close(a.comm_exposed_transfer_s_mean, 0.1));
    // R is compute over the transfer, not over the wait: (0.3 + 0.5) / 0.1 = 8 for A,
    // (0.5 + 0.6) / 0.1 = 11 for B.
    assert!(close(a.compute_comm_ratio, 8.0) && close(b.compute_comm_ratio, 11.0));
    // busbw = 2·(2−1)/2 · 400 B / 0.1 s.
    assert!(close(a.busbw_bytes_per_s, 4000.0) && close(a.algbw_bytes_per_s, 4000.0));
    // B is last into every all-reduce and A waits 0.3 s for it each step: B gates the job.
    assert!(close(b.last_arrival_share, 1.0) && close(a.last_arrival_share, 0.0));
    assert!(close(b.caused_wait_s_mean, 0.3) && close(a.caused_wait_s_mean, 0.0));
    assert_eq!((a.gating, b.gating), (0, 1));
    let ranks = rank_summaries(&two);
    assert!(close(ranks[0].comm_wait_s_mean, 0.3) && close(ranks[1].last_arrival_share, 1.0));
    // The epoch was cut short: its time is projected, and says so.
    assert_eq!(a.epoch_s_projected, 1);
    assert!(close(a.epoch_s, 100.0 * 1.5));
}

/// Writes `clock.csv` for a 2-rank run: rank 1's offset estimated as 0 with `error_s`
/// at the start and at 50 s, and its exact offset (with its error) where given.
fn write_clock(dir: &Path, error_s: f64, exact: Option<(f64, f64)>) {
    let cell = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut text = String::from("sync,rank,rank0_elapsed_s,offset_s,error_s,rounds,exact_offset_s,exact_error_s\n");
    for (sync, at) in [(0, 0.0), (1, 50.0)] {
        text += &format!("{sync},0,{at},0,0,0,0,0\n");
        text += &format!(
            "{sync},1,{at},0,{error_s},8,{},{}\n",
            cell(exact.map(|e| e.0)),
            cell(exact.map(|e| e.1))
        );
    }
    std::fs::write(dir.join("clock.csv"), text).unwrap();
}

#[test]
fn arrival_order_is_claimed_only_beyond_the_clocks_error() {
    // A enters 0.3 s before B every step (TWO). With rank 1's offset right to within
    // 0.4 s the order cannot be told: nobody is named last, and A's 0.3 s counts as
    // transfer (merged with waiting), said in the report.
    let d = tmp();
    let dir = d.path().join("two");
    write_run(&dir, "two", "m", &TWO, 10, 4);
    write_clock(&dir, 0.4, None);
    let two = read_run(&dir).unwrap();
    assert!(two.complete(), "{:?}", two.problems);
    let s = type_summaries(&two);
    let (a, b) = (&s[0], &s[1]);
    assert_eq!((a.last_arrival_share, b.last_arrival_share), (0.0, 0.0));
    assert!(close(a.comm_wait_s_mean, 0.0) && close(a.comm_transfer_s_median, 0.4), "{a:?}");
    assert_eq!((two.arrivals.unresolved_steps, two.arrivals.waits_merged), (4, 4));
    assert!(close(two.arrivals.max_error_s, 0.4));
    let out = d.path().join("out");
    ddpbench(&["reduce", "--no-plots", &path_str(&dir), "--out", &path_str(&out)]).assert_ok();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("the clocks cannot order the ranks' arrivals in 4 of 4 steps") && md.contains("transfer and waiting merged"),
        "{md}"
    );

    // Right to within 0.1 s: B is last at every step and A waits 0.3 s.
    write_clock(&dir, 0.1, None);
    let two = read_run(&dir).unwrap();
    let s = type_summaries(&two);
    assert!(close(s[1].last_arrival_share, 1.0) && close(s[0].comm_wait_s_mean, 0.3));
    assert_eq!((two.arrivals.unresolved_steps, two.arrivals.waits_merged), (0, 0));

    // An exact offset (one kernel) wins over a poor estimate.
    write_clock(&dir, 0.4, Some((0.0, 1e-7)));
    let two = read_run(&dir).unwrap();
    assert!(close(type_summaries(&two)[1].last_arrival_share, 1.0));
    assert_eq!(two.arrivals.unresolved_steps, 0);
}

#[test]
fn weak_scaling_by_hand_with_its_waterfall() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 4);
    let base = read_run(&d.path().join("base")).unwrap();
    let two = read_run(&d.path().join("two")).unwrap();
    // One node type: no type gates anything.
    assert!(type_summaries(&two).iter().all(|s| s.gating == 0));
    let rows = scaling(&[&base, &two], None);
    assert_eq!(rows.len(), 2);
    let (r0, r1) = (&rows[0], &rows[1]);
    assert_eq!((r0.scaling_mode, r0.run_ids.join(" ")), (ScalingMode::Baseline, "base".into()));
    assert!(close(r0.samples_per_s, 10.0) && close(r0.speedup, 1.0));
    assert_eq!((r1.scaling_mode, r1.baseline_run_ids.join(" ")), (ScalingMode::Weak, "base".into()));
    // 20 samples per 1.5 s = 13.33/s: speedup 4/3, efficiency 2/3; weak scaling reports
    // Gustafson's serial fraction (2 − 4/3)/(2 − 1) = 2/3 and no Karp–Flatt.
    assert!(close(r1.samples_per_s, 20.0 / 1.5));
    assert!(close(r1.speedup, 4.0 / 3.0) && close(r1.efficiency, 2.0 / 3.0));
    // One run per side: no run-to-run spread, so no interval, no direction and no
    // serial fraction stated; what a direction needs instead (constant steps: within-run
    // noise 0, so at least 2 repeats).
    assert!(r1.speedup_low.is_nan() && r1.speedup_high.is_nan(), "{r1:?}");
    assert_eq!((r1.direction, r1.within_noise), (Some(Direction::NoInterval), 0));
    assert!(r1.interval_method.starts_with("none: one run per side"), "{}", r1.interval_method);
    assert!(r1.interval_method.contains("at least 2 repeats per side"), "{}", r1.interval_method);
    assert_eq!(r1.repeats_needed, Some(2));
    assert!(r1.gustafson_serial_fraction.is_nan() && r1.karp_flatt.is_nan());
    assert!(r1.amdahl_serial_fraction.is_nan(), "Amdahl is a strong-scaling law");
    // A second, identical run of each: a spread of 0, the interval collapses onto the
    // speedup, and Gustafson's serial fraction (2 − 4/3)/(2 − 1) = 2/3 is stated with it.
    write_run(&d.path().join("base-b"), "base-b", "m", &BASE, 10, 4);
    write_run(&d.path().join("two-b"), "two-b", "m", &TWO_A, 10, 4);
    let runs: Vec<_> = ["base", "two", "base-b", "two-b"]
        .iter()
        .map(|n| read_run(&d.path().join(n)).unwrap())
        .collect();
    let rows = scaling(&runs.iter().collect::<Vec<_>>(), None);
    let r2 = rows.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    assert!(close(r2.speedup_low, 4.0 / 3.0) && close(r2.speedup_high, 4.0 / 3.0), "{r2:?}");
    assert_eq!(r2.direction, Some(Direction::Faster));
    assert!(close(r2.gustafson_serial_fraction, 2.0 / 3.0) && r2.karp_flatt.is_nan());
    assert!(close(r2.gustafson_serial_fraction_low, 2.0 / 3.0) && close(r2.gustafson_serial_fraction_high, 2.0 / 3.0));

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
}

#[test]
fn strong_scaling_reports_karp_flatt_and_the_batch_ratio() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 20, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 4);
    let base = read_run(&d.path().join("base")).unwrap();
    let two = read_run(&d.path().join("two")).unwrap();
    let rows = scaling(&[&base, &two], None);
    let r = rows.iter().find(|r| r.run_ids == ["two"]).unwrap();
    assert_eq!(r.scaling_mode, ScalingMode::Strong);
    // Baseline 20 samples/s (20 per 1.0 s); the 2-rank run 13.33/s: speedup 2/3.
    assert!(close(r.speedup, (20.0 / 1.5) / 20.0));
    // Karp–Flatt at s = 2/3, p = 2 would be (3/2 − 1/2)/(1/2) = 2: above 1, where the law
    // is undefined, so not applicable (empty); one strong point: no Amdahl fit.
    assert!(r.karp_flatt.is_nan() && r.amdahl_serial_fraction.is_nan());
    let sum = r.loss_comm_samples_per_s + r.loss_data_samples_per_s + r.loss_straggler_samples_per_s + r.loss_other_samples_per_s;
    assert!(close(sum, r.ideal_samples_per_s - r.samples_per_s));
}

/// Runs are compared only with a 1-rank run of the same configuration: the per-rank
/// batch for weak scaling, the global batch for strong, both where both exist; another
/// bucket size is not comparable, and a run without a reference gets no speedup.
#[test]
fn references_match_the_whole_configuration() {
    let d = tmp();
    let w = |name: &str, f: Fixture| write(&d.path().join(name), &f);
    w("b64", fixture("b64", &BASE, 64));
    w("b32", fixture("b32", &BASE, 32));
    w("two", fixture("two", &TWO_A, 32));
    let mut other = fixture("other-buckets", &TWO_A, 32);
    other.config["bucket_mb"] = serde_json::json!(1.0);
    w("other-buckets", other);
    let runs: Vec<_> = ["b64", "b32", "two", "other-buckets"]
        .iter()
        .map(|n| read_run(&d.path().join(n)).unwrap())
        .collect();
    let refs: Vec<_> = runs.iter().collect();
    let rows = scaling(&refs, None);
    let find = |id: &str, mode: &str| rows.iter().find(|r| r.run_ids == [id] && r.scaling_mode.name() == mode);
    // A 1-rank run is the baseline of itself only, whatever its batch.
    assert!(find("b64", "baseline").is_some() && find("b32", "baseline").is_some());
    assert!(close(find("b64", "baseline").unwrap().speedup, 1.0));
    // 2 × 32 against 1 × 32 (weak) and against 1 × 64 (strong).
    let weak = find("two", "weak").expect("weak row");
    let strong = find("two", "strong").expect("strong row");
    assert_eq!(
        (weak.baseline_run_ids.join(" "), strong.baseline_run_ids.join(" ")),
        ("b32".into(), "b64".into())
    );
    // Both references run 1.0 s steps: 32/s and 64/s; the point 64/1.5 = 42.7/s.
    assert!(close(weak.speedup, (64.0 / 1.5) / 32.0) && close(strong.speedup, (64.0 / 1.5) / 64.0));
    // Another bucket size has no 1-rank run: no speedup, no efficiency, and what to add.
    let lone = find("other-buckets", "none").expect("row without a reference");
    assert!(lone.speedup.is_nan() && lone.efficiency.is_nan());
    assert!(
        lone.missing_reference
            .contains("a 1-rank run on A, weak: `mpirun -n 1 ddpbench train ")
            && lone.missing_reference.contains(" --batch-size 32 "),
        "{}",
        lone.missing_reference
    );
    assert_eq!(rows.len(), 5);
    // report.md's strong grid is keyed by the global batch: the 2 × 32 point sits on
    // 1 × 64's row, beside its 1-rank step; the weak grid by the batch per rank.
    let (_, md) = report_of(d.path());
    let strong_grid = md
        .split("### strong speedup by global batch × ranks")
        .nth(1)
        .expect("a strong grid");
    let row64 = strong_grid
        .lines()
        .find(|l| l.starts_with("| 64 |"))
        .unwrap_or_else(|| panic!("{strong_grid}"));
    assert!(row64.ends_with(&format!(" {:.2} |", (64.0 / 1.5) / 64.0)), "{row64}");
    assert!(!row64.contains("| – |"), "its 1-rank step is on its row: {row64}");
    let weak_grid = md.split("### weak speedup by batch per rank × ranks").nth(1).expect("a weak grid");
    let row32 = weak_grid
        .lines()
        .find(|l| l.starts_with("| 32 |"))
        .unwrap_or_else(|| panic!("{weak_grid}"));
    assert!(row32.ends_with(&format!(" {:.2} |", (64.0 / 1.5) / 32.0)), "{row32}");
}

/// `--overlap force` all-reduces on a thread that shares backward's cores: the step does
/// other work than with overlap off, so the two are different points, never repeats of
/// one (pooled, a measured point's speedup moved from 0.912 to 0.823).
#[test]
fn overlap_force_and_off_are_different_points() {
    let d = tmp();
    let mut off = fixture("off", &TWO_A, 10);
    off.config["overlap"] = serde_json::json!("off");
    write(&d.path().join("off"), &off);
    let mut force = fixture("force", &TWO_A, 10);
    force.config["overlap"] = serde_json::json!("force");
    force.scale = 1.6;
    write(&d.path().join("force"), &force);
    let mut m = Manifest::read(&d.path().join("force")).unwrap();
    m.comm.overlap = true;
    m.comm.backward_stages = 2;
    m.comm.overlap_shares_core = true;
    m.write(&d.path().join("force")).unwrap();
    let runs: Vec<_> = ["off", "force"].iter().map(|n| read_run(&d.path().join(n)).unwrap()).collect();
    let rows = scaling(&runs.iter().collect::<Vec<_>>(), None);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    for (id, overlap) in [("off", "overlap=off"), ("force", "overlap=force")] {
        let r = rows
            .iter()
            .find(|r| r.run_ids == [id])
            .unwrap_or_else(|| panic!("no point of {id} alone: {rows:#?}"));
        assert_eq!(r.repeats, 1);
        assert!(r.comparison.contains(overlap), "{id}: {}", r.comparison);
    }
}

/// Runs that asked for the gradient noise scale's norms and runs that did not are
/// different points, never repeats of one (the norms cost a little of the step), and
/// a run whose recorded key predates the field is compared by the flag its config holds.
#[test]
fn noise_scale_on_and_off_are_different_points() {
    let d = tmp();
    let mut off = fixture("off", &TWO_A, 10);
    off.config["noise_scale"] = serde_json::json!("off");
    write(&d.path().join("off"), &off);
    let mut on = fixture("on", &TWO_A, 10);
    on.config["noise_scale"] = serde_json::json!("every:10");
    on.scale = 1.01;
    write(&d.path().join("on"), &on);
    let mut same = fixture("same", &TWO_A, 10);
    same.config["noise_scale"] = serde_json::json!("every:10");
    write(&d.path().join("same"), &same);
    // "same" records a key without the field, as runs before it did; its config says every:10.
    let mut m = Manifest::read(&d.path().join("same")).unwrap();
    let mut key = ddpbench::record::ComparisonKey::derive(&m).unwrap();
    key.noise_scale = ddpbench::record::NoiseScaleMode::Off;
    m.comparison_key = Some(key);
    m.write(&d.path().join("same")).unwrap();
    let runs: Vec<_> = ["off", "on", "same"].iter().map(|n| read_run(&d.path().join(n)).unwrap()).collect();
    let rows = scaling(&runs.iter().collect::<Vec<_>>(), None);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let alone = rows.iter().find(|r| r.run_ids == ["off"]).unwrap_or_else(|| panic!("{rows:#?}"));
    assert!(!alone.comparison.contains("noise_scale"), "{}", alone.comparison);
    let pooled = rows.iter().find(|r| r.run_ids.len() == 2).unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(pooled.repeats, 2);
    assert!(pooled.comparison.contains("noise_scale=every:10"), "{}", pooled.comparison);
}

/// The key a manifest records is what its run is compared by; a manifest without one
/// has it derived, and a setting there that no run has is named and leaves the run out.
#[test]
fn the_manifest_key_is_read_and_a_setting_no_run_has_is_named() {
    let d = tmp();
    write(&d.path().join("stored"), &fixture("stored", &TWO_A, 10));
    let mut m = Manifest::read(&d.path().join("stored")).unwrap();
    let mut key = ddpbench::record::ComparisonKey::derive(&m).unwrap();
    key.threads_per_rank = vec![3];
    m.comparison_key = Some(key);
    m.write(&d.path().join("stored")).unwrap();
    let run = read_run(&d.path().join("stored")).unwrap();
    let rows = scaling(&[&run], None);
    assert!(rows[0].comparison.starts_with("cpu threads=3 "), "{}", rows[0].comparison);

    for (name, edit, named) in [
        (
            "optimizer",
            ("optimizer", serde_json::json!("quantum")),
            "config.optimizer is \"quantum\"",
        ),
        ("accum", ("grad_accum", serde_json::json!(-2)), "config.grad_accum is -2"),
    ] {
        let mut f = fixture(name, &TWO_A, 10);
        f.config[edit.0] = edit.1;
        write(&d.path().join(name), &f);
        let run = read_run(&d.path().join(name)).unwrap();
        assert!(run.problems.iter().any(|p| p.contains(named)), "{name}: {:?}", run.problems);
    }
    write(&d.path().join("gloo"), &fixture("gloo", &TWO_A, 10));
    let path = d.path().join("gloo/manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["comm_backend"] = "gloo".into();
    std::fs::write(&path, m.to_string()).unwrap();
    let Err(e) = read_run(&d.path().join("gloo")) else {
        panic!("a manifest naming the all-reduce gloo was read")
    };
    assert!(e.contains("gloo") && e.contains("`mpi`"), "{e}");
}

/// Repeats are grouped, never "best of"; the speedup is the ratio of geometric means
/// and its interval a t-interval on log throughput with Welch–Satterthwaite's df, each
/// side's spread its own (a 2-rank point and its 1-rank reference are not pooled).
#[test]
fn repeats_give_t_intervals_on_log_throughput() {
    let d = tmp();
    let mut names = Vec::new();
    let scales = [1.0, 1.1, 0.95];
    for (i, scale) in scales.iter().enumerate() {
        for (kind, ranks) in [("base", &BASE[..]), ("two", &TWO_A[..])] {
            let id = format!("{kind}-{i}");
            let mut f = fixture(&id, ranks, 10);
            f.scale = *scale;
            write(&d.path().join(&id), &f);
            names.push(id);
        }
    }
    let runs: Vec<_> = names.iter().map(|n| read_run(&d.path().join(n)).unwrap()).collect();
    let row_of = |ids: &[&str]| {
        let refs: Vec<_> = runs.iter().filter(|r| ids.contains(&r.manifest.run_id.as_str())).collect();
        let rows = scaling(&refs, None);
        rows.into_iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap()
    };
    // By hand: a run's step scales by s, so its log throughput moves by −ln s on both
    // sides alike: speedup (20/1.5)/10 = 4/3 exactly, each side's variance that of ln s.
    let by_hand = |k: usize, t: f64| {
        let logs: Vec<f64> = scales[..k].iter().map(|s| f64::ln(*s)).collect();
        let m = logs.iter().sum::<f64>() / k as f64;
        let v = logs.iter().map(|l| (l - m).powi(2)).sum::<f64>() / (k - 1) as f64;
        let hw = t * (2.0 * v / k as f64).sqrt();
        (4.0 / 3.0 * (-hw).exp(), 4.0 / 3.0 * hw.exp())
    };
    // Two repeats a side: equal spreads of 1 df each, Welch–Satterthwaite df 2,
    // t(0.975, 2) = 4.3027: 1.33 (0.997–1.78) holds 1, no direction from 2 repeats.
    let two = row_of(&["base-0", "base-1", "two-0", "two-1"]);
    let (lo, hi) = by_hand(2, 4.302_652_7);
    assert!(close(two.speedup, 4.0 / 3.0), "{two:?}");
    assert!(
        (two.speedup_low - lo).abs() < 1e-6 && (two.speedup_high - hi).abs() < 1e-6,
        "{two:?} vs {lo} {hi}"
    );
    assert!(
        (two.interval_df - 2.0).abs() < 1e-9 && two.interval_method.contains("df 2.0"),
        "{}",
        two.interval_method
    );
    assert_eq!((two.direction, two.within_noise), (Some(Direction::WithinNoise), 1));
    assert!(
        two.interval_method.contains("no direction possible from 2 repeats at this spread"),
        "{}",
        two.interval_method
    );
    assert_eq!(two.repeats_needed, Some(3), "{}", two.interval_method);
    // Three a side: df 4, t(0.975, 4) = 2.7764; now it excludes 1.
    let three = row_of(&["base-0", "base-1", "base-2", "two-0", "two-1", "two-2"]);
    let (lo, hi) = by_hand(3, 2.776_445_1);
    assert!(
        (three.speedup_low - lo).abs() < 1e-6 && (three.speedup_high - hi).abs() < 1e-6,
        "{three:?}"
    );
    assert_eq!((three.direction, three.repeats_needed), (Some(Direction::Faster), None));
}

/// The weak point of 3 repeats a side whose percentile bootstrap said "scales: 1.58
/// (1.26–2.02)": per-run 955.5 / 602.8 / 685.5 against 436.7 / 466.5 / 516.5 samples/s.
/// Its t-interval holds 1, and the verdict claims no direction.
#[test]
fn a_point_of_three_noisy_repeats_claims_no_direction() {
    let d = tmp();
    // A run's throughput is 20 samples per 1.5·scale s (2 ranks) or 10 per scale s (1).
    for (i, (two, one)) in [(955.5, 436.7), (602.8, 466.5), (685.5, 516.5)].iter().enumerate() {
        for (id, ranks, per_step, thr) in [
            (format!("two-{i}"), &TWO_A[..], 20.0 / 1.5, two),
            (format!("base-{i}"), &BASE[..], 10.0, one),
        ] {
            let mut f = fixture(&id, ranks, 10);
            f.scale = per_step / thr;
            write(&d.path().join(&id), &f);
        }
    }
    let (report, md) = report_of(d.path());
    let row = report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    let gm = (955.5f64 * 602.8 * 685.5).cbrt();
    assert!((row.samples_per_s - gm).abs() < 1e-6 * gm, "the geometric mean: {row:?}");
    // Gustafson's fraction over the interval stops at 0 (speedup 2) and 1 (speedup 1).
    assert_eq!((row.gustafson_serial_fraction_low, row.gustafson_serial_fraction_high), (0.0, 1.0));
    // Welch on log throughput: 1.554 (0.923–2.616), df 2.50 (the interval's own test).
    assert!(
        (row.speedup_low - 0.923).abs() < 0.001 && (row.speedup_high - 2.616).abs() < 0.001,
        "{row:?}"
    );
    assert!((row.interval_df - 2.498).abs() < 0.001, "{row:?}");
    let v = &report.workloads[0].verdict;
    assert!(
        v.contains("indistinguishable from no speedup at this noise: no direction possible from 3 repeats at this spread"),
        "{v}"
    );
    assert!(!v.contains("scales"), "{v}");
    assert!(md.contains("t on log throughput, df 2."), "{md}");
}

/// With overlap a rank's exposed wait can be shorter than its wait for the last rank:
/// the wait is taken whole, so the transfer (and busbw) is not inflated by it.
#[test]
fn the_straggler_wait_is_not_capped_at_the_exposed_time() {
    let d = tmp();
    // A's exposed phase is 0.1 s, but it entered 0.3 s before B; its comm_s (0.4 s)
    // covers the whole wait and the 0.1 s transfer.
    const OVERLAPPED: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 0.1, 0.1, 0.4]), ("A", [0.1, 0.5, 0.6, 0.1, 0.1, 0.1])];
    let dir = d.path().join("run");
    write_run(&dir, "run", "m", &OVERLAPPED, 10, 4);
    hide_comm(&dir, 0.3);
    let run = read_run(&dir).unwrap();
    let s = &type_summaries(&run)[0];
    // Rank 0 waits 0.3 s, rank 1 none; transfers 0.4 − 0.3 = 0.1 and 0.4 − 0 = 0.4 s.
    assert!(close(s.comm_wait_s_mean, 0.15), "{}", s.comm_wait_s_mean);
    assert!(close(rank_summaries(&run)[0].comm_wait_s_mean, 0.3));
}

#[test]
fn a_lone_multi_rank_run_gets_no_efficiency_and_epochs_without_validation_count() {
    let d = tmp();
    let dir = d.path().join("lone");
    write_run(&dir, "lone", "m", &TWO_A, 10, 4);
    // An epoch as --val-samples 0 writes it: empty validation cells.
    std::fs::write(
        dir.join("epochs.csv"),
        "epoch,time_utc,steps,epoch_s,train_loss,val_loss,val_accuracy,val_samples,val_s,param_l2\n0,2026-01-01T00:00:00.000000Z,100,150.5,2.3,,,0,0,12.5\n",
    )
    .unwrap();
    // The run went on for the epoch's 100 steps.
    let mut m = Manifest::read(&dir).unwrap();
    m.wall_s = Some(160.0);
    m.write(&dir).unwrap();
    let run = read_run(&dir).unwrap();
    assert!(run.complete(), "{:?}", run.problems);
    let s = &type_summaries(&run)[0];
    assert_eq!((s.epoch_s, s.epoch_s_projected), (150.5, 0), "a full epoch is measured");
    let job = ddpbench(&["reduce", "--no-plots", &path_str(&dir), "--out", &path_str(&dir)]);
    job.assert_ok();
    let (h, rows) = read_csv(&dir.join("scaling.csv"));
    assert_eq!(rows.len(), 1);
    let cell = |c: &str| rows[0][h.iter().position(|x| x == c).unwrap()].clone();
    assert_eq!(
        (cell("speedup"), cell("efficiency"), cell("scaling_mode")),
        (String::new(), String::new(), "none".to_string())
    );
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("`lone` (batch 10 per rank) has no reference: add a 1-rank run on A, weak: `mpirun -n 1 ddpbench train "),
        "{report}"
    );
}

#[test]
fn amdahl_is_fitted_through_two_strong_points_and_no_cap_is_claimed_for_zero() {
    let d = tmp();
    // Perfect strong scaling: 1 × 40 in 1 s, 2 × 20 in 0.5 s, 4 × 10 in 0.25 s; each
    // point twice (identical runs: a spread of 0, so intervals of one value).
    const ONE: [RankSpec; 1] = [("A", [0.0, 0.5, 0.5, 0.0, 0.0, 0.0])];
    const HALF: [RankSpec; 2] = [("A", [0.0, 0.25, 0.25, 0.0, 0.0, 0.0]); 2];
    const QUARTER: [RankSpec; 4] = [("A", [0.0, 0.125, 0.125, 0.0, 0.0, 0.0]); 4];
    for rep in ["", "-b"] {
        write(&d.path().join(format!("one{rep}")), &fixture(&format!("one{rep}"), &ONE, 40));
        write(&d.path().join(format!("two{rep}")), &fixture(&format!("two{rep}"), &HALF, 20));
    }
    let runs: Vec<_> = ["one", "two", "one-b", "two-b"]
        .iter()
        .map(|n| read_run(&d.path().join(n)).unwrap())
        .collect();
    let rows = scaling(&runs.iter().collect::<Vec<_>>(), None);
    let two = rows.iter().find(|r| r.run_ids == ["two", "two-b"]).unwrap();
    assert!(close(two.speedup, 2.0) && two.amdahl_serial_fraction.is_nan(), "one point: no fit");
    for rep in ["", "-b"] {
        write(&d.path().join(format!("four{rep}")), &fixture(&format!("four{rep}"), &QUARTER, 10));
    }
    let job = ddpbench(&["reduce", "--no-plots", &path_str(d.path()), "--out", &path_str(d.path())]);
    job.assert_ok();
    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    let f = col_opt(&h, &rows, "amdahl_serial_fraction");
    assert!(f.iter().flatten().any(|v| v.abs() < 1e-6), "{f:?}");
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    assert!(report.contains("no serial fraction distinguishable from 0"), "{report}");
    assert!(!report.contains("caps the strong speedup"), "{report}");
}

/// Every fitted law carries the range it takes over the speedups' intervals, or is not
/// stated: single runs give no interval, so no Karp–Flatt and no Amdahl fit; repeats give
/// both, each between its values at the intervals' ends.
#[test]
fn fitted_laws_carry_intervals_or_are_not_stated() {
    let d = tmp();
    // Strong scaling with a serial part: 1 × 40 in 1 s, 2 × 20 in 0.6 s, 4 × 10 in 0.4 s.
    const ONE: [RankSpec; 1] = [("A", [0.0, 0.5, 0.5, 0.0, 0.0, 0.0])];
    const HALF: [RankSpec; 2] = [("A", [0.0, 0.3, 0.3, 0.0, 0.0, 0.0]); 2];
    const QUARTER: [RankSpec; 4] = [("A", [0.0, 0.2, 0.2, 0.0, 0.0, 0.0]); 4];
    let put = |id: &str, ranks: &'static [RankSpec<'static>], batch: usize, scale: f64| {
        let mut f = fixture(id, ranks, batch);
        f.scale = scale;
        write(&d.path().join(id), &f);
    };
    put("one-0", &ONE, 40, 1.0);
    put("two-0", &HALF, 20, 1.0);
    put("four-0", &QUARTER, 10, 1.0);
    let (report, md) = report_of(d.path());
    let strong: Vec<_> = report.scaling.iter().filter(|r| r.scaling_mode == ScalingMode::Strong).collect();
    assert_eq!(strong.len(), 2);
    for r in &strong {
        assert!(r.karp_flatt.is_nan() && r.amdahl_serial_fraction.is_nan(), "{r:?}");
    }
    assert!(
        md.contains("No Amdahl fit is stated: a strong point it would go through has no interval"),
        "{md}"
    );
    assert!(md.contains("Karp–Flatt: not stated (no interval)"), "{md}");
    std::fs::remove_dir_all(d.path().join("report")).unwrap();
    for (i, scale) in [1.03, 0.98].iter().enumerate() {
        put(&format!("one-{}", i + 1), &ONE, 40, *scale);
        put(&format!("two-{}", i + 1), &HALF, 20, *scale * 1.01);
        put(&format!("four-{}", i + 1), &QUARTER, 10, *scale * 0.99);
    }
    let (report, md) = report_of(d.path());
    let strong: Vec<_> = report.scaling.iter().filter(|r| r.scaling_mode == ScalingMode::Strong).collect();
    for r in &strong {
        let kf = |s: f64| ddpbench::reduce::karp_flatt(s, r.ranks as f64);
        assert!(r.speedup_low.is_finite(), "{r:?}");
        assert!(close(r.karp_flatt, kf(r.speedup)), "{r:?}");
        assert!(
            close(r.karp_flatt_low, kf(r.speedup_high)) && close(r.karp_flatt_high, kf(r.speedup_low.max(1.0))),
            "{r:?}"
        );
        let (f, lo, hi) = (
            r.amdahl_serial_fraction,
            r.amdahl_serial_fraction_low,
            r.amdahl_serial_fraction_high,
        );
        assert!(lo < f && f < hi, "{lo} {f} {hi}");
        assert!(
            r.amdahl_speedup_low <= r.amdahl_speedup && r.amdahl_speedup <= r.amdahl_speedup_high,
            "{r:?}"
        );
    }
    let (lo, hi) = (strong[0].amdahl_serial_fraction_low, strong[0].amdahl_serial_fraction_high);
    assert!(md.contains(&format!("({lo:.3}–{hi:.3} over the speedups' intervals)")), "{md}");
}

#[test]
fn the_terminal_counts_steps_per_rank_as_report_md_does() {
    // Two ranks of 4 measured steps each: 4 steps per rank, 8 rank-steps.
    let d = tmp();
    write(&d.path().join("two"), &fixture("two", &TWO_A, 32));
    let out = reduce(&["--no-plots", &path_str(d.path())]);
    out.assert_ok();
    let header = out.stdout.lines().find(|l| l.starts_with("run ")).expect("the runs table");
    assert!(header.contains("steps/rank"), "{header}");
    let row = out.stdout.lines().find(|l| l.starts_with("two ")).expect("the run's row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    let ranks = cells.iter().position(|c| *c == "2").expect("the ranks cell");
    assert_eq!(cells[ranks + 1], "4", "{row}");
}

/// `ddpbench reduce ARGS`, into the last folder given unless ARGS name an `--out`: the
/// files these tests read (reduce's own default, a new report folder beside the inputs,
/// has its test).
fn reduce(args: &[&str]) -> Job {
    let mut a = vec!["reduce"];
    a.extend_from_slice(args);
    if !args.contains(&"--out") {
        if let Some(last) = args.last() {
            a.extend(["--out", last]);
        }
    }
    ddpbench(&a)
}

#[test]
fn cli_writes_spreadsheet_ready_files_report_and_plots() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 4);
    write_run(&d.path().join("mixed"), "mixed", "m", &TWO, 10, 4);
    write_run(&d.path().join("other-model"), "other-model", "transformer", &TWO_A, 10, 4);
    let job = reduce(&[&path_str(d.path())]);
    job.assert_ok();
    // The "wrote" line names every file in the folder but the plots and the hidden
    // marker of a report folder.
    let wrote = job.stdout.lines().find(|l| l.starts_with("wrote ")).expect("a wrote line");
    for e in std::fs::read_dir(d.path()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let plot = name.ends_with(".svg") || name.ends_with(".png");
        if e.file_type().unwrap().is_file() && !plot && !name.starts_with('.') {
            assert!(wrote.contains(&name), "{wrote} lacks {name}");
        }
    }
    assert!(wrote.contains("*.svg, *.png"), "{wrote}");
    let (h, rows) = read_csv(&d.path().join("scaling.csv"));
    let id = |i: usize| rows[i][h.iter().position(|c| c == "run_ids").unwrap()].clone();
    let base_of = |i: usize| rows[i][h.iter().position(|c| c == "baseline_run_ids").unwrap()].clone();
    // Runs of another model are never compared with this one; the mixed A + B run has no
    // 1-rank run on B, so it is compared with nothing.
    for i in 0..rows.len() {
        match id(i).as_str() {
            "other-model" | "mixed" => assert_eq!(base_of(i), ""),
            _ => assert_eq!(base_of(i), "base"),
        }
    }
    let speedups = col_opt(&h, &rows, "speedup");
    assert!(speedups.iter().flatten().any(|&s| close(s, 4.0 / 3.0)));
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
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    for needle in [
        "## Speedup and efficiency: m on synthetic",
        "## Compute vs communication",
        "## All-reduce bandwidth",
        "## Where the efficiency goes",
        "type \"B\"",
        "sets the job's pace",
        "has no reference: add a 1-rank run on B, weak: `mpirun -n 1 ddpbench train ",
    ] {
        assert!(report.contains(needle), "report lacks {needle:?}");
    }
    // The phases are one panel per model and batch per rank: phases-MODEL-bBATCH.
    let phases = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("phases-") && n.ends_with(".svg"))
        .expect("a phases-MODEL-bBATCH.svg panel");
    let phases = phases.trim_end_matches(".svg");
    for plot in ["speedup", "efficiency", phases, "bandwidth", "step_time_per_rank-two"] {
        let svg = std::fs::read_to_string(d.path().join(format!("{plot}.svg"))).unwrap();
        resvg::usvg::Tree::from_str(&svg, &resvg::usvg::Options::default()).unwrap_or_else(|e| panic!("{plot}.svg: {e}"));
        let png = std::fs::read(d.path().join(format!("{plot}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{plot}.png");
    }
}

/// Column `name` with empty cells as None.
fn col_opt(h: &[String], rows: &[Vec<String>], name: &str) -> Vec<Option<f64>> {
    let i = h.iter().position(|c| c == name).unwrap();
    rows.iter().map(|r| r[i].parse().ok()).collect()
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
    text.push_str("truncated,1,B,0,5,5,0,2026-01-01T00:0");
    std::fs::write(&f, text).unwrap();
    // One rank has fewer steps than the other.
    write_run(&d.path().join("short"), "short", "m", &TWO, 10, 4);
    let f = d.path().join("short/rank-00000.csv");
    let text = std::fs::read_to_string(&f).unwrap();
    let kept: Vec<&str> = text.lines().take(4).collect();
    std::fs::write(&f, kept.join("\n") + "\n").unwrap();
    // An unfinished job, killed before any rank recorded an end.
    write_run(&d.path().join("running"), "running", "m", &TWO, 10, 4);
    let mut m = Manifest::read(&d.path().join("running")).unwrap();
    m.status = "running".into();
    m.write(&d.path().join("running")).unwrap();
    // Not CSV at all.
    write_run(&d.path().join("garbage"), "garbage", "m", &TWO, 10, 4);
    std::fs::write(d.path().join("garbage/rank-00000.csv"), b"\x00\x01 not a csv\n").unwrap();

    let expect = [
        ("missing", "1 of 2 rank files are missing (rank-00001.csv)"),
        ("truncated", "last row is truncated"),
        ("short", "different numbers of steps (rank 0: 3, rank 1: 5)"),
        ("running", "killed (SIGKILL, out of memory, node lost) while running"),
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
    assert!(report.contains("## Incomplete runs") && report.contains("rank files are missing"));

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
         0,2026-01-01T00:00:00Z,0.1,5,,5000,1410,40,60\n\
         0,2026-01-01T00:00:10Z,10.1,50,,1000,1410,100,60\n\
         0,2026-01-01T00:00:21Z,21.1,70,,3000,1410,,61\n\
         0,2026-01-01T00:00:45Z,45.0,3,,1000,1410,30,61\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("rank-00001.gpu.csv"),
        "rank,time_utc,elapsed_s,gpu_util_pct,mem_util_pct,mem_used_bytes,sm_clock_mhz,power_w,temperature_c\n\
         1,2026-01-01T00:00:00Z,0.5,0,,,,,\n\
         1,2026-01-01T00:00:10Z,10.1,90,,,,,\n",
    )
    .unwrap();
    let run = read_run(&dir).unwrap();
    assert!(run.complete(), "{:?}", run.problems);
    let s = type_summaries(&run);
    let (a, b) = (&s[0], &s[1]);
    // The phase is the exposed part; all of the work is comm_s.
    assert!(close(a.phases[Phase::CommExposed].median_s, 0.4) && close(a.comm_s_median, 0.6));
    // R uses the transfer, the work after the last rank entered: (0.3 + 0.5) / 0.3.
    assert!(close(a.compute_comm_ratio, 0.8 / 0.3));
    // A waited 0.3 s of its 0.4 s exposed for B; the transfer is the work minus that wait.
    assert!(close(a.comm_wait_s_mean, 0.3) && close(a.comm_exposed_transfer_s_mean, 0.1));
    assert!(close(a.comm_transfer_s_median, 0.3) && close(b.comm_transfer_s_median, 0.3));
    // Telemetry: utilisation and power are means over the samples that have a value and
    // fall within the timed steps (10 s to 41.5 s here: the warm-up step at 0 s and the
    // sample after the last step are left out); memory is the peak of every sample.
    assert!(close(a.gpu_util_pct_mean, 60.0) && close(a.gpu_mem_used_max_bytes, 5000.0) && close(a.gpu_power_w_mean, 100.0));
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
        "end_utc":"2026-11-01T00:01:20.000000Z","wall_s":80.0,"final_param_l2":1.0,"final_val_accuracy":0.5,
        "allreduce_probe":null,"ranks":[{"rank":0,"local_rank":0,"host":"a","node_type":"T","device":"Cpu",
        "binding":"auto: 0","threads":1,"cpu_model":"x","gpus":[],"launcher_env":[]}]}"#,
    )
    .unwrap();
    let header = "rank,node_type,epoch,step,global_step,warmup,time_utc,elapsed_s,samples,data_s,forward_s,backward_s,comm_s,comm_exposed_s,copy_d2h_s,copy_h2d_s,optimizer_s,other_s,step_s,comm_start_s,loss,bytes,loss_scale,step_skipped";
    // Steps start 20 s apart; the all-reduce is entered after backward.
    let row = |step: usize, warm: u8, data: f64, fwd: f64| {
        let step_s = data + fwd + 0.2 + 0.05 + 0.01 + 0.04;
        let (start, entry) = (20 * step, 20.0 * step as f64 + data + fwd + 0.2);
        format!("0,T,0,{step},{step},{warm},2026-11-01T00:00:{start:02}.000000Z,{start},64,{data},{fwd},0.2,0.05,0.05,0,0,0.01,0.04,{step_s},{entry},2.3,4799528,,0")
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
    assert!(close(s.phases[Phase::Data].median_s, 0.2) && close(s.phases[Phase::Forward].median_s, 0.4));
    assert_eq!(
        s.phases[Phase::BatchCopy].median_s,
        0.0,
        "schema 1 has no batch copy column: it is 0"
    );
    assert!(close(s.phases[Phase::CommExposed].median_s, 0.05) && close(s.comm_s_median, 0.05));
    assert!(close(s.step_s_median, 0.2 + 0.4 + 0.3));
    assert_eq!(
        s.schema_version,
        ddpbench::record::SCHEMA_VERSION,
        "summary.csv is written in the reducer's schema"
    );
}

/// Hostile or damaged input is named, never a panic, in bounded time: impossible times,
/// a rank file from another run, an absurd world size, an empty rank file, a stall.
#[test]
fn hostile_inputs_are_named_and_stalls_are_listed() {
    let d = tmp();
    let edit = |name: &str, rank: usize, col: &str, step: usize, value: &str| {
        let f = d.path().join(name).join(format!("rank-{rank:05}.csv"));
        let mut r = csv::Reader::from_path(&f).unwrap();
        let h = r.headers().unwrap().clone();
        let c = h.iter().position(|x| x == col).unwrap();
        let mut rows: Vec<Vec<String>> = r.records().map(|x| x.unwrap().iter().map(String::from).collect()).collect();
        rows[step][c] = value.into();
        let mut w = csv::Writer::from_path(&f).unwrap();
        w.write_record(&h).unwrap();
        for row in rows {
            w.write_record(&row).unwrap();
        }
    };
    for name in ["negative", "nan", "foreign", "huge", "empty", "stalled"] {
        write_run(&d.path().join(name), name, "m", &TWO_A, 10, 30);
    }
    edit("negative", 1, "step_s", 3, "-5");
    edit("nan", 0, "comm_exposed_s", 2, "NaN");
    std::fs::copy(d.path().join("negative/rank-00001.csv"), d.path().join("foreign/rank-00001.csv")).unwrap();
    let mut m = Manifest::read(&d.path().join("huge")).unwrap();
    m.world_size = 1_000_000_000_000;
    m.write(&d.path().join("huge")).unwrap();
    std::fs::write(d.path().join("empty/rank-00001.csv"), "").unwrap();
    // One step of rank 0 took 40 s where the others take 1.5 s: 38.5 s more in other_s,
    // and every later step of the job starts 38.5 s later.
    edit("stalled", 0, "step_s", 17, "40");
    edit("stalled", 0, "other_s", 17, "38.6");
    let stalled = d.path().join("stalled");
    for r in 0..2 {
        edit_rows(&stalled, r, |i, col, row| {
            for c in ["step_start_at_s", "comm_start_at_s", "comm_last_start_at_s"]
                .into_iter()
                .filter(|_| i > 17)
            {
                row[col(c)] = (row[col(c)].parse::<f64>().unwrap() + 38.5).to_string();
            }
        });
    }
    let mut m = Manifest::read(&stalled).unwrap();
    m.wall_s = m.wall_s.map(|w| w + 38.5);
    m.write(&stalled).unwrap();
    let expect = [
        ("negative", "step_s is -5"),
        ("nan", "comm_exposed_s is NaN"),
        ("foreign", "belongs to run \"negative\""),
        ("empty", "rank-00001.csv is empty"),
    ];
    for (name, problem) in expect {
        let run = read_run(&d.path().join(name)).unwrap();
        assert!(run.problems.iter().any(|p| p.contains(problem)), "{name}: {:?}", run.problems);
    }
    let e = read_run(&d.path().join("huge")).err().unwrap();
    assert!(e.contains("world_size 1000000000000 is not a plausible number of ranks"), "{e}");
    let start = std::time::Instant::now();
    let job = reduce(&["--no-plots", &path_str(d.path())]);
    job.assert_ok();
    assert!(start.elapsed() < std::time::Duration::from_secs(60));
    assert!(!job.all().contains("panicked"), "{}", job.all());
    assert!(
        job.stderr.contains("skipped") && job.stderr.contains("world_size 1000000000000"),
        "{}",
        job.stderr
    );
    let report = std::fs::read_to_string(d.path().join("report.md")).unwrap();
    assert!(
        report.contains("## Stalls") && report.contains("| stalled | 0 | 17 | 40.000 |"),
        "{report}"
    );
}

/// Rewrites rank `rank`'s file of run folder `dir`: `change(row index, cells)` edits each
/// row in place, cells found by `col(name)`.
fn edit_rows(dir: &Path, rank: usize, mut change: impl FnMut(usize, &dyn Fn(&str) -> usize, &mut Vec<String>)) {
    let f = dir.join(format!("rank-{rank:05}.csv"));
    let mut r = csv::Reader::from_path(&f).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |name: &str| h.iter().position(|x| x == name).unwrap_or_else(|| panic!("no column {name}"));
    let mut rows: Vec<Vec<String>> = r.records().map(|x| x.unwrap().iter().map(String::from).collect()).collect();
    for (i, row) in rows.iter_mut().enumerate() {
        change(i, &col, row);
    }
    let mut w = csv::Writer::from_path(&f).unwrap();
    w.write_record(&h).unwrap();
    for row in rows {
        w.write_record(&row).unwrap();
    }
}

/// Sets column `name` of rank `rank`'s rows whose index `rows` holds to `value`.
fn set_cells(dir: &Path, rank: usize, name: &str, rows: impl Fn(usize) -> bool, value: &str) {
    edit_rows(dir, rank, |i, col, row| {
        if rows(i) {
            row[col(name)] = value.into();
        }
    });
}

/// A good 1-rank run `base` beside the run `name` (2 ranks, 30 steps) that `damage`
/// edits: the damaged run is refused with every one of `named` in its problem, and
/// `reduce` reduces the good run, names the damaged one and leaves it out.
fn refused_and_named(name: &str, damage: impl Fn(&Path), named: &[&str]) {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    let dir = d.path().join(name);
    write_run(&dir, name, "m", &TWO_A, 10, 30);
    damage(&dir);
    let run = read_run(&dir).unwrap();
    assert!(!run.complete(), "{name}: read as complete");
    let problems = run.problems.join("\n");
    for n in named {
        assert!(problems.contains(n), "{name}: {n:?} not in {problems}");
    }
    let job = reduce(&["--no-plots", &path_str(d.path())]);
    job.assert_ok();
    assert!(!job.all().contains("panicked"), "{}", job.all());
    assert!(job.stderr.contains(&format!("incomplete run {}", path_str(&dir))), "{}", job.stderr);
    for n in named {
        assert!(job.stderr.contains(n), "{n:?} not in {}", job.stderr);
    }
    let (_, rows) = read_csv(&d.path().join("scaling.csv"));
    assert_eq!(rows.len(), 1, "only the good run is reduced");
    let (h, rows) = read_csv(&d.path().join("summary.csv"));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][h.iter().position(|c| c == "run_id").unwrap()], "base");
}

#[test]
fn rows_of_another_run_after_row_15_are_refused() {
    refused_and_named(
        "spliced",
        |dir| set_cells(dir, 1, "run_id", |i| i >= 16, "another-run"),
        &["rank-00001.csv row 17", "run_id", "\"another-run\""],
    );
}

#[test]
fn a_rank_column_that_changes_is_refused() {
    refused_and_named(
        "changed",
        |dir| set_cells(dir, 1, "rank", |i| i >= 5, "0"),
        &["rank-00001.csv row 6", "rank is 0"],
    );
}

#[test]
fn phases_beyond_the_step_are_refused() {
    // forward_s 10218.66 s in a 1.5 s step: 681,244 % of it.
    refused_and_named(
        "forward",
        |dir| set_cells(dir, 0, "forward_s", |i| i == 3, "10218.66"),
        &["rank-00000.csv row 4", "forward_s is 10218.66", "step_s"],
    );
    // The phases add up to 1.4 s in a 1.5 s step: 0.1 s is missing.
    refused_and_named(
        "missing-phase",
        |dir| set_cells(dir, 1, "other_s", |i| i == 2, "0"),
        &["rank-00001.csv row 3", "add up to 1.4", "step_s is 1.5"],
    );
}

#[test]
fn samples_that_would_wrap_are_refused() {
    // Two rows of 2^63 samples add up to 2^64: a u64 sum wraps to the other rows alone.
    refused_and_named(
        "wrapping",
        |dir| set_cells(dir, 0, "samples", |i| i == 3 || i == 4, "9223372036854775808"),
        &["rank-00000.csv row 4", "samples is 9223372036854775808"],
    );
}

#[test]
fn bytes_u64_max_is_refused() {
    refused_and_named(
        "bytes",
        |dir| {
            for r in 0..2 {
                set_cells(dir, r, "bytes", |_| true, &u64::MAX.to_string());
            }
        },
        &["rank-00000.csv row 1", "bytes is 18446744073709551615"],
    );
}

#[test]
fn comm_last_start_before_origin_is_refused() {
    // Before the run's common origin: a wait of 1e9 s for the other rank.
    refused_and_named(
        "early",
        |dir| set_cells(dir, 1, "comm_last_start_at_s", |_| true, "-1000000000"),
        &["rank-00001.csv row 1", "comm_last_start_at_s is -1000000000"],
    );
    // Long after its own step ended.
    refused_and_named(
        "late",
        |dir| set_cells(dir, 1, "comm_last_start_at_s", |i| i == 4, "1000000000"),
        &["rank-00001.csv row 5", "comm_last_start_at_s is 1000000000"],
    );
    // A step that starts before the previous one ended.
    refused_and_named(
        "overlapping",
        |dir| {
            for c in ["step_start_at_s", "comm_start_at_s", "comm_last_start_at_s"] {
                edit_rows(dir, 0, |i, col, row| {
                    if i == 7 {
                        row[col(c)] = (row[col(c)].parse::<f64>().unwrap() - 9.0).to_string();
                    }
                });
            }
        },
        &["rank-00000.csv row 8", "step_start_at_s is 61"],
    );
}

/// A link model file (`link_model.json`) with one inter-node fit of `alpha_s` and `beta` (seconds per byte).
fn model_json(alpha_s: f64, beta: f64) -> String {
    use ddpbench::link::{LevelFit, LinkModel, LinkModelFile, RouteLinkModel, FORMULA};
    let fit = LevelFit {
        level: "inter-node".into(),
        backend: ddpbench::record::Backend::Mpi,
        dtype: "float".into(),
        ranks: 2,
        alpha_s,
        beta_s_per_byte: beta,
        bandwidth_bytes_per_s: 1.0 / beta,
        min_bytes: 8,
        max_bytes: 1 << 30,
        residuals: Vec::new(),
        max_abs_rel_error: 0.1,
        rms_rel_error: 0.05,
        nominal: None,
        efficiency: None,
        probe: None,
    };
    let file = LinkModelFile {
        formula: FORMULA.into(),
        models: vec![RouteLinkModel {
            backend: ddpbench::record::Backend::Mpi,
            memory: ddpbench::record::Memory::Host,
            model: LinkModel {
                formula: FORMULA.into(),
                ranks_per_node: 1,
                nodes: 2,
                intra: None,
                inter: Some(fit),
                node_type: "A".into(),
            },
        }],
    };
    serde_json::to_string_pretty(&file).unwrap()
}

/// `reduce --interconnect` with the model (`alpha_s`, `beta`) on a 1- and a 2-rank run:
/// the model is refused with `named` in the message, the projection left out and the
/// rest of the report written.
fn model_refused(alpha_s: f64, beta: f64, named: &[&str]) {
    model_text_refused(&model_json(alpha_s, beta), named);
}

/// [`model_refused`] for the model file's text as given.
fn model_text_refused(text: &str, named: &[&str]) {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, text).unwrap();
    let job = reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]);
    job.assert_ok();
    assert!(!job.all().contains("panicked"), "{}", job.all());
    for n in [&path_str(&model) as &str].iter().chain(named) {
        assert!(job.stderr.contains(n), "{n:?} not in {}", job.stderr);
    }
    assert!(!runs.join("projection.csv").exists(), "a projection from a refused model");
    let report = std::fs::read_to_string(runs.join("report.md")).unwrap();
    assert!(report.contains("## Speedup and efficiency"), "{report}");
    assert!(
        report.contains("## Projection beyond the allocation\n\nLeft out: ") && report.contains(named[0]),
        "{report}"
    );
    // No projected workload, so no step, speedup or efficiency from the model.
    assert!(!report.contains("(from run ") && !report.contains("inf %"), "{report}");
    let (_, rows) = read_csv(&runs.join("scaling.csv"));
    assert_eq!(rows.len(), 2);
}

#[test]
fn a_negative_link_model_is_refused_and_named() {
    // A good model projects: the fixture is otherwise sound.
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    let model = d.path().join("model.json");
    std::fs::write(&model, model_json(1e-5, 1e-9)).unwrap();
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&d.path().join("base"))]).assert_ok();
    let (h, rows) = read_csv(&d.path().join("base/projection.csv"));
    assert!(col(&h, &rows, "step_s").iter().all(|&s| s > 0.0));
    // α = −1 ms, β = −1 µs/B projected steps of −4660 ms.
    model_refused(-1e-3, -1e-6, &["alpha_s is -0.001"]);
    model_refused(1e-5, -1e-6, &["beta_s_per_byte is -0.000001"]);
}

#[test]
fn a_link_models_efficiency_outside_line_rate_is_refused_and_named() {
    // A nominal level's fraction of line rate lies above 0 and at most 1, low ≤ expected
    // ≤ high; a file that says otherwise (or names no known basis) projects nothing.
    let with = |efficiency: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_str(&model_json(1e-5, 1e-9)).unwrap();
        v["models"][0]["inter"]["nominal"] = "10GB/s,1us".into();
        v["models"][0]["inter"]["efficiency"] = efficiency;
        v.to_string()
    };
    let bad = |e: f64, lo: f64, hi: f64| serde_json::json!({"expected": e, "low": lo, "high": hi, "basis": "published"});
    model_text_refused(&with(bad(1.5, 0.5, 2.0)), &["efficiency is 1.5"]);
    model_text_refused(&with(bad(0.0, 0.0, 0.5)), &["efficiency is 0"]);
    model_text_refused(&with(bad(0.8, 0.9, 0.95)), &["low ≤ expected ≤ high"]);
    model_text_refused(
        &with(serde_json::json!({"expected": 0.8, "low": 0.7, "high": 0.9, "basis": "rumoured"})),
        &["rumoured"],
    );
}

#[test]
fn an_infinite_link_model_is_refused_and_named() {
    // α = β = 1e300 printed inf and "+inf %".
    model_refused(1e300, 1e300, &["alpha_s is 1e300"]);
    model_refused(1e-5, 1e300, &["beta_s_per_byte is 1e300"]);
}

#[test]
fn reduce_interconnect_refuses_1e12_buckets() {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    // The 1-rank run is the projection's reference: its buckets would be sized.
    let mut m = Manifest::read(&runs.join("base")).unwrap();
    m.buckets = 1_000_000_000_000;
    m.write(&runs.join("base")).unwrap();
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, model_json(1e-5, 1e-9)).unwrap();
    let job = reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]);
    job.assert_ok();
    assert!(
        !job.all().contains("memory allocation") && !job.all().contains("panicked"),
        "{}",
        job.all()
    );
    let named = format!("{}: buckets is 1000000000000", path_str(&runs.join("base/manifest.json")));
    assert!(job.stderr.contains(&named), "{named:?} not in {}", job.stderr);
    // The other run is reduced and projected.
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    assert!(rows.iter().all(|r| r[h.iter().position(|c| c == "from_runs").unwrap()] == "two"));
}

/// The report of the run folders under `dir`, and its report.md.
fn report_of(dir: &Path) -> (ddpbench::reduce::Report, String) {
    let req = ddpbench::reduce::ReduceRequest {
        runs: vec![dir.to_path_buf()],
        baseline: None,
        interconnect: None,
        project_to: 1024,
        ..Default::default()
    };
    let report = ddpbench::reduce::run(&req).unwrap();
    let out = dir.join("report");
    ddpbench::reduce::write(&report, &out, false).unwrap();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    (report, md)
}

// Rank 0 enters the all-reduce at +0.7 s, rank 1 at +1.0 s: rank 0 waits 0.3 s, both
// transfer 0.1 s, both steps last 1.2 s; the ranks compute 0.8 and 1.1 s.
const LATE: [RankSpec; 2] = [("A", [0.1, 0.2, 0.4, 0.4, 0.1, 0.0]), ("A", [0.1, 0.3, 0.6, 0.1, 0.1, 0.0])];

/// R = 7.5 ≥ 3, yet the waterfall's largest loss is the wait for the late rank: the
/// verdict names it with its share and shows what R implies, in report.md and its value.
#[test]
fn the_verdict_names_the_largest_measured_loss_and_what_r_implies() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("late"), "late", "m", &LATE, 10, 4);
    let (report, md) = report_of(d.path());
    // Ideal 20/s, measured 20/1.2 = 16.7/s: 3.3/s lost. Extra time per step over the ideal
    // 1.0 s: transfer 0.1, waiting 0.15, compute (0.8 + 1.1)/2 − 0.9 = 0.05 − 0.1 = −0.05
    // (optimizer included): waiting is 0.15/0.2 = 75 % of the loss.
    let v = &report.workloads[0].verdict;
    assert!(v.contains("the largest measured loss is waiting for a late rank"), "{v}");
    assert!(v.contains("2.5 of the 3.3 samples/s lost (75 %)"), "{v}");
    // R = (fwd + bwd) / transfer = 0.75 / 0.1; without overlap the transfer alone limits
    // efficiency to T1 / (T1 + transfer) = 1.0 / 1.1 = 91 %.
    assert!(v.contains("R = 7.50") && v.contains("T1/(T1 + transfer) = 91 %"), "{v}");
    assert!(md.contains(v.as_str()), "report.md does not print the verdict:\n{md}");
    let c = &report.findings.compute_vs_comm;
    assert!(!c.contains("not what limits"), "{c}");
    // One run per side: no interval, so no direction, whatever the within-run noise.
    assert!(v.contains("has speedup 1.67 with no interval: one run per side"), "{v}");
    assert!(!v.contains("scales"), "{v}");
}

/// A speedup below 1 whose interval holds 1 is no direction.
#[test]
fn no_direction_is_claimed_inside_the_noise() {
    let d = tmp();
    const SLOW: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 1.2, 0.1, 0.0]), ("A", [0.1, 0.3, 0.5, 1.2, 0.1, 0.0])];
    for (i, (b, t)) in [(1.0, 1.0), (1.3, 1.15)].iter().enumerate() {
        let (base, slow) = (format!("base-{i}"), format!("slow-{i}"));
        let mut f = fixture(&base, &BASE, 10);
        f.scale = *b;
        write(&d.path().join(&base), &f);
        let mut f = fixture(&slow, &SLOW, 10);
        f.scale = *t;
        write(&d.path().join(&slow), &f);
    }
    let (report, _) = report_of(d.path());
    let row = report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    assert!(row.speedup < 1.0 && row.speedup_low < 1.0 && row.speedup_high > 1.0, "{row:?}");
    let v = &report.workloads[0].verdict;
    assert!(
        v.contains("indistinguishable from no speedup at this noise: no direction possible from 2 repeats at this spread"),
        "{v}"
    );
    assert!(!v.to_lowercase().contains("negative"), "{v}");
}

/// A point slower than its reference (interval excluding 1) scales negatively; its
/// serial fraction is above 1, where Gustafson's law is undefined: not applicable.
#[test]
fn serial_fractions_of_a_slower_point_are_not_applicable() {
    let d = tmp();
    const SLOW: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 1.2, 0.1, 0.0]), ("A", [0.1, 0.3, 0.5, 1.2, 0.1, 0.0])];
    // Two repeats a side, 2 % apart alike: the speedup stays 0.91, its interval narrow.
    for (i, scale) in [1.0, 1.02].iter().enumerate() {
        for (kind, ranks) in [("base", &BASE[..]), ("slow", &SLOW[..])] {
            let id = format!("{kind}-{i}");
            let mut f = fixture(&id, ranks, 10);
            f.scale = *scale;
            write(&d.path().join(&id), &f);
        }
    }
    let (report, md) = report_of(d.path());
    let row = report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    assert!(close(row.speedup, 20.0 / 2.2 / 10.0), "{}", row.speedup);
    assert!(row.gustafson_serial_fraction.is_nan(), "{}", row.gustafson_serial_fraction);
    assert!(md.contains("not applicable (speedup < 1"), "{md}");
    let v = &report.workloads[0].verdict;
    assert!(v.contains("scales negatively: speedup 0.91"), "{v}");
}

/// A bandwidth gap with nothing hidden behind backward and overlap off names no cause.
#[test]
fn a_bandwidth_gap_names_no_cause_its_columns_do_not_show() {
    let d = tmp();
    let dir = d.path().join("late");
    write_run(&dir, "late", "m", &LATE, 10, 4);
    // busbw = 2(n−1)/n · 400 B / 0.1 s = 4000 B/s; a probe of 5333 B/s: training at 75 %.
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    m["allreduce_probe"] = serde_json::json!({"bytes": 400, "iters": 5, "median_s": 0.075, "min_s": 0.07,
        "busbw_bytes_per_s": 4000.0 / 0.75, "algbw_bytes_per_s": 4000.0 / 0.75, "cold_cache": true});
    std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
    let (report, _) = report_of(d.path());
    assert_eq!(report.summary[0].comm_hidden_s_mean, 0.0);
    let t = &report.findings.bandwidth;
    assert!(t.contains("75 %"), "{t}");
    // No cause is claimed: no contention, no "adds cost (staging copies …)".
    assert!(!t.contains("contention") && !t.contains("adds cost around the transfer"), "{t}");
    assert!(t.contains("none of its columns shows why"), "{t}");
}

/// A 1-rank run all-reduces with nobody: no R, no bytes on a wire, no arrival order.
#[test]
fn a_one_rank_run_has_no_communication_figures() {
    let d = tmp();
    const ALONE: [RankSpec; 1] = [("A", [0.1, 0.3, 0.5, 0.05, 0.1, 0.0])];
    write_run(&d.path().join("alone"), "alone", "m", &ALONE, 10, 4);
    let (report, md) = report_of(d.path());
    let s = &report.summary[0];
    assert!(s.compute_comm_ratio.is_nan() && s.last_arrival_share.is_nan(), "{s:?}");
    assert!(report.ranks[0].last_arrival_share.is_nan());
    let j = serde_json::to_value(&report).unwrap();
    assert!(j["runs"][0]["bytes_per_step"].is_null(), "{}", j["runs"][0]["bytes_per_step"]);
    assert!(report.runs[0].per_epoch.compute_comm_ratio.is_nan());
    let said = "A 1-rank run all-reduces with nobody";
    assert_eq!(md.matches(said).count(), 1, "{md}");
}

/// One run against a reference of two repeats: the point's side has no run-to-run
/// spread (and no other point at 2 ranks to pool one from), so there is no interval and
/// no direction; the speedup is against the reference's geometric mean.
#[test]
fn a_single_run_against_repeats_has_no_interval() {
    let d = tmp();
    for (i, scale) in [1.0, 3.0].iter().enumerate() {
        let id = format!("base-{i}");
        let mut f = fixture(&id, &BASE, 10);
        (f.scale, f.steps) = (*scale, 64);
        write(&d.path().join(&id), &f);
    }
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 64);
    let (report, _) = report_of(d.path());
    let row = report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    // 13.33/s against √(10 · 3.33) = 5.77 samples/s: speedup 2.31.
    assert!(close(row.speedup, (20.0 / 1.5) / (10.0f64 * 10.0 / 3.0).sqrt()), "{}", row.speedup);
    assert!(row.speedup_low.is_nan() && row.direction == Some(Direction::NoInterval), "{row:?}");
    assert!(
        row.interval_method.starts_with("none: a single run on one side"),
        "{}",
        row.interval_method
    );
    let v = &report.workloads[0].verdict;
    assert!(v.contains("with no interval: a single run on one side"), "{v}");
}

#[test]
fn a_fit_beyond_its_error_and_a_clamped_alpha_are_flagged() {
    // α clamped to 0 and a fit 99.5 % off at the 400 B the fixture all-reduces: the
    // projection is marked unreliable, the clamp said, and the band (the fit's error
    // beyond the sizes measured) doubled past 100 % leaves a low end said to be own work.
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    let mut v: serde_json::Value = serde_json::from_str(&model_json(0.0, 1e-9)).unwrap();
    let fit = &mut v["models"][0]["inter"];
    fit["residuals"] = serde_json::json!([
        {"bytes": 256, "measured_s": 1e-3, "model_s": 5e-6, "rel_error": -0.995, "rel_spread": 0.0},
        {"bytes": 1024, "measured_s": 1e-3, "model_s": 5e-6, "rel_error": -0.995, "rel_spread": 0.0},
    ]);
    fit["max_abs_rel_error"] = serde_json::json!(0.995);
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, v.to_string()).unwrap();
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let cells = |c: &str| -> Vec<String> {
        let i = h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
        rows.iter().map(|r| r[i].clone()).collect()
    };
    let ranks = col(&h, &rows, "ranks");
    for (i, u) in cells("unreliable").iter().enumerate() {
        // 1 rank has no all-reduce: nothing rests on the fit there.
        assert_eq!(u, if ranks[i] > 1.0 { "true" } else { "false" }, "row {i}: {:?}", rows[i]);
    }
    assert!(cells("fit_clamped").iter().zip(&ranks).all(|(c, &n)| n == 1.0 || c == "true"));
    assert!(col(&h, &rows, "fit_error_pct")
        .iter()
        .zip(&ranks)
        .all(|(&e, &n)| n == 1.0 || (e - 99.5).abs() < 1e-9));
    let report = std::fs::read_to_string(runs.join("report.md")).unwrap();
    assert!(report.contains("α clamped to 0"), "{report}");
    assert!(
        report.contains("Unreliable: the interconnect fit is off by up to 99.5 %"),
        "{report}"
    );
    assert!(report.contains(" (unreliable) |"), "{report}");
}

/// Adds `extra_s` to `other_s` and `step_s` of every odd step of each rank of the run in
/// `dir`: noise that hits every rank of a step at once.
fn add_common_noise(dir: &Path, ranks: usize, extra_s: f64) {
    for r in 0..ranks {
        let path = dir.join(format!("rank-{r:05}.csv"));
        let (h, rows) = read_csv(&path);
        let at = |c: &str| h.iter().position(|x| x == c).unwrap();
        let mut w = csv::Writer::from_path(&path).unwrap();
        w.write_record(&h).unwrap();
        for mut row in rows {
            if row[at("global_step")].parse::<u64>().unwrap() % 2 == 1 {
                for c in ["other_s", "step_s"] {
                    row[at(c)] = (row[at(c)].parse::<f64>().unwrap() + extra_s).to_string();
                }
            }
            w.write_record(&row).unwrap();
        }
        w.flush().unwrap();
    }
}

#[test]
fn the_projection_is_against_the_measured_1_rank_point_with_its_terms_measured() {
    // Steps alternate between 1.1 and 3.1 s (rank 0) and 1.4 and 3.4 s (rank 1) of own
    // work: the common part moves both; the ranks differ by ±0.15 s around it. The
    // straggler term is E[max of 2] of ±0.15 = 0.075 s, so the slowest rank's own work
    // is 2.25 + 0.075 s (measured: 2.4 s); independent draws of own work would make it
    // about 2.9 s. Speedup is against the measured 1-rank run (2.0 s per step).
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    add_common_noise(&runs.join("base"), 1, 2.0);
    add_common_noise(&runs.join("two"), 2, 2.0);
    let mut m = Manifest::read(&runs.join("two")).unwrap();
    m.nodes = 1;
    m.write(&runs.join("two")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&model_json(1e-5, 1e-9)).unwrap();
    let mut intra = v["models"][0]["inter"].clone();
    intra["level"] = "intra-node".into();
    v["models"][0]["intra"] = intra;
    v["models"][0]["ranks_per_node"] = 2.into();
    v["models"][0]["nodes"] = 1.into();
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, v.to_string()).unwrap();
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let row = rows
        .iter()
        .find(|r| r[at("ranks")] == "2" && r[at("scaling")] == "weak" && r[at("from_runs")] == "two")
        .unwrap();
    let num = |c: &str| row[at(c)].parse::<f64>().unwrap_or_else(|_| panic!("{c}={:?}", row[at(c)]));
    assert!((num("straggler_s") - 0.075).abs() < 0.01, "{row:?}");
    assert!((num("own_work_s") - 2.325).abs() < 0.01, "{row:?}");
    assert!((num("measured_own_work_s") - 2.4).abs() < 1e-9, "{row:?}");
    assert_eq!(row[at("speedup_against")], "measured 1-rank run");
    // Against the measured 1-rank run: 10 samples in 2.0 s.
    assert!((num("speedup") - 20.0 / num("step_s") / 5.0).abs() < 1e-9, "{row:?}");
    assert!(
        (num("measured_speedup") - 20.0 / num("measured_step_s") / 5.0).abs() < 1e-9,
        "{row:?}"
    );
    // The transfer after the last rank entered: 0.1 s. Rank 0 waits 0.3 s for rank 1: a
    // wait of 0.15 s per rank-step, its own term; the exposed all-reduce without it is the
    // mean of 0.4 − 0.3 and 0.1, no more than the all-reduce it is part of.
    assert!((num("measured_comm_s") - 0.1).abs() < 1e-9, "{row:?}");
    assert!((num("measured_wait_s") - 0.15).abs() < 1e-9, "{row:?}");
    assert!((num("measured_comm_exposed_s") - 0.1).abs() < 1e-9, "{row:?}");
    assert!(num("measured_comm_exposed_s") <= num("measured_comm_s") + 1e-12, "{row:?}");
    let report = std::fs::read_to_string(runs.join("report.md")).unwrap();
    for term in [
        "own work (slowest rank)",
        "| wait for a late rank |",
        "| all-reduce |",
        "exposed all-reduce",
        "| step |",
        "| speedup |",
    ] {
        assert!(report.contains(term), "{term:?} not in {report}");
    }
    assert!(
        report.contains("Speedup and efficiency are against the measured 1-rank run."),
        "{report}"
    );
}

#[test]
fn the_largest_of_three_rank_counts_is_held_out() {
    // 1, 2 and 4 ranks measured: the reference is the 2-rank run, the 4-rank point is the
    // held-out check, reported apart from the reference's in-sample error.
    const FOUR_A: [RankSpec; 4] = [TWO_A[0], TWO_A[1], TWO_A[0], TWO_A[1]];
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    write_run(&runs.join("four"), "four", "m", &FOUR_A, 10, 4);
    for run in ["two", "four"] {
        let mut m = Manifest::read(&runs.join(run)).unwrap();
        m.nodes = 1;
        m.write(&runs.join(run)).unwrap();
    }
    let mut v: serde_json::Value = serde_json::from_str(&model_json(1e-5, 1e-9)).unwrap();
    let mut intra = v["models"][0]["inter"].clone();
    intra["level"] = "intra-node".into();
    v["models"][0]["intra"] = intra;
    v["models"][0]["ranks_per_node"] = 4.into();
    v["models"][0]["nodes"] = 1.into();
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, v.to_string()).unwrap();
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let weak: Vec<&Vec<String>> = rows.iter().filter(|r| r[at("scaling")] == "weak").collect();
    assert!(weak.iter().all(|r| r[at("from_runs")] == "two"), "{weak:?}");
    let held: Vec<&&Vec<String>> = weak.iter().filter(|r| r[at("held_out")] == "true").collect();
    assert_eq!(held.len(), 1, "{weak:?}");
    assert_eq!(held[0][at("ranks")], "4");
    let err: f64 = held[0][at("error_pct")].parse().unwrap();
    let report = std::fs::read_to_string(runs.join("report.md")).unwrap();
    assert!(
        report.contains(&format!("Held out: 4 ranks, the largest rank count measured, was left out of the choice of the reference; the projection's error there is {err:+.1} %")),
        "{report}"
    );
    assert!(report.contains("In sample: at the reference's own shape the error is"), "{report}");
}

/// `reduce --no-plots <extra> <dir>` by the binary: its report.json.
fn reduced(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--no-plots"];
    args.extend_from_slice(extra);
    let d = path_str(dir);
    args.push(&d);
    reduce(&args).assert_ok();
    json(&dir.join("report.json"))
}

/// The row of `report`'s `table` (summary, ranks, scaling) where `key` is `value`.
fn entry<'a>(report: &'a serde_json::Value, table: &str, key: &str, value: &serde_json::Value) -> &'a serde_json::Value {
    report[table]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| &e[key] == value)
        .unwrap_or_else(|| panic!("no {table} entry with {key} = {value}"))
}

/// The transfer alone limits efficiency to T1 / (T1 + transfer): a point whose step is the
/// 1-rank step plus its transfer reaches that limit exactly, where R/(R+1) (3.2/4.2 = 76 %)
/// would be passed by the measured 80 %: R leaves the optimizer and the rest out.
#[test]
fn the_limit_the_transfer_sets_is_one_a_point_reaches() {
    let d = tmp();
    // Both ranks: the 1.0 s step of BASE plus 0.25 s of all-reduce, no wait.
    const EXACT: [RankSpec; 2] = [("A", [0.1, 0.3, 0.5, 0.25, 0.1, 0.0]), ("A", [0.1, 0.3, 0.5, 0.25, 0.1, 0.0])];
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("exact"), "exact", "m", &EXACT, 10, 4);
    let r = reduced(d.path(), &[]);
    let row = entry(&r, "scaling", "scaling_mode", &"weak".into());
    let (eff, limit) = (
        row["efficiency"].as_f64().unwrap(),
        row["transfer_limit_efficiency"].as_f64().unwrap(),
    );
    assert!(close(eff, 0.8) && close(limit, 0.8), "efficiency {eff}, limit {limit}");
    let v = r["workloads"][0]["verdict"].as_str().unwrap();
    assert!(v.contains("R = 3.20") && v.contains("T1/(T1 + transfer) = 80 %"), "{v}");
    assert!(!v.contains("R/(R+1)") && !v.contains("caps"), "{v}");
    let c = r["findings"]["compute_vs_comm"].as_str().unwrap();
    assert!(!c.contains("R/(R+1)") && c.contains("no limit on efficiency by itself"), "{c}");
}

/// A wait happens inside the waiting rank's all-reduce: where the clocks put the last
/// entry further off than that rank's whole all-reduce (here 0.55 s against 0.4 s), the
/// wait is that all-reduce and the transfer 0, so transfer + wait = comm_s still.
#[test]
fn a_wait_is_never_longer_than_the_all_reduce_it_is_in() {
    let d = tmp();
    let dir = d.path().join("late");
    write_run(&dir, "late", "m", &TWO_A, 10, 4);
    edit_rows(&dir, 1, |_, col, row| {
        let at: f64 = row[col("comm_last_start_at_s")].parse().unwrap();
        row[col("comm_last_start_at_s")] = (at + 0.25).to_string();
    });
    let r = reduced(&dir, &[]);
    let rank0 = entry(&r, "ranks", "rank", &0.into());
    assert!(close(rank0["comm_wait_s_mean"].as_f64().unwrap(), 0.4), "{rank0}");
    let e = &r["runs"][0]["per_epoch"];
    let (comm, transfer, wait) = (
        e["comm_s"].as_f64().unwrap(),
        e["comm_transfer_s"].as_f64().unwrap(),
        e["comm_wait_s"].as_f64().unwrap(),
    );
    // Per step: comm (0.4 + 0.1)/2, wait (0.4 + 0)/2, transfer (0 + 0.1)/2; × 100 steps.
    assert!(close(comm, 25.0) && close(wait, 20.0) && close(transfer, 5.0), "{e}");
    let said = r["findings"]["node_types"].to_string();
    assert!(
        said.contains("in 4 rank-steps the last rank entered the all-reduce later than"),
        "{said}"
    );
}

/// Three ranks, the third 0.3 s late: each of the other two waits 0.3 s per step. "Each
/// other rank waits for it" is that mean (not their sum, 0.6 s), and report.md names the
/// late rank though the run has one node type.
#[test]
fn a_late_rank_is_named_with_the_mean_wait_of_the_others() {
    let d = tmp();
    const THREE: [RankSpec; 3] = [
        ("A", [0.1, 0.3, 0.5, 0.4, 0.1, 0.1]),
        ("A", [0.1, 0.3, 0.5, 0.4, 0.1, 0.1]),
        ("A", [0.1, 0.5, 0.6, 0.1, 0.1, 0.1]),
    ];
    write_run(&d.path().join("three"), "three", "m", &THREE, 10, 4);
    let r = reduced(&d.path().join("three"), &[]);
    let s = &r["summary"][0];
    assert!(close(s["caused_wait_s_mean"].as_f64().unwrap(), 0.3), "{s}");
    let late = entry(&r, "ranks", "rank", &2.into());
    assert!(close(late["caused_wait_s_mean"].as_f64().unwrap(), 0.3), "{late}");
    let md = std::fs::read_to_string(d.path().join("three/report.md")).unwrap();
    assert!(
        md.contains(
            "rank 2 (on host2) entered the all-reduce last in 100 % of the steps: each other rank waited 300.00 ms per step for it"
        ),
        "{md}"
    );
    assert!(md.contains("each other rank waits for it ms (mean)"), "{md}");
}

/// A workload whose table mixes batches and modes: the verdict says which point (ranks,
/// mode, batch) it is about, and every point a list names carries its mode and batch.
#[test]
fn verdicts_and_lists_say_the_mode_and_the_batch_of_each_point() {
    let d = tmp();
    write_run(&d.path().join("base10"), "base10", "m", &BASE, 10, 4);
    write_run(&d.path().join("base20"), "base20", "m", &BASE, 20, 4);
    // 20 samples in 1.5 s: weak 13.3/10 = 1.33, strong 13.3/20 = 0.67; one run per side,
    // so neither has a direction, and the list of such points says which is which.
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 4);
    let r = reduced(d.path(), &[]);
    let v = r["workloads"][0]["verdict"].as_str().unwrap();
    assert!(
        v.starts_with("At 2 ranks (weak, batch 10 per rank, global batch 20) it has speedup 1.33"),
        "{v}"
    );
    assert!(v.contains(" `two` (strong, batch 10 per rank) at 2 ranks: one run per side"), "{v}");
}

/// A bandwidth range gets a sentence at each end from what its columns show: below 90 %
/// with nothing run during backward, no cause named; above 110 %, the probe is off.
#[test]
fn both_ends_of_the_bandwidth_range_are_explained() {
    let d = tmp();
    // busbw = 2(n−1)/n · 400 B / 0.1 s = 4000 B/s in both runs; probes of 8000 and 3077 B/s.
    for (id, probe) in [("low", 8000.0), ("high", 4000.0 / 1.3)] {
        let dir = d.path().join(id);
        write_run(&dir, id, "m", &LATE, 10, 4);
        let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
        m["allreduce_probe"] = serde_json::json!({"bytes": 400, "iters": 5, "median_s": 0.05, "min_s": 0.05,
            "busbw_bytes_per_s": probe, "algbw_bytes_per_s": probe, "cold_cache": true});
        std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
    }
    let r = reduced(d.path(), &[]);
    let t = r["findings"]["bandwidth"].as_str().unwrap();
    assert!(t.contains("reaches 50–130 %"), "{t}");
    assert!(
        t.contains("At the low end, `low` (50 %): below 90 % training is slower than the probe, and none of its columns shows why"),
        "{t}"
    );
    assert!(
        t.contains("At the high end, `high` (130 %): above 110 % the probe, not training, is off"),
        "{t}"
    );
}

/// The link model `model_json(1e-5, 1e-9)` with an intra-node fit as well, for
/// `per_node` ranks on one node, written into `dir`; its path.
fn intra_model(dir: &Path, per_node: usize) -> std::path::PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(&model_json(1e-5, 1e-9)).unwrap();
    let mut intra = v["models"][0]["inter"].clone();
    intra["level"] = "intra-node".into();
    v["models"][0]["intra"] = intra;
    v["models"][0]["ranks_per_node"] = per_node.into();
    v["models"][0]["nodes"] = 1.into();
    let model = dir.join("allreduce_model.json");
    std::fs::write(&model, v.to_string()).unwrap();
    model
}

/// Sets `nodes` and, when given, the wire dtype of the run in `dir`.
fn set_manifest(dir: &Path, nodes: usize, grad_dtype: Option<&str>) {
    let mut m = Manifest::read(dir).unwrap();
    m.nodes = nodes;
    if let Some(g) = grad_dtype {
        m.comm.grad_dtype = g.into();
    }
    m.write(dir).unwrap();
}

/// The projection section of `md` for the workload projected from run `from` (weak):
/// its table rows by rank count (their cells) and its what-if sentences.
fn projected_workload(md: &str, from: &str) -> (std::collections::BTreeMap<String, Vec<String>>, Vec<String>) {
    let head = format!("(from run {from})");
    let start = md
        .lines()
        .position(|l| l.starts_with("### ") && l.contains(&head) && !l.contains("strong"))
        .unwrap_or_else(|| panic!("no section {head} in {md}"));
    let mut table = std::collections::BTreeMap::new();
    let mut sentences = Vec::new();
    for l in md
        .lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("### ") && !l.starts_with("!["))
    {
        let cells: Vec<String> = l.split('|').map(|c| c.trim().to_string()).collect();
        if l.starts_with("| ") && cells.len() > 14 && cells[2].contains(" × ") && cells[1] != "ranks" {
            let ranks = cells[1].split(' ').next().unwrap().to_string();
            table.insert(ranks, cells);
        } else if let Some(s) = l.strip_prefix("- At ") {
            sentences.push(s.to_string());
        }
    }
    (table, sentences)
}

/// Every efficiency a what-if sentence quotes is one the table above it shows, in the
/// row of the same rank count, and both are against the measured 1-rank step (2.0 s),
/// where the projection at 1 rank (2.25 s, the 2-rank run's own work) would say more. At
/// or above 80 % no smaller batch is recommended.
#[test]
fn every_efficiency_a_what_if_sentence_quotes_is_in_its_table() {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    add_common_noise(&runs.join("base"), 1, 2.0);
    add_common_noise(&runs.join("two"), 2, 2.0);
    set_manifest(&runs.join("two"), 1, None);
    let model = intra_model(d.path(), 2);
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let md = std::fs::read_to_string(runs.join("report.md")).unwrap();
    let (table, sentences) = projected_workload(&md, "two");
    assert!(!sentences.is_empty(), "{md}");
    for s in &sentences {
        let ranks = s.split(" ranks)").next().and_then(|h| h.rsplit('(').next()).unwrap();
        let row = table
            .get(ranks)
            .unwrap_or_else(|| panic!("no row of {ranks} ranks for {s:?} in {table:?}"));
        let quoted: Vec<&str> = s.match_indices("efficiency ").map(|(at, _)| &s[at + 11..]).collect();
        assert!(quoted.len() >= 2, "{s}");
        for q in quoted {
            let pct = &q[..q.find('%').unwrap() + 1];
            assert!(row.iter().any(|c| c == pct), "{s:?} quotes {pct:?}, not in its row {row:?}");
        }
        // The table's own efficiency column is the first one quoted.
        assert!(s.contains(&format!("efficiency {};", row[8])), "{s} vs {row:?}");
        assert!(!s.contains("per-rank batch of about"), "{s}");
        assert!(s.contains("at or above 80 % at this batch"), "{s}");
    }
}

/// Gradients that already travel as bf16 are not halved again by a what-if.
#[test]
fn gradients_already_at_two_bytes_are_not_halved_again() {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    set_manifest(&runs.join("base"), 1, Some("bf16"));
    set_manifest(&runs.join("two"), 1, Some("bf16"));
    let model = intra_model(d.path(), 2);
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let md = std::fs::read_to_string(runs.join("report.md")).unwrap();
    let (table, sentences) = projected_workload(&md, "two");
    assert!(!sentences.is_empty(), "{md}");
    for s in &sentences {
        assert!(
            s.contains("the gradients already travel at 2 bytes") && !s.contains("fp16/bf16"),
            "{s}"
        );
    }
    assert!(table.values().all(|row| row[9] == "already 2 bytes"), "{table:?}");
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let at = h.iter().position(|c| c == "efficiency_half_wire_bytes").unwrap();
    assert!(rows.iter().all(|r| r[at].is_empty()), "{rows:?}");
}

/// Without a measured 1-rank run no speedup called measured is given (it would be a
/// measurement over a projection), and the run to add is named as its command.
#[test]
fn a_measured_speedup_needs_a_measured_1_rank_run() {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    let model = d.path().join("allreduce_model.json");
    std::fs::write(&model, model_json(1e-5, 1e-9)).unwrap();
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let measured: Vec<&Vec<String>> = rows.iter().filter(|r| !r[at("measured_step_s")].is_empty()).collect();
    assert!(!measured.is_empty(), "{rows:?}");
    for r in &measured {
        assert_eq!(r[at("speedup_against")], "projection at 1 rank (no 1-rank run measured)");
        assert_eq!(r[at("measured_speedup")], "", "{r:?}");
        assert!(r[at("missing_reference")].starts_with("`mpirun -n 1 ddpbench train "), "{r:?}");
    }
    let md = std::fs::read_to_string(runs.join("report.md")).unwrap();
    assert!(
        md.contains("so no measured speedup is given") && md.contains("add `mpirun -n 1 ddpbench train "),
        "{md}"
    );
    assert!(!md.contains("| 2 × 1 | speedup |"), "{md}");
}

/// A warning that invalidates a run keeps `reduce` from claiming a direction for its
/// point and for the points it is the reference of, whatever the interval says; one
/// that does not (fp16 on CPU) leaves the direction; report.md lists both under the runs.
#[test]
fn a_run_whose_warning_invalidates_it_is_given_no_direction() {
    use ddpbench::record::{RunWarning, WarningCode};
    let d = tmp();
    // The three repeats a side of `repeats_give_t_intervals_on_log_throughput`: faster.
    for (i, scale) in [1.0, 1.1, 0.95].iter().enumerate() {
        for (kind, ranks) in [("base", &BASE[..]), ("two", &TWO_A[..])] {
            let id = format!("{kind}-{i}");
            let mut f = fixture(&id, ranks, 10);
            f.scale = *scale;
            write(&d.path().join(&id), &f);
        }
    }
    let warn = |id: &str, w: RunWarning| {
        let dir = d.path().join(id);
        let mut m = Manifest::read(&dir).unwrap();
        m.warnings.push(w);
        m.write(&dir).unwrap();
    };
    let weak = |report: &ddpbench::reduce::Report| report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap().clone();
    warn("two-0", RunWarning::new(WarningCode::Fp16OnCpu, "fp16 on CPU"));
    let (report, md) = report_of(d.path());
    assert_eq!(weak(&report).direction, Some(Direction::Faster), "a cost, not an invalid run");
    assert!(
        md.contains("- `two-0`: `fp16_on_cpu` (its figures stand, with this cost): fp16 on CPU"),
        "{md}"
    );
    // A warning on the reference invalidates the point compared with it.
    warn("base-1", RunWarning::new(WarningCode::TooFewMeasuredSteps, "1 measured step(s)"));
    let (report, md) = report_of(d.path());
    let row = weak(&report);
    assert_eq!(row.direction, Some(Direction::Invalidated), "{row:?}");
    assert!(row.speedup_low > 1.0, "the interval alone would say faster: {row:?}");
    assert!(
        row.interval_method
            .ends_with("no direction: runs carry warnings that invalidate them (base-1: too_few_measured_steps)"),
        "{}",
        row.interval_method
    );
    let v = &report.workloads[0].verdict;
    assert!(
        v.contains("no direction is claimed: its runs carry warnings that invalidate them (base-1: too_few_measured_steps)"),
        "{v}"
    );
    assert!(!v.contains("scales"), "{v}");
    assert!(
        md.contains("- `base-1`: `too_few_measured_steps` (no direction is claimed for its points): 1 measured step(s)"),
        "{md}"
    );
    let (h, rows) = read_csv(&d.path().join("report/scaling.csv"));
    let i = h.iter().position(|c| c == "direction").unwrap();
    assert!(rows.iter().any(|r| r[i] == "invalidated"), "{rows:?}");
}

/// A point of one run a side has no interval; when a run carries a warning that
/// invalidates it, the verdict and `interval_method` still name the warning, so a
/// reader of study.md or report.md is not left with "no interval" alone.
#[test]
fn a_single_run_point_with_an_invalidating_warning_names_it() {
    use ddpbench::record::{RunWarning, WarningCode};
    let d = tmp();
    for (id, ranks) in [("base", &BASE[..]), ("two", &TWO_A[..])] {
        write(&d.path().join(id), &fixture(id, ranks, 10));
    }
    let dir = d.path().join("two");
    let mut m = Manifest::read(&dir).unwrap();
    m.warnings
        .push(RunWarning::new(WarningCode::TooFewMeasuredSteps, "1 measured step(s)"));
    m.write(&dir).unwrap();
    let (report, _) = report_of(d.path());
    let row = report.scaling.iter().find(|r| r.scaling_mode == ScalingMode::Weak).unwrap();
    assert_eq!(row.direction, Some(Direction::NoInterval), "{row:?}");
    assert!(
        row.interval_method.ends_with("(two: too_few_measured_steps)"),
        "{}",
        row.interval_method
    );
    let v = &report.workloads[0].verdict;
    assert!(
        v.contains("no direction would be claimed: its runs carry warnings that invalidate them (two: too_few_measured_steps)"),
        "{v}"
    );
}

/// A single rank puts nothing on a wire: the what-if cells of every 1-rank projected row
/// equal its efficiency, 1, whatever the measured 1-rank run's step was.
#[test]
fn the_what_if_cells_of_a_1_rank_row_equal_its_efficiency() {
    let d = tmp();
    let runs = d.path().join("runs");
    write_run(&runs.join("base"), "base", "m", &BASE, 10, 4);
    write_run(&runs.join("two"), "two", "m", &TWO_A, 10, 4);
    let model = intra_model(d.path(), 2);
    reduce(&["--no-plots", "--interconnect", &path_str(&model), &path_str(&runs)]).assert_ok();
    let (h, rows) = read_csv(&runs.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let single: Vec<&Vec<String>> = rows.iter().filter(|r| r[at("ranks")] == "1").collect();
    assert!(!single.is_empty(), "{rows:?}");
    for r in single {
        assert_eq!(r[at("efficiency")], "1", "{r:?}");
        assert_eq!(r[at("efficiency_one_bucket")], "1", "{r:?}");
        assert!(["", "1"].contains(&r[at("efficiency_half_wire_bytes")].as_str()), "{r:?}");
    }
}

/// Sets what `change` does to the manifest of run folder `dir`.
fn edit_manifest(dir: &Path, change: impl Fn(&mut Manifest)) {
    let mut m = Manifest::read(dir).unwrap();
    change(&mut m);
    m.write(dir).unwrap();
}

#[test]
fn samples_beyond_the_runs_batch_are_refused() {
    // One edited cell of 10^9 samples in a step of 10 gave an efficiency of 18,314,296 %.
    refused_and_named(
        "one-cell",
        |dir| set_cells(dir, 0, "samples", |i| i == 3, "1000000000"),
        &[
            "rank-00000.csv row 4",
            "samples is 1000000000",
            "more than a step of this run holds (10",
        ],
    );
    // Every row at ten times the batch gave 586 % with no warning.
    refused_and_named(
        "ten-times",
        |dir| {
            for r in 0..2 {
                set_cells(dir, r, "samples", |_| true, "100");
            }
        },
        &["rank-00000.csv row 1", "samples is 100"],
    );
}

#[test]
fn a_step_with_micro_batches_holds_their_samples_and_no_more() {
    // 4 micro-batches of 10: 40 samples a step is a real step, 41 is not.
    let d = tmp();
    let dir = d.path().join("accum");
    write(
        &dir,
        &Fixture {
            config: serde_json::json!({"optimizer": "sgd", "bucket_mb": 25.0, "grad_accum": 4}),
            ..fixture("accum", &TWO_A, 10)
        },
    );
    edit_manifest(&dir, |m| m.global_batch_size = 80);
    for r in 0..2 {
        set_cells(&dir, r, "samples", |_| true, "40");
    }
    let run = read_run(&dir).unwrap();
    assert!(run.complete(), "{:?}", run.problems);
    set_cells(&dir, 1, "samples", |i| i == 2, "41");
    let run = read_run(&dir).unwrap();
    assert!(
        run.problems
            .iter()
            .any(|p| p.contains("samples is 41: more than a step of this run holds (40")),
        "{:?}",
        run.problems
    );
}

#[test]
fn flags_other_than_0_or_1_and_a_negative_loss_scale_are_refused() {
    refused_and_named(
        "skipped-7",
        |dir| set_cells(dir, 1, "step_skipped", |i| i == 2, "7"),
        &["rank-00001.csv row 3", "step_skipped is \"7\": it is 0 or 1"],
    );
    refused_and_named(
        "warmup-5",
        |dir| set_cells(dir, 0, "warmup", |i| i == 2, "5"),
        &["rank-00000.csv row 3", "warmup is \"5\": it is 0 or 1"],
    );
    refused_and_named(
        "scale",
        |dir| set_cells(dir, 0, "loss_scale", |i| i == 6, "-1"),
        &["rank-00000.csv row 7", "loss_scale is \"-1\": a loss scale is a positive number"],
    );
}

#[test]
fn a_global_batch_that_is_not_the_ranks_batches_is_refused() {
    refused_and_named(
        "huge-batch",
        |dir| edit_manifest(dir, |m| m.batch_size_per_rank = 1_000_000_000_000),
        &["manifest.json: batch_size_per_rank is 1000000000000"],
    );
    // 2 ranks of 10 samples are a global batch of 20, not 1.
    refused_and_named(
        "global-1",
        |dir| edit_manifest(dir, |m| m.global_batch_size = 1),
        &["manifest.json: global_batch_size is 1: 2 ranks × batch_size_per_rank 10 × 1 micro-batch(es) train 20"],
    );
}

#[test]
fn a_rank_list_that_is_empty_or_repeats_a_rank_is_refused() {
    refused_and_named(
        "no-ranks",
        |dir| edit_manifest(dir, |m| m.ranks.clear()),
        &["manifest.json: ranks lists 0 of the 2 ranks (none for rank 0)"],
    );
    refused_and_named(
        "rank-twice",
        |dir| edit_manifest(dir, |m| m.ranks[1].rank = 0),
        &["manifest.json: ranks lists rank 0 twice"],
    );
}

#[test]
fn a_manifest_of_a_newer_schema_is_refused_as_compare_refuses_it() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    let dir = d.path().join("newer");
    write_run(&dir, "newer", "m", &TWO_A, 10, 4);
    edit_manifest(&dir, |m| m.schema_version = 999);
    let e = read_run(&dir).expect_err("a schema-999 run read");
    assert!(
        e.contains("schema 999, written by a newer ddpbench; this one reads up to schema") && e.contains("reduce with the newer ddpbench"),
        "{e}"
    );
    let job = reduce(&["--no-plots", &path_str(d.path())]);
    job.assert_ok();
    assert!(
        job.stderr.contains(&format!("skipped {}", path_str(&dir))) && job.stderr.contains("schema 999"),
        "{}",
        job.stderr
    );
    let (h, rows) = read_csv(&d.path().join("summary.csv"));
    assert!(rows.iter().all(|r| r[h.iter().position(|c| c == "run_id").unwrap()] == "base"));
}

#[test]
fn a_link_spec_outside_the_range_of_a_link_model_is_refused() {
    let d = tmp();
    write_run(&d.path().join("base"), "base", "m", &BASE, 10, 4);
    write_run(&d.path().join("two"), "two", "m", &TWO_A, 10, 4);
    // Accepted, it printed `inf h`, `-inf %` and `NaN×` in the recommendation.
    let job = reduce(&[
        "--no-plots",
        "--link",
        "1e-320bit/s,0s",
        "--project-shape",
        "16x4",
        &path_str(d.path()),
    ]);
    assert!(!job.ok(), "accepted:\n{}", job.all());
    assert!(
        job.stderr.contains("1e-320bit/s,0s") && job.stderr.contains("beta_s_per_byte is inf"),
        "{}",
        job.stderr
    );
    assert!(!job.all().contains("inf h") && !job.all().contains("NaN"), "{}", job.all());
    // The same β in link_model.json is refused with the same words.
    model_refused(1e-5, f64::MAX, &["beta_s_per_byte is 1.7976931348623157e308"]);
}

/// Writes `scales.len()` repeats of a run (`id-k`, every phase times `scales[k]`) on one
/// node: the repeats of one point.
fn write_repeats(runs: &Path, id: &str, ranks: &[RankSpec], scales: &[f64]) {
    for (k, &scale) in scales.iter().enumerate() {
        let name = format!("{id}-{k}");
        write(
            &runs.join(&name),
            &Fixture {
                scale,
                ..fixture(&name, ranks, 10)
            },
        );
        let mut m = Manifest::read(&runs.join(&name)).unwrap();
        m.nodes = 1;
        m.write(&runs.join(&name)).unwrap();
    }
}

/// projection.csv's weak row at `ranks`, as column name → cell.
fn weak_row(dir: &Path, ranks: usize) -> std::collections::BTreeMap<String, String> {
    let (h, rows) = read_csv(&dir.join("projection.csv"));
    let at = |c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let row = rows
        .iter()
        .find(|r| r[at("ranks")] == ranks.to_string() && r[at("scaling")] == "weak")
        .unwrap_or_else(|| panic!("no weak row at {ranks} ranks in {rows:?}"));
    h.iter().cloned().zip(row.iter().cloned()).collect()
}

fn num(row: &std::collections::BTreeMap<String, String>, c: &str) -> f64 {
    row[c].parse().unwrap_or_else(|_| panic!("{c}={:?} in {row:?}", row[c]))
}

#[test]
fn a_projection_stands_on_every_repeat_and_one_busy_repeat_moves_it_less_than_its_interval() {
    // Four repeats of 1 rank and of 2 ranks on one node; the last of each ran on a busy
    // machine (every phase twice as long). Steps of the 1-rank repeats: 1.0 × scale s.
    let one = [1.0, 1.02, 0.98, 2.0];
    let two = [1.0, 1.03, 0.97, 2.0];
    let d = tmp();
    let (all, quiet, alone) = (d.path().join("all"), d.path().join("quiet"), d.path().join("alone"));
    write_repeats(&all, "one", &BASE, &one);
    write_repeats(&all, "two", &TWO_A, &two);
    write_repeats(&quiet, "two", &TWO_A, &two[..3]);
    write_repeats(&alone, "two", &TWO_A, &two);
    let model = path_str(&intra_model(d.path(), 2));
    for dir in [&all, &quiet, &alone] {
        reduce(&["--no-plots", "--interconnect", &model, &path_str(dir)]).assert_ok();
    }
    // --no-plots: neither report.md nor report.html names a plot that was not drawn.
    let md = std::fs::read_to_string(all.join("report.md")).unwrap();
    let html = std::fs::read_to_string(all.join("report.html")).unwrap();
    assert!(
        !all.join("projection.svg").exists() && !md.contains(".svg") && !html.contains("projection.svg"),
        "{md}"
    );
    // Every repeat of the reference point stands behind every row.
    let two_rank = weak_row(&all, 2);
    assert_eq!(two_rank["from_repeats"], "4", "{two_rank:?}");
    for k in 0..4 {
        assert!(two_rank["from_runs"].split(' ').any(|id| id == format!("two-{k}")), "{two_rank:?}");
    }
    // The 1-rank row is the measured 1-rank point: its geometric mean step, inside the
    // point's interval from 4 repeats, and speedup 1.
    let single = weak_row(&all, 1);
    let geo = one.iter().map(|s: &f64| s.ln()).sum::<f64>() / 4.0;
    assert_eq!(single["step_basis"], "measured", "{single:?}");
    assert!((num(&single, "step_s") - geo.exp()).abs() < 1e-9, "{single:?}");
    assert!(num(&single, "step_low_s") < num(&single, "step_s") && num(&single, "step_s") < num(&single, "step_high_s"));
    assert!(
        (num(&single, "speedup") - 1.0).abs() < 1e-12 && single["error_pct"].is_empty(),
        "{single:?}"
    );
    // The projected 2-rank step (the reference's own shape) lies within its band of the
    // measured geometric mean.
    let measured = num(&two_rank, "measured_step_s");
    assert!(
        num(&two_rank, "step_low_s") <= measured && measured <= num(&two_rank, "step_high_s"),
        "{two_rank:?}"
    );
    // Without a measured 1-rank point the 1-rank row is projected from the 2-rank point:
    // the busy fourth repeat moves it by less than the band's half-width.
    let (with_busy, without) = (weak_row(&alone, 1), weak_row(&quiet, 1));
    assert_eq!(with_busy["step_basis"], "projected");
    let moved = (num(&with_busy, "step_s") - num(&without, "step_s")).abs();
    let half = (num(&with_busy, "step_high_s") - num(&with_busy, "step_low_s")) / 2.0;
    assert!(
        moved > 0.0 && moved < half,
        "moved {moved} s, half-width {half} s: {with_busy:?} {without:?}"
    );
    // A reference of one run is projected from and warned of.
    let lone = d.path().join("lone");
    write_repeats(&lone, "two", &TWO_A, &two[..1]);
    let out = reduce(&["--no-plots", "--interconnect", &model, &path_str(&lone)]);
    out.assert_ok();
    assert_eq!(weak_row(&lone, 2)["from_repeats"], "1");
    let md = std::fs::read_to_string(lone.join("report.md")).unwrap();
    assert!(md.contains("its band holds no run-to-run spread"), "{md}");
}

/// The report leads with the decision: report.md's first section is "What to run". With
/// no link model it says why nothing is recommended, and its next command, run as
/// written with a link named, makes a recommendation; the terminal prints the decision
/// last, right above where the files went.
#[test]
fn the_report_leads_with_what_to_run_and_its_next_command_makes_a_recommendation() {
    let dir = tmp();
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study/runs");
    let out = dir.path().join("plain");
    ddpbench(&["reduce", &path_str(&runs), "--out", &path_str(&out), "--no-plots"]).assert_ok();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let first = md.lines().find(|l| l.starts_with("## ")).unwrap();
    assert_eq!(first, "## What to run", "{md}");
    let d = &json(&out.join("report.json"))["decisions"][0];
    assert_eq!(d["run"].as_array().map(Vec::len), Some(0), "{d}");
    let why = d["no_run_because"].as_str().unwrap();
    assert!(why.contains("no link model was given"), "{why}");
    let next = d["next"].as_str().unwrap();
    let command = next.split('`').nth(1).unwrap_or_else(|| panic!("no command in {next}"));
    assert!(
        command.starts_with("ddpbench reduce ") && command.contains("--link NAME"),
        "{command}"
    );
    assert!(!command.contains('\''), "the fixture's path needs no quoting: {command}");
    let linked = dir.path().join("linked");
    let mut args: Vec<String> = command
        .split(' ')
        .skip(1)
        .map(|a| if a == "NAME" { "ib-hdr".to_string() } else { a.to_string() })
        .collect();
    args.extend(["--out".into(), path_str(&linked), "--no-plots".into()]);
    let job = ddpbench(&args.iter().map(String::as_str).collect::<Vec<_>>());
    job.assert_ok();
    let d = &json(&linked.join("report.json"))["decisions"][0];
    let run = d["run"][0]
        .as_str()
        .unwrap_or_else(|| panic!("the next command made no recommendation: {d}"));
    assert!(run.contains("on ib-hdr") && run.contains("GPU-hours per epoch"), "{run}");
    assert!(d["no_run_because"].is_null(), "{d}");
    let at = |t: &str| job.stdout.rfind(t).unwrap_or_else(|| panic!("{t:?} not printed:\n{}", job.stdout));
    assert!(at("Recommendation for") < at("What to run:") && at("What to run:") < at("\nwrote "));
}

/// A point with no other rank count: the next command measures it at 2 ranks with every
/// setting of its comparison key spelled out, each a flag of `train`, and a
/// new folder beside the run where it lies now.
#[test]
fn the_next_command_of_a_lone_point_spells_out_its_key_with_trains_own_flags() {
    let dir = tmp();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/single");
    let out = dir.path().join("report");
    ddpbench(&["reduce", &path_str(&fixture), "--out", &path_str(&out), "--no-plots"]).assert_ok();
    let report = json(&out.join("report.json"));
    let next = report["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|d| d["next"].as_str().filter(|n| n.starts_with("Measure it at 2 ranks")))
        .unwrap_or_else(|| panic!("no decision measures at 2 ranks: {}", report["decisions"]));
    let command = next.split('`').nth(1).unwrap();
    let words: Vec<&str> = command.split(' ').collect();
    assert_eq!(&words[..5], ["mpirun", "-n", "2", "ddpbench", "train"], "{command}");
    // train's flags as src/record/train_defaults.json lists them (a unit test of `train`
    // holds that file to its flags): this file runs without `train`, in the quick tier.
    let defaults = json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/record/train_defaults.json"));
    let flags: Vec<String> = defaults
        .as_object()
        .unwrap()
        .keys()
        .map(|k| format!("--{}", k.replace('_', "-")))
        .collect();
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        assert!(flags.iter().any(|f| f == flag), "{flag} is not a train flag: {command}");
    }
    let run = &report["runs"].as_array().unwrap()[0];
    let key = &run["comparison_key"];
    for (flag, field) in [
        ("--allreduce", "backend"),
        ("--overlap", "overlap"),
        ("--model", "model"),
        ("--dataset", "dataset"),
    ] {
        let at = words
            .iter()
            .position(|w| *w == flag)
            .unwrap_or_else(|| panic!("{flag} missing: {command}"));
        let value = key[field].as_str().unwrap_or_else(|| panic!("{field} in {key}"));
        assert_eq!(words[at + 1], value, "{flag} in {command}");
    }
    let folder = words[words.iter().position(|w| *w == "--out").unwrap() + 1];
    assert_eq!(Path::new(folder), fixture.join("at-2-ranks"), "{command}");
}

/// Without `--out`, reduce writes into a new folder `report-<UTC time>` beside what it
/// was given: a folder of runs gets its report beside it (the runs folder gains
/// nothing), a second reduce in the same second a second folder (the first kept
/// whole), and one run its report beside the run (the run folder gains nothing). The
/// "wrote" line names the folder.
#[test]
fn without_out_each_reduce_writes_a_new_report_folder_beside_the_runs() {
    let d = tmp();
    let study = d.path().join("study");
    let runs = study.join("runs");
    std::fs::create_dir_all(&study).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study/runs");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(&runs)
        .status()
        .unwrap();
    assert!(cp.success());
    let listing = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = listing(&runs);
    let wrote = |job: &Job| -> std::path::PathBuf {
        let line = job.stdout.lines().find(|l| l.starts_with("wrote ")).expect("a wrote line");
        Path::new(&line["wrote ".len()..line.find("/{").expect("wrote DIR/{…}")]).to_path_buf()
    };
    let a = ddpbench(&["reduce", "--no-plots", &path_str(&runs)]);
    a.assert_ok();
    let b = ddpbench(&["reduce", "--no-plots", &path_str(&runs)]);
    b.assert_ok();
    let (ra, rb) = (wrote(&a), wrote(&b));
    assert_ne!(ra, rb, "two reduces wrote into one folder");
    let home = study.canonicalize().unwrap();
    for r in [&ra, &rb] {
        assert_eq!(r.parent(), Some(home.as_path()), "{} is not beside {}", r.display(), runs.display());
        let name = r.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("report-20") && name.contains('T'), "{name}");
        assert!(r.join("report.md").is_file() && r.join("report.json").is_file(), "{}", r.display());
    }
    assert_eq!(listing(&runs), before, "the runs folder changed");
    let one = runs.join(&before[0]);
    let c = ddpbench(&["reduce", "--no-plots", &path_str(&one)]);
    c.assert_ok();
    let beside = runs.canonicalize().unwrap();
    assert_eq!(wrote(&c).parent(), Some(beside.as_path()), "one run's report: {}", c.stdout);
    assert_eq!(listing(&one), listing(&fixture.join(&before[0])), "the run folder changed");
}

/// Tables name a point by its label and repeat count (`000-…-r1 ×3`), not by every run
/// id in one cell; the runs of each point follow the table, so every run id of
/// scaling.csv is still on the page.
#[test]
fn tables_name_points_by_label_and_list_their_runs_after() {
    let dir = tmp();
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study/runs");
    let out = dir.path().join("r");
    ddpbench(&["reduce", &path_str(&runs), "--out", &path_str(&out), "--no-plots"]).assert_ok();
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    // The tables of points: speedup and efficiency, and where the efficiency goes (the
    // runs table above them has a row per run, by design).
    let section = |from: &str, to: &str| -> &str {
        let at = md.find(from).unwrap_or_else(|| panic!("no {from:?} in {md}"));
        &md[at..at + md[at..].find(to).unwrap_or(md.len() - at)]
    };
    let points = [
        section("## Speedup and efficiency", "The runs of each point"),
        section("## Where the efficiency goes", "\n## "),
    ];
    let rows: Vec<&str> = points.iter().flat_map(|p| p.lines()).filter(|l| l.starts_with("| 0")).collect();
    assert!(!rows.is_empty(), "{md}");
    for row in &rows {
        assert!(!row.contains("-rep1"), "a row lists repeats' ids: {row}");
    }
    assert!(
        rows.iter().any(|r| r.starts_with("| 000-mnist-cnn-fashion-mnist-b32-r1 ×3 |")),
        "{md}"
    );
    let (h, table) = read_csv(&out.join("scaling.csv"));
    let ids = h.iter().position(|c| c == "run_ids").unwrap();
    let listed = &md[md.find("The runs of each point:").unwrap_or_else(|| panic!("{md}"))..];
    for r in &table {
        for id in r[ids].split(' ') {
            assert!(listed.contains(id), "{id} is not among the runs listed:\n{listed}");
        }
    }
}
