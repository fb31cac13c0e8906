//! Every rank of a job must be started with the same command and flags: ranks that
//! disagree on `--max-steps` or `--bucket-mb` make different collectives and hang the
//! job (an MPMD launch, `mpirun -n 1 ddpbench train --max-steps 10 : -n 1 ddpbench train
//! --max-steps 20`, or a script that builds each rank's line). Each command names the
//! flags that may differ per rank (such as `train --node-type`) and every other flag is
//! compared at start-up ([`check_same_on_every_rank`]): one hash per rank, all-reduced;
//! only when they differ are the differing flags found and named, once, by rank 0.

use crate::world::{agree, broadcast_string, gather_strings, Group};
use anyhow::{anyhow, Result};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The name a difference in the command itself is reported under.
const COMMAND: &str = "the command";
/// Flags a refusal names at most, and values per flag.
const FLAGS_LISTED: usize = 6;
const VALUES_LISTED: usize = 4;

/// What one rank was started to do, as compared with every other rank: the command and
/// the value of each flag but those that may differ per rank.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LaunchFlags {
    command: String,
    /// `--max-steps` → its value as this rank parsed it.
    values: BTreeMap<String, Value>,
    /// The flags left out (they may differ per rank), for the refusal's hint.
    #[serde(skip)]
    rank_local: Vec<String>,
}

impl LaunchFlags {
    /// `command` with no flag compared yet; `rank_local` holds (flag, why it may differ).
    pub(crate) fn new(command: &str, rank_local: &[(&str, &str)]) -> LaunchFlags {
        LaunchFlags {
            command: command.into(),
            values: BTreeMap::new(),
            rank_local: rank_local.iter().map(|(f, _)| f.to_string()).collect(),
        }
    }

    /// The flags of `command` from `config` serialized flat, one field per flag
    /// (`max_steps` is `--max-steps`), but those in `rank_local`.
    pub(crate) fn from_fields(command: &str, config: &impl Serialize, rank_local: &[(&str, &str)]) -> LaunchFlags {
        let mut flags = LaunchFlags::new(command, rank_local);
        if let Ok(Value::Object(fields)) = serde_json::to_value(config) {
            for (key, value) in fields {
                flags = flags.with(&format!("--{}", key.replace('_', "-")), value);
            }
        }
        flags
    }

    /// Adds `flag` with `value`, unless it may differ per rank.
    pub(crate) fn with(mut self, flag: &str, value: Value) -> LaunchFlags {
        if !self.rank_local.iter().any(|f| f == flag) {
            self.values.insert(flag.to_string(), value);
        }
        self
    }

    /// The flags compared.
    #[cfg(test)]
    pub(crate) fn flags(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    /// What this rank differs in from `reference` (rank 0's): (flag, this rank's value).
    fn differences(&self, reference: &LaunchFlags) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        if self.command != reference.command {
            out.push((COMMAND.to_string(), Value::String(self.command.clone())));
        }
        let keys: std::collections::BTreeSet<&String> = self.values.keys().chain(reference.values.keys()).collect();
        for k in keys {
            let mine = self.values.get(k).cloned().unwrap_or(Value::Null);
            if reference.values.get(k).cloned().unwrap_or(Value::Null) != mine {
                out.push((k.clone(), mine));
            }
        }
        out
    }

    fn value_of(&self, flag: &str) -> Value {
        match flag {
            COMMAND => Value::String(self.command.clone()),
            _ => self.values.get(flag).cloned().unwrap_or(Value::Null),
        }
    }
}

