//! A study file as written: its keys (the TOML spec), the `train` options it sets, and
//! the resolved study.toml written back. Pure functions, tested on their own.

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::lr_grid::LrGrid;
use crate::compare::Refusal;
use crate::link::spec::LinkSpec;
use crate::record::Twin;
use crate::reduce::analysis::recommend::Shape;
use crate::train::TrainConfig;

/// How a point's ranks fill the nodes (`node_fill`; `placement` before schema 4, a word
/// that now means only a rank's device and cores).
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeFill {
    /// k ranks fill ⌈k / ranks-per-node⌉ nodes: intra-node links first.
    #[default]
    Pack,
    /// One rank per node: inter-node links first. A study refuses a point of more ranks
    /// than the allocation has nodes, which would put two of them on one node.
    Spread,
}

/// Which batch is held fixed as ranks are added.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scaling {
    /// The per-rank batch stays: the global batch grows with the ranks.
    #[default]
    Weak,
    /// The global batch of the 1-rank point stays: each rank's batch shrinks.
    Strong,
    Both,
}

/// Keys of a study file that are not `train` options.
pub(crate) const STUDY_KEYS: [&str; 18] = [
    "name",
    "lr_grid",
    "data_dirs",
    "models",
    "datasets",
    "batch_sizes",
    "scaling",
    "ranks",
    "node_fill",
    "repeats",
    "threads_per_rank",
    "description",
    "peer",
    "link",
    "link_intra",
    "project_shape",
    "target_efficiency",
    "price_per_gpu_hour",
];

/// The study keys that only say how the study's report projects and recommends
/// (`reduce`'s flags of the same names): no point depends on them, so a study resumes
/// under other values of them.
pub(crate) const REPORT_KEYS: [&str; 5] = ["link", "link_intra", "project_shape", "target_efficiency", "price_per_gpu_hour"];

/// What the study's report is asked for beyond its runs ([`REPORT_KEYS`]), each checked
/// by the parser of `reduce`'s flag of the same name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReportKeys {
    pub link: Option<LinkSpec>,
    pub link_intra: Option<LinkSpec>,
    pub project_shape: Vec<Shape>,
    pub target_efficiency: Option<f64>,
    pub price_per_gpu_hour: Option<f64>,
}

