//! The run to add: the exact `train` command that gives a point its 1-rank reference.
//!
//! It is the point's own settings (its manifest's `config`, one entry per flag as given)
//! with 1 rank, the reference's batch, and every field of the point's comparison key
//! pinned to the value that ran ([`ComparisonKey::flags`]): a setting that resolved by
//! itself (`--overlap on` that turned itself off, the threads a binding gave, the backend
//! `auto` chose) would resolve differently on 1 rank. `--node-slots` keeps the 1-rank
//! run's share of a node the same as each rank of the point had, and the environment the
//! key holds is set again, so the new run gets the point's key.

use super::RunStats;
use crate::record::key::KeyFlag;
use crate::record::ComparisonKey;
use serde_json::{Map, Value};

/// A point's 1-rank reference as a command: all of it, and what it changes of the point's
/// own settings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReferenceCommand {
    /// `[NAME=value ... ]mpirun [-x NAME ...] -n 1 ddpbench train <flags>`, flags at their
    /// default left out, values quoted for a POSIX shell where they need it.
    pub command: String,
    /// The flags whose value differs from the point's (`--batch-size 64`, `--threads 1`).
    pub changes: Vec<String>,
    /// The environment the key holds (`NAME=value`), unquoted.
    pub env: Vec<String>,
    /// The `train` flags of `command` in its order, unquoted: each flag with its value,
    /// or with "" for a switch.
    pub flags: Vec<(String, String)>,
}

impl ReferenceCommand {
    /// The command in backticks, then what it changes: a sentence's part.
    pub(crate) fn describe(&self) -> String {
        if self.changes.is_empty() {
            format!("`{}` (the point's settings on 1 rank)", self.command)
        } else {
            format!(
                "`{}` (the point's settings on 1 rank, with {})",
                self.command,
                self.changes.join(", ")
            )
        }
    }
}

/// A setting's value as a command line gives it; None for a switch that is off or a
/// setting left at nothing.
fn arg(v: &Value) -> Option<String> {
    match v {
        Value::Null | Value::Bool(false) => None,
        Value::Bool(true) => Some(String::new()),
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `s` quoted for a POSIX shell when it holds anything but plain characters.
pub(crate) fn quoted(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command of a 1-rank run with `batch_size` samples per step (per micro-batch) that
/// has `key`, the comparison key of `run`'s point (whose config it starts from).
pub(crate) fn reference_command(run: &RunStats, key: &ComparisonKey, batch_size: usize) -> ReferenceCommand {
    let m = &run.manifest;
    if key.peer == Some(crate::record::Twin::PytorchDdpScript) {
        return script_command(&m.command_line, batch_size);
    }
    let defaults = crate::record::train_defaults();
    let given = m.config.as_object().cloned().unwrap_or_default();
    // The point's settings that are flags of this binary, without where its files went.
    let mut settings: Map<String, Value> = given
        .iter()
        .filter(|(k, _)| defaults.contains_key(*k) && k.as_str() != "out")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // A manifest without them (none `train` writes): the key's names.
    settings.entry("model").or_insert_with(|| Value::String(key.model.clone()));
    settings.entry("dataset").or_insert_with(|| Value::String(key.dataset.clone()));
    let mut set = |flag: &str, v: Value| {
        settings.insert(flag.trim_start_matches("--").replace('-', "_"), v);
    };
    set("--batch-size", Value::from(batch_size));
    for f in key.flags() {
        match f {
            KeyFlag::Value(flag, v) => set(flag, Value::String(v)),
            KeyFlag::Switch(flag, on) => set(flag, Value::Bool(on)),
        }
    }
    // Each rank of the point had 1 / (ranks per node) of a node's cores: so does this run.
    let per_node = m.world_size / m.nodes.max(1);
    let slots = given.get("node_slots").and_then(Value::as_u64).unwrap_or(1).max(per_node as u64);
    if slots > 1 {
        set("--node-slots", Value::from(slots));
    }
    let mut args = Vec::new();
    let mut flags = Vec::new();
    let mut changes = Vec::new();
    for (k, v) in &settings {
        let flag = format!("--{}", k.replace('_', "-"));
        let Some(value) = arg(v) else { continue };
        let said = if value.is_empty() {
            flag.clone()
        } else {
            format!("{flag} {}", quoted(&value))
        };
        // What the point ran with: its own setting, or the default where it had none.
        if given.get(k).or_else(|| defaults.get(k)).and_then(arg).as_ref() != Some(&value) {
            changes.push(said.clone());
        }
        // The model, the data set and the batch are said even at their default.
        if ["model", "dataset", "batch_size"].contains(&k.as_str()) || defaults.get(k).and_then(arg).as_ref() != Some(&value) {
            args.push(said);
            flags.push((flag, value));
        }
    }
    for (k, v) in given.iter().filter(|(k, _)| settings.contains_key(*k)) {
        // A switch the point gave and the reference leaves off.
        if arg(v).is_some_and(|a| a.is_empty()) && settings.get(k).and_then(arg).is_none() {
            changes.push(format!("no --{}", k.replace('_', "-")));
        }
    }
    let names: Vec<&str> = key.env.iter().filter_map(|e| e.split_once('=').map(|(n, _)| n)).collect();
    let mut command = String::new();
    for e in &key.env {
        command.push_str(&quoted(e));
        command.push(' ');
    }
    command.push_str("mpirun");
    for n in &names {
        command.push_str(&format!(" -x {n}"));
    }
    command.push_str(" -n 1 ddpbench train ");
    command.push_str(&args.join(" "));
    ReferenceCommand {
        command,
        changes,
        env: key.env.clone(),
        flags,
    }
}

/// A DDP script's 1-rank reference (`python/ddpbench_record`): the script as its run
/// was started (`command_line`: the Python, the script, its arguments) under
/// `torchrun --nproc-per-node 1`, with `batch_size` samples per step and another folder.
fn script_command(command_line: &[String], batch_size: usize) -> ReferenceCommand {
    let script: Vec<String> = command_line.iter().skip(1).map(|a| quoted(a)).collect();
    ReferenceCommand {
        command: format!("torchrun --nproc-per-node 1 {}", script.join(" ")),
        changes: vec![
            format!("batch_size={batch_size} per rank in the script and its Recorder"),
            "another `out` for the Recorder".into(),
        ],
        // Not a `train` command: no flags of ddpbench's, and the script's own environment.
        env: Vec::new(),
        flags: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_for_a_shell_only_where_needed() {
        assert_eq!(quoted("/data/mnist"), "/data/mnist");
        assert_eq!(quoted("DDPBENCH_SLOW_FORWARD=1:30"), "DDPBENCH_SLOW_FORWARD=1:30");
        assert_eq!(quoted("my data"), "'my data'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
        let defaults = crate::record::train_defaults();
        assert!(defaults.contains_key("batch_size") && defaults.contains_key("node_slots"));
    }

    /// A DDP script's reference is the script itself on 1 rank, never `ddpbench train`.
    #[test]
    fn a_ddp_scripts_reference_is_the_script_under_torchrun_on_one_rank() {
        let line: Vec<String> = ["/venv/bin/python3", "train.py", "--out", "results/my job"]
            .map(String::from)
            .to_vec();
        let c = script_command(&line, 64);
        assert_eq!(c.command, "torchrun --nproc-per-node 1 train.py --out 'results/my job'");
        assert!(
            c.describe().contains("batch_size=64 per rank") && c.describe().contains("another `out`"),
            "{}",
            c.describe()
        );
    }
}
