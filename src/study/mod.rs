//! `ddpbench study`: a whole scaling study in one launch. The job is started with the
//! most ranks any point needs; each point (one configuration at one rank count) runs on
//! a sub-communicator of the world holding exactly its ranks, in its own run folder
//! (the folder `train` writes), while the other ranks wait without spinning; at the end
//! rank 0 reduces every point into one report.
//!
//! The study folder holds `study.toml` (the resolved study: every key explicit),
//! `study.json` (its hash and points), `points.csv` (one row per point run: its ranks,
//! hosts, outcome and the idle ranks' CPU use), `runs/<point>-rep<N>/` and `report/`.
//! Running the same command again skips finished points, retries failed ones only with
//! `--retry-failed`, and refuses a study whose resolved file changed.

mod estimate;
pub(crate) mod peer;
pub(crate) mod plan;
mod report;
mod state;

use crate::allreduce::Swept;
use crate::job::{self, signals, watchdog, watchdog::Watchdog, JobOptions};
use crate::record::lock::{FolderLock, LOCK_FILE};
use crate::record::{self, CsvLog, RunStatus};
use crate::reduce::ReduceRequest;
use crate::train;
use crate::world::{agree, all_strings, broadcast_string, gather_strings, AgreedError, Group};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Color, Communicator};
use plan::{Layout, NodeFill, Plan, Point, Scaling, StudySpec};
use serde::{Deserialize, Serialize};
use state::{Decision, PointOutcome, State};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// `ddpbench study` options. Every key of a study file can also be given here: the
/// grid keys by name, any `train` option after `--`.
#[derive(Args, Debug, Clone)]
pub struct StudyArgs {
    /// Study file (TOML): study keys and `train` options; a list makes a grid axis.
    /// Without one: mnist-cnn on Fashion-MNIST, batch 64 per rank, weak scaling over the
    /// default ladder.
    pub file: Option<PathBuf>,

    /// Study name (default: the file's name); the folder is results/study-<name>.
    #[arg(long)]
    pub name: Option<String>,

    /// Models, comma-separated (a grid axis).
    #[arg(long, value_delimiter = ',')]
    pub models: Option<Vec<String>>,

    /// Data sets, comma-separated (a grid axis).
    #[arg(long, value_delimiter = ',')]
    pub datasets: Option<Vec<String>>,

    /// Per-rank batch sizes, comma-separated (for strong scaling: the 1-rank batch, kept
    /// as the global batch).
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Option<Vec<usize>>,

    /// Weak (per-rank batch fixed), strong (global batch fixed) or both.
    #[arg(long, value_enum)]
    pub scaling: Option<Scaling>,

    /// Rank counts, comma-separated (default: 1, doubling within a node until it is
    /// full, then doubling the number of full nodes).
    #[arg(long, value_delimiter = ',')]
    pub ranks: Option<Vec<usize>>,

    /// How a point's ranks fill the nodes: pack, as few nodes as they can; spread, one
    /// per node (a point of more ranks than the allocation has nodes is refused)
    /// (`--placement` before).
    #[arg(long, value_enum, alias = "placement")]
    pub node_fill: Option<NodeFill>,

    /// Runs of each point, interleaved (all points, then all points again, ...)
    /// (`--repeat` before).
    #[arg(long, alias = "repeat")]
    pub repeats: Option<usize>,

    /// Study folder (default: results/study-<name>). Run again to resume, once the job
    /// before has ended: one job per study folder (its lock is .ddpbench.lock).
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Remove the study folder's lock left by a job that was killed on another host (a
    /// lock of this host is cleared by itself once its process is gone). Check first that
    /// the job named in the refusal has ended.
    #[arg(long)]
    pub break_lock: bool,

    /// Print the points, their ranks and nodes, time each workload for a few steps on
    /// one rank, print an estimate of the study's time, and stop.
    #[arg(long)]
    pub dry_run: bool,

    /// Seconds the dry run may spend timing workloads (each trains a few steps on rank
    /// 0): the workloads not reached by then are listed as not timed, and the estimate
    /// says how many points it leaves out.
    #[arg(long, default_value_t = DRY_RUN_BUDGET_S, value_name = "SECONDS")]
    pub budget_s: f64,

    /// Run again the points that failed before (by default a resumed study skips them).
    #[arg(long)]
    pub retry_failed: bool,

