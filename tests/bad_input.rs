//! Bad input never hangs: each case exits non-zero on every rank, with a message
//! that says what is wrong, within a time bound.

// tier: beside (needs no quiet machine and leaves a core free: job-scripts/run-tests.sh runs this file beside the others)

mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// Every rank printed `rank-exit <r> <non-zero>`, and the message appeared.
fn assert_fails_everywhere(job: &Job, message: &str) {
    assert!(!job.timed_out, "hung: killed after {:?}\n{}", job.elapsed, job.all());
    assert!(job.elapsed < LIMIT);
    let all = job.all();
    assert!(all.contains(message), "expected {message:?} in:\n{all}");
    assert_eq!(all.matches(message).count(), 1, "printed once, not once per rank:\n{all}");
    assert!(
        !all.contains("panicked") && !all.contains("RUST_BACKTRACE"),
        "a panic reached the user:\n{all}"
    );
    for r in 0..2 {
        let line = all
            .lines()
            .find(|l| l.starts_with(&format!("rank-exit {r} ")))
            .unwrap_or_else(|| panic!("rank {r} reported no exit status:\n{all}"));
        let code: i32 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_ne!(code, 0, "rank {r} exited 0:\n{all}");
    }
}

/// Runs in a fresh working folder, so the default results/<run-id>/ would land there.
fn fails(args: &[&str], message: &str) {
    let cwd = tmp();
    let job = train_reporting_exits_in(cwd.path(), 2, args, &[], LIMIT);
    assert_fails_everywhere(&job, message);
    let results = cwd.path().join("results");
    let left: Vec<_> = std::fs::read_dir(&results)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a failed set-up left run folders behind: {left:?}");
}

fn write_idx(path: &std::path::Path, magic: u32, dims: &[u32], payload: usize) {
    let mut bytes = magic.to_be_bytes().to_vec();
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.resize(bytes.len() + payload, 0);
    std::fs::write(path, bytes).unwrap();
}

/// An MNIST-format folder of `n` blank images; `corrupt` edits one file.
fn idx_dir(n: u32, corrupt: impl Fn(&std::path::Path)) -> tempfile::TempDir {
    let d = tmp();
    for prefix in ["train", "t10k"] {
        write_idx(
            &d.path().join(format!("{prefix}-images-idx3-ubyte")),
            0x803,
            &[n, 28, 28],
            (n * 784) as usize,
        );
        write_idx(&d.path().join(format!("{prefix}-labels-idx1-ubyte")), 0x801, &[n], n as usize);
    }
    corrupt(d.path());
    d
}

#[test]
fn unknown_model_and_dataset() {
    fails(&["--model", "resnet999"], "invalid value 'resnet999' for '--model");
    fails(&["--dataset", "imagenet22k"], "invalid value 'imagenet22k' for '--dataset");
}

#[test]
fn batch_size_zero() {
    fails(&["--batch-size", "0"], "--batch-size 0: must be 1 to 1048576 samples per rank");
}

/// Impossible or absurd values are refused before anything runs, each with the flag and
/// its limit: overflowing counts, NaN, more threads than the node has, negative rates.
#[test]
fn impossible_values_are_refused_with_their_limits() {
    for (args, message) in [
        (
            &["--batch-size", "9223372036854775808", "--grad-accum", "2"][..],
            "--batch-size 9223372036854775808: must be 1 to 1048576",
        ),
        (
            &["--epochs", "9223372036854775808", "--batch-size", "15000"][..],
            "--epochs 9223372036854775808: must be 1 to 1000000",
        ),
        (&["--threads", "4294967296"][..], "--threads 4294967296: must be 1 to"),
        (&["--threads", "1000"][..], "--threads 1000: must be 1 to"),
        (&["--workers", "100000"][..], "--workers 100000: must be 0 to"),
        (&["--momentum", "nan"][..], "--momentum NaN: must be a momentum from 0 to 1"),
        (&["--lr", "-0.01"][..], "--lr -0.01: must be a learning rate above 0"),
        (&["--bucket-mb", "inf"][..], "--bucket-mb inf: must be MiB above 0"),
        (
            &["--node-type", "a|b"][..],
            "--node-type \"a|b\": must be printable text without '|'",
        ),
    ] {
        fails(args, message);
    }
}

#[test]
fn missing_data() {
    fails(
        &["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"],
        "/nonexistent/mnist: not found",
    );
    let d = idx_dir(10, |p| std::fs::remove_file(p.join("t10k-labels-idx1-ubyte")).unwrap());
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "t10k-labels-idx1-ubyte[.gz]: not found",
    );
}

#[test]
fn corrupt_data_files() {
    let d = idx_dir(10, |p| write_idx(&p.join("train-images-idx3-ubyte"), 0x1234, &[10, 28, 28], 7840));
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "not an IDX file (magic 0x00001234",
    );
    let d = idx_dir(10, |p| write_idx(&p.join("train-images-idx3-ubyte"), 0x803, &[10, 28, 28], 100));
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "truncated: header says 7840 bytes of data, the file holds 100",
    );
    let d = idx_dir(10, |p| {
        std::fs::write(p.join("train-labels-idx1-ubyte"), [0x1f, 0x8b, 8, 0, 1, 2]).unwrap()
    });
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "gzip data is corrupt or truncated",
    );
}

