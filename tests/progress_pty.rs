//! Progress bars, for real: `mpirun -n 2` under a pseudo-terminal (util-linux `script`)
//! draws rank 0's bars, and only rank 0's, with log lines on lines of their own; with
//! stderr a file no control character reaches it.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

/// Runs `mpirun -n 2 ddpbench <args>` under `script`, a pseudo-terminal of 120 columns,
/// and returns everything the terminal received.
fn under_terminal(d: &Path, args: &[&str]) -> String {
    under_terminal_with(d, true, args, &[])
}

/// [`under_terminal`], launched by `mpirun -n 2` or not (one process, no launcher),
/// with `env` set for it.
fn under_terminal_with(d: &Path, launched: bool, args: &[&str], env: &[(&str, &str)]) -> String {
    let mpirun = mpirun_cmd(2);
    let mut line: Vec<String> = vec!["stty cols 120;".into()];
    if launched {
        line.push("mpirun".into());
        line.extend(mpirun.get_args().map(|a| format!("'{}'", a.to_string_lossy())));
    }
    line.push(format!("'{BIN}'"));
    line.extend(args.iter().map(|a| format!("'{a}'")));
    let typescript = d.join("typescript");
    let mut cmd = Command::new("script");
    cmd.args(["-qfec", &line.join(" "), &path_str(&typescript)]);
    for (k, v) in mpirun.get_envs() {
        cmd.env(k, v.unwrap());
    }
    cmd.envs(env.iter().copied());
    run_with_limit(cmd, LIMIT).assert_ok();
    String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned()
}

/// A short run's arguments, into `d`/`name`.
fn short_run(d: &Path, name: &str) -> Vec<String> {
    let out = path_str(&d.join(name));
    [
        "train",
        "--max-steps",
        "8",
        "--log-every",
        "3",
        "--val-samples",
        "100",
        "--out",
        &out,
    ]
    .map(String::from)
    .to_vec()
}

/// Every log line (`INFO`) of `text` starts on a line of its own: after the bar's last
/// redraw on that line is cleared (`\r` ESC[2K), the timestamp comes first, and no
/// bar text follows it.
fn assert_log_lines_whole(text: &str) {
    let mut logs = 0;
    for line in text.split('\n').filter(|l| l.contains(" INFO ")) {
        let after = line.rsplit("\x1b[2K").next().unwrap().trim_start_matches('\r');
        assert!(after.starts_with("20"), "a log line shares its line with a bar: {line:?}");
        assert!(!after.contains("ETA"), "a bar drawn inside a log line: {line:?}");
        logs += 1;
    }
    assert!(logs > 0, "no log line reached the terminal: {text:?}");
}

#[test]
fn rank_0_draws_an_epoch_bar_under_a_terminal_and_rank_1_none() {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let text = under_terminal(
        d.path(),
        &[
            "train",
            "--max-steps",
            "8",
            "--log-every",
            "3",
            "--val-samples",
            "100",
            "--out",
            &out,
        ],
    );
    assert!(text.contains("rank 0 · epoch 1/1 ["), "no epoch bar: {text:?}");
    for part in ["/8 steps", "steps/s", "samples/s", "loss ", "ETA "] {
        assert!(text.contains(part), "the bar lacks {part:?}: {text:?}");
    }
    // Redraws are rate-limited: some step after the first is drawn, not each.
    assert!(
        (1..=8).any(|k| text.contains(&format!("] {k}/8 steps"))),
        "the bar never moved: {text:?}"
    );
    assert!(!text.contains("rank 1 ·"), "rank 1 drew a bar: {text:?}");
    assert_log_lines_whole(&text);
    assert!(text.contains("epoch 0: 8 steps in"), "{text:?}");
}

#[test]
fn rank_0_draws_a_bar_over_the_sizes_of_an_allreduce_sweep() {
    let d = tmp();
    let out = path_str(&d.path().join("sw"));
    let text = under_terminal(
        d.path(),
        &[
            "allreduce",
            "--min-bytes",
            "8",
            "--max-bytes",
            "32K",
            "--factor",
            "4",
            "--iters",
            "4",
            "--warmup-iters",
            "1",
            "--out",
            &out,
        ],
    );
    assert!(text.contains("rank 0 · all-reduce mpi on host memory ["), "no sweep bar: {text:?}");
    assert!(text.contains("/7 sizes"), "8 B to 32 KiB by 4 is 7 sizes: {text:?}");
    assert!(!text.contains("rank 1 ·"), "rank 1 drew a bar: {text:?}");
}