    /// Before the points, sweep the all-reduce on the whole allocation (`ddpbench
    /// allreduce`, 8 B to 64 MiB, MPI and, on GPUs, MPI from device memory and NCCL) into <study>/allreduce
    /// (kept when a resumed study already has it), so that the report projects every
    /// workload beyond the allocation and checks the projection against the points.
    #[arg(long)]
    pub allreduce_sweep: bool,

    /// `train` options for every point, after `--` (e.g. `-- --max-steps 50 --overlap off`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub train: Vec<String>,
}

/// The dry run's default time for timing workloads.
pub const DRY_RUN_BUDGET_S: f64 = 600.0;

/// The `study` arguments that may differ between the ranks of one job, and why: every
/// other one is compared across ranks at start-up ([`launch_flags`]).
pub const RANK_LOCAL: &[(&str, &str)] = &[(
    "FILE",
    "where this rank reads the study file: what it says is compared, as the resolved study",
)];

/// The `study` arguments every rank of a job must be given alike (`--`: the `train`
/// options, each compared but those `train` lets differ per rank).
pub const SAME_ON_EVERY_RANK: &[&str] = &[
    "--name",
    "--models",
    "--datasets",
    "--batch-sizes",
    "--scaling",
    "--ranks",
    "--node-fill",
    "--repeats",
    "--out",
    "--break-lock",
    "--dry-run",
    "--budget-s",
    "--retry-failed",
    "--allreduce-sweep",
    "--",
];

/// The command and the resolved study (file and command line) compared across ranks.
pub fn launch_flags(spec: &StudySpec, args: &StudyArgs) -> job::same_flags::LaunchFlags {
    use serde_json::json;
    let mut flags = job::same_flags::LaunchFlags::new("study", RANK_LOCAL)
        .with("--name", json!(spec.name))
        .with("--models", json!(spec.models))
        .with("--datasets", json!(spec.datasets))
        .with("--batch-sizes", json!(spec.batch_sizes))
        .with("--scaling", json!(spec.scaling))
        .with("--ranks", json!(spec.ranks))
        .with("--node-fill", json!(spec.node_fill))
        .with("--repeats", json!(spec.repeats))
        .with("study key threads_per_rank", json!(spec.threads_per_rank))
        .with("study key data_dirs", json!(spec.data_dirs))
        .with("study key peer", json!(spec.peer))
        .with("study key link", json!(spec.report.link.as_ref().map(|l| &l.name)))
        .with("study key link_intra", json!(spec.report.link_intra.as_ref().map(|l| &l.name)))
        .with("study key project_shape", json!(spec.report.project_shape))
        .with("study key target_efficiency", json!(spec.report.target_efficiency))
        .with("study key price_per_gpu_hour", json!(spec.report.price_per_gpu_hour))
        .with("--out", json!(args.out))
        .with("--break-lock", json!(args.break_lock))
        .with("--dry-run", json!(args.dry_run))
        .with("--budget-s", json!(args.budget_s))
        .with("--retry-failed", json!(args.retry_failed))
        .with("--allreduce-sweep", json!(args.allreduce_sweep));
    for (name, values) in &spec.train {
        let flag = format!("--{name}");
        if !train::config::RANK_LOCAL.iter().any(|(f, _)| *f == flag) {
            flags = flags.with(&format!("-- {flag}"), json!(values));
        }
    }
    flags
}

/// The study as written: the file, then the command line.
pub fn spec_of(args: &StudyArgs) -> Result<StudySpec> {
    let (text, default_name) = match &args.file {
        Some(f) => (
            std::fs::read_to_string(f).with_context(|| format!("cannot read the study file {}", f.display()))?,
            plan::name_from_file(&f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()),
        ),
        None => (String::new(), "default".to_string()),
    };
    let mut s = StudySpec::from_toml(&text, &default_name).with_context(|| match &args.file {
        Some(f) => format!("in {}", f.display()),
        None => "the default study".into(),
    })?;
    if let Some(v) = &args.name {
        plan::check_name(v).context("--name")?;
        s.name = v.clone();
    }
    if let Some(v) = &args.models {
        s.models = v.clone();
    }
    if let Some(v) = &args.datasets {
        s.datasets = v.clone();
    }
    if let Some(v) = &args.batch_sizes {
        s.batch_sizes = v.clone();
    }
    if let Some(v) = args.scaling {
        s.scaling = v;
    }
    if let Some(v) = &args.ranks {
        s.ranks = Some(v.clone());
    }
    if let Some(v) = args.node_fill {
        s.node_fill = v;
    }
    if let Some(v) = args.repeats {
        anyhow::ensure!(v >= 1, "--repeats must be at least 1");
        s.repeats = v;
    }
    s.apply_flags(&args.train)?;
    Ok(s)
}

