//! A study resolved into points, without MPI: the study file's keys, the rank ladder,
//! which world ranks run each point, and the `train` command line of each point. Pure
//! functions, so the planning is tested on its own.

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

use super::lr_grid::LrGrid;
use crate::compare::Refusal;
use crate::link::spec::LinkSpec;
use crate::record::{PointId, Twin};
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

/// The most points a study plans; more is refused with the count before any is built.
pub(crate) const MAX_POINTS: usize = 10_000;

impl StudySpec {
    /// Reads a study from TOML text. Every key is a study key ([`STUDY_KEYS`], with
    /// `model`, `dataset` and `batch_size` accepted for the grid keys) or a `train`
    /// option by its long name; a list makes the option a grid axis. Unknown keys are
    /// refused later, when the points' command lines are parsed ([`plan`]).
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

/// The nodes of the job as the world sees them: each node's world ranks, in rank order;
/// nodes in the order of their lowest rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub nodes: Vec<Vec<usize>>,
    pub hosts: Vec<String>,
}

impl Layout {
    /// From every world rank's host name.
    pub(crate) fn from_hosts(hosts: &[String]) -> Layout {
        let mut names: Vec<String> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        for (rank, h) in hosts.iter().enumerate() {
            match names.iter().position(|n| n == h) {
                Some(i) => nodes[i].push(rank),
                None => {
                    names.push(h.clone());
                    nodes.push(vec![rank]);
                }
            }
        }
        Layout { nodes, hosts: names }
    }

    pub(crate) fn world_size(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum()
    }

    /// Ranks on the smallest node: what a full node holds in the ladder.
    pub(crate) fn ranks_per_node(&self) -> usize {
        self.nodes.iter().map(Vec::len).min().unwrap_or(1)
    }

    /// The default ladder: 1, then doubling within the first node until it is full, then
    /// doubling the number of full nodes: 1, 2, 4 | 8, 16 on 4-rank nodes.
    pub(crate) fn default_ladder(&self) -> Vec<usize> {
        let per = self.ranks_per_node().max(1);
        let mut ladder = Vec::new();
        let mut k = 1;
        while k < per {
            ladder.push(k);
            k *= 2;
        }
        ladder.push(per);
        let mut nodes = 2;
        while nodes < self.nodes.len() {
            ladder.push(nodes * per);
            nodes *= 2;
        }
        if self.nodes.len() > 1 {
            ladder.push(self.nodes.len() * per);
        }
        ladder.dedup();
        ladder
    }

    /// The world ranks of a `k`-rank point.
    pub(crate) fn ranks_for(&self, k: usize, fill: NodeFill) -> Result<Vec<usize>> {
        let per = self.ranks_per_node().max(1);
        ensure!(
            k >= 1 && k <= self.world_size(),
            "a {k}-rank point needs {k} ranks, and the job has {} (launch the study with the most ranks any point uses)",
            self.world_size()
        );
        let mut out = Vec::with_capacity(k);
        match fill {
            NodeFill::Pack => {
                ensure!(
                    k <= per * self.nodes.len(),
                    "a {k}-rank point does not fit {} nodes of {per} ranks",
                    self.nodes.len()
                );
                for node in &self.nodes {
                    out.extend(node.iter().take(per.min(k - out.len())));
                    if out.len() == k {
                        break;
                    }
                }
            }
            NodeFill::Spread => {
                let mut round = 0;
                while out.len() < k {
                    for node in &self.nodes {
                        if let Some(&r) = node.get(round) {
                            if out.len() < k {
                                out.push(r);
                            }
                        }
                    }
                    round += 1;
                }
                out.sort_unstable();
            }
        }
        Ok(out)
    }

    /// Why a study of `ladder` with `fill` would not measure what it says: `spread` puts
    /// each rank of a point on a node of its own, so a point of more ranks than the
    /// allocation has nodes puts some of them on one node, and a study about nodes would
    /// conclude from links it did not cross (on one node, every point of 2 ranks or more
    /// is an intra-node run).
    pub(crate) fn node_fill_concern(&self, ladder: &[usize], fill: NodeFill) -> Option<String> {
        if fill != NodeFill::Spread {
            return None;
        }
        let nodes = self.nodes.len().max(1);
        let mut over: Vec<usize> = ladder.iter().copied().filter(|&k| k > nodes).collect();
        over.sort_unstable();
        over.dedup();
        let (&first, &widest) = (over.first()?, over.last()?);
        let others = match &over[1..] {
            [] => String::new(),
            rest => format!(", as would its points of {} ranks", and_list(rest)),
        };
        let fewer = if nodes > 1 {
            format!(", keep every point within {nodes} ranks (study key `ranks`, study --ranks)")
        } else {
            String::new()
        };
        let allocation = if nodes == 1 {
            "1 node".to_string()
        } else {
            format!("{nodes} nodes")
        };
        Some(format!(
            "node_fill = \"spread\" puts each rank of a point on a node of its own, but the allocation has {allocation} ({}, \
             {} rank(s)): its {first}-rank point needs {first} nodes and would put {} of its ranks on one node{others}; \
             submit on as many nodes as the widest point has ranks (sbatch -N {widest}, mpirun --host <one per node>)\
             {fewer}, or use node_fill = \"pack\"",
            host_list(&self.hosts),
            self.world_size(),
            first.div_ceil(nodes),
        ))
    }