/// IDX files whose header lies or whose images are not MNIST's are named, not a
/// libtorch shape error at the first forward pass.
#[test]
fn idx_headers_that_cannot_be_mnist() {
    let d = idx_dir(0, |_| {});
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "holds no images (its header says 0)",
    );
    let d = idx_dir(10, |p| write_idx(&p.join("train-images-idx3-ubyte"), 0x803, &[10, 32, 32], 10240));
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "holds 32×32 images; MNIST-format data sets have 28×28",
    );
    let d = idx_dir(10, |p| {
        write_idx(&p.join("train-images-idx3-ubyte"), 0x803, &[u32::MAX, u32::MAX, u32::MAX], 16)
    });
    fails(
        &["--dataset", "mnist", "--data-dir", &path_str(d.path())],
        "describe more bytes than any file holds",
    );
}

/// A folder the user made for the run stays when set-up fails; only one ddpbench
/// created goes.
#[test]
fn a_users_own_out_folder_survives_a_failed_set_up() {
    let d = tmp();
    let mine = d.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    fails(
        &["--dataset", "mnist", "--data-dir", "/nonexistent/mnist", "--out", &path_str(&mine)],
        "/nonexistent/mnist: not found",
    );
    assert!(mine.is_dir(), "the user's folder was removed");
}

/// The run folder's name is the run id, which `reduce` uses as a file name: a name
/// with characters beyond letters, digits, `.`, `_` and `-` is refused before training.
#[test]
fn an_out_folder_whose_name_cannot_be_a_run_id_is_refused() {
    let d = tmp();
    let out = d.path().join("my run");
    fails(
        &["--out", &path_str(&out), "--max-steps", "1"],
        "the run folder's name is the run id, and it holds ' '",
    );
    assert!(!out.exists());
}

#[test]
fn output_folder_unwritable_or_taken() {
    fails(
        &["--out", "/proc/ddpbench-cannot-be-here", "--max-steps", "1"],
        "cannot create output folder /proc/ddpbench-cannot-be-here",
    );
    let d = tmp();
    std::fs::write(d.path().join("manifest.json"), "{}").unwrap();
    fails(
        &["--out", &path_str(d.path()), "--max-steps", "1"],
        "already holds a run (manifest.json)",
    );
}

#[test]
fn a_failing_rank_takes_the_job_down() {
    let d = tmp();
    let out = d.path().join("run");
    let job = train_reporting_exits(
        2,
        &["--max-steps", "50", "--val-samples", "0", "--out", &path_str(&out)],
        &[("DDPBENCH_FAULT", "1:3")],
        LIMIT,
    );
    assert!(!job.timed_out, "hung after a rank failed:\n{}", job.all());
    let all = job.all();
    assert!(
        all.contains("Error on rank 1") && all.contains("fault injected by DDPBENCH_FAULT at step 3"),
        "{all}"
    );
    assert!(
        !all.contains("rank-exit 0 0") && !all.contains("rank-exit 1 0"),
        "no rank may succeed:\n{all}"
    );
    // The failing rank records the failure before it aborts the job: the manifest and
    // its end record say failed, where and why; the 3 steps before it are on disk.
    let m = json(&out.join("manifest.json"));
    assert_eq!(m["status"], "failed");
    let error = m["error"].as_str().unwrap();
    assert!(
        error.starts_with("rank 1 (") && error.contains("at step 3: fault injected"),
        "{error}"
    );
    // Rank 1 marks the manifest rank 0 wrote: every rank's placement stays in it.
    assert_eq!(m["ranks"].as_array().map(Vec::len), Some(2), "{m}");
    let end = json(&out.join("rank-00001.end.json"));
    assert_eq!((end["status"].as_str(), end["steps"].as_u64()), (Some("failed"), Some(3)));
    let (_, rows) = read_csv(&out.join("rank-00001.csv"));
    assert_eq!(rows.len(), 3);
}

/// An error every rank holds ends the job without MPI_Abort: one message, rank 0's,
/// the last line ddpbench prints (only the launcher's notice of a non-zero exit comes
/// after it), and the same non-zero exit status on every rank.
#[test]
fn an_agreed_error_is_the_last_line_printed_and_aborts_nothing() {
    let message = "Error: /nonexistent/mnist: not found";
    let cwd = tmp();
    let job = train_reporting_exits_in(
        cwd.path(),
        2,
        &["--dataset", "mnist", "--data-dir", "/nonexistent/mnist"],
        &[],
        LIMIT,
    );
    assert_fails_everywhere(&job, message);
    assert!(!job.all().contains("MPI_ABORT was invoked"), "{}", job.all());
    let all = job.all();
    let codes: Vec<&str> = all
        .lines()
        .filter_map(|l| l.strip_prefix("rank-exit ").and_then(|l| l.split(' ').nth(1)))
        .collect();
    assert_eq!(codes, ["1", "1"], "{}", job.all());
    // Open MPI's notice starts with a line of dashes; the shell adds the rank-exit lines.
    let ours: Vec<&str> = job
        .stderr
        .lines()
        .take_while(|l| !l.starts_with("-----"))
        .filter(|l| !l.starts_with("rank-exit "))
        .collect();
    assert!(ours.last().is_some_and(|l| l.starts_with(message)), "{}", job.stderr);
}