/// `study.json`: what a resumed study is checked against.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StudyFile {
    name: String,
    /// Hash of `study.toml` as resolved for this job.
    hash: String,
    world_size: usize,
    nodes: usize,
    points: Vec<serde_json::Value>,
}

/// One row of `points.csv`.
#[derive(Debug, Clone, Serialize)]
struct PointRow {
    run: String,
    point: String,
    workload: String,
    scaling: String,
    repeat: usize,
    ranks: usize,
    batch_per_rank: usize,
    global_batch: usize,
    world_ranks: String,
    hosts: String,
    /// completed, failed, interrupted, or skipped (done in an earlier launch).
    status: String,
    error: String,
    #[serde(serialize_with = "record::plain_decimal")]
    wall_s: f64,
    /// The most CPU time any idle rank used per second of waiting (0 when none idled).
    #[serde(serialize_with = "record::plain_decimal")]
    idle_cpu_s_per_s: f64,
}

/// Entry point of `ddpbench study`.
pub fn main(args: StudyArgs) -> Result<()> {
    let spec = match spec_of(&args) {
        // Under a launcher every rank reads the same study: rank 0 says what is wrong.
        Err(e) if e.is::<crate::compare::Refusal>() && crate::world::launcher_rank().is_some_and(|r| r != 0) => {
            std::process::exit(crate::compare::REFUSAL_EXIT)
        }
        checked => job::check_before_mpi(checked)?,
    };
    let options = JobOptions {
        watchdog_limit_s: watchdog::SETUP_LIMIT_S,
        teardown_limit_s: watchdog::TEARDOWN_LIMIT_S,
        flags: launch_flags(&spec, &args),
    };
    job::run_job(options, |job| {
        let g = job.group;
        let why = match run(g, &spec, &args, job.watchdog)? {
            Ended::DryRun | Ended::Done(None) => None,
            Ended::Done(Some(why)) => Some(why),
        };
        // Rank 0 judged the study: every rank exits as it says.
        let why = broadcast_string(g, why.as_deref().unwrap_or(""));
        if why.is_empty() {
            return Ok(());
        }
        Err(AgreedError { rank: 0, message: why }.into())
    })
}

/// The job's layout and the fewest cores of any node, known to every rank.
fn layout(g: &Group) -> Result<(Layout, usize)> {
    let hosts = all_strings(g, &g.host);
    let cores = hwloc2::Topology::new()
        .map(|t| crate::topology::discover_cores(&t).len())
        .unwrap_or(1)
        .max(1) as u64;
    let mut fewest = 0u64;
    let _f = crate::flight::enter("all-reduce", "cores per node");
    g.comm.all_reduce_into(&cores, &mut fewest, SystemOperation::min());
    Ok((Layout::from_hosts(&hosts), fewest as usize))
}

/// How a study ended, for its exit status.
enum Ended {
    DryRun,
    /// Every point ran or was skipped; Some(why) when the study must exit non-zero.
    Done(Option<String>),
}