impl ReportKeys {
    /// Sets report key `key` from `v` with the parser of `reduce`'s flag: a bad value is
    /// a [`Refusal`] (exit status 2) saying what the flag would. Ok(false): not a report key.
    fn set(&mut self, key: &str, v: &toml::Value) -> Result<bool> {
        let text = |x: &toml::Value| x.as_str().map_or_else(|| x.to_string(), str::to_string);
        let refuse = |why: String| anyhow::Error::new(Refusal(format!("study key `{key}`: {why}")));
        match key {
            "link" => self.link = Some(LinkSpec::parse(&text(v)).map_err(refuse)?),
            "link_intra" => self.link_intra = Some(LinkSpec::parse(&text(v)).map_err(refuse)?),
            "project_shape" => {
                self.project_shape = as_list(v)
                    .iter()
                    .map(|x| Shape::parse(&text(x)))
                    .collect::<Result<_, _>>()
                    .map_err(refuse)?
            }
            "target_efficiency" => self.target_efficiency = Some(crate::reduce::parse_target_efficiency(&text(v)).map_err(refuse)?),
            "price_per_gpu_hour" => self.price_per_gpu_hour = Some(crate::reduce::parse_price(&text(v)).map_err(refuse)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The keys set, as the resolved study.toml holds them.
    fn insert_into(&self, t: &mut toml::Table) {
        for (key, link) in [("link", &self.link), ("link_intra", &self.link_intra)] {
            if let Some(l) = link {
                t.insert(key.into(), l.name.clone().into());
            }
        }
        if !self.project_shape.is_empty() {
            let shapes = self
                .project_shape
                .iter()
                .map(|s| format!("{}x{}", s.nodes, s.ranks_per_node).into());
            t.insert("project_shape".into(), toml::Value::Array(shapes.collect()));
        }
        if let Some(e) = self.target_efficiency {
            t.insert("target_efficiency".into(), e.into());
        }
        if let Some(p) = self.price_per_gpu_hour {
            t.insert("price_per_gpu_hour".into(), p.into());
        }
    }
}

/// A study as written (file, then command-line overrides), before it is laid out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StudySpec {
    pub name: String,
    pub models: Vec<String>,
    pub datasets: Vec<String>,
    pub batch_sizes: Vec<usize>,
    pub scaling: Scaling,
    pub ranks: Option<Vec<usize>>,
    pub node_fill: NodeFill,
    /// Runs of each point.
    pub repeats: usize,
    pub threads_per_rank: Option<usize>,
    /// Per data set, its `--data-dir` (`[data_dirs]` table), for studies over several.
    pub data_dirs: BTreeMap<String, String>,
    /// `train` options: one value each, or a list (a grid axis), in file order.
    pub train: Vec<(String, Vec<toml::Value>)>,
    /// A sentence per old key the study was given under ([`RENAMED_KEYS`]), each once.
    pub renamed: Vec<String>,
    /// Another trainer whose points run beside ddpbench's, one twin per point
    /// (`peer = "pytorch-ddp"`).
    pub peer: Option<Twin>,
    /// How the study's report projects and recommends ([`REPORT_KEYS`]).
    pub report: ReportKeys,
    /// Learning rates paired with each point's global batch (`[lr_grid]`).
    pub lr_grid: Option<LrGrid>,
}

/// Study keys renamed in schema 4 (old, new): still read, and said once to be renamed.
pub(crate) const RENAMED_KEYS: [(&str, &str); 2] = [("placement", "node_fill"), ("repeat", "repeats")];

fn as_list(v: &toml::Value) -> Vec<toml::Value> {
    match v {
        toml::Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    }
}

fn strings(key: &str, v: &toml::Value) -> Result<Vec<String>> {
    as_list(v)
        .iter()
        .map(|x| {
            x.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("study key `{key}`: {x} is not a string"))
        })
        .collect()
}

fn counts(key: &str, v: &toml::Value) -> Result<Vec<usize>> {
    as_list(v)
        .iter()
        .map(|x| match x.as_integer() {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(anyhow!("study key `{key}`: {x} is not a whole number of at least 1")),
        })
        .collect()
}

fn one_enum<T: ValueEnum>(key: &str, v: &toml::Value) -> Result<T> {
    let s = v.as_str().ok_or_else(|| anyhow!("study key `{key}`: {v} is not a string"))?;
    T::from_str(s, true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|x| x.to_possible_value().map(|p| p.get_name().to_string()))
            .collect();
        anyhow!("study key `{key}`: `{s}` is not one of {}", names.join(", "))
    })
}

/// The `train` option a study key names (`max_steps` and `max-steps` are `--max-steps`).
pub(crate) fn option_name(key: &str) -> String {
    key.replace('_', "-")
}

/// Whether `name` is the long name of a `ddpbench train` option, exactly.
fn is_train_option(name: &str) -> bool {
    use clap::CommandFactory;
    TrainLine::command().get_arguments().any(|a| a.get_long() == Some(name))
}

/// A study's name becomes a folder name under `results/`: letters, digits, `.`, `_` and
/// `-` only, not starting with a dot.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    ensure!(
        ok,
        "study name `{name}`: use letters, digits, `.`, `_` and `-` only (it names the folder results/study-<name>), at most 128 characters, not starting with a dot"
    );
    Ok(())
}

/// A file name made into a study name ([`check_name`]'s characters).
pub(crate) fn name_from_file(stem: &str) -> String {
    let s = slug(stem);
    if s.is_empty() {
        "study".into()
    } else {
        s.trim_start_matches('.').to_string()
    }
}

