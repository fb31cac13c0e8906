//! What `train` accepts but warns of, on real `mpirun -n 2` jobs on CPU: each warning
//! printed once by rank 0 and recorded in the manifest; and validation bounded by what
//! the epoch trained.

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn codes(m: &serde_json::Value) -> Vec<String> {
    m["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings list: {m}"))
        .iter()
        .map(|w| w["code"].as_str().unwrap().to_string())
        .collect()
}

/// fp16 autocast on CPU, 2 measured steps of the 20 asked, and a Slurm allocation of
/// more CPUs per task than the rank was given: three warnings, each printed once, in
/// the manifest with whether it invalidates the run. Validation takes the 48 samples
/// the epoch trained (3 steps × 8 × 2 ranks), not the 200 of the test split.
#[test]
fn accepted_misconfigurations_are_warned_of_once_and_recorded() {
    let dir = tmp();
    let out = dir.path().join("run");
    let mut cmd = mpirun_cmd_with_env(2, &[("SLURM_CPUS_PER_TASK", "4096")]);
    cmd.arg(BIN).arg("train").args([
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "1200",
        "--batch-size",
        "8",
        "--amp",
        "fp16",
        "--max-steps",
        "3",
        "--warmup-steps",
        "1",
        "--probe-iters",
        "1",
        "--out",
        &path_str(&out),
    ]);
    let job = run_with_limit(cmd, LIMIT);
    job.assert_ok();
    let m = json(&out.join("manifest.json"));
    assert_eq!(
        codes(&m),
        ["fp16_on_cpu", "too_few_measured_steps", "fewer_cores_than_allocated"],
        "{m}"
    );
    let w = m["warnings"].as_array().unwrap();
    let invalidates: Vec<bool> = w.iter().map(|w| w["invalidates_direction"].as_bool().unwrap()).collect();
    assert_eq!(invalidates, [false, true, false]);
    let all = job.all();
    for w in w {
        let message = w["message"].as_str().unwrap();
        assert_eq!(all.matches(message).count(), 1, "printed once, by rank 0: {message}\n{all}");
    }
    assert!(all.contains("--amp bf16"), "{all}");
    assert!(
        all.contains("2 measured step(s) per rank (3 in all, 1 of warm-up), fewer than --min-measured-steps 20"),
        "{all}"
    );
    assert!(
        all.contains("fewer than the 4096 Slurm allocated per task (SLURM_CPUS_PER_TASK)"),
        "{all}"
    );
    let (h, rows) = read_csv(&out.join("epochs.csv"));
    assert_eq!(col(&h, &rows, "val_samples"), vec![48.0]);
    assert!(
        all.contains("validating on 48 of 200 test samples (as many as the epoch trained"),
        "{all}"
    );
}

/// The same kind of run without any of those: no warning; `--min-measured-steps` lowers
/// the threshold, and `--val-samples` still sets the validation's size.
#[test]
fn a_run_without_misconfigurations_carries_no_warning() {
    let dir = tmp();
    let out = dir.path().join("run");
    let job = train(
        2,
        &[
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "1200",
            "--batch-size",
            "8",
            "--max-steps",
            "3",
            "--warmup-steps",
            "1",
            "--min-measured-steps",
            "2",
            "--val-samples",
            "100",
            "--probe-iters",
            "1",
            "--out",
            &path_str(&out),
        ],
        LIMIT,
    );
    job.assert_ok();
    let m = json(&out.join("manifest.json"));
    assert_eq!(codes(&m), Vec::<String>::new(), "{m}");
    let (h, rows) = read_csv(&out.join("epochs.csv"));
    assert_eq!(col(&h, &rows, "val_samples"), vec![100.0]);
    assert!(
        job.all().contains("validating on 100 of 200 test samples (--val-samples)"),
        "{}",
        job.all()
    );
}