fn run(g: &Group, spec: &StudySpec, args: &StudyArgs, watchdog: &Watchdog) -> Result<Ended> {
    if g.rank == 0 {
        for note in &spec.renamed {
            eprintln!("note: {note}");
        }
    }
    let (layout, cores) = layout(g)?;
    let plan = agree(g, plan::plan(spec, &layout, cores))?;
    if let Some(p) = spec.peer {
        // Every rank starts the peer's processes: each checks its own Python.
        let version = agree(g, peer::torch_version(p))?;
        if g.rank == 0 {
            info!("peer {}: PyTorch {version} from {}", p.title(), peer::python().display());
        }
    }
    let resolved = spec.to_toml(&plan.ladder, plan.threads_per_rank);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("study-{}", spec.name)));
    let concern = layout.node_fill_concern(&plan.ladder, spec.node_fill);
    if args.dry_run {
        if let Some(c) = concern.as_ref().filter(|_| g.rank == 0) {
            println!("warning: {c} (a dry run only warns; the study refuses to run)");
        }
        dry_run(g, spec, &plan, &layout, &out, args.budget_s, watchdog);
        return Ok(Ended::DryRun);
    }
    if let Some(c) = concern {
        // Every rank saw the same layout: every rank returns the same refusal.
        return Err(AgreedError { rank: 0, message: c }.into());
    }
    let names: Vec<String> = plan::schedule(plan.points.len(), spec.repeats)
        .iter()
        .map(|&(pi, rep)| plan::run_name(&plan.points[pi], rep))
        .collect();
    let opened = if g.rank == 0 {
        open_folder(&out, spec, &plan, &resolved, &layout, &names, args.break_lock).map(|(s, l)| (s, Some(l)))
    } else {
        Ok((State::new(), None))
    };
    // Rank 0 holds the study folder's lock until the study ends (dropped on return).
    let (state, _lock) = agree(g, opened)?;
    // Between points a hang's flight records go to the study's folder.
    watchdog.set_flight_dir(out.clone());
    if g.rank == 0 {
        announce(spec, &plan, &layout, g.size, &out);
    }
    let swept = if args.allreduce_sweep { sweep(g, &out)? } else { Swept::Whole };
    let mut book = Book {
        out: out.clone(),
        layout,
        state,
        rows: if g.rank == 0 {
            Some(CsvLog::<PointRow>::append_or_create(&out.join("points.csv"))?)
        } else {
            None
        },
    };
    // A stop signal during the sweep ends the study before its first point.
    let mut stopped = swept != Swept::Whole;
    let bar = crate::progress::Bar::new("study", names.len() as u64, "points");
    for (part, &(pi, rep)) in plan::schedule(plan.points.len(), spec.repeats).iter().enumerate() {
        if stopped {
            break;
        }
        let point = &plan.points[pi];
        let name = plan::run_name(point, rep);
        bar.set(part as u64, format!("point {name}"));
        // Rank 0 decides from the run's folder what to do with this point; every rank follows.
        let decision = if g.rank == 0 {
            state::decide(&out, &book.state, &name, args.retry_failed)
        } else {
            Ok(Decision::Run)
        };
        let skip = match agree(g, decision)? {
            Decision::Run => String::new(),
            Decision::Skip(why) => why,
        };
        let skip = broadcast_string(g, &skip);
        if !skip.is_empty() {
            book.row(point, rep, &name, &skip, "", 0.0, 0.0)?;
            continue;
        }
        if run_scheduled(g, part, point, rep, &mut book, watchdog)? {
            stopped = true;
            break;
        }
    }
    drop(bar);
    let verdict = if g.rank == 0 {
        finish(&out, &book.state, &plan, spec, stopped)
    } else {
        None
    };
    let _f = crate::flight::enter("barrier", "end of the study");
    g.comm.barrier();
    Ok(Ended::Done(verdict))
}

/// What rank 0 keeps of a study as it goes: its folder, layout, state and points.csv.
struct Book {
    out: PathBuf,
    layout: Layout,
    state: State,
    rows: Option<CsvLog<PointRow>>,
}

impl Book {
    /// A points.csv row (rank 0).
    #[allow(clippy::too_many_arguments)]
    fn row(&mut self, point: &Point, rep: usize, name: &str, status: &str, error: &str, wall_s: f64, idle: f64) -> Result<()> {
        let Some(rows) = self.rows.as_mut() else { return Ok(()) };
        rows.write(&row(point, rep, name, &self.layout, status, error, wall_s, idle))?;
        rows.sync()
    }

    /// Records a run's outcome in the state (rank 0), at once.
    fn record(&mut self, name: &str, outcome: &PointOutcome) -> Result<()> {
        if self.rows.is_none() {
            return Ok(());
        }
        self.state.insert(name.to_string(), outcome.clone());
        state::save(&self.out, &self.state)
    }
}