impl StudySpec {
    /// Reads a study from TOML text. Every key is a study key ([`STUDY_KEYS`], with
    /// `model`, `dataset` and `batch_size` accepted for the grid keys) or a `train`
    /// option by its long name; a list makes the option a grid axis. Unknown keys are
    /// refused later, when the points' command lines are parsed ([`plan`](super::plan::plan)).
    pub(crate) fn from_toml(text: &str, default_name: &str) -> Result<StudySpec> {
        let table: toml::Table = toml::from_str(text).context("the study file is not valid TOML")?;
        let mut s = StudySpec {
            name: default_name.to_string(),
            models: vec!["mnist-cnn".into()],
            datasets: vec!["fashion-mnist".into()],
            batch_sizes: vec![64],
            scaling: Scaling::Weak,
            ranks: None,
            node_fill: NodeFill::Pack,
            repeats: 1,
            threads_per_rank: None,
            data_dirs: BTreeMap::new(),
            train: Vec::new(),
            renamed: Vec::new(),
            peer: None,
            report: ReportKeys::default(),
            lr_grid: None,
        };
        for (key, v) in &table {
            s.set(key, v)?;
        }
        Ok(s)
    }

    /// Sets one key (from the file or the command line; a later one wins).
    pub(crate) fn set(&mut self, key: &str, v: &toml::Value) -> Result<()> {
        let key = key.replace('-', "_");
        if let Some((old, new)) = RENAMED_KEYS.iter().find(|(old, _)| *old == key) {
            let note = format!("study key `{old}` is now `{new}` (read as it; rename it in the file)");
            if !self.renamed.contains(&note) {
                self.renamed.push(note);
            }
            return self.set(new, v);
        }
        let key = key.as_str();
        if self.report.set(key, v)? {
            return Ok(());
        }
        match key {
            "name" => {
                let name = strings(key, v)?.join("-");
                check_name(&name)?;
                self.name = name;
            }
            "description" => {}
            "models" | "model" => self.models = strings(key, v)?,
            "datasets" | "dataset" => self.datasets = strings(key, v)?,
            "batch_sizes" | "batch_size" => self.batch_sizes = counts(key, v)?,
            "scaling" => self.scaling = one_enum(key, v)?,
            "peer" => self.peer = Some(one_enum(key, v)?),
            "lr_grid" => self.lr_grid = Some(LrGrid::from_toml(v)?),
            "node_fill" => self.node_fill = one_enum(key, v)?,
            "ranks" => self.ranks = Some(counts(key, v)?),
            "repeats" => self.repeats = *counts(key, v)?.first().ok_or_else(|| anyhow!("study key `repeats` is empty"))?,
            "threads_per_rank" | "threads" => {
                self.threads_per_rank = Some(*counts(key, v)?.first().ok_or_else(|| anyhow!("study key `{key}` is empty"))?)
            }
            "data_dirs" => {
                let t = v
                    .as_table()
                    .ok_or_else(|| anyhow!("study key `data_dirs` is a table of data set = \"folder\""))?;
                for (dataset, dir) in t {
                    let dir = dir
                        .as_str()
                        .ok_or_else(|| anyhow!("study key `data_dirs.{dataset}`: {dir} is not a string"))?;
                    self.data_dirs.insert(dataset.clone(), dir.to_string());
                }
            }
            "out" => bail!("study key `out`: the study's points are written under the study folder (--out of `ddpbench study`)"),
            "break_lock" => bail!("study key `break_lock`: a study's points each start in a new folder; pass --break-lock to `ddpbench study` for the study folder's lock"),
            "node_slots" => bail!("study key `node_slots` is set by the study itself"),
            _ => {
                let name = option_name(key);
                ensure!(
                    is_train_option(&name),
                    "unknown study key `{key}`: neither a study key ({}) nor a `ddpbench train` option",
                    STUDY_KEYS.join(", ")
                );
                ensure!(!as_list(v).is_empty(), "study key `{key}` is an empty list");
                self.train.retain(|(k, _)| *k != name);
                self.train.push((name, as_list(v)));
            }
        }
        Ok(())
    }