/// Compares every rank's command and flags (a collective, made before the command's
/// first one). Err, agreed on every rank, names the flags and the ranks that differ.
pub(crate) fn check_same_on_every_rank(g: &Group, mine: &LaunchFlags) -> Result<()> {
    let text = serde_json::to_string(mine)?;
    let hash = u64::from_le_bytes(Sha256::digest(text.as_bytes())[..8].try_into()?);
    // One all-reduce gives the lowest hash and the lowest complement (the highest hash).
    let mut lowest = [0u64; 2];
    {
        let _f = crate::flight::enter("all-reduce", "same flags on every rank");
        g.comm.all_reduce_into(&[hash, !hash][..], &mut lowest[..], SystemOperation::min());
    }
    if lowest[0] == !lowest[1] {
        return Ok(());
    }
    // From here every rank makes the same calls whatever it reads: an error on one rank
    // alone would leave the others waiting in the gather.
    let said = broadcast_string(g, &text);
    let reference: Reference = serde_json::from_str(&said).unwrap_or_default();
    let reference = LaunchFlags {
        command: reference.command,
        values: reference.values,
        rank_local: mine.rank_local.clone(),
    };
    let diff = serde_json::to_string(&mine.differences(&reference)).unwrap_or_default();
    let refused = match gather_strings(g, &diff) {
        Some(all) => {
            let per_rank: Vec<Vec<(String, Value)>> = all.iter().map(|t| serde_json::from_str(t).unwrap_or_default()).collect();
            Err(anyhow!(refusal(&reference, &per_rank)))
        }
        None => Ok(()),
    };
    agree(g, refused)
}

/// Rank 0's flags as broadcast.
#[derive(Default, serde::Deserialize)]
struct Reference {
    command: String,
    values: BTreeMap<String, Value>,
}

/// `the ranks were started with different flags: --max-steps is 10 on rank 0 but 20 on
/// rank 1; ...`, from rank 0's flags and what each rank differs in.
fn refusal(reference: &LaunchFlags, per_rank: &[Vec<(String, Value)>]) -> String {
    // Flag → value → the ranks that have it (rank 0's value: every rank not listed).
    let mut by_flag: BTreeMap<&str, Vec<(String, Vec<usize>)>> = BTreeMap::new();
    for (rank, diffs) in per_rank.iter().enumerate() {
        for (flag, value) in diffs {
            let shown = show(value);
            let values = by_flag.entry(flag.as_str()).or_default();
            match values.iter_mut().find(|(v, _)| *v == shown) {
                Some((_, ranks)) => ranks.push(rank),
                None => values.push((shown, vec![rank])),
            }
        }
    }
    let mut order: Vec<&str> = by_flag.keys().copied().collect();
    // The command first: a difference there explains the others.
    order.sort_by_key(|f| *f != COMMAND);
    let parts: Vec<String> = order
        .iter()
        .take(FLAGS_LISTED)
        .map(|flag| {
            let others = &by_flag[flag];
            let differing: std::collections::BTreeSet<usize> = others.iter().flat_map(|(_, r)| r.iter().copied()).collect();
            let same: Vec<usize> = (0..per_rank.len()).filter(|r| !differing.contains(r)).collect();
            let mut values: Vec<String> = others
                .iter()
                .take(VALUES_LISTED)
                .map(|(v, ranks)| format!("{v} on {}", crate::flight::hang::rank_list(ranks)))
                .collect();
            if others.len() > VALUES_LISTED {
                values.push(format!("{} other values", others.len() - VALUES_LISTED));
            }
            let name = if *flag == COMMAND { COMMAND.to_string() } else { flag.to_string() };
            format!(
                "{name} is {} on {} but {}",
                show(&reference.value_of(flag)),
                crate::flight::hang::rank_list(&same),
                values.join(" and ")
            )
        })
        .collect();
    let more = match order.len().saturating_sub(FLAGS_LISTED) {
        0 => String::new(),
        n => format!("; {n} more flags differ"),
    };
    let may = if reference.rank_local.is_empty() {
        String::new()
    } else {
        format!(" (only {} may differ between ranks)", reference.rank_local.join(", "))
    };
    format!(
        "the ranks were started with different flags: {}{more}. Give every rank of the job the same command and flags{may}",
        parts.join("; ")
    )
}

/// A value as a user typed it: `10`, `adam`, `1,2,4`, `not given`.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "not given".into(),
        Value::Bool(true) => "given".into(),
        Value::Bool(false) => "not given".into(),
        // Given with nothing after it (`--backends ""`): said, never printed as nothing.
        Value::String(s) if s.is_empty() => "given empty".into(),
        Value::Array(items) if items.is_empty() => "given empty".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(show).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// A command's flags by name: `--max-steps`, a positional argument in capitals