/// Runs one scheduled point on its ranks while the others wait; every rank then learns
/// how it went. Returns true when a stop signal ends the study.
fn run_scheduled(g: &Group, part: usize, point: &Point, rep: usize, book: &mut Book, watchdog: &Watchdog) -> Result<bool> {
    let name = plan::run_name(point, rep);
    let dir = book.out.join("runs").join(&name);
    let base = (part as u64 + 1) << 32;
    let member = point.world_ranks.contains(&g.rank);
    crate::flight::recorder().begin_part(base, !member);
    watchdog.set_limit(watchdog::SETUP_LIMIT_S);
    let started = Instant::now();
    let color = if member { Color::with_value(0) } else { Color::undefined() };
    let sub = {
        let _f = crate::flight::enter("split", &format!("study point {name}"));
        g.comm.split_by_color(color)
    };
    let root = point.world_ranks[0];
    let (outcome, idle) = match sub {
        Some(comm) => {
            let pg = Group::new(comm, g.threading);
            let outcome = match run_point(&pg, point, &dir, watchdog) {
                Ok(()) if signals::received().is_some() => PointOutcome::new(RunStatus::Interrupted, None),
                Ok(()) => PointOutcome::new(RunStatus::Completed, None),
                Err(e) if e.downcast_ref::<AgreedError>().is_some() => PointOutcome::new(RunStatus::Failed, Some(format!("{e:#}"))),
                Err(e) => return Err(e.context(format!("study point {name}"))),
            };
            // The run's records are final: nothing that hangs later rewrites them.
            watchdog.end_run();
            drop(pg);
            if g.rank == root {
                book.record(&name, &outcome)?;
            }
            (Some(outcome), None)
        }
        None => (None, Some(IdleMeter::start())),
    };
    // Every rank meets here; those that waited did so without spinning.
    wait_without_spinning(g, &name);
    let idle_cpu = idle.map(IdleMeter::cpu_s_per_s).unwrap_or(0.0);
    crate::flight::recorder().begin_part(base + (1 << 31), false);
    // The point's first rank tells everyone how it went.
    let mine = outcome
        .as_ref()
        .map(|o| serde_json::to_string(o).unwrap_or_default())
        .unwrap_or_default();
    let said = broadcast_from(g, root, &mine);
    let outcome: PointOutcome =
        serde_json::from_str(&said).unwrap_or_else(|_| PointOutcome::new(RunStatus::Failed, Some("its outcome did not arrive".into())));
    let idles = gather_strings(g, &format!("{idle_cpu}"));
    let mut stop = 0i32;
    {
        let _f = crate::flight::enter("all-reduce", "study stop check");
        g.comm
            .all_reduce_into(&i32::from(signals::received().is_some()), &mut stop, SystemOperation::max());
    }
    if g.rank == 0 {
        let worst_idle = idles
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.parse::<f64>().ok())
            .fold(0.0, f64::max);
        let wall_s = started.elapsed().as_secs_f64();
        match &outcome.error {
            Some(e) => warn!("point {name} failed: {e}"),
            None => info!("point {name}: {} in {wall_s:.1} s", outcome.status.as_str()),
        }
        book.row(
            point,
            rep,
            &name,
            outcome.status.as_str(),
            outcome.error.as_deref().unwrap_or(""),
            wall_s,
            worst_idle,
        )?;
        if root != 0 {
            book.record(&name, &outcome)?;
        }
    }
    Ok(stop != 0)
}

/// `--dry-run`: the plan, and an estimate from timing each workload on rank 0.
fn dry_run(g: &Group, spec: &StudySpec, plan: &Plan, layout: &Layout, out: &Path, budget_s: f64, watchdog: &Watchdog) {
    if g.rank == 0 {
        print_plan(spec, plan, layout, out);
        println!(
            "\ntiming each workload on rank 0 ({} steps of its fewest-rank point, no validation; --budget-s {budget_s}) ...",
            estimate::TIMED_STEPS
        );
    }
    let timings = estimate::time_workloads(g, plan, budget_s, watchdog);
    if g.rank == 0 {
        print_estimate(plan, spec.repeats, &timings);
    }
}

fn announce(spec: &StudySpec, plan: &Plan, layout: &Layout, world: usize, out: &Path) {
    info!(
        "study {}: {} points × {} repeat(s) on {} ranks ({} node(s)), {} thread(s) per rank, into {}",
        spec.name,
        plan.points.len(),
        spec.repeats,
        world,
        layout.nodes.len(),
        plan.threads_per_rank,
        out.display()
    );
    for s in &plan.skipped {
        warn!("skipped: {} at {} ranks: {}", s.workload, s.ranks, s.why);
    }
}

/// The all-reduce sweep into `<out>/allreduce`, unless a resumed study has it (one a
/// stop signal ended has no model, and is swept again).
fn sweep(g: &Group, out: &Path) -> Result<Swept> {
    let sweep_dir = out.join("allreduce");
    let done = g.rank == 0 && crate::allreduce::link_model_path(&sweep_dir).is_some();
    if broadcast_string(g, if done { "done" } else { "" }) == "done" {
        return Ok(Swept::Whole);
    }
    if g.rank == 0 {
        info!("sweeping the all-reduce on all {} ranks into {}", g.size, sweep_dir.display());
        // An unfinished sweep of an earlier launch is kept aside, not deleted.
        if sweep_dir.exists() {
            let kept = out
                .join(state::DISCARDED)
                .join(format!("allreduce-{}", record::compact_utc(std::time::SystemTime::now())));
            if let Some(parent) = kept.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::rename(&sweep_dir, &kept);
        }
    }
    crate::allreduce::run_on(g, &crate::allreduce::AllreduceArgs::for_study(sweep_dir), None)
}

