//! The PyTorch recorder (`python/ddpbench_record`) on a real `torchrun` job: a small DDP
//! script (`python/examples/ddp_toy.py`, gloo on CPU) records its steps, and `reduce`
//! reads the folder as it reads ddpbench's own runs. No MPI: torchrun starts the ranks.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The toy script's parameters (Linear 64→256, 256→256, 256→10, weights and biases),
/// all fp32: the gradient bytes DDP all-reduces each step.
const TOY_GRADIENT_BYTES: u64 = (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4;
/// Steps the toy trains in these tests, and the warm-up steps the recorder marks.
const STEPS: usize = 40;
const WARMUP: usize = 5;
const LIMIT: Duration = Duration::from_secs(240);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `torchrun --standalone --nproc-per-node ranks ddp_toy.py args` with the recorder on
/// the path, one thread per rank.
fn torchrun(ranks: usize, args: &[&str]) -> Command {
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        &ranks.to_string(),
    ])
    .arg(repo().join("python/examples/ddp_toy.py"))
    .args(args)
    .env("PYTHONPATH", repo().join("python"))
    .env("OMP_NUM_THREADS", "1")
    .env("CUDA_VISIBLE_DEVICES", "");
    cmd
}

/// `python ddp_toy.py args` as rank 0 of 1, with the variables torchrun gives its one
/// worker: the same script, without torchrun's own process (its Python and torch start
/// cost about 4 s a job here).
fn single(args: &[&str]) -> Command {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = Command::new(python());
    cmd.arg(repo().join("python/examples/ddp_toy.py"))
        .args(args)
        .env("PYTHONPATH", repo().join("python"))
        .env("OMP_NUM_THREADS", "1")
        .env("CUDA_VISIBLE_DEVICES", "")
        .envs([("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")])
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    cmd
}

/// The toy on `ranks` ranks: under torchrun from 2 ranks, alone (`single`) on 1.
fn toy(ranks: usize, out: &Path, extra: &[&str]) -> Job {
    let steps = STEPS.to_string();
    let mut args = vec!["--out", out.to_str().unwrap(), "--steps", &steps];
    args.extend_from_slice(extra);
    let cmd = if ranks == 1 { single(&args) } else { torchrun(ranks, &args) };
    run_with_limit(cmd, LIMIT)
}

/// The `<h2>` headings of a report.html, in order.
fn sections(html: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(html).unwrap();
    text.split("<h2")
        .skip(1)
        .map(|s| s.split_once('>').unwrap().1.split('<').next().unwrap().to_string())
        .collect()
}

fn number(headers: &[String], row: &[String], name: &str) -> f64 {
    let i = headers.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
    row[i].parse().unwrap_or_else(|_| panic!("{name}={:?} is not a number", row[i]))
}

/// Every row of one rank's file: a whole step whose phases add up to it, with the
/// all-reduce of every gradient bucket in it.
fn check_rank_file(path: &Path, rank: usize, steps: usize) {
    let (headers, rows) = read_csv(path);
    assert_eq!(rows.len(), steps, "{}: one row per step", path.display());
    let phases = phase_columns();
    for (i, row) in rows.iter().enumerate() {
        let at = format!("{} row {i}", path.display());
        assert_eq!(number(&headers, row, "rank"), rank as f64, "{at}");
        assert_eq!(number(&headers, row, "global_step"), i as f64, "{at}: steps in order");
        assert_eq!(number(&headers, row, "warmup"), f64::from(u8::from(i < WARMUP)), "{at}");
        let step_s = number(&headers, row, "step_s");
        let sum: f64 = phases.iter().map(|p| number(&headers, row, p)).sum();
        // Each cell is rounded to 1 ns: eight of them differ from their sum by at most 4 ns.
        assert!((sum - step_s).abs() <= 4e-9, "{at}: phases add up to {sum}, step_s is {step_s}");
        for p in ["forward_s", "backward_s", "optimizer_s"] {
            assert!(number(&headers, row, p) > 0.0, "{at}: {p} was measured");
        }
        assert_eq!(
            number(&headers, row, "bytes") as u64,
            TOY_GRADIENT_BYTES,
            "{at}: every gradient byte, once"
        );
        let comm_s = number(&headers, row, "comm_s");
        assert!(comm_s > 0.0 && comm_s <= step_s, "{at}: comm_s {comm_s} within the step {step_s}");
        assert!(number(&headers, row, "comm_hidden_s") <= comm_s, "{at}");
        let start = number(&headers, row, "step_start_at_s");
        let (first, last) = (
            number(&headers, row, "comm_start_at_s"),
            number(&headers, row, "comm_last_start_at_s"),
        );
        assert!(
            start <= first && first <= last && last <= start + step_s,
            "{at}: the buckets' hand-overs lie in the step"
        );
        assert!(number(&headers, row, "loss").is_finite(), "{at}: the loss the script gave");
    }
}