    /// The most ranks `members` put on one node.
    pub(crate) fn most_on_a_node(&self, members: &[usize]) -> usize {
        self.nodes
            .iter()
            .map(|n| n.iter().filter(|r| members.contains(r)).count())
            .max()
            .unwrap_or(0)
    }
}

/// `2`, `2 and 4`, `2, 4 and 8`.
fn and_list(counts: &[usize]) -> String {
    let words: Vec<String> = counts.iter().map(usize::to_string).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => words.join(""),
    }
}

/// The allocation's host names for a message: the first four, then how many more.
fn host_list(hosts: &[String]) -> String {
    const SHOWN: usize = 4;
    match hosts.len() {
        0 => "?".into(),
        n if n <= SHOWN => hosts.join(", "),
        n => format!("{}, and {} more", hosts[..SHOWN].join(", "), n - SHOWN),
    }
}

/// One point of a study: one configuration at one rank count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Point {
    /// Folder-safe, unique in the study, stable across runs of the same study.
    pub id: PointId,
    /// The workload and settings, without the rank count (points of one curve share it).
    pub workload: String,
    pub ranks: usize,
    pub world_ranks: Vec<usize>,
    pub batch_per_rank: usize,
    pub global_batch: usize,
    /// `weak`, `strong`, or `weak+strong` for a point both curves share.
    pub scaling: String,
    /// The `train` options of the point (without --out, which the runner adds).
    pub args: Vec<String>,
    /// The trainer when it is not ddpbench: the point is the twin of ddpbench's point
    /// with the same options, trained by the peer on the same ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<Twin>,
}

/// A point left out, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Skipped {
    pub workload: String,
    pub ranks: usize,
    pub why: String,
}

/// A study laid out: its points in order (repeats not expanded), the skipped ones, and
/// what every point shares.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub points: Vec<Point>,
    pub skipped: Vec<Skipped>,
    pub ladder: Vec<usize>,
    pub threads_per_rank: usize,
    pub node_slots: usize,
}

/// Parses a `train` command line the way `ddpbench train` does.
#[derive(Parser, Debug)]
#[command(name = "ddpbench train", no_binary_name = true)]
struct TrainLine {
    #[command(flatten)]
    cfg: TrainConfig,
}

/// Parses and validates one point's `train` options; an unknown option is named as the
/// study key it came from.
pub(crate) fn parse_train(args: &[String]) -> Result<TrainConfig> {
    let line = TrainLine::try_parse_from(args).map_err(|e| {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
        match e.kind() {
            clap::error::ErrorKind::UnknownArgument => {
                let key = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string().trim_start_matches("--").replace('-', "_"))
                    .unwrap_or_default();
                anyhow!(
                    "unknown study key `{key}`: neither a study key ({}) nor a `ddpbench train` option",
                    STUDY_KEYS.join(", ")
                )
            }
            _ => anyhow!("{first}"),
        }
    })?;
    line.cfg.validate()?;
    Ok(line.cfg)
}

/// Every combination of the grid axes, in file order (the last axis varies fastest).
fn combinations(axes: &[(String, Vec<toml::Value>)]) -> Vec<Vec<(String, toml::Value)>> {
    let mut out: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
    for (k, values) in axes {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut p = prefix.clone();
                    p.push((k.clone(), v.clone()));
                    p
                })
            })
            .collect();
    }
    out
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The `train` arguments of one setting (booleans are flags: true present, false absent).
fn setting_args(setting: &[(String, toml::Value)]) -> Vec<String> {
    let mut args = Vec::new();
    for (k, v) in setting {
        match v {
            toml::Value::Boolean(true) => args.push(format!("--{k}")),
            toml::Value::Boolean(false) => {}
            // One argument, so that a value such as -5 is never read as a flag.
            other => args.push(format!("--{k}={}", value_text(other))),
        }
    }
    args
}

/// A file- and shell-safe form of a value for point ids.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .to_string()
}

/// One cell of the grid: what a point trains, before its rank count.
struct Setting<'a> {
    model: &'a str,
    dataset: &'a str,
    setting: &'a [(String, toml::Value)],
    batch: usize,
    mode: &'a str,
    workload: &'a str,
    /// The `[lr_grid]` factor of the point, where the study has a grid.
    lr_factor: Option<f64>,
}