/// Runs one point on the ranks of `pg`.
fn run_point(pg: &Group, point: &Point, dir: &Path, watchdog: &Watchdog) -> Result<()> {
    let mut argv = point.args.clone();
    argv.push("--out".into());
    argv.push(dir.to_string_lossy().into_owned());
    let cfg = agree(pg, plan::parse_train(&argv))?;
    if let Some(p) = point.peer {
        return peer::run(pg, p, &cfg, dir);
    }
    let malloc = train::host_memory::apply(cfg.placement.malloc);
    train::train(pg, &cfg, &malloc, watchdog)
}

/// Rank `root`'s string, on every rank.
fn broadcast_from(g: &Group, root: usize, s: &str) -> String {
    use mpi::collective::Root;
    let _f = crate::flight::enter("broadcast", "study point outcome");
    let r = g.comm.process_at_rank(root as i32);
    let mut bytes = if g.rank == root { s.as_bytes().to_vec() } else { Vec::new() };
    let mut len = bytes.len() as u64;
    r.broadcast_into(&mut len);
    bytes.resize(len as usize, 0);
    r.broadcast_into(&mut bytes[..]);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A barrier on the world that leaves a waiting rank's core idle: a non-blocking
/// barrier tested every few milliseconds, sleeping in between (a blocking MPI barrier
/// busy-polls).
pub fn wait_without_spinning(g: &Group, what: &str) {
    let _f = crate::flight::enter("barrier", &format!("end of {what}"));
    let mut req = g.comm.immediate_barrier();
    let mut nap = Duration::from_micros(200);
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

/// CPU time this process uses while it waits.
struct IdleMeter {
    wall: Instant,
    cpu_s: f64,
}

fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills a zeroed struct for this process.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
        t(u.ru_utime) + t(u.ru_stime)
    }
}

impl IdleMeter {
    fn start() -> IdleMeter {
        IdleMeter {
            wall: Instant::now(),
            cpu_s: process_cpu_s(),
        }
    }

    /// CPU seconds per second of waiting since `start`.
    fn cpu_s_per_s(self) -> f64 {
        let wall = self.wall.elapsed().as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        (process_cpu_s() - self.cpu_s).max(0.0) / wall
    }
}

/// Creates the study folder and takes its lock, or checks that the folder there holds
/// this same study (and takes its lock: a study resumes once the job before has ended).
fn open_folder(
    out: &Path,
    spec: &StudySpec,
    plan: &Plan,
    resolved: &str,
    layout: &Layout,
    names: &[String],
    break_lock: bool,
) -> Result<(State, FolderLock)> {
    let created = !out.exists();
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let lock = FolderLock::take(out, "study folder", break_lock).inspect_err(|_| {
        if created {
            let _ = std::fs::remove_dir(out);
        }
    })?;
    Ok((start_or_resume(out, spec, plan, resolved, layout, names)?, lock))
}

/// The state of the study in `out` (locked): a new study's files written, or a resumed
/// study's state read.
fn start_or_resume(out: &Path, spec: &StudySpec, plan: &Plan, resolved: &str, layout: &Layout, names: &[String]) -> Result<State> {
    // The report keys change no point: a study resumes under other values of them.
    let points_only = plan::without_report_keys(resolved);
    let hash = plan::study_hash(&points_only);
    let json = out.join("study.json");
    if crate::files::is_regular_no_follow(&json) {
        let before: StudyFile = serde_json::from_str(&std::fs::read_to_string(&json)?)
            .with_context(|| format!("{} is not a ddpbench study file", json.display()))?;
        // A folder made before schema 4 holds the same study under the old keys.
        if before.hash != hash && before.hash != plan::study_hash(&plan::with_old_keys(&points_only)) {
            bail!(
                "{} holds a different study (its study.toml differs from this one's): use another --out, \
                 or remove the folder to start over",
                out.display()
            );
        }
        // study.toml says what this launch's report is made with.
        let saved = out.join("study.toml");
        if let Some(updated) = crate::files::read_regular_to_string(&saved, 1 << 20)
            .ok()
            .and_then(|text| plan::with_report_keys_of(&text, resolved))
        {
            record::write_atomic(&saved, &updated)?;
        }
        return state::load(out, names);
    }
    let other = std::fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        // The lock, and another job's attempts at it (`.ddpbench.lock.*`), are not the folder's.
        .find(|n| !n.to_string_lossy().starts_with(LOCK_FILE));
    if let Some(name) = other {
        bail!(
            "{} exists and is not a study folder (it holds {}): choose another --out",
            out.display(),
            name.to_string_lossy()
        );
    }
    std::fs::create_dir(out.join("runs")).with_context(|| format!("cannot create {}", out.join("runs").display()))?;
    record::write_atomic(&out.join("study.toml"), resolved)?;
    let file = StudyFile {
        name: spec.name.clone(),
        hash,
        world_size: layout.world_size(),
        nodes: layout.nodes.len(),
        points: plan.points.iter().map(|p| serde_json::to_value(p).unwrap_or_default()).collect(),
    };
    record::write_atomic(&json, &(serde_json::to_string_pretty(&file)? + "\n"))?;
    Ok(State::new())
}