    /// Applies `train`-style flags from the command line (`--max-steps 20 --deterministic`)
    /// as study keys.
    pub(crate) fn apply_flags(&mut self, flags: &[String]) -> Result<()> {
        let mut i = 0;
        while i < flags.len() {
            let f = &flags[i];
            let key = f
                .strip_prefix("--")
                .ok_or_else(|| anyhow!("`{f}`: options after `--` are train options such as --max-steps 20"))?;
            let (key, value) = match key.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => match flags.get(i + 1).filter(|n| !n.starts_with("--")) {
                    Some(v) => {
                        i += 1;
                        (key.to_string(), Some(v.clone()))
                    }
                    None => (key.to_string(), None),
                },
            };
            let v = match value {
                None => toml::Value::Boolean(true),
                Some(v) => parse_scalar(&v),
            };
            self.set(&key, &v)?;
            i += 1;
        }
        Ok(())
    }

    /// The resolved study as TOML (`study.toml` of the study folder): every key explicit.
    pub(crate) fn to_toml(&self, ladder: &[usize], threads_per_rank: usize) -> String {
        let mut t = toml::Table::new();
        let list = |v: Vec<toml::Value>| toml::Value::Array(v);
        t.insert("name".into(), self.name.clone().into());
        t.insert("models".into(), list(self.models.iter().map(|m| m.clone().into()).collect()));
        t.insert("datasets".into(), list(self.datasets.iter().map(|m| m.clone().into()).collect()));
        t.insert(
            "batch_sizes".into(),
            list(self.batch_sizes.iter().map(|&b| (b as i64).into()).collect()),
        );
        t.insert("scaling".into(), enum_name(self.scaling).into());
        t.insert("ranks".into(), list(ladder.iter().map(|&r| (r as i64).into()).collect()));
        t.insert("node_fill".into(), enum_name(self.node_fill).into());
        t.insert("repeats".into(), (self.repeats as i64).into());
        if !self.data_dirs.is_empty() {
            let dirs: toml::Table = self.data_dirs.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
            t.insert("data_dirs".into(), toml::Value::Table(dirs));
        }
        t.insert("threads_per_rank".into(), (threads_per_rank as i64).into());
        if let Some(peer) = self.peer {
            t.insert("peer".into(), peer.name().into());
        }
        self.report.insert_into(&mut t);
        if let Some(g) = &self.lr_grid {
            t.insert("lr_grid".into(), g.to_toml());
        }
        for (k, v) in &self.train {
            let v = if v.len() == 1 { v[0].clone() } else { list(v.clone()) };
            t.insert(k.replace('-', "_"), v);
        }
        toml::to_string(&t).unwrap_or_default()
    }
}

/// A resolved study.toml ([`StudySpec::to_toml`]) under the keys before schema 4, as
/// study folders made before hold it: the same study, so a resume compares with both.
pub(crate) fn with_old_keys(resolved: &str) -> String {
    let Ok(mut t) = toml::from_str::<toml::Table>(resolved) else {
        return resolved.to_string();
    };
    for (old, new) in RENAMED_KEYS {
        if let Some(v) = t.remove(new) {
            t.insert(old.into(), v);
        }
    }
    toml::to_string(&t).unwrap_or_default()
}

/// A resolved study.toml without its [`REPORT_KEYS`]: what its hash is taken of, so the
/// report keys may change between launches of one study.
pub(crate) fn without_report_keys(resolved: &str) -> String {
    let Ok(mut t) = toml::from_str::<toml::Table>(resolved) else {
        return resolved.to_string();
    };
    for key in REPORT_KEYS {
        t.remove(key);
    }
    toml::to_string(&t).unwrap_or_default()
}