/// The points planned so far, indexed by (command line, world ranks) so that the run
/// that serves two curves (the 1-rank point, mostly) is found in constant time.
struct Grid<'a> {
    spec: &'a StudySpec,
    threads_per_rank: usize,
    node_slots: usize,
    points: Vec<Point>,
    index: HashMap<(Vec<String>, Vec<usize>), usize>,
    skipped: Vec<Skipped>,
}

impl Grid<'_> {
    /// Adds the `k`-rank point of `at` on `world_ranks`, or marks an existing one as
    /// serving `at.mode` too.
    fn add(&mut self, at: &Setting, k: usize, world_ranks: &[usize]) {
        let per_rank = if at.mode == "strong" {
            if at.batch % k != 0 {
                self.skipped.push(Skipped {
                    workload: format!("{} (strong)", at.workload),
                    ranks: k,
                    why: format!("the global batch {} does not divide by {k} ranks", at.batch),
                });
                return;
            }
            at.batch / k
        } else {
            at.batch
        };
        let mut args = vec![
            "--model".to_string(),
            at.model.to_string(),
            "--dataset".into(),
            at.dataset.to_string(),
            "--batch-size".into(),
            per_rank.to_string(),
            "--threads".into(),
            self.threads_per_rank.to_string(),
            "--node-slots".into(),
            self.node_slots.to_string(),
        ];
        if let Some(dir) = self.spec.data_dirs.get(at.dataset) {
            args.extend(["--data-dir".to_string(), dir.clone()]);
        }
        args.extend(setting_args(at.setting));
        if let (Some(g), Some(f)) = (&self.spec.lr_grid, at.lr_factor) {
            args.extend(g.args(per_rank * k, f));
        }
        let key = (args, world_ranks.to_vec());
        if let Some(&i) = self.index.get(&key) {
            let p = &mut self.points[i];
            if !p.scaling.split('+').any(|m| m == at.mode) {
                p.scaling = format!("{}+{}", p.scaling, at.mode);
            }
            return;
        }
        let spread = if self.spec.node_fill == NodeFill::Spread { "-spread" } else { "" };
        let suffix = if at.mode == "strong" {
            format!("-strong-b{per_rank}")
        } else {
            String::new()
        };
        self.index.insert(key.clone(), self.points.len());
        self.points.push(Point {
            id: PointId(format!("{:03}-{}{suffix}-r{k}{spread}", self.points.len(), at.workload)),
            workload: at.workload.to_string(),
            ranks: k,
            world_ranks: key.1,
            batch_per_rank: per_rank,
            global_batch: per_rank * k,
            scaling: at.mode.to_string(),
            args: key.0,
            peer: None,
        });
    }
}