#[allow(clippy::too_many_arguments)]
fn row(point: &Point, rep: usize, name: &str, layout: &Layout, status: &str, error: &str, wall_s: f64, idle: f64) -> PointRow {
    let hosts: Vec<&str> = layout
        .nodes
        .iter()
        .zip(&layout.hosts)
        .filter(|(ranks, _)| ranks.iter().any(|r| point.world_ranks.contains(r)))
        .map(|(_, h)| h.as_str())
        .collect();
    PointRow {
        run: name.into(),
        point: point.id.clone(),
        workload: point.workload.clone(),
        scaling: point.scaling.clone(),
        repeat: rep,
        ranks: point.ranks,
        batch_per_rank: point.batch_per_rank,
        global_batch: point.global_batch,
        world_ranks: crate::topology::compact_list(&point.world_ranks.iter().map(|&r| r as u32).collect::<Vec<_>>()),
        hosts: hosts.join(" "),
        status: status.into(),
        error: error.into(),
        wall_s,
        idle_cpu_s_per_s: idle,
    }
}

fn print_plan(spec: &StudySpec, plan: &Plan, layout: &Layout, out: &Path) {
    println!(
        "study {}: {} point(s) × {} repeat(s) = {} runs, ladder {:?}, {} thread(s) per rank, node fill {}, into {}",
        spec.name,
        plan.points.len(),
        spec.repeats,
        plan.points.len() * spec.repeats,
        plan.ladder,
        plan.threads_per_rank,
        spec.node_fill
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default(),
        out.display()
    );
    for (workload, points) in plan::by_workload(&plan.points) {
        println!("{workload}");
        for p in points {
            let hosts: Vec<&str> = layout
                .nodes
                .iter()
                .zip(&layout.hosts)
                .filter(|(ranks, _)| ranks.iter().any(|r| p.world_ranks.contains(r)))
                .map(|(_, h)| h.as_str())
                .collect();
            println!(
                "  {:<48} {:>3} ranks {:<12} batch {:>5}/rank {:>6} global  {:<12} on {}",
                p.id,
                p.ranks,
                crate::topology::compact_list(&p.world_ranks.iter().map(|&r| r as u32).collect::<Vec<_>>()),
                p.batch_per_rank,
                p.global_batch,
                p.scaling,
                hosts.join(",")
            );
        }
    }
    for s in &plan.skipped {
        println!("skipped: {} at {} ranks: {}", s.workload, s.ranks, s.why);
    }
}

/// The dry run's estimate per point and in all, from each workload's timing.
fn print_estimate(plan: &Plan, repeat: usize, timings: &BTreeMap<String, Result<estimate::WorkloadTiming, String>>) {
    let mut total = 0.0;
    let mut unknown = 0;
    for (workload, points) in plan::by_workload(&plan.points) {
        match timings.get(&workload) {
            Some(Ok(t)) => {
                println!(
                    "{workload}: {:.1} ms per step at batch {} on 1 rank, {:.1} s set-up",
                    t.step_s * 1e3,
                    t.batch_per_rank,
                    t.setup_s
                );
                for w in &t.warnings {
                    println!("  warning: {}", w.message);
                }
                for p in points {
                    match estimate::point_seconds(p, t) {
                        Some(s) => {
                            println!("  {:<48} ~{s:.0} s per run", p.id);
                            total += s * repeat as f64;
                        }
                        None => unknown += 1,
                    }
                    if let Some(w) = estimate::too_few_steps(p, t) {
                        println!("    warning: {}", w.message);
                    }
                }
            }
            Some(Err(e)) => {
                println!("{workload}: not timed: {e}");
                unknown += points.len();
            }
            None => unknown += points.len(),
        }
    }
    println!(
        "estimate: about {} for {} run(s){}; compute only (communication, waiting and validation come on top)",
        human_seconds(total),
        plan.points.len() * repeat,
        if unknown > 0 {
            format!(", {unknown} point(s) not estimated")
        } else {
            String::new()
        }
    );
}