/// (`FILE`), and `--` for what follows it.
#[cfg(test)]
pub(crate) fn flag_names(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .map(|a| match a.get_long() {
            Some(l) => format!("--{l}"),
            // What follows `--` (a study's train options).
            None if a.is_last_set() => "--".to_string(),
            None => a.get_id().as_str().to_uppercase(),
        })
        .filter(|l| l != "--help")
        .collect()
}

/// Asserts that every flag of `command` is listed once, in `rank_local` (with why it may
/// differ between ranks) or in `same`; that each listed one is a flag of it; and that
/// `compared` compares every flag of `same` and none of `rank_local`: a new flag fails
/// here until someone decides whether ranks may differ in it.
#[cfg(test)]
pub(crate) fn assert_every_flag_decided(command: &clap::Command, rank_local: &[(&str, &str)], same: &[&str], compared: &LaunchFlags) {
    let flags = flag_names(command);
    let name = command.get_name();
    for f in &flags {
        let local = rank_local.iter().filter(|(g, _)| g == f).count();
        let alike = same.iter().filter(|g| *g == f).count();
        assert!(
            local + alike == 1,
            "{name} {f} must be listed once, in RANK_LOCAL (why it may differ between the ranks of a job) or in \
             SAME_ON_EVERY_RANK; it is in RANK_LOCAL {local} time(s) and in SAME_ON_EVERY_RANK {alike} time(s)"
        );
    }
    for f in rank_local.iter().map(|(f, _)| f).chain(same) {
        assert!(flags.iter().any(|g| g == f), "{f} is listed but is no {name} flag");
    }
    let compared: Vec<&str> = compared.flags().collect();
    // `--` is compared as the options after it, each under its name (`-- --max-steps`).
    let covers = |f: &str| compared.iter().any(|c| *c == f || c.starts_with(&format!("{f} ")));
    for f in same {
        assert!(covers(f), "{name} {f} is not compared across ranks");
    }
    for (f, _) in rank_local {
        assert!(!compared.contains(f), "{name} {f} may differ per rank but is compared");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn train(max_steps: u64) -> LaunchFlags {
        LaunchFlags::new("train", &[("--node-type", "labels a node")])
            .with("--max-steps", json!(max_steps))
            .with("--node-type", json!("a100"))
            .with("--no-dropout", json!(false))
    }

    #[test]
    fn flags_that_may_differ_are_left_out_and_the_differing_ones_found() {
        assert_eq!(train(10).flags().collect::<Vec<_>>(), vec!["--max-steps", "--no-dropout"]);
        assert!(train(10).differences(&train(10)).is_empty());
        assert_eq!(train(20).differences(&train(10)), vec![("--max-steps".to_string(), json!(20))]);
        let study = LaunchFlags::new("study", &[])
            .with("--max-steps", json!(10))
            .with("--no-dropout", json!(false));
        assert_eq!(study.differences(&train(10)), vec![(COMMAND.to_string(), json!("study"))]);
    }

    #[test]
    fn the_refusal_names_each_flag_its_values_and_their_ranks() {
        let rank0 = train(10);
        let ranks = [train(10), train(20), train(20), train(30), train(10)];
        let per_rank: Vec<_> = ranks.iter().map(|r| r.differences(&rank0)).collect();
        assert_eq!(
            refusal(&rank0, &per_rank),
            "the ranks were started with different flags: --max-steps is 10 on ranks 0, 4 but 20 on ranks 1-2 \
             and 30 on rank 3. Give every rank of the job the same command and flags (only --node-type may differ \
             between ranks)"
        );
        let empty = train(10).with("--backends", json!([]));
        assert_eq!(
            refusal(&rank0, &[Vec::new(), empty.differences(&rank0)]),
            "the ranks were started with different flags: --backends is not given on rank 0 but given empty on \
             rank 1. Give every rank of the job the same command and flags (only --node-type may differ between ranks)"
        );
        let mut other = train(10).with("--no-dropout", json!(true));
        other.command = "study".into();
        let text = refusal(&rank0, &[Vec::new(), other.differences(&rank0)]);
        assert!(
            text.starts_with(
                "the ranks were started with different flags: the command is train on rank 0 but study on rank 1; \
                 --no-dropout is not given on rank 0 but given on rank 1."
            ),
            "{text}"
        );
    }
}