/// Lays a study over a job: the ladder, each point's ranks, batch and `train` options.
/// `cores_per_node`: the fewest cores of any node, for the default threads per rank.
pub(crate) fn plan(spec: &StudySpec, layout: &Layout, cores_per_node: usize) -> Result<Plan> {
    let ladder = match &spec.ranks {
        Some(r) => {
            let mut r = r.clone();
            r.sort_unstable();
            r.dedup();
            r
        }
        None => layout.default_ladder(),
    };
    ensure!(!ladder.is_empty(), "the study has no rank counts");
    if let Some(g) = &spec.lr_grid {
        g.check_train_keys(&spec.train)?;
    }
    let lr_factors: Vec<Option<f64>> = match &spec.lr_grid {
        Some(g) => g.factors.iter().map(|&f| Some(f)).collect(),
        None => vec![None],
    };
    let mut members = Vec::new();
    for &k in &ladder {
        members.push((k, layout.ranks_for(k, spec.node_fill)?));
    }
    let node_slots = members.iter().map(|(_, m)| layout.most_on_a_node(m)).max().unwrap_or(1).max(1);
    let user_threads = spec
        .train
        .iter()
        .find(|(k, _)| k == "threads")
        .and_then(|(_, v)| v.first()?.as_integer());
    let threads_per_rank = match (spec.threads_per_rank, user_threads) {
        (Some(t), _) => t,
        (None, Some(t)) => t.max(1) as usize,
        (None, None) => (cores_per_node / node_slots).max(1),
    };
    let axes: Vec<(String, Vec<toml::Value>)> = spec.train.iter().filter(|(k, _)| k != "threads").cloned().collect();
    let modes: Vec<&str> = match spec.scaling {
        Scaling::Weak => vec!["weak"],
        Scaling::Strong => vec!["strong"],
        Scaling::Both => vec!["weak", "strong"],
    };
    let planned = [
        spec.models.len(),
        spec.datasets.len(),
        spec.batch_sizes.len(),
        modes.len(),
        ladder.len(),
        lr_factors.len(),
    ]
    .into_iter()
    .chain(axes.iter().map(|(_, v)| v.len()))
    .try_fold(1usize, |n, k| n.checked_mul(k));
    match planned {
        Some(n) if n <= MAX_POINTS => {}
        n => bail!(
            "the study would plan {} points (models × data sets × grid values × batch sizes × scaling × rank counts \
             × learning-rate factors), \
             more than {MAX_POINTS}: split it into several studies",
            n.map(|n| n.to_string()).unwrap_or_else(|| "more than 2^64".into())
        ),
    }
    let varying: Vec<&str> = axes.iter().filter(|(_, v)| v.len() > 1).map(|(k, _)| k.as_str()).collect();
    let mut grid = Grid {
        spec,
        threads_per_rank,
        node_slots,
        points: Vec::new(),
        index: HashMap::new(),
        skipped: Vec::new(),
    };
    for model in &spec.models {
        for dataset in &spec.datasets {
            for setting in combinations(&axes) {
                let label: Vec<String> = setting
                    .iter()
                    .filter(|(k, _)| varying.contains(&k.as_str()))
                    .map(|(k, v)| format!("{k}-{}", slug(&value_text(v))))
                    .collect();
                for (&batch, &lr_factor) in spec.batch_sizes.iter().flat_map(|b| lr_factors.iter().map(move |f| (b, f))) {
                    let workload = [slug(model), slug(dataset), format!("b{batch}")]
                        .into_iter()
                        .chain(label.iter().cloned())
                        .chain(lr_factor.map(|f| slug(&LrGrid::label(f))))
                        .collect::<Vec<_>>()
                        .join("-");
                    for mode in &modes {
                        for (k, world_ranks) in &members {
                            let at = Setting {
                                model,
                                dataset,
                                setting: &setting,
                                batch,
                                mode,
                                workload: &workload,
                                lr_factor,
                            };
                            grid.add(&at, *k, world_ranks);
                        }
                    }
                }
            }
        }
    }
    let Grid { points, skipped, .. } = grid;
    ensure!(!points.is_empty(), "the study has no point to run ({} skipped)", skipped.len());
    // Points that share a command line (the same setting at several rank counts) parse once.
    let mut checked: HashSet<&Vec<String>> = HashSet::new();
    for p in &points {
        if checked.insert(&p.args) {
            let cfg = parse_train(&p.args).with_context(|| format!("point {}", p.id))?;
            if let Some(peer) = spec.peer {
                super::peer::check_point(peer, &cfg).with_context(|| format!("point {}", p.id))?;
            }
        }
    }
    let points = with_twins(points, spec.peer);
    Ok(Plan {
        points,
        skipped,
        ladder,
        threads_per_rank,
        node_slots,
    })
}

/// Each point followed by its twin trained by `peer` (same options and ranks), so that
/// the schedule alternates the two trainers point by point.
fn with_twins(points: Vec<Point>, peer: Option<Twin>) -> Vec<Point> {
    let Some(peer) = peer else { return points };
    points
        .into_iter()
        .flat_map(|p| {
            let twin = Point {
                id: PointId(format!("{}-{}", p.id, peer.name())),
                workload: format!("{}-{}", p.workload, peer.name()),
                peer: Some(peer),
                ..p.clone()
            };
            [p, twin]
        })
        .collect()
}

/// The order points run in: repeat after repeat over all points (interleaved, so slow
/// drift of the machine spreads over every point instead of landing on one).
pub(crate) fn schedule(points: usize, repeats: usize) -> Vec<(usize, usize)> {
    (0..repeats.max(1)).flat_map(|rep| (0..points).map(move |p| (p, rep))).collect()
}

/// FNV-1a of the resolved study: a changed study is refused when resuming.
pub(crate) fn study_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Run names of a point's repeats: `<point id>-rep<N>`.
pub(crate) fn run_name(point: &Point, rep: usize) -> String {
    format!("{}-rep{rep}", point.id)
}

