//! A study resolved into points, without MPI: the study ([`super::spec`]) on the job's
//! nodes ([`super::layout`]) becomes points, each with its world ranks and its `train`
//! command line, and the order their runs go in. Pure functions, so the planning is
//! tested on its own.

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::Parser;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

use super::layout::Layout;
use super::lr_grid::LrGrid;
use super::spec::{slug, NodeFill, Scaling, StudySpec, TrainLine, STUDY_KEYS};
use crate::record::{PointId, Twin};
use crate::train::TrainConfig;

/// The most points a study plans; more is refused with the count before any is built.
pub(crate) const MAX_POINTS: usize = 10_000;

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
    use crate::compare::Refusal;
    use crate::link::spec::LinkSpec;
    use crate::reduce::analysis::recommend::Shape;
    use crate::study::layout::tests::hosts;
    use crate::study::spec::{name_from_file, with_report_keys_of, without_report_keys};

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
