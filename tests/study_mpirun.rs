//! `ddpbench study` under a real `mpirun -n 2`: every point runs on its own ranks and
//! writes a complete run folder, idle ranks sleep, a failing point is skipped on every
//! rank and named, a study resumes, a changed study is refused, and a point inside a
//! study trains exactly as `train` does (2 × 32 == 1 × 64 across two points).

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
/// The relative L2 distance under which a study's 1 × 64 and 2 × 32 points count as the
/// same training: 10 × the largest distance seen over seeds 1 to 3 and every CPU kernel
/// setting (BENCHMARKS.md, "Equality of training on other CPU kernels").
// Largest seen: 4.85e-5 (2 ranks x accumulated, seed 5, AMD EPYC, any ATen kernel);
// 1.5e-5 in the sweep (1 x 64 against 2 x 32, MKL_CBWR=COMPATIBLE). Another seed ends
// 1.4 away, 2,800 x the bound.
const EQUALITY_BOUND: f64 = 5e-4;

fn study_cmd(file: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("study").arg(file).arg("--out").arg(out).args(extra);
    cmd
}

fn study(file: &Path, out: &Path, extra: &[&str]) -> Job {
    run_with_limit(study_cmd(file, out, extra), LIMIT)
}

/// points.csv as maps from column to cell.
fn points(out: &Path) -> Vec<std::collections::BTreeMap<String, String>> {
    let (h, rows) = read_csv(&out.join("points.csv"));
    rows.into_iter().map(|r| h.iter().cloned().zip(r).collect()).collect()
}

fn rank_files(run: &Path) -> usize {
    std::fs::read_dir(run)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with("rank-") && n.ends_with(".csv") && !n.ends_with(".gpu.csv")
        })
        .count()
}

const GRID: &str = r#"
name = "grid"
models = ["mnist-cnn"]
# cifar10 holds 3×32×32 images, which mnist-cnn cannot take: those points fail.
datasets = ["fashion-mnist", "cifar10"]
batch_sizes = [32, 64]
scaling = "both"
repeats = 2
max_steps = 15
val_samples = 256
probe_iters = 0
"#;