/// Points per workload, for the dry run's table.
pub(crate) fn by_workload(points: &[Point]) -> BTreeMap<String, Vec<&Point>> {
    let mut m: BTreeMap<String, Vec<&Point>> = BTreeMap::new();
    for p in points {
        m.entry(p.workload.clone()).or_default().push(p);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(nodes: usize, per: usize) -> Layout {
        let h: Vec<String> = (0..nodes * per).map(|r| format!("n{}", r / per)).collect();
        Layout::from_hosts(&h)
    }

    #[test]
    fn the_default_ladder_fills_a_node_then_doubles_nodes() {
        assert_eq!(hosts(2, 4).default_ladder(), vec![1, 2, 4, 8]);
        assert_eq!(hosts(16, 4).default_ladder(), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(hosts(3, 4).default_ladder(), vec![1, 2, 4, 8, 12]);
        assert_eq!(hosts(1, 2).default_ladder(), vec![1, 2]);
        assert_eq!(hosts(1, 1).default_ladder(), vec![1]);
        assert_eq!(hosts(1, 6).default_ladder(), vec![1, 2, 4, 6]);
    }

    #[test]
    fn spread_on_one_node_is_named_with_the_allocation() {
        let one = Layout::from_hosts(&["a".to_string(), "a".to_string()]);
        let c = one.node_fill_concern(&[1, 2], NodeFill::Spread).unwrap();
        assert!(
            c.contains("the allocation has 1 node (a, 2 rank(s))") && c.contains("sbatch -N 2"),
            "{c}"
        );
        assert!(one.node_fill_concern(&[1, 2], NodeFill::Pack).is_none());
        assert!(
            one.node_fill_concern(&[1], NodeFill::Spread).is_none(),
            "one rank spans one node anyway"
        );
        let two = Layout::from_hosts(&["a".to_string(), "b".to_string()]);
        assert!(two.node_fill_concern(&[1, 2], NodeFill::Spread).is_none());
    }

    /// A spread point of more ranks than the allocation has nodes puts two of them on one
    /// node: named with its ranks, the nodes it needs, the allocation and the fixes.
    #[test]
    fn a_spread_point_wider_than_the_allocation_is_named_with_the_nodes_it_needs() {
        let l = hosts(2, 4);
        assert!(l.node_fill_concern(&[1, 2], NodeFill::Spread).is_none(), "one rank per node");
        assert!(l.node_fill_concern(&[1, 2, 4, 8], NodeFill::Pack).is_none());
        let c = l.node_fill_concern(&[8, 1, 2, 4], NodeFill::Spread).unwrap();
        for part in [
            "the allocation has 2 nodes (n0, n1, 8 rank(s))",
            "its 4-rank point needs 4 nodes and would put 2 of its ranks on one node",
            "as would its points of 8 ranks",
            "sbatch -N 8",
            "keep every point within 2 ranks",
            "node_fill = \"pack\"",
        ] {
            assert!(c.contains(part), "{part}: {c}");
        }
        let c = hosts(6, 2).node_fill_concern(&[1, 2, 4, 8, 12], NodeFill::Spread).unwrap();
        assert!(
            c.contains("6 nodes (n0, n1, n2, n3, and 2 more, 12 rank(s)): its 8-rank point needs 8 nodes")
                && c.contains("as would its points of 12 ranks;"),
            "{c}"
        );
    }

    #[test]
    fn pack_fills_nodes_and_spread_crosses_them_first() {
        let l = hosts(2, 4);
        assert_eq!(l.ranks_for(4, NodeFill::Pack).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(l.ranks_for(6, NodeFill::Pack).unwrap(), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(l.ranks_for(2, NodeFill::Spread).unwrap(), vec![0, 4]);
        assert_eq!(l.ranks_for(4, NodeFill::Spread).unwrap(), vec![0, 1, 4, 5]);
        assert_eq!(l.most_on_a_node(&[0, 1, 4, 5]), 2);
        let e = l.ranks_for(9, NodeFill::Pack).unwrap_err().to_string();
        assert!(e.contains("the job has 8"), "{e}");
        // Ranks interleaved over hosts (round-robin mapping) are grouped by host.
        let l = Layout::from_hosts(&["a".into(), "b".into(), "a".into(), "b".into()]);
        assert_eq!(l.nodes, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(l.ranks_for(2, NodeFill::Pack).unwrap(), vec![0, 2]);
    }

    #[test]
    fn a_grid_becomes_points_with_fixed_threads_and_shared_baselines() {
        let spec = StudySpec::from_toml(
            "name = \"t\"\nbatch_sizes = [32, 64]\nscaling = \"both\"\nmax_steps = 5\noverlap = [\"on\", \"off\"]\n",
            "x",
        )
        .unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        assert_eq!(p.ladder, vec![1, 2]);
        assert_eq!((p.threads_per_rank, p.node_slots), (1, 2));
        // Per overlap: 1 × 32, 2 × 32 (weak of 32 and strong of 64: one run serves
        // both), 2 × 16 (strong of 32), 1 × 64, 2 × 64 = 5 runs; × 2 overlaps.
        assert_eq!(p.points.len(), 10, "{:#?}", p.points.iter().map(|p| &p.id).collect::<Vec<_>>());
        let one = p.points.iter().find(|q| q.ranks == 1).unwrap();
        assert_eq!(one.scaling, "weak+strong");
        let shared = &p.points[1];
        assert_eq!(
            (shared.ranks, shared.batch_per_rank, shared.scaling.as_str()),
            (2, 32, "weak+strong")
        );
        let strong = p.points.iter().find(|q| q.scaling == "strong").unwrap();
        assert_eq!((strong.batch_per_rank, strong.global_batch), (16, 32));
        assert!(p.points.iter().all(|q| q.args.windows(2).any(|w| w == ["--threads", "1"])));
        let ids: std::collections::BTreeSet<_> = p.points.iter().map(|q| &q.id).collect();
        assert_eq!(ids.len(), p.points.len(), "ids are unique");
    }

    #[test]
    fn strong_scaling_skips_a_batch_that_does_not_divide() {
        let spec = StudySpec::from_toml("batch_sizes = [30]\nscaling = \"strong\"\nranks = [1, 4]\n", "x").unwrap();
        let p = plan(&spec, &hosts(1, 4), 4).unwrap();
        assert_eq!(p.points.len(), 1);
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].why.contains("does not divide by 4"), "{:?}", p.skipped);
    }

    #[test]
    fn each_data_set_gets_its_own_data_dir() {
        let text = "datasets = [\"mnist\", \"bigmnist\", \"synthetic\"]\nranks = [1]\n\n[data_dirs]\nmnist = \"/d/mnist\"\nbigmnist = \"/d/big\"\n";
        let spec = StudySpec::from_toml(text, "x").unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        let dir_of = |i: usize| {
            let a = &p.points[i].args;
            a.iter().position(|x| x == "--data-dir").map(|j| a[j + 1].clone())
        };
        assert_eq!(p.points.len(), 3);
        assert_eq!(
            (dir_of(0), dir_of(1), dir_of(2)),
            (Some("/d/mnist".into()), Some("/d/big".into()), None)
        );
        // The resolved study keeps the table and reads back the same.
        let again = StudySpec::from_toml(&spec.to_toml(&p.ladder, p.threads_per_rank), "x").unwrap();
        assert_eq!(again.data_dirs, spec.data_dirs);
        assert!(StudySpec::from_toml("data_dirs = 3\n", "x")
            .unwrap_err()
            .to_string()
            .contains("data_dirs"));
    }

    #[test]
    fn every_shipped_study_file_plans() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("job-scripts/studies");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().and_then(|x| x.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let spec = StudySpec::from_toml(&text, "x").unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            // 16 nodes of 4 GPUs hold every shipped ladder.
            let p = plan(&spec, &hosts(16, 4), 2).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(!p.points.is_empty(), "{}", path.display());
            n += 1;
        }
        assert!(n >= 7, "{n} study files");
    }

    /// The report keys read as `reduce`'s flags of the same names, change no point (nor
    /// the hash a resume compares), and a bad value is refused with the flag's message.
    #[test]
    fn report_keys_read_as_reduce_flags_and_change_no_point() {
        let text = "link = \"roce-100g\"\nlink_intra = \"10GB/s,2us\"\nproject_shape = [\"4x2\", \"2x4\"]\n\
                    target_efficiency = 0.6\nprice_per_gpu_hour = 3\n";
        let spec = StudySpec::from_toml(text, "x").unwrap();
        let r = &spec.report;
        assert_eq!(r.link, Some(LinkSpec::parse("roce-100g").unwrap()));
        assert_eq!(r.link_intra, Some(LinkSpec::parse("10GB/s,2us").unwrap()));
        assert_eq!(r.project_shape, vec![Shape::parse("4x2").unwrap(), Shape::parse("2x4").unwrap()]);
        assert_eq!((r.target_efficiency, r.price_per_gpu_hour), (Some(0.6), Some(3.0)));
        let plain = StudySpec::from_toml("", "x").unwrap();
        let (with_keys, without) = (spec.to_toml(&[1, 2], 1), plain.to_toml(&[1, 2], 1));
        assert_eq!(StudySpec::from_toml(&with_keys, "x").unwrap().report, spec.report);
        assert_eq!(
            plan(&spec, &hosts(1, 2), 2).unwrap().points,
            plan(&plain, &hosts(1, 2), 2).unwrap().points
        );
        // A folder made before these keys hashes the same; the keys do not move the hash.
        assert_eq!(without_report_keys(&without), without);
        assert_eq!(study_hash(&without_report_keys(&with_keys)), study_hash(&without));
        // Resumed with other report keys, study.toml takes them, and only them.
        assert_eq!(with_report_keys_of(&without, &without), None);
        let updated = with_report_keys_of(&without, &with_keys).unwrap();
        assert_eq!(StudySpec::from_toml(&updated, "x").unwrap().report, spec.report);
        // On the command line after `--`, as in the file.
        let mut flagged = StudySpec::from_toml("", "x").unwrap();
        flagged
            .apply_flags(&["--target-efficiency".into(), "0.6".into(), "--link".into(), "roce-100g".into()])
            .unwrap();
        assert_eq!((flagged.report.target_efficiency, flagged.report.link), (Some(0.6), r.link.clone()));
        let flag_says = |e: Result<f64, String>| e.unwrap_err();
        for (text, says) in [
            ("link = \"fast\"", LinkSpec::parse("fast").unwrap_err()),
            ("link_intra = \"100Gbit\"", LinkSpec::parse("100Gbit").unwrap_err()),
            ("link = \"10GB/s,2s\"", LinkSpec::parse("10GB/s,2s").unwrap_err()),
            ("project_shape = [\"2x2\", \"16\"]", Shape::parse("16").unwrap_err()),
            ("target_efficiency = 1.5", flag_says(crate::reduce::parse_target_efficiency("1.5"))),
            ("target_efficiency = 0", flag_says(crate::reduce::parse_target_efficiency("0"))),
            ("price_per_gpu_hour = -1", flag_says(crate::reduce::parse_price("-1"))),
        ] {
            let e = StudySpec::from_toml(text, "x").unwrap_err();
            assert!(e.is::<Refusal>(), "{text}: {e:#}");
            let key = text.split(' ').next().unwrap();
            assert_eq!(e.to_string(), format!("study key `{key}`: {says}"), "{text}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = StudySpec::from_toml("max_stepz = 5\n", "x").unwrap_err();
        assert!(format!("{e:#}").contains("unknown study key `max_stepz`"), "{e:#}");
        // Keys match an option exactly: one that smuggles a value in is unknown.
        let e = StudySpec::from_toml("\"out=/elsewhere\" = true\n", "x").unwrap_err();
        assert!(format!("{e:#}").contains("unknown study key `out=/elsewhere`"), "{e:#}");
        // A negative value is a value, named with its option, not an unknown key `_5`.
        let spec = StudySpec::from_toml("max_steps = -5\n", "x").unwrap();
        let e = format!("{:#}", plan(&spec, &hosts(1, 2), 2).unwrap_err());
        assert!(
            e.contains("-5") && e.contains("--max-steps") && !e.contains("unknown study key"),
            "{e}"
        );
        // The name becomes a folder: no separators, no escaping results/.
        for bad in ["x/../../../escaped", "..", ".hidden", "a b"] {
            let e = StudySpec::from_toml(&format!("name = \"{bad}\"\n"), "x").unwrap_err();
            assert!(e.to_string().contains("study name"), "{bad}: {e}");
        }
        assert_eq!(name_from_file("my study"), "my-study");
        let e = StudySpec::from_toml("node_fill = \"diagonal\"\n", "x").unwrap_err();
        assert!(e.to_string().contains("not one of pack, spread"), "{e}");
        let e = StudySpec::from_toml("out = \"x\"\n", "x").unwrap_err();
        assert!(e.to_string().contains("study key `out`"), "{e}");
        let spec = StudySpec::from_toml("lr = -1.0\n", "x").unwrap();
        assert!(plan(&spec, &hosts(1, 2), 2).is_err());
    }

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

    #[test]
    fn repeats_are_interleaved() {
        assert_eq!(schedule(2, 2), vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
    }

    #[test]
    fn the_resolved_study_reads_back_to_the_same_points() {
        let spec = StudySpec::from_toml("batch_sizes = [16]\nmax_steps = 3\noverlap = [\"on\", \"off\"]\n", "rt").unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        let text = spec.to_toml(&p.ladder, p.threads_per_rank);
        let again = plan(&StudySpec::from_toml(&text, "other").unwrap(), &hosts(1, 2), 2).unwrap();
        assert_eq!(p.points, again.points);
        assert_ne!(study_hash(&text), study_hash(&text.replace("3", "4")));
    }

    #[test]
    fn a_peer_gives_every_point_a_twin_on_the_same_ranks_right_after_it() {
        let text = "datasets = [\"synthetic\"]\noptimizer = \"sgd\"\nmax_steps = 5\npeer = \"pytorch-ddp\"\n";
        let spec = StudySpec::from_toml(text, "p").unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        let ids: Vec<&str> = p.points.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "000-mnist-cnn-synthetic-b64-r1",
                "000-mnist-cnn-synthetic-b64-r1-pytorch-ddp",
                "001-mnist-cnn-synthetic-b64-r2",
                "001-mnist-cnn-synthetic-b64-r2-pytorch-ddp"
            ]
        );
        for pair in p.points.chunks(2) {
            let (own, twin) = (&pair[0], &pair[1]);
            assert_eq!((own.peer, twin.peer), (None, Some(Twin::PytorchDdp)));
            assert_eq!((&own.args, &own.world_ranks), (&twin.args, &twin.world_ranks));
            assert_eq!(twin.workload, format!("{}-pytorch-ddp", own.workload));
        }
        // The resolved study keeps the peer, and reads back to the same points.
        let resolved = spec.to_toml(&p.ladder, p.threads_per_rank);
        assert!(resolved.contains("peer = \"pytorch-ddp\""), "{resolved}");
        let again = plan(&StudySpec::from_toml(&resolved, "p").unwrap(), &hosts(1, 2), 2).unwrap();
        assert_eq!(p.points, again.points);
        let without = StudySpec::from_toml(&text.replace("peer = \"pytorch-ddp\"\n", ""), "p").unwrap();
        assert!(plan(&without, &hosts(1, 2), 2).unwrap().points.iter().all(|q| q.peer.is_none()));
    }

    #[test]
    fn a_peer_refuses_a_point_it_has_no_twin_for_and_says_what_to_change() {
        let refused = |extra: &str| {
            let text = format!("datasets = [\"synthetic\"]\nmax_steps = 5\npeer = \"pytorch-ddp\"\n{extra}");
            let spec = StudySpec::from_toml(&text, "p").unwrap();
            format!("{:#}", plan(&spec, &hosts(1, 2), 2).unwrap_err())
        };
        let e = refused("optimizer = \"sgd\"\nmodels = [\"resnet18\"]\n");
        assert!(
            e.contains("the model `resnet18` has no PyTorch twin") && e.contains("drop `peer`"),
            "{e}"
        );
        let e = refused("optimizer = \"adam\"\n");
        assert!(e.contains("optimizer other than sgd"), "{e}");
        let e = refused("optimizer = \"sgd\"\ngrad_accum = 2\n");
        assert!(e.contains("grad_accum above 1"), "{e}");
        let spec = StudySpec::from_toml("peer = \"tensorflow\"\n", "p");
        assert!(format!("{:#}", spec.unwrap_err()).contains("`tensorflow` is not one of pytorch-ddp"));
    }

    #[test]
    fn a_huge_grid_is_refused_with_its_count_before_it_is_built() {
        let lrs: Vec<String> = (1..=400).map(|i| format!("{}.0", i)).collect();
        let seeds: Vec<String> = (1..=320).map(|i| i.to_string()).collect();
        let text = format!("lr = [{}]\nseed = [{}]\n", lrs.join(", "), seeds.join(", "));
        let spec = StudySpec::from_toml(&text, "x").unwrap();
        let e = plan(&spec, &hosts(1, 2), 2).unwrap_err().to_string();
        assert!(e.contains("256000 points") && e.contains("more than 10000"), "{e}");
        // Below the cap, points that share a setting are found, not duplicated.
        let spec = StudySpec::from_toml("seed = [1, 2, 3]\nscaling = \"both\"\n", "x").unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        assert_eq!(p.points.len(), 3 * 3, "{:?}", p.points.iter().map(|p| &p.id).collect::<Vec<_>>());
        assert!(p.points.iter().filter(|q| q.ranks == 1).all(|q| q.scaling == "weak+strong"));
    }

    /// `[lr_grid]` pairs each point's rate with its global batch by the rule: a weak
    /// point of 2 ranks trains at twice the 1-rank rate (linear), a strong one at the
    /// same; each factor is its own workload; the resolved study plans the same points;
    /// a study key that sets the rate beside the grid is refused.
    #[test]
    fn a_learning_rate_grid_pairs_rates_with_global_batches() {
        let text = "batch_sizes = [32]\nscaling = \"both\"\nmax_steps = 3\ntarget_loss = 0.6\n\
                    [lr_grid]\nbase = 0.005\nbase_batch = 64\nfactors = [1, 2]\nwarmup_fraction = 0.1\n";
        let spec = StudySpec::from_toml(text, "lr").unwrap();
        let p = plan(&spec, &hosts(1, 2), 2).unwrap();
        let lr = |q: &Point| q.args.iter().find_map(|a| a.strip_prefix("--lr=")).unwrap().parse::<f64>().unwrap();
        // Per factor: 1 × 32 (weak+strong), 2 × 32 (weak), 2 × 16 (strong) = 3 points.
        assert_eq!(p.points.len(), 6, "{:?}", p.points.iter().map(|p| &p.id).collect::<Vec<_>>());
        for q in &p.points {
            let factor = if q.workload.ends_with("lrx1") { 1.0 } else { 2.0 };
            assert!(q.workload.ends_with("lrx1") || q.workload.ends_with("lrx2"), "{}", q.workload);
            let want = 0.005 * q.global_batch as f64 / 64.0 * factor;
            assert!((lr(q) - want).abs() < 1e-15, "{}: {} against {want}", q.id, lr(q));
            assert!(q.args.contains(&"--lr-scaling=none".to_string()) && q.args.contains(&"--warmup-epochs=0.1".to_string()));
        }
        let resolved = spec.to_toml(&p.ladder, p.threads_per_rank);
        let again = plan(&StudySpec::from_toml(&resolved, "other").unwrap(), &hosts(1, 2), 2).unwrap();
        assert_eq!(p.points, again.points, "{resolved}");
        let both = StudySpec::from_toml(&format!("lr = 0.1\n{text}"), "lr").unwrap();
        let e = plan(&both, &hosts(1, 2), 2).unwrap_err().to_string();
        assert!(e.contains("study key `lr` sets what [lr_grid] sets"), "{e}");
    }
}