#[test]
fn a_torchrun_script_with_the_recorder_reduces_like_a_ddpbench_run() {
    let d = tmp();
    let run = d.path().join("toy2");
    toy(2, &run, &[]).assert_ok();
    for r in 0..2 {
        check_rank_file(&run.join(format!("rank-{r:05}.csv")), r, STEPS);
    }
    let m = json(&run.join("manifest.json"));
    assert_eq!(m["status"], "completed");
    assert_eq!(m["gradient_bytes"].as_u64(), Some(TOY_GRADIENT_BYTES));
    let buckets: Vec<u64> = m["comm"]["bucket_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert!(buckets.len() >= 2, "0.25 MB buckets split the 340 kB of gradients: {buckets:?}");
    assert_eq!(buckets.iter().sum::<u64>(), TOY_GRADIENT_BYTES);
    let key = &m["comparison_key"];
    assert_eq!(
        (key["peer"].as_str(), key["model"].as_str()),
        (Some("pytorch-ddp-script"), Some("toy-mlp"))
    );
    assert_eq!(m["world_size"], 2);
    assert!(m["config"]["ddp"]["bucket_cap_mb"].as_f64() == Some(0.25), "{}", m["config"]);
    assert!(!run.join(".ddpbench.lock").exists(), "the lock goes when the recorder closes");
    // clock.csv: every rank at the start, after the epoch (the loader ran out) and at
    // close, each estimate between steps; rank 0's offset 0.
    let (h, rows) = read_csv(&run.join("clock.csv"));
    assert_eq!(col(&h, &rows, "rank"), [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
    assert_eq!(col(&h, &rows, "sync"), [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
    assert!(col(&h, &rows, "offset_s").iter().step_by(2).all(|o| *o == 0.0));
    let at = col(&h, &rows, "rank0_at_s");
    let (rh, rank0) = read_csv(&run.join("rank-00000.csv"));
    let last_step_end = {
        let r = rank0.last().unwrap();
        number(&rh, r, "step_start_at_s") + number(&rh, r, "step_s")
    };
    assert!(
        at[0] < number(&rh, &rank0[0], "step_start_at_s") && at[2] >= last_step_end && at[4] >= at[2],
        "estimates between steps: {at:?}, last step ended at {last_step_end}"
    );
    // clock_sync="ends": at the start and at close only.
    let ends = d.path().join("ends");
    toy(2, &ends, &["--clock-sync", "ends"]).assert_ok();
    let (h, rows) = read_csv(&ends.join("clock.csv"));
    assert_eq!(col(&h, &rows, "sync"), [0.0, 0.0, 1.0, 1.0]);

    // reduce: the run in its tables, and the report a ddpbench run of 2 ranks gets.
    let report = d.path().join("report");
    let job = ddpbench(&["reduce", run.to_str().unwrap(), "--out", report.to_str().unwrap()]);
    job.assert_ok();
    // Its 1-rank reference is the script under torchrun, not a ddpbench run.
    assert!(
        job.all().contains("`torchrun --nproc-per-node 1 ") && !job.all().contains("ddpbench train"),
        "{}",
        job.all()
    );
    let (h, rows) = read_csv(&report.join("summary.csv"));
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r[h.iter().position(|c| c == "run_id").unwrap()].as_str())
        .collect();
    assert_eq!(ids, ["toy2"], "{}", job.all());
    let (h, rows) = read_csv(&report.join("scaling.csv"));
    let model = h.iter().position(|c| c == "model").unwrap();
    assert!(rows.iter().any(|r| r[model] == "toy-mlp"), "{rows:?}");
    let own = d.path().join("own");
    let fixture = repo().join("tests/fixtures/schema4-967f27a/runs/two");
    ddpbench(&["reduce", fixture.to_str().unwrap(), "--out", own.to_str().unwrap()]).assert_ok();
    assert_eq!(sections(&report.join("report.html")), sections(&own.join("report.html")));
    for file in ["summary.csv", "scaling.csv", "ranks.csv", "times.csv", "report.md", "report.json"] {
        assert!(report.join(file).is_file(), "{file}");
    }
}

#[test]
fn a_script_that_fails_leaves_its_whole_steps_and_reduce_says_it_did_not_end() {
    let d = tmp();
    let run = d.path().join("crashed");
    let job = toy(2, &run, &["--crash-at", "12"]);
    assert!(!job.ok() && job.all().contains("crashed on purpose at step 12"), "{}", job.all());
    for r in 0..2 {
        check_rank_file(&run.join(format!("rank-{r:05}.csv")), r, 12);
        assert_eq!(json(&run.join(format!("rank-{r:05}.end.json")))["status"], "failed");
    }
    let m = json(&run.join("manifest.json"));
    assert_eq!(m["status"], "failed");
    let job = ddpbench(&["reduce", run.to_str().unwrap(), "--out", d.path().join("r").to_str().unwrap()]);
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.all().contains("status is failed") && job.all().contains("RuntimeError: crashed on purpose at step 12"),
        "{}",
        job.all()
    );
}

#[test]
fn bad_input_is_refused_with_what_to_do() {
    let d = tmp();
    for (misuse, says) in [
        ("no-ddp", "not wrapped in DistributedDataParallel"),
        ("no-optimizer", "no optimizer given"),
        ("no-sync", "a forward inside DDP's no_sync()"),
        ("backward-twice", "a second backward in one step"),
        ("clock-sync", "clock_sync='sometimes': give \"epochs\""),
        ("bad-scaler", "scaler is a str, not a torch.amp.GradScaler"),
    ] {
        let run = d.path().join(misuse);
        let args: &[&str] = if misuse == "clock-sync" {
            &["--clock-sync", "sometimes"]
        } else {
            &["--misuse", misuse]
        };
        let job = toy(1, &run, args);
        assert!(!job.ok(), "{misuse}: {}", job.all());
        assert!(
            job.all().contains("RecorderError") && job.all().contains(says),
            "{misuse}: {}",
            job.all()
        );
        if misuse == "backward-twice" {
            // Refused in the first step, which never finished: no row, a failed run.
            let (_, rows) = read_csv(&run.join("rank-00000.csv"));
            assert!(rows.is_empty(), "{rows:?}");
            assert_eq!(json(&run.join("manifest.json"))["status"], "failed");
        }
    }
    let run = d.path().join("twice");
    toy(1, &run, &[]).assert_ok();
    let before = std::fs::read(run.join("rank-00000.csv")).unwrap();
    let job = toy(1, &run, &[]);
    assert!(job.all().contains("already holds a run (manifest.json)"), "{}", job.all());
    assert_eq!(
        std::fs::read(run.join("rank-00000.csv")).unwrap(),
        before,
        "the run there is untouched"
    );
    // A folder the caller says it holds (a study's twin) must be locked by a live process.
    let held = d.path().join("held");
    std::fs::create_dir(&held).unwrap();
    let job = toy(1, &held, &["--caller-holds-folder"]);
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.all().contains("caller_holds_folder=True") && job.all().contains(".ddpbench.lock is missing"),
        "{}",
        job.all()
    );
    assert_eq!(std::fs::read_dir(&held).unwrap().count(), 0, "the recorder wrote nothing there");
}

/// With the script's GradScaler given, each row holds the scale its backward ran under
/// and whether the scaler skipped its optimizer step. Steps 0 and 3 overflow (their loss
/// times inf), so the scaler skips them on every rank; after a skip the scale halves,
/// after a step taken it stays (it grows only every 2,000 steps).
#[test]
fn a_grad_scalers_scale_and_skipped_steps_are_in_every_row() {
    let d = tmp();
    let run = d.path().join("scaled");
    toy(2, &run, &["--scaler", "--overflow-at", "0,3"]).assert_ok();
    let init = 2f64.powi(16);
    for r in 0..2 {
        let (h, rows) = read_csv(&run.join(format!("rank-{r:05}.csv")));
        assert_eq!(rows.len(), STEPS, "rank {r}");
        let scale = col(&h, &rows, "loss_scale");
        let skipped = col(&h, &rows, "step_skipped");
        let optimizer = col(&h, &rows, "optimizer_s");
        assert_eq!(scale[0], init, "rank {r}");
        let at: Vec<usize> = (0..rows.len()).filter(|&i| skipped[i] == 1.0).collect();
        assert_eq!(at, [0, 3], "rank {r}: the steps that overflowed");
        for i in 1..rows.len() {
            let expected = if skipped[i - 1] == 1.0 { scale[i - 1] / 2.0 } else { scale[i - 1] };
            assert_eq!(scale[i], expected, "rank {r} step {i}: {scale:?} {skipped:?}");
        }
        for i in 0..rows.len() {
            assert_eq!(
                skipped[i] == 1.0,
                optimizer[i] == 0.0,
                "rank {r} step {i}: an optimizer time on a skipped step"
            );
        }
        assert_eq!(scale[rows.len() - 1], init / 4.0, "rank {r}");
    }
    let m = json(&run.join("manifest.json"));
    assert!(
        m["config"]["loss_scale"].as_str().unwrap().contains("GradScaler's scale"),
        "{}",
        m["config"]
    );
    let report = d.path().join("report");
    ddpbench(&["reduce", run.to_str().unwrap(), "--out", report.to_str().unwrap()]).assert_ok();
}

/// A lock the Python recorder holds is one ddpbench judges live (it names the holder and
/// refuses the folder); once that process is killed outright, stale (ddpbench clears it).
#[test]
fn ddpbench_judges_the_python_recorders_lock_live_then_stale() {
    use std::os::unix::process::CommandExt;
    let d = tmp();
    let source = d.path().join("done");
    toy(1, &source, &[]).assert_ok();
    let held = d.path().join("held");
    let mut holder = single(&["--out", held.to_str().unwrap(), "--steps", "4", "--hold-s", "120"]);
    let mut child = holder
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let lock = held.join(".ddpbench.lock");
    let started = std::time::Instant::now();
    while !(lock.exists() && held.join("manifest.json").exists()) {
        assert!(started.elapsed() < LIMIT, "the recorder took no lock");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = json(&lock)["pid"].as_u64().unwrap();
    let reduce = || ddpbench(&["reduce", source.to_str().unwrap(), "--out", held.to_str().unwrap()]);
    let job = reduce();
    // The holder itself, then its process group.
    assert_eq!(pid, u64::from(child.id()), "the lock names the script's process");
    let killed = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    assert_eq!(killed, 0, "pid {pid} runs");
    assert!(!job.ok(), "{}", job.all());
    assert!(
        job.all().contains("is being written by another ddpbench job") && job.all().contains(&format!("pid {pid} on ")),
        "{}",
        job.all()
    );
    // The holder is gone (SIGKILL: its lock stays behind): ddpbench clears the lock.
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(started.elapsed() < LIMIT, "pid {pid} outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(lock.exists(), "SIGKILL leaves the lock");
    let job = reduce();
    job.assert_ok();
    assert!(held.join("report.html").is_file() && !lock.exists(), "{}", job.all());
}

/// `noise_every=2`: every second step's row holds the gradient noise scale's two squared
/// norms, taken in the communication hook, and they equal the ones the script computes
/// itself (this rank's gradient by a copy of the network, the mean from the parameters'
/// gradients after DDP). Both sides sum the same float32 gradients in float64, in
/// another order: they agree to about 1e-15 relative, so 1e-9 holds on any CPU, while a
/// norm taken after DDP's division by the world size (a quarter of the squared norm) or
/// a bucket left out would be off by far more. The other rows' cells are empty, and
/// `reduce` reads the folder.
#[test]
fn the_noise_scales_norms_are_taken_in_the_comm_hook_every_kth_step() {
    let d = tmp();
    let run = d.path().join("noisy");
    let check = d.path().join("norms");
    toy(2, &run, &["--noise-every", "2", "--check-norms", check.to_str().unwrap()]).assert_ok();
    let m = json(&run.join("manifest.json"));
    assert_eq!(m["comparison_key"]["noise_scale"], "every:2", "{}", m["comparison_key"]);
    for rank in 0..2 {
        let (h, rows) = read_csv(&run.join(format!("rank-{rank:05}.csv")));
        let own: Vec<serde_json::Value> = std::fs::read_to_string(format!("{}-{rank}.jsonl", check.display()))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(own.len(), STEPS / 2, "the script's own norms, every second step");
        let cell = |row: &[String], name: &str| row[h.iter().position(|c| c == name).unwrap()].clone();
        for (i, row) in rows.iter().enumerate() {
            let at = format!("rank {rank} row {i}");
            if i % 2 == 1 {
                for c in ["noise_batch_small", "grad_sq_small", "noise_batch_big", "grad_sq_big"] {
                    assert_eq!(cell(row, c), "", "{at}: {c} empty off the noise steps");
                }
                continue;
            }
            let o = &own[i / 2];
            assert_eq!(o["step"].as_u64(), Some(i as u64), "{at}");
            assert_eq!(
                (cell(row, "noise_batch_small"), cell(row, "noise_batch_big")),
                ("32".into(), "64".into()),
                "{at}"
            );
            for (c, key) in [("grad_sq_small", "local"), ("grad_sq_big", "mean")] {
                let (got, want) = (number(&h, row, c), o[key].as_f64().unwrap());
                assert!((got - want).abs() <= 1e-9 * want, "{at}: {c} {got} against the script's own {want}");
            }
            assert!(
                number(&h, row, "grad_sq_big") < number(&h, row, "grad_sq_small"),
                "{at}: averaging shrinks noise"
            );
        }
    }
    ddpbench(&[
        "reduce",
        "--no-plots",
        run.to_str().unwrap(),
        "--out",
        d.path().join("r").to_str().unwrap(),
    ])
    .assert_ok();
}