#[test]
fn a_study_runs_every_point_on_its_ranks_and_goes_on_past_a_failing_one() {
    let d = tmp();
    let file = d.path().join("grid.toml");
    std::fs::write(&file, GRID).unwrap();
    let out = d.path().join("study");
    // The dry run lists the points with their ranks and an estimate timed on rank 0,
    // and writes nothing.
    let dry = study(&file, &out, &["--dry-run"]);
    dry.assert_ok();
    assert!(
        dry.stdout
            .contains("study grid: 10 point(s) × 2 repeat(s) = 20 runs, ladder [1, 2]"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("001-mnist-cnn-fashion-mnist-b32-r2") && dry.stdout.contains("2 ranks 0-1"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("mnist-cnn-fashion-mnist-b64: ") && dry.stdout.contains("ms per step at batch 64 on 1 rank"),
        "{}",
        dry.stdout
    );
    assert!(dry.stdout.contains("mnist-cnn-cifar10-b32: not timed: "), "{}", dry.stdout);
    assert!(
        dry.stdout.contains("estimate: about ") && dry.stdout.contains("5 point(s) not estimated"),
        "{}",
        dry.stdout
    );
    assert!(!out.exists());

    let job = study(&file, &out, &[]);
    job.assert_ok();

    // The resolved study is kept beside the runs.
    assert!(out.join("study.toml").exists() && out.join("study.json").exists());
    let rows = points(&out);
    // Per data set: b32 at 1 and 2 ranks, b32's strong point (2 × 16), b64 at 1 and 2
    // ranks (2 × 32 is b32's 2-rank point, shared), each twice.
    assert_eq!(rows.len(), 2 * 5 * 2, "{rows:#?}");
    for r in &rows {
        let failed = r["run"].contains("cifar10");
        assert_eq!(r["status"], if failed { "failed" } else { "completed" }, "{r:?}");
        if failed {
            // The error every rank agreed on, named in the table and on screen.
            assert!(r["error"].contains("3×32×32"), "{r:?}");
            assert!(job.stderr.contains(&format!("failed point {}", r["run"])), "{}", job.all());
            continue;
        }
        let run = out.join("runs").join(&r["run"]);
        let m = json(&run.join("manifest.json"));
        assert_eq!(m["status"], "completed");
        let ranks: usize = r["ranks"].parse().unwrap();
        // The point really ran on its own rank count: world size and rank files.
        assert_eq!(m["world_size"].as_u64().unwrap() as usize, ranks, "{r:?}");
        assert_eq!(rank_files(&run), ranks);
        assert_eq!(m["batch_size_per_rank"].as_u64().unwrap().to_string(), r["batch_per_rank"]);
        // Threads per rank are the same at every point: the 2 cores over 2 ranks.
        for rank in m["ranks"].as_array().unwrap() {
            assert_eq!(rank["threads"], 1, "{r:?}");
        }
        let (h, steps) = read_csv(&run.join("rank-00000.csv"));
        assert_eq!(steps.len(), 15);
        assert!(col(&h, &steps, "step_s").iter().all(|s| *s > 0.0));
        if ranks == 1 {
            // The other rank sat out, sleeping: its CPU time per second of waiting.
            let idle: f64 = r["idle_cpu_s_per_s"].parse().unwrap();
            assert!(idle < 0.05, "idle rank used {idle} CPU-s/s: {r:?}");
        }
    }
    // Repeats interleave: every point's first repeat before any second one.
    let reps: Vec<&str> = rows.iter().map(|r| r["repeat"].as_str()).collect();
    let first_second = reps.iter().position(|r| *r == "1").unwrap();
    assert!(
        reps[..first_second].iter().all(|r| *r == "0") && reps[first_second..].iter().all(|r| *r == "1"),
        "{reps:?}"
    );

    // The report covers the study: the grid, per-point summary and verdicts.
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(report.contains("weak speedup by batch per rank × ranks"), "{report}");
    assert!(report.contains("strong speedup by global batch × ranks"), "{report}");
    let (h, summary) = read_csv(&out.join("report/study.csv"));
    let point = h.iter().position(|c| c == "point").unwrap();
    let weak = h.iter().position(|c| c == "weak_speedup").unwrap();
    let two = summary
        .iter()
        .find(|r| r[point].contains("fashion-mnist-b64-r2"))
        .expect("b64 2-rank point in study.csv");
    assert!(two[weak].parse::<f64>().unwrap() > 0.0, "{two:?}");
    // The verdict on its largest point, as report.md says it.
    assert!(job.stdout.contains("mnist-cnn-fashion-mnist-b64: At 2 ranks"), "{}", job.stdout);
    assert!(
        job.stdout.contains("mnist-cnn-cifar10-b32: no point beyond 1 rank completed"),
        "{}",
        job.stdout
    );
    assert!(out.join("report/speedup-mnist-cnn-fashion-mnist-b32.png").exists());

    // Again: finished points are skipped, failed ones too unless --retry-failed; each
    // launch adds a row per run saying what it did.
    let again = study(&file, &out, &[]);
    again.assert_ok();
    let after = points(&out);
    let launch2 = &after[rows.len()..];
    assert_eq!(launch2.len(), rows.len());
    assert!(launch2.iter().all(|r| r["status"].starts_with("skipped")), "{launch2:#?}");
    let retry = study(&file, &out, &["--retry-failed"]);
    retry.assert_ok();
    let after = points(&out);
    let launch3 = &after[2 * rows.len()..];
    let ran: Vec<&str> = launch3
        .iter()
        .filter(|r| !r["status"].starts_with("skipped"))
        .map(|r| r["run"].as_str())
        .collect();
    assert_eq!(ran.len(), 10, "the 10 failed runs ran again, and only they: {launch3:#?}");
    assert!(ran.iter().all(|r| r.contains("cifar10")));

    // A changed study into the same folder is refused, with what to do.
    std::fs::write(&file, GRID.replace("max_steps = 15", "max_steps = 16")).unwrap();
    let changed = study(&file, &out, &[]);
    assert!(!changed.ok());
    assert!(changed.all().contains("different study"), "{}", changed.all());
}

#[test]
fn an_interrupted_study_resumes_where_it_stopped() {
    let d = tmp();
    let file = d.path().join("long.toml");
    std::fs::write(
        &file,
        "name = \"long\"\nbatch_sizes = [32]\nranks = [1, 2]\nrepeats = 3\nmax_steps = 40\nval_samples = 0\nprobe_iters = 0\n",
    )
    .unwrap();
    let out = d.path().join("study");
    // Stop the whole job with SIGTERM once the first point is on disk.
    use std::os::unix::process::CommandExt;
    let mut cmd = study_cmd(&file, &out, &[]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(out.join("points.csv")).is_ok_and(|t| t.lines().count() >= 2) {
        assert!(start.elapsed() < LIMIT, "no point finished");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The ranks may outlive mpirun by their clean-up, holding the folder's lock till
    // they end: the study is resumed once every process of the job has ended.
    let procs = descendants(child.id());
    assert!(procs.len() >= 2, "the job's ranks are not among mpirun's descendants: {procs:?}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    wait_for_gone(&procs, LIMIT);
    let before = points(&out);
    let finished: Vec<String> = before
        .iter()
        .filter(|r| r["status"] == "completed")
        .map(|r| r["run"].clone())
        .collect();
    assert!(!finished.is_empty() && finished.len() < 6, "{before:?}");
    let started: Vec<String> = finished
        .iter()
        .map(|r| json(&out.join("runs").join(r).join("manifest.json"))["start_utc"].to_string())
        .collect();

    let job = study(&file, &out, &[]);
    job.assert_ok();
    let after = points(&out);
    let done: Vec<&String> = after.iter().filter(|r| r["status"] == "completed").map(|r| &r["run"]).collect();
    // All six runs completed once; the ones finished before were not run again.
    let mut unique = done.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((done.len(), unique.len()), (6, 6), "{after:?}");
    for (r, s) in finished.iter().zip(&started) {
        assert_eq!(&json(&out.join("runs").join(r).join("manifest.json"))["start_utc"].to_string(), s);
    }
    for r in &done {
        assert_eq!(json(&out.join("runs").join(r).join("manifest.json"))["status"], "completed");
    }
}

#[test]
fn two_points_of_a_study_train_as_one_rank_of_twice_the_batch() {
    let d = tmp();
    let file = d.path().join("eq.toml");
    // Strong scaling from 1 × 64: the 2-rank point is 2 × 32. Both see the same samples
    // each step; their fp32 sums round apart by about 1e-7, which the 20 steps amplify
    // (EQUALITY_BOUND says by how much).
    let seed = equality_seed(1);
    std::fs::write(
        &file,
        format!(
            "name = \"eq\"\nbatch_sizes = [64]\nranks = [1, 2]\nscaling = \"strong\"\nmax_steps = 20\n\
             deterministic = true\nno_dropout = true\noptimizer = \"sgd\"\nlr = 0.01\nseed = {seed}\n\
             val_samples = 0\nprobe_iters = 0\nsave_model = true\n"
        ),
    )
    .unwrap();
    let out = d.path().join("study");
    study(&file, &out, &[]).assert_ok();
    let rows = points(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let params = |run: &str| {
        let mut p = tch::Tensor::read_safetensors(out.join("runs").join(run).join("model.safetensors")).unwrap();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    };
    let one = rows.iter().find(|r| r["ranks"] == "1").unwrap();
    let two = rows.iter().find(|r| r["ranks"] == "2").unwrap();
    assert_eq!((one["batch_per_rank"].as_str(), two["batch_per_rank"].as_str()), ("64", "32"));
    // The baseline of a strong-only study is its own strong ideal, and has no weak one.
    let (h, summary) = read_csv(&out.join("report/study.csv"));
    let cell = |name: &str| summary[0][h.iter().position(|c| c == name).unwrap()].clone();
    assert_eq!(cell("ranks"), "1", "{summary:?}");
    assert_eq!(
        (cell("strong_speedup"), cell("strong_efficiency")),
        ("1".into(), "1".into()),
        "{h:?} {summary:?}"
    );
    assert_eq!(
        (cell("weak_speedup"), cell("weak_efficiency")),
        (String::new(), String::new()),
        "{h:?} {summary:?}"
    );
    let distance = |a: &[(String, tch::Tensor)], b: &[(String, tch::Tensor)]| {
        let (mut diff, mut norm) = (0.0, 0.0);
        for ((na, ta), (nb, tb)) in a.iter().zip(b) {
            assert_eq!(na, nb);
            diff += (ta - tb).square().sum(tch::Kind::Double).double_value(&[]);
            norm += ta.square().sum(tch::Kind::Double).double_value(&[]);
        }
        (diff / norm).sqrt()
    };
    let one_params = params(&one["run"]);
    let rel = distance(&one_params, &params(&two["run"]));
    // The far side: the same 1-rank point's training under another seed, outside the study.
    let other = d.path().join("other");
    let mut args = vec!["--batch-size", "64", "--max-steps", "20", "--deterministic", "--no-dropout"];
    let other_s = other_seed(seed).to_string();
    let other_out = path_str(&other);
    args.extend(["--optimizer", "sgd", "--lr", "0.01", "--val-samples", "0", "--probe-iters", "0"]);
    args.extend(["--save-model", "--seed", &other_s, "--out", &other_out]);
    train(1, &args, LIMIT).assert_ok();
    let far = {
        let mut p = tch::Tensor::read_safetensors(other.join("model.safetensors")).unwrap();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    };
    assert_equal_training("study-1x64-2x32", seed, rel, distance(&one_params, &far), EQUALITY_BOUND);
}

#[test]
fn bad_study_files_are_refused_before_anything_runs() {
    let d = tmp();
    let cases = [
        ("batchsizes = [32]\n", "unknown study key `batchsizes`"),
        ("scaling = \"sideways\"\n", "sideways"),
        ("batch_sizes = [0]\n", "batch_sizes"),
        ("ranks = [1, 4]\n", "4"),
        ("models = [\"resnet9000\"]\n", "resnet9000"),
    ];
    for (text, says) in cases {
        let file = d.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let job = study(&file, &d.path().join("never"), &[]);
        assert!(!job.ok(), "{text}: {}", job.all());
        assert!(job.all().contains(says), "{text}: expected `{says}` in:\n{}", job.all());
        assert!(!d.path().join("never").join("runs").exists(), "{text}");
    }
}

/// A study's report keys are `reduce`'s flags: a bad value is refused as the flag is, with
/// the flag's message (the accepted forms, the presets), exit status 2 on every rank, and
/// nothing written.
#[test]
fn bad_report_keys_are_refused_with_the_flags_messages_and_exit_status_2() {
    let d = tmp();
    let never = d.path().join("never");
    for (text, says) in [
        ("link = \"fast\"\n", "'fast' is no preset"),
        ("link_intra = \"100Gbit\"\n", "'100Gbit' has no latency"),
        ("link = \"10GB/s,2s\"\n", "a latency lies from 0 to 1 s"),
        ("project_shape = [\"2x2\", \"16\"]\n", "NODESxRANKS_PER_NODE"),
        ("target_efficiency = 1.5\n", "above 0 and at most 1"),
        ("price_per_gpu_hour = -1\n", "a number from 0"),
    ] {
        let file = d.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let job = study(&file, &never, &[]);
        let all = job.all();
        assert_eq!(job.status, Some(2), "{text}: {all}");
        assert!(all.contains(says), "{text}: expected `{says}` in:\n{all}");
        assert_eq!(all.matches(says).count(), 1, "said once, not once per rank:\n{all}");
        if text.starts_with("link") {
            assert!(all.contains("BANDWIDTH,LATENCY") && all.contains("eth-10g, eth-25g"), "{all}");
        }
        assert!(!never.exists(), "{text}: something was written");
    }
}

/// The report keys reach the study's report: study.md says what to run as report.md
/// does (the levels, each workload's sentence and table), and a finished study takes new
/// report keys without running any point again; its study.toml then holds them.
#[test]
fn a_study_with_a_link_says_what_to_run_in_study_md() {
    let d = tmp();
    let out = d.path().join("study");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study"), &out);
    let before = run_starts(&out);
    let saved = std::fs::read_to_string(out.join("study.toml")).unwrap();
    assert!(!saved.contains("link"), "{saved}");
    let file = d.path().join("planned.toml");
    let keys = "link = \"roce-100g\"\nproject_shape = \"2x2\"\ntarget_efficiency = 0.6\nprice_per_gpu_hour = 2.5\n";
    std::fs::write(&file, format!("{saved}{keys}")).unwrap();
    study(&file, &out, &[]).assert_ok();
    assert_eq!(run_starts(&out), before, "a point ran again");
    let report = json(&out.join("report/report.json"));
    let recs = report["projection"]["recommendations"].as_array().cloned().unwrap_or_default();
    assert!(!recs.is_empty(), "no recommendation: {}", report["projection"]);
    let study_md = std::fs::read_to_string(out.join("report/study.md")).unwrap();
    let report_md = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    // study.md opens as report.md does: its first section is report.md's "What to run".
    let first = |md: &str| -> String {
        let at = md.find("\n## ").unwrap_or_else(|| panic!("{md}")) + 1;
        let end = md[at + 3..].find("\n## ").map_or(md.len(), |e| at + 3 + e);
        md[at..end].to_string()
    };
    assert!(first(&report_md).starts_with("## What to run\n"), "{report_md}");
    // (report.md's section goes on with what its figures are, a paragraph of its own.)
    assert!(
        first(&report_md).starts_with(&first(&study_md)) && first(&study_md).contains("\n### "),
        "study.md does not open with report.md's decision:\n{study_md}"
    );
    assert!(first(&study_md).contains("GPU-hours per epoch"), "{study_md}");
    let what_to_run = &study_md[study_md.find("## What to run").unwrap_or_else(|| panic!("{study_md}"))..];
    assert!(what_to_run.contains("nominal, from the specification roce-100g"), "{what_to_run}");
    for r in &recs {
        assert_eq!(r["target_efficiency"], 0.6);
        let sentence = r["sentence"].as_str().unwrap();
        assert!(sentence.contains("≥ 60 % efficiency"), "{sentence}");
        assert!(
            what_to_run.contains(sentence) && report_md.contains(sentence),
            "{sentence}\n{what_to_run}"
        );
        // The same table as report.md's, each of its shapes a row: 1 × 1 … 2 × 2.
        for s in r["shapes"].as_array().unwrap() {
            let label = format!("| {} × {} |", s["shape"]["nodes"], s["shape"]["ranks_per_node"]);
            let row = |md: &str| {
                md[md.find(sentence).unwrap()..]
                    .lines()
                    .find(|l| l.starts_with(&label))
                    .map(str::to_string)
            };
            assert_eq!(row(what_to_run), row(&report_md), "{label}");
            assert!(row(what_to_run).is_some(), "{label} not in:\n{what_to_run}");
        }
    }
    let resolved = std::fs::read_to_string(out.join("study.toml")).unwrap();
    assert!(
        resolved.contains("link = \"roce-100g\"") && resolved.contains("target_efficiency = 0.6"),
        "{resolved}"
    );
}

/// Start times of every run folder of a study, by name.
fn run_starts(out: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| {
            let m = json(&e.path().join("manifest.json"));
            (e.file_name().to_string_lossy().into_owned(), m["start_utc"].to_string())
        })
        .collect()
}

/// `state.json` cut in half, then deleted, then a run whose manifest still says
/// `running` (its job died under it): the same command again never removes a finished
/// run; the unfinished one is moved aside and run again.
#[test]
fn a_damaged_or_missing_state_never_deletes_a_finished_point() {
    let d = tmp();
    let file = d.path().join("keep.toml");
    std::fs::write(
        &file,
        "name = \"keep\"\nbatch_sizes = [32]\nranks = [1, 2]\nmax_steps = 8\nval_samples = 0\nprobe_iters = 0\n",
    )
    .unwrap();
    let out = d.path().join("study");
    study(&file, &out, &[]).assert_ok();
    let first = run_starts(&out);
    assert_eq!(first.len(), 2, "{first:?}");
    let state = std::fs::read_to_string(out.join("state.json")).unwrap();
    std::fs::write(out.join("state.json"), &state[..state.len() / 2]).unwrap();
    let job = study(&file, &out, &[]);
    job.assert_ok();
    assert!(
        job.all().contains("was damaged") && job.all().contains("rebuilt from the run folders"),
        "{}",
        job.all()
    );
    assert_eq!(run_starts(&out), first, "a finished run was run again");
    std::fs::remove_file(out.join("state.json")).unwrap();
    let job = study(&file, &out, &[]);
    job.assert_ok();
    assert!(job.all().contains("was missing"), "{}", job.all());
    assert_eq!(run_starts(&out), first, "a finished run was run again");
    let rows = points(&out);
    assert!(
        rows.iter().rev().take(2).all(|r| r["status"] == "skipped (completed earlier)"),
        "{rows:?}"
    );
    // A run whose job died under it: moved aside (kept), and run again.
    let (dead, kept) = {
        let mut names = first.keys();
        (names.next().unwrap().clone(), names.next().unwrap().clone())
    };
    let manifest = out.join("runs").join(&dead).join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap().replace("\"completed\"", "\"running\"");
    std::fs::write(&manifest, text).unwrap();
    std::fs::remove_file(out.join("state.json")).unwrap();
    study(&file, &out, &[]).assert_ok();
    let now = run_starts(&out);
    assert_eq!(now[&kept], first[&kept]);
    assert_ne!(now[&dead], first[&dead], "the unfinished run was not run again");
    let discarded: Vec<String> = std::fs::read_dir(out.join("discarded"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(discarded.len() == 1 && discarded[0].starts_with(&dead), "{discarded:?}");
}

/// Rank 1 sits out the 1-rank point and is stopped there: the watchdog names rank 1
/// once rank 0 waits for it, and the point rank 0 finished stays completed, in its
/// folder and in the study's state.
#[test]
fn a_rank_stopped_while_sitting_out_a_point_is_named_and_the_point_stays_completed() {
    use std::os::unix::process::CommandExt;
    let d = tmp();
    let file = d.path().join("idle.toml");
    std::fs::write(
        &file,
        "name = \"idle\"\nbatch_sizes = [32]\nranks = [1, 2]\nmax_steps = 120\nval_samples = 0\nprobe_iters = 0\nwatchdog_s = 5\n",
    )
    .unwrap();
    let out = d.path().join("study");
    let err_log = d.path().join("err");
    let mut cmd = study_cmd(&file, &out, &[]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_log).unwrap())
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let first = out.join("runs").join("000-mnist-cnn-fashion-mnist-b32-r1-rep0");
    let start = std::time::Instant::now();
    while std::fs::read_to_string(first.join("rank-00000.csv"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
        < 5
    {
        assert!(start.elapsed() < LIMIT, "the 1-rank point never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pids = Command::new("pgrep")
        .args(["-f", &format!("study .*{}", path_str(&out))])
        .output()
        .unwrap()
        .stdout;
    let rank1 = String::from_utf8(pids)
        .unwrap()
        .lines()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .find(|p| std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == b"OMPI_COMM_WORLD_RANK=1")))
        .expect("rank 1's process");
    unsafe { libc::kill(rank1, libc::SIGSTOP) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            panic!("the study did not end:\n{}", std::fs::read_to_string(&err_log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    unsafe { libc::kill(rank1, libc::SIGKILL) };
    let err = std::fs::read_to_string(&err_log).unwrap();
    assert!(!status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("watchdog: "))
        .unwrap_or_else(|| panic!("no watchdog line:\n{err}"));
    assert!(line.starts_with("watchdog: rank 1 on ") && line.contains("silent for"), "{line}");
    assert_eq!(json(&first.join("manifest.json"))["status"], "completed", "{err}");
    assert_eq!(json(&first.join("rank-00000.end.json"))["status"], "completed");
    let state = json(&out.join("state.json"));
    assert_eq!(state["000-mnist-cnn-fashion-mnist-b32-r1-rep0"]["status"], "completed", "{state}");
    assert!(
        out.join("rank-00000.flight.json").is_file(),
        "flight records go to the study folder"
    );
}

/// A study in which no run completes exits non-zero and says so.
#[test]
fn a_study_where_nothing_completes_exits_non_zero() {
    let d = tmp();
    let file = d.path().join("none.toml");
    // cifar10 holds 3×32×32 images, which mnist-cnn cannot take.
    std::fs::write(
        &file,
        "name = \"none\"\ndatasets = [\"cifar10\"]\nbatch_sizes = [32]\nranks = [1]\nmax_steps = 5\nval_samples = 0\nprobe_iters = 0\n",
    )
    .unwrap();
    let out = d.path().join("study");
    let job = study(&file, &out, &[]);
    assert!(!job.ok(), "{}", job.all());
    assert!(job.all().contains("no run of the study completed"), "{}", job.all());
}

/// Copies the folder `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().map(|e| e.unwrap()) {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A run's throughput as `reduce` defines it: samples per step over the mean step, the
/// step being the mean over ranks of `step_s` (warm-up steps left out).
fn run_throughput(run: &Path) -> f64 {
    let (mut samples, mut step_sum, mut ranks) = (0.0, 0.0, 0.0);
    for r in 0..rank_files(run) {
        let (h, rows) = read_csv(&run.join(format!("rank-{r:05}.csv")));
        let timed: Vec<Vec<String>> = rows
            .into_iter()
            .filter(|row| row[h.iter().position(|c| c == "warmup").unwrap()] == "0")
            .collect();
        samples += col(&h, &timed, "samples").iter().sum::<f64>();
        step_sum += col(&h, &timed, "step_s").iter().sum::<f64>();
        ranks += 1.0;
    }
    samples / (step_sum / ranks)
}

/// Each run of a study names its point and repeat in its manifest (`study_run`), and the
/// study's report joins the run to the point it names, not to the one its folder's name
/// says: with the two runs' `study_run` swapped, each point reports the other's throughput.
#[test]
fn a_studys_report_joins_each_run_to_the_point_its_manifest_names() {
    let d = tmp();
    let file = d.path().join("ids.toml");
    std::fs::write(
        &file,
        "name = \"ids\"\nbatch_sizes = [32]\nranks = [1, 2]\nmax_steps = 8\nval_samples = 0\nprobe_iters = 0\n",
    )
    .unwrap();
    let out = d.path().join("study");
    study(&file, &out, &[]).assert_ok();
    let rows = points(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let manifest = |run: &str| out.join("runs").join(run).join("manifest.json");
    for r in &rows {
        let named = &json(&manifest(&r["run"]))["study_run"];
        assert_eq!(named, &serde_json::json!({"point": r["point"], "repeat": 0}), "{}", r["run"]);
    }
    let (a, b) = (&rows[0]["run"], &rows[1]["run"]);
    let (ma, mb) = (json(&manifest(a)), json(&manifest(b)));
    for (run, mut m, other) in [(a, ma.clone(), &mb), (b, mb.clone(), &ma)] {
        m["study_run"] = other["study_run"].clone();
        std::fs::write(manifest(run), serde_json::to_string_pretty(&m).unwrap()).unwrap();
    }
    // Resumed with nothing to run: only the report is made again.
    study(&file, &out, &[]).assert_ok();
    let (h, summary) = read_csv(&out.join("report/study.csv"));
    let cell = |row: &Vec<String>, name: &str| row[h.iter().position(|c| c == name).unwrap()].clone();
    for (r, other) in [(&rows[0], b), (&rows[1], a)] {
        let row = summary.iter().find(|s| cell(s, "point") == r["point"]).unwrap();
        let got: f64 = cell(row, "samples_per_s").parse().unwrap();
        let want = run_throughput(&out.join("runs").join(other));
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "{}: {got}, {other}'s throughput is {want}",
            r["point"]
        );
    }
}

/// study.csv has one estimator, the geometric mean of a point's repeats: its throughput
/// is the geometric mean of the repeats' throughputs, and its weak speedup the ratio of two
/// such columns (2 ranks against the 1-rank point of the same batch per rank). The
/// fixture study (3 repeats per point, made with the schema-2 binary) is resumed with
/// nothing left to run, so only its report is made.
#[test]
fn study_csv_has_one_estimator_the_geometric_mean_of_the_repeats() {
    let d = tmp();
    let out = d.path().join("study");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study"), &out);
    let job = study(&out.join("study.toml"), &out, &[]);
    job.assert_ok();
    let (h, rows) = read_csv(&out.join("report/study.csv"));
    let i = |c: &str| h.iter().position(|x| x == c).unwrap();
    assert_eq!(rows.len(), 3);
    let mut got_of = std::collections::BTreeMap::new();
    for row in &rows {
        let thr: Vec<f64> = (0..3)
            .map(|rep| run_throughput(&out.join("runs").join(format!("{}-rep{rep}", row[i("point")]))))
            .collect();
        let geometric = (thr.iter().map(|t| t.ln()).sum::<f64>() / 3.0).exp();
        let mut sorted = thr.clone();
        sorted.sort_by(f64::total_cmp);
        // The repeats differ enough that the median is not the geometric mean.
        assert!((sorted[1] - geometric).abs() > 1e-3 * geometric, "{thr:?}");
        let got: f64 = row[i("samples_per_s")].parse().unwrap();
        assert!(
            (got - geometric).abs() <= 1e-6 * geometric,
            "{}: {got}, the geometric mean of {thr:?} is {geometric}",
            row[i("point")]
        );
        got_of.insert(
            (row[i("ranks")].clone(), row[i("batch_per_rank")].clone()),
            (got, row[i("weak_speedup")].clone()),
        );
    }
    let (two, weak) = &got_of[&("2".to_string(), "32".to_string())];
    let (one, _) = &got_of[&("1".to_string(), "32".to_string())];
    let weak: f64 = weak.parse().unwrap();
    assert!((weak - two / one).abs() <= 1e-6 * weak, "weak speedup {weak} vs {two} / {one}");
}

/// study.csv says how each interval was found, with its degrees of freedom, as
/// scaling.csv does for the same point: the fixture study resumed with nothing to run.
#[test]
fn study_csv_says_how_each_interval_was_found() {
    let d = tmp();
    let out = d.path().join("study");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study"), &out);
    study(&out.join("study.toml"), &out, &[]).assert_ok();
    let (h, rows) = read_csv(&out.join("report/study.csv"));
    let (sh, scaling) = read_csv(&out.join("report/scaling.csv"));
    let at = |h: &[String], c: &str| h.iter().position(|x| x == c).unwrap_or_else(|| panic!("no column {c} in {h:?}"));
    let mut said = 0;
    for row in &rows {
        for mode in ["weak", "strong"] {
            let method = &row[at(&h, &format!("{mode}_interval_method"))];
            if row[at(&h, "ranks")] == "1" || method.is_empty() {
                continue;
            }
            let point = &row[at(&h, "point")];
            let same = scaling
                .iter()
                .find(|r| r[at(&sh, "scaling_mode")] == mode && r[at(&sh, "run_ids")].contains(point.as_str()));
            let same = same.unwrap_or_else(|| panic!("no {mode} row of {point}"));
            assert_eq!(method, &same[at(&sh, "interval_method")]);
            assert!(method.starts_with("t on log throughput, df "), "{method}");
            said += 1;
        }
    }
    // The fixture's weak and strong 2-rank points, 3 repeats each.
    assert_eq!(said, 2, "{rows:?}");
}

/// The text from `from` up to the first `)` after it, in `text`.
fn clause<'a>(text: &'a str, from: &str) -> Option<&'a str> {
    let at = text.find(from)?;
    let end = text[at..].find(')')?;
    Some(&text[at..=at + end])
}

/// study.md and report.md say the same thing of a workload (one sentence made from the
/// report), accuracy is not compared across different amounts of training unsaid, and a
/// serial fraction above 1 is not applicable.
#[test]
fn study_md_and_report_md_give_one_verdict() {
    let d = tmp();
    let out = d.path().join("study");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study"), &out);
    // The 2-rank weak point's runs measured a noise scale, and one run of the 1-rank
    // point was trained to a target loss: study.md shows what report.md shows of them.
    for rep in 0..3 {
        let epochs = out.join(format!("runs/001-mnist-cnn-fashion-mnist-b32-r2-rep{rep}/epochs.csv"));
        let text = std::fs::read_to_string(&epochs).unwrap();
        let mut lines = text.lines();
        let head = format!(
            "{},noise_steps,noise_skipped,grad_sq,trace_sigma,b_simple,b_simple_low,b_simple_high",
            lines.next().unwrap()
        );
        // 40 measured steps: at least the 20 a prediction needs.
        let rows: Vec<String> = lines.map(|l| format!("{l},40,0,0.5,40,80,60,120")).collect();
        std::fs::write(&epochs, format!("{head}\n{}\n", rows.join("\n"))).unwrap();
    }
    let reference = out.join("runs/000-mnist-cnn-fashion-mnist-b32-r1-rep0/manifest.json");
    let mut m = json(&reference);
    m["target"] = serde_json::json!({"target_loss": 4.0, "window_steps": 20, "reached": true, "steps_to_target": 12,
        "samples_to_target": 384, "seconds_to_target": 0.7, "smoothed_loss": 3.9, "lr_rule": "adam learning rate 0.001"});
    std::fs::write(&reference, serde_json::to_string(&m).unwrap()).unwrap();
    study(&out.join("study.toml"), &out, &[]).assert_ok();
    let study_md = std::fs::read_to_string(out.join("report/study.md")).unwrap();
    let report_md = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    for section in [
        "## Gradient noise scale and time to accuracy",
        "Predicted time to accuracy",
        "## Samples to a target: measured against predicted",
    ] {
        assert!(report_md.contains(section), "{section:?} not in report.md:\n{report_md}");
        assert!(study_md.contains(section), "{section:?} not in study.md:\n{study_md}");
    }
    let loss = clause(&study_md, "the largest measured loss is").unwrap_or_else(|| panic!("{study_md}"));
    assert!(report_md.contains(loss), "{loss:?} not in report.md:\n{report_md}");
    let r = clause(&study_md, "R = ").unwrap_or_else(|| panic!("{study_md}"));
    assert!(report_md.contains(r), "{r:?} not in report.md:\n{report_md}");
    // Weak (global batch 64) and strong (32) points ran the same 12 steps: one saw twice
    // the samples of the other.
    assert!(study_md.contains("different numbers of samples"), "{study_md}");
    // Karp–Flatt 2.796 and Gustafson 1.242 in the fixture: speedups below 1.
    assert!(!report_md.contains("Karp–Flatt 2.796"), "{report_md}");
    assert!(report_md.contains("not applicable (speedup < 1"), "{report_md}");
    // study.html: the same verdict as a page, with the speedup curves inline and a link
    // to report.html, written beside it.
    let page = std::fs::read_to_string(out.join("report/study.html")).unwrap();
    assert!(page.contains(&loss.replace('&', "&amp;")), "{loss:?} not in study.html");
    assert!(page.contains("<svg") && page.contains("href=\"report.html\""), "{page}");
    assert!(out.join("report/report.html").is_file());
}

/// A study folder written before `node_fill` and `repeats` (the fixture's study.toml says
/// `placement` and `repeat`) is the same study under the new keys: resumed from a file
/// with the new keys, and from its own study.toml (the old keys, each said once to be
/// renamed), nothing is run again.
#[test]
fn a_study_folder_with_the_old_keys_resumes_without_running_again() {
    let d = tmp();
    let out = d.path().join("study");
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/study"), &out);
    let saved = std::fs::read_to_string(out.join("study.toml")).unwrap();
    assert!(saved.contains("placement = \"pack\"") && saved.contains("repeat = 3"), "{saved}");
    let started = |out: &Path| -> Vec<String> {
        let mut runs: Vec<_> = std::fs::read_dir(out.join("runs")).unwrap().map(|e| e.unwrap().path()).collect();
        runs.sort();
        runs.iter()
            .map(|r| json(&r.join("manifest.json"))["start_utc"].to_string())
            .collect()
    };
    let before = started(&out);
    assert_eq!(before.len(), 9);
    let renamed = |all: &str| {
        (
            all.matches("`placement` is now `node_fill`").count(),
            all.matches("`repeat` is now `repeats`").count(),
        )
    };

    let new_keys = d.path().join("new.toml");
    std::fs::write(
        &new_keys,
        saved.replace("placement =", "node_fill =").replace("repeat =", "repeats ="),
    )
    .unwrap();
    // The flags' old spellings are hidden aliases.
    let job = study(&new_keys, &out, &["--repeat", "3", "--placement", "pack"]);
    job.assert_ok();
    assert_eq!(renamed(&job.all()), (0, 0), "{}", job.all());
    assert!(
        points(&out).iter().all(|p| p["status"] == "skipped (completed earlier)"),
        "{:?}",
        points(&out)
    );

    let job = study(&out.join("study.toml"), &out, &["--repeats", "3", "--node-fill", "pack"]);
    job.assert_ok();
    assert_eq!(renamed(&job.all()), (1, 1), "{}", job.all());
    assert!(
        points(&out).iter().all(|p| p["status"] == "skipped (completed earlier)"),
        "{:?}",
        points(&out)
    );
    assert_eq!(started(&out), before);
}

const PEER: &str = r#"
name = "peer"
datasets = ["synthetic"]
ranks = [1, 2]
repeats = 1
optimizer = "sgd"
max_steps = 8
warmup_steps = 2
val_samples = 0
probe_iters = 0
peer = "pytorch-ddp"
"#;

/// A study with `peer = "pytorch-ddp"` runs PyTorch DDP's twin of every point on the same
/// ranks, into run folders `reduce` reads, whose key names the peer: neither trainer's
/// runs are pooled with the other's, and both rows are in the report.
#[test]
fn a_study_with_the_pytorch_peer_writes_both_sets_of_points_and_both_rows() {
    let d = tmp();
    let file = d.path().join("peer.toml");
    std::fs::write(&file, PEER).unwrap();
    let out = d.path().join("study");
    let job = study(&file, &out, &[]);
    job.assert_ok();
    let runs = out.join("runs");
    for (run, ranks) in [
        ("000-mnist-cnn-synthetic-b64-r1-rep0", 1),
        ("000-mnist-cnn-synthetic-b64-r1-pytorch-ddp-rep0", 1),
        ("001-mnist-cnn-synthetic-b64-r2-rep0", 2),
        ("001-mnist-cnn-synthetic-b64-r2-pytorch-ddp-rep0", 2),
    ] {
        let m = json(&runs.join(run).join("manifest.json"));
        assert_eq!(m["status"], "completed", "{run}: {m}");
        assert_eq!(rank_files(&runs.join(run)), ranks, "{run}");
        let peer = run.contains("pytorch-ddp");
        let (backend, key_peer) = if peer { ("gloo", "pytorch-ddp") } else { ("mpi", "") };
        assert_eq!(m["comm_backend"], backend, "{run}");
        assert_eq!(m["comparison_key"]["peer"].as_str().unwrap_or(""), key_peer, "{run}");
        if peer {
            // The script that ran is kept with the run, with the recorder it imported.
            assert!(runs.join(run).join("peer/pytorch_ddp_mnist.py").is_file());
            assert!(runs.join(run).join("peer/ddpbench_record/recorder.py").is_file());
            let log = std::fs::read_to_string(runs.join(run).join("peer/rank-00000.log")).unwrap();
            let from = format!("ddpbench_record from {}", runs.join(run).join("peer/ddpbench_record").display());
            assert!(log.contains(&from), "{run}: {log}");
            assert!(!runs.join(run).join(".ddpbench.lock").exists(), "{run}: the lock outlived the run");
            let ours = run.replace("-pytorch-ddp", "");
            twin_rows_have_ddpbench_bytes(&runs.join(run), &runs.join(ours), ranks);
        }
    }
    assert!(points(&out).iter().all(|p| p["status"] == "completed"), "{:?}", points(&out));
    // scaling.csv: each trainer's 2-rank point against its own 1-rank point, never pooled.
    let (h, rows) = read_csv(&out.join("report/scaling.csv"));
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let weak: Vec<&Vec<String>> = rows.iter().filter(|r| r[at("scaling_mode")] == "weak").collect();
    assert_eq!(weak.len(), 2, "{rows:?}");
    for r in &weak {
        let ids = format!("{} | {}", r[at("run_ids")], r[at("baseline_run_ids")]);
        let peer = r[at("run_ids")].contains("pytorch-ddp");
        assert_eq!(ids.matches("pytorch-ddp").count(), if peer { 2 } else { 0 }, "{ids}");
        assert!(r[at("speedup")].parse::<f64>().unwrap() > 0.0, "{ids}");
    }
    // report.md says what its figures are and sets the two trainers side by side;
    // study.md has a section and a curve per trainer.
    let report = std::fs::read_to_string(out.join("report/report.md")).unwrap();
    assert!(
        report.contains("These figures are the scaling of ddpbench, a lean data-parallel trainer"),
        "{report}"
    );
    assert!(
        report.contains("mnist-cnn on synthetic, 2 rank(s) (weak, batch 64 per rank): ddpbench's efficiency")
            && report.contains("; PyTorch DDP's efficiency"),
        "{report}"
    );
    let study_md = std::fs::read_to_string(out.join("report/study.md")).unwrap();
    for section in ["## mnist-cnn-synthetic-b64\n", "## mnist-cnn-synthetic-b64-pytorch-ddp\n"] {
        assert!(study_md.contains(section), "{section:?} not in\n{study_md}");
    }
    assert!(out.join("report/speedup-mnist-cnn-synthetic-b64-pytorch-ddp.svg").is_file());
}

/// The twin's rows in `twin` (a run on `ranks` ranks): every step trained, its phases
/// adding up to step_s, and on every row the bytes of ddpbench's rows of the same point
/// (`ours`): the model's gradient bytes (mnist-cnn's parameters × 4) all-reduced on two
/// ranks, with time in flight; none on one rank, where neither trainer communicates.
fn twin_rows_have_ddpbench_bytes(twin: &Path, ours: &Path, ranks: usize) {
    let (m, o) = (json(&twin.join("manifest.json")), json(&ours.join("manifest.json")));
    let gradient_bytes = m["gradient_bytes"].as_f64().unwrap();
    assert_eq!(gradient_bytes, m["parameters"].as_f64().unwrap() * 4.0, "{m}");
    assert_eq!(m["gradient_bytes"], o["gradient_bytes"], "{}", twin.display());
    for rank in 0..ranks {
        let file = format!("rank-{rank:05}.csv");
        let (h, rows) = read_csv(&twin.join(&file));
        let (oh, orows) = read_csv(&ours.join(&file));
        let what = format!("{} {file}", twin.display());
        assert_eq!(rows.len(), 8, "{what}");
        assert_eq!(col(&h, &rows, "warmup"), [1., 1., 0., 0., 0., 0., 0., 0.], "{what}");
        assert!(col(&h, &rows, "forward_s").iter().all(|&s| s > 0.0), "{what}");
        let phases = phase_columns();
        for (i, step_s) in col(&h, &rows, "step_s").into_iter().enumerate() {
            let sum: f64 = phases.iter().map(|p| col(&h, &rows, p)[i]).sum();
            assert!((sum - step_s).abs() < 1e-6, "{what} row {i}: phases {sum} against step_s {step_s}");
        }
        let ours_bytes = col(&oh, &orows, "bytes");
        let expected = if ranks > 1 { gradient_bytes } else { 0.0 };
        assert!(ours_bytes.iter().all(|&b| b == expected), "{what}: ddpbench's bytes {ours_bytes:?}");
        assert!(col(&h, &rows, "bytes").iter().all(|&b| b == ours_bytes[0]), "{what}: {rows:?}");
        if ranks > 1 {
            assert!(col(&h, &rows, "comm_s").iter().all(|&s| s > 0.0), "{what}: {rows:?}");
        }
    }
}

/// Without a Python that imports torch, a study with a peer is refused on every rank
/// before any point runs, with what to do.
#[test]
fn a_study_with_a_peer_and_no_pytorch_is_refused_before_any_point() {
    let d = tmp();
    let file = d.path().join("peer.toml");
    std::fs::write(&file, PEER).unwrap();
    let out = d.path().join("study");
    let mut cmd = mpirun_cmd_with_env(2, &[("DDPBENCH_PYTHON", "/nonexistent/python")]);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out);
    let job = run_with_limit(cmd, LIMIT);
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.all()
            .contains("study key `peer = \"pytorch-ddp\"`: cannot run /nonexistent/python")
            && job.all().contains("set DDPBENCH_PYTHON to a Python with torch"),
        "{}",
        job.all()
    );
    assert!(!out.join("runs").exists(), "no point ran");
}