/// `saved` (a study folder's study.toml) with the [`REPORT_KEYS`] of `resolved`; None
/// when they are the same already.
pub(crate) fn with_report_keys_of(saved: &str, resolved: &str) -> Option<String> {
    let (Ok(mut saved_t), Ok(new_t)) = (toml::from_str::<toml::Table>(saved), toml::from_str::<toml::Table>(resolved)) else {
        return None;
    };
    let keys = |t: &toml::Table| REPORT_KEYS.map(|k| t.get(k).cloned());
    if keys(&saved_t) == keys(&new_t) {
        return None;
    }
    for key in REPORT_KEYS {
        match new_t.get(key) {
            Some(v) => saved_t.insert(key.into(), v.clone()),
            None => saved_t.remove(key),
        };
    }
    toml::to_string(&saved_t).ok()
}

fn enum_name<T: ValueEnum>(v: T) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

/// A command-line value as the TOML value it reads as (number, boolean, else string).
fn parse_scalar(s: &str) -> toml::Value {
    if let Ok(i) = s.parse::<i64>() {
        return i.into();
    }
    if let Ok(f) = s.parse::<f64>() {
        return f.into();
    }
    match s {
        "true" => true.into(),
        "false" => false.into(),
        _ => s.to_string().into(),
    }
}

/// Parses a `train` command line the way `ddpbench train` does.
#[derive(Parser, Debug)]
#[command(name = "ddpbench train", no_binary_name = true)]
pub(super) struct TrainLine {
    #[command(flatten)]
    pub(super) cfg: TrainConfig,
}

/// A file- and shell-safe form of a value for point ids.
pub(super) fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pack/spread is `node_fill` and the run count `repeats`, in the file and in the
    /// study.toml written; the old keys read as them, each said once, and the study
    /// written under the old keys is the one a folder made before holds.
    #[test]
    fn node_fill_and_repeats_are_the_keys_and_the_old_ones_still_read() {
        let spec = StudySpec::from_toml("node_fill = \"spread\"\nrepeats = 3\n", "x").unwrap();
        assert_eq!((spec.node_fill, spec.repeats, spec.renamed.len()), (NodeFill::Spread, 3, 0));
        let resolved = spec.to_toml(&[1, 2], 1);
        assert!(
            resolved.contains("node_fill = \"spread\"") && resolved.contains("repeats = 3"),
            "{resolved}"
        );
        assert!(!resolved.contains("placement") && !resolved.contains("repeat ="), "{resolved}");
        let mut old = StudySpec::from_toml("placement = \"spread\"\nrepeat = 3\n", "x").unwrap();
        old.set("placement", &"spread".into()).unwrap();
        assert_eq!((old.node_fill, old.repeats), (NodeFill::Spread, 3));
        assert_eq!(old.renamed.len(), 2, "{:?}", old.renamed);
        assert!(old.renamed[0].contains("`placement` is now `node_fill`"), "{:?}", old.renamed);
        let legacy = with_old_keys(&resolved);
        assert!(
            legacy.contains("placement = \"spread\"") && legacy.contains("repeat = 3"),
            "{legacy}"
        );
        assert_eq!(with_old_keys(&old.to_toml(&[1, 2], 1)), legacy);
    }

    #[test]
    fn command_line_flags_override_the_file() {
        let mut spec = StudySpec::from_toml("max_steps = 100\nrepeat = 3\n", "x").unwrap();
        spec.apply_flags(&["--max-steps".into(), "7".into(), "--deterministic".into(), "--lr=-0.5".into()])
            .unwrap();
        assert_eq!(spec.train[0], ("max-steps".to_string(), vec![toml::Value::Integer(7)]));
        assert!(spec
            .train
            .contains(&("deterministic".to_string(), vec![toml::Value::Boolean(true)])));
        assert!(spec.train.contains(&("lr".to_string(), vec![toml::Value::Float(-0.5)])));
        assert_eq!(spec.repeats, 3);
    }
}