#[test]
fn with_stderr_a_file_no_control_characters_reach_it() {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let job = train(
        2,
        &["--max-steps", "8", "--log-every", "3", "--val-samples", "100", "--out", &out],
        LIMIT,
    );
    job.assert_ok();
    assert!(job.stderr.contains("epoch 0 step 2/"), "the log lines stay: {}", job.stderr);
    assert!(job.stderr.contains("epoch 0: 8 steps in"), "{}", job.stderr);
    let bad: Vec<&str> = job.stderr.lines().filter(|l| l.contains(['\x1b', '\r'])).collect();
    assert!(bad.is_empty(), "control characters in the log: {bad:?}");
    assert!(!job.stderr.contains("ETA"), "a bar in the log: {}", job.stderr);
}

#[test]
fn rank_0_draws_a_bar_over_a_studys_points_above_each_points_epoch_bar() {
    let d = tmp();
    let file = d.path().join("bar.toml");
    std::fs::write(
        &file,
        "name = \"bar\"\nmodels = [\"mnist-cnn\"]\ndatasets = [\"fashion-mnist\"]\nbatch_sizes = [32]\n\
         scaling = \"weak\"\nrepeat = 1\nmax_steps = 6\nval_samples = 64\nprobe_iters = 0\n",
    )
    .unwrap();
    let out = path_str(&d.path().join("study"));
    let text = under_terminal(d.path(), &["study", &path_str(&file), "--out", &out]);
    // Ladder [1, 2]: two points, each a run with its own epoch bar.
    assert!(text.contains("rank 0 · study ["), "no study bar: {text:?}");
    assert!(
        text.contains("] 0/2 points · point 000-") && text.contains("] 1/2 points · point 001-"),
        "{text:?}"
    );
    assert!(text.contains("rank 0 · epoch 1/1 ["), "no epoch bar inside the study: {text:?}");
    assert!(!text.contains("rank 1 ·"), "rank 1 drew a bar: {text:?}");
    assert_log_lines_whole(&text);
}

#[test]
fn a_dumb_terminal_gets_no_escape_sequence() {
    let d = tmp();
    for (launched, name) in [(true, "launched"), (false, "alone")] {
        let args = short_run(d.path(), name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = under_terminal_with(d.path(), launched, &args, &[("TERM", "dumb")]);
        assert!(text.contains("epoch 0: 8 steps in"), "the log lines stay: {text:?}");
        let escapes = text.matches('\x1b').count();
        assert_eq!(escapes, 0, "{name}: {escapes} escape sequences on TERM=dumb: {text:?}");
    }
}

#[test]
fn no_color_takes_the_colours_and_leaves_the_bars() {
    let d = tmp();
    let args = short_run(d.path(), "run");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = under_terminal_with(d.path(), false, &args, &[("TERM", "xterm"), ("NO_COLOR", "1")]);
    assert!(text.contains("epoch 1/1 ["), "no epoch bar: {text:?}");
    // Colours are SGR sequences: ESC [ digits and semicolons, ending in m.
    let sgr = text.split('\x1b').skip(1).filter(|s| {
        let body = s.strip_prefix('[').unwrap_or("");
        let end = body.find(|c: char| !c.is_ascii_digit() && c != ';');
        end.is_some_and(|i| body[i..].starts_with('m'))
    });
    assert_eq!(sgr.count(), 0, "colours despite NO_COLOR: {text:?}");
}

/// Validation draws a bar of rank 0's share of the test samples, and a log line says
/// how many are validated and why.
#[test]
fn rank_0_draws_a_validation_bar_and_says_what_it_validates() {
    let d = tmp();
    let out = path_str(&d.path().join("run"));
    let text = under_terminal(d.path(), &["train", "--max-steps", "2", "--val-samples", "10000", "--out", &out]);
    assert!(text.contains("rank 0 · validation ["), "no validation bar: {text:?}");
    assert!(
        text.contains("/5000 samples (rank 0's share)"),
        "10,000 samples over 2 ranks: {text:?}"
    );
    assert!(!text.contains("rank 1 ·"), "rank 1 drew a bar: {text:?}");
    assert!(
        text.contains("validating on 10000 of 10000 test samples (--val-samples)"),
        "{text:?}"
    );
    assert_log_lines_whole(&text);
}