fn human_seconds(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// The end of a study on rank 0: failures named, then the report over every point.
/// Returns why the study must exit non-zero: no run of it completed, or its report
/// could not be written.
fn finish(out: &Path, state: &State, plan: &Plan, spec: &StudySpec, stopped: bool) -> Option<String> {
    let repeat = spec.repeats;
    let failed: Vec<(&String, &PointOutcome)> = state.iter().filter(|(_, o)| o.status == RunStatus::Failed).collect();
    for (name, o) in &failed {
        eprintln!("failed point {name}: {}", o.error.as_deref().unwrap_or(""));
    }
    if stopped {
        eprintln!(
            "study interrupted: every finished point is in {}; run the same command again to resume",
            out.display()
        );
    }
    let completed = state.values().filter(|o| o.status == RunStatus::Completed).count();
    if completed == 0 {
        return Some(format!(
            "no run of the study completed ({} failed): see points.csv in {}",
            failed.len(),
            out.display()
        ));
    }
    let request = ReduceRequest {
        runs: vec![out.join("runs")],
        baseline: None,
        // A sweep the user ran into the study's folder (`ddpbench allreduce --out <study>/allreduce`).
        interconnect: crate::allreduce::link_model_path(&out.join("allreduce")).map(|_| out.join("allreduce")),
        project_to: 1024,
        link: spec.report.link.clone(),
        link_intra: spec.report.link_intra.clone(),
        project_shape: spec.report.project_shape.clone(),
        target_efficiency: spec.report.target_efficiency.unwrap_or(crate::reduce::report::TARGET_EFFICIENCY),
        price_per_gpu_hour: spec.report.price_per_gpu_hour,
        ..crate::reduce::ReduceRequest::default()
    };
    let report_dir = out.join("report");
    let reduced = match crate::reduce::run(&request) {
        Ok(r) => r,
        Err(e) => return Some(format!("the study's report could not be made: {e:#}")),
    };
    // reduce's files and the study's summary replace the previous ones together.
    let written = crate::files::StagedFiles::new(&report_dir)
        .map_err(anyhow::Error::from)
        .and_then(|mut files| {
            for n in crate::reduce::stage(&reduced, &mut files, true)? {
                eprintln!("report.html: {n}");
            }
            let verdicts = report::write(&mut files, plan, repeat, state, &reduced, true)?;
            files.commit()?;
            Ok(verdicts)
        })
        .with_context(|| crate::reduce::report::not_written(&report_dir));
    match written {
        Ok(verdicts) => {
            crate::reduce::report::print(&reduced, &report_dir, true);
            println!();
            for v in verdicts {
                println!("{v}");
            }
        }
        Err(e) => return Some(format!("the study's report could not be written: {e:#}")),
    }
    let not_run = plan.points.len() * repeat - state.len().min(plan.points.len() * repeat);
    println!(
        "study: {} point(s) × {repeat}: {completed} run(s) completed, {} failed, {not_run} not run; {} skipped by plan; report in {}",
        plan.points.len(),
        failed.len(),
        plan.skipped.len(),
        out.join("report").display()
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `study` argument is compared across ranks (or says why it may differ), the
    /// `train` options after `--` each under its name but `train`'s own rank-local ones.
    #[test]
    fn every_study_argument_is_compared_across_ranks_or_says_why_not() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        #[command(name = "study")]
        struct Line {
            #[command(flatten)]
            args: StudyArgs,
        }
        let args = Line::try_parse_from(["study", "--", "--max-steps", "7", "--node-type", "x"])
            .unwrap()
            .args;
        let flags = launch_flags(&spec_of(&args).unwrap(), &args);
        crate::job::same_flags::assert_every_flag_decided(&Line::command(), RANK_LOCAL, SAME_ON_EVERY_RANK, &flags);
        let compared: Vec<&str> = flags.flags().collect();
        assert!(compared.contains(&"-- --max-steps"), "{compared:?}");
        assert!(!compared.iter().any(|f| f.contains("--node-type")), "{compared:?}");
    }
}
