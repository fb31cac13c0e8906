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
pub mod plan;
mod report;

use crate::cli::ReduceArgs;
use crate::record::{self, CsvLog, Manifest};
use crate::train::{self, signals, watchdog, watchdog::Watchdog};
use crate::world::{agree, all_strings, broadcast_string, gather_strings, AgreedError, Group, World};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Color, Communicator};
use plan::{Layout, PlacementPolicy, Plan, Point, Scaling, StudySpec};
use serde::{Deserialize, Serialize};
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

    /// pack: a point's ranks fill as few nodes as they can; spread: one per node first.
    #[arg(long, value_enum)]
    pub placement: Option<PlacementPolicy>,

    /// Runs of each point, interleaved (all points, then all points again, ...).
    #[arg(long)]
    pub repeat: Option<usize>,

    /// Study folder (default: results/study-<name>). Run again to resume.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Print the points, their ranks and nodes, time each workload for a few steps on
    /// one rank, print an estimate of the study's time, and stop.
    #[arg(long)]
    pub dry_run: bool,

    /// Run again the points that failed before (by default a resumed study skips them).
    #[arg(long)]
    pub retry_failed: bool,

    /// Before the points, sweep the all-reduce on the whole allocation (`ddpbench
    /// allreduce`, 8 B to 64 MiB, MPI and, on GPUs, NCCL and staged) into <study>/allreduce
    /// (kept when a resumed study already has it), so that the report projects every
    /// workload beyond the allocation and checks the projection against the points.
    #[arg(long)]
    pub allreduce_sweep: bool,

    /// `train` options for every point, after `--` (e.g. `-- --max-steps 50 --overlap off`).
    #[arg(last = true, allow_hyphen_values = true)]
    pub train: Vec<String>,
}

/// The study as written: the file, then the command line.
pub fn spec_of(args: &StudyArgs) -> Result<StudySpec> {
    let (text, default_name) = match &args.file {
        Some(f) => (
            std::fs::read_to_string(f).with_context(|| format!("cannot read the study file {}", f.display()))?,
            f.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "study".into()),
        ),
        None => (String::new(), "default".to_string()),
    };
    let mut s = StudySpec::from_toml(&text, &default_name).with_context(|| match &args.file {
        Some(f) => format!("in {}", f.display()),
        None => "the default study".into(),
    })?;
    if let Some(v) = &args.name {
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
    if let Some(v) = args.placement {
        s.placement = v;
    }
    if let Some(v) = args.repeat {
        anyhow::ensure!(v >= 1, "--repeat must be at least 1");
        s.repeat = v;
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

/// Outcome of every point run so far (`state.json`), rewritten atomically after each.
type State = BTreeMap<String, PointOutcome>;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PointOutcome {
    status: String,
    error: Option<String>,
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
    let launcher_rank = crate::world::launcher_rank().unwrap_or(0);
    let spec = match spec_of(&args) {
        Ok(s) => s,
        Err(e) if launcher_rank == 0 => return Err(e),
        Err(_) => std::process::exit(1),
    };
    let world = World::init()?;
    let g = &world.group;
    train::init_logging(g.rank);
    train::install_abort_on_panic(g.rank, &g.host);
    signals::install();
    let watchdog = Watchdog::start(g, watchdog::SETUP_LIMIT_S);
    match run(g, &spec, &args, &watchdog) {
        Ok(()) => Ok(()),
        Err(err) => {
            let agreed = err.downcast_ref::<AgreedError>().is_some();
            drop(watchdog);
            if agreed {
                drop(world);
                if launcher_rank == 0 {
                    return Err(err);
                }
                std::process::exit(1)
            }
            eprintln!("Error on rank {launcher_rank}: {err:#}. Aborting the job.");
            // SAFETY: MPI is initialised; MPI_Abort ends every rank of the job.
            unsafe {
                mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 1);
            }
            std::process::exit(1)
        }
    }
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

/// Every rank's string, on every rank.
fn run(g: &Group, spec: &StudySpec, args: &StudyArgs, watchdog: &Watchdog) -> Result<()> {
    let (layout, cores) = layout(g)?;
    let plan = agree(g, plan::plan(spec, &layout, cores))?;
    let resolved = spec.to_toml(&plan.ladder, plan.threads_per_rank);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("study-{}", spec.name)));
    if args.dry_run {
        if g.rank == 0 {
            print_plan(spec, &plan, &layout, &out);
            println!(
                "\ntiming each workload on rank 0 ({} steps of its fewest-rank point, no validation) ...",
                estimate::TIMED_STEPS
            );
        }
        let timings = estimate::time_workloads(g, &plan, watchdog);
        if g.rank == 0 {
            print_estimate(&plan, spec.repeat, &timings);
        }
        return Ok(());
    }
    let opened = if g.rank == 0 {
        open_folder(&out, spec, &plan, &resolved, &layout)
    } else {
        Ok(State::new())
    };
    let mut state = agree(g, opened)?;
    if g.rank == 0 {
        info!(
            "study {}: {} points × {} repeat(s) on {} ranks ({} node(s)), {} thread(s) per rank, into {}",
            spec.name,
            plan.points.len(),
            spec.repeat,
            g.size,
            layout.nodes.len(),
            plan.threads_per_rank,
            out.display()
        );
        for s in &plan.skipped {
            warn!("skipped: {} at {} ranks: {}", s.workload, s.ranks, s.why);
        }
    }
    if args.allreduce_sweep {
        let sweep_dir = out.join("allreduce");
        let done = g.rank == 0 && sweep_dir.join("allreduce_model.json").is_file();
        if broadcast_string(g, if done { "done" } else { "" }) != "done" {
            if g.rank == 0 {
                info!("sweeping the all-reduce on all {} ranks into {}", g.size, sweep_dir.display());
                let _ = std::fs::remove_dir_all(&sweep_dir);
            }
            crate::allreduce::run_on(g, &crate::allreduce::AllreduceArgs::for_study(sweep_dir), None)?;
        }
    }
    let mut rows = if g.rank == 0 {
        Some(CsvLog::<PointRow>::append_or_create(&out.join("points.csv"))?)
    } else {
        None
    };
    let schedule = plan::schedule(plan.points.len(), spec.repeat);
    let mut stopped = false;
    for (part, &(pi, rep)) in schedule.iter().enumerate() {
        let point = &plan.points[pi];
        let name = plan::run_name(point, rep);
        let dir = out.join("runs").join(&name);
        // Rank 0 decides from the state what to do with this point; every rank follows.
        let decision = if g.rank == 0 {
            decide(&state, &name, &dir, args.retry_failed)
        } else {
            String::new()
        };
        let decision = broadcast_string(g, &decision);
        if decision != "run" {
            if let Some(r) = rows.as_mut() {
                r.write(&row(point, rep, &name, &layout, &decision, "", 0.0, 0.0))?;
            }
            continue;
        }
        let base = (part as u64 + 1) << 32;
        let member = point.world_ranks.contains(&g.rank);
        crate::flight::recorder().begin_part(base, false);
        watchdog.set_limit(watchdog::SETUP_LIMIT_S);
        let started = Instant::now();
        let color = if member { Color::with_value(0) } else { Color::undefined() };
        let sub = {
            let _f = crate::flight::enter("split", &format!("study point {name}"));
            g.comm.split_by_color(color)
        };
        let (mut outcome, idle) = match sub {
            Some(comm) => {
                let pg = Group::new(comm, g.threading);
                let result = run_point(&pg, point, &dir, watchdog);
                let outcome = match result {
                    Ok(()) if signals::received().is_some() => PointOutcome {
                        status: "interrupted".into(),
                        error: None,
                    },
                    Ok(()) => PointOutcome {
                        status: "completed".into(),
                        error: None,
                    },
                    Err(e) if e.downcast_ref::<AgreedError>().is_some() => PointOutcome {
                        status: "failed".into(),
                        error: Some(format!("{e:#}")),
                    },
                    Err(e) => return Err(e.context(format!("study point {name}"))),
                };
                drop(pg);
                (outcome, None)
            }
            None => {
                crate::flight::recorder().begin_part(base, true);
                (
                    PointOutcome {
                        status: String::new(),
                        error: None,
                    },
                    Some(IdleMeter::start()),
                )
            }
        };
        // Every rank meets here; those that waited did so without spinning.
        wait_without_spinning(g);
        let idle_cpu = idle.map(IdleMeter::cpu_s_per_s).unwrap_or(0.0);
        crate::flight::recorder().begin_part(base + (1 << 31), false);
        // The point's first rank tells everyone how it went.
        let root = point.world_ranks[0];
        let said = broadcast_from(g, root, &serde_json::to_string(&outcome)?);
        outcome = serde_json::from_str(&said).unwrap_or(outcome);
        let idles = gather_strings(g, &format!("{idle_cpu}"));
        let mut any_signal = i32::from(signals::received().is_some());
        let mut stop = 0i32;
        {
            let _f = crate::flight::enter("all-reduce", "study stop check");
            g.comm.all_reduce_into(&any_signal, &mut stop, SystemOperation::max());
        }
        any_signal = stop;
        if g.rank == 0 {
            let worst_idle = idles
                .unwrap_or_default()
                .iter()
                .filter_map(|s| s.parse::<f64>().ok())
                .fold(0.0, f64::max);
            let wall_s = started.elapsed().as_secs_f64();
            match &outcome.error {
                Some(e) => warn!("point {name} failed: {e}"),
                None => info!("point {name}: {} in {wall_s:.1} s", outcome.status),
            }
            if let Some(r) = rows.as_mut() {
                r.write(&row(
                    point,
                    rep,
                    &name,
                    &layout,
                    &outcome.status,
                    outcome.error.as_deref().unwrap_or(""),
                    wall_s,
                    worst_idle,
                ))?;
                r.sync()?;
            }
            state.insert(name.clone(), outcome.clone());
            record::write_atomic(&out.join("state.json"), &serde_json::to_string_pretty(&state)?)?;
        }
        if any_signal != 0 {
            stopped = true;
            break;
        }
    }
    if g.rank == 0 {
        finish(&out, &state, &plan, spec.repeat, stopped);
    }
    let _f = crate::flight::enter("barrier", "end of the study");
    g.comm.barrier();
    Ok(())
}

/// Runs one point on the ranks of `pg`.
fn run_point(pg: &Group, point: &Point, dir: &Path, watchdog: &Watchdog) -> Result<()> {
    let mut argv = point.args.clone();
    argv.push("--out".into());
    argv.push(dir.to_string_lossy().into_owned());
    let cfg = agree(pg, plan::parse_train(&argv))?;
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
pub fn wait_without_spinning(g: &Group) {
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

/// What to do with a point's run: `run`, or `skipped (...)` with the reason.
fn decide(state: &State, name: &str, dir: &Path, retry_failed: bool) -> String {
    let manifest_done = Manifest::read(dir).map(|m| m.status == "completed").unwrap_or(false);
    match state.get(name).map(|o| o.status.as_str()) {
        Some("completed") if manifest_done => return "skipped (completed earlier)".into(),
        Some("failed") if !retry_failed => return "skipped (failed earlier; --retry-failed runs it again)".into(),
        _ => {}
    }
    // A partial or failed folder from an earlier launch makes way for the new run.
    if dir.exists() {
        if let Err(e) = std::fs::remove_dir_all(dir) {
            warn!("cannot clear {}: {e}", dir.display());
        }
    }
    "run".into()
}

/// Creates the study folder, or checks that the one there holds this same study.
fn open_folder(out: &Path, spec: &StudySpec, plan: &Plan, resolved: &str, layout: &Layout) -> Result<State> {
    let hash = plan::study_hash(resolved);
    let json = out.join("study.json");
    if json.is_file() {
        let before: StudyFile = serde_json::from_str(&std::fs::read_to_string(&json)?)
            .with_context(|| format!("{} is not a ddpbench study file", json.display()))?;
        if before.hash != hash {
            bail!(
                "{} holds a different study (its study.toml differs from this one's): use another --out, \
                 or remove the folder to start over",
                out.display()
            );
        }
        let state = std::fs::read_to_string(out.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        return Ok(state);
    }
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(false) {
        bail!("{} exists and is not a study folder: choose another --out", out.display());
    }
    std::fs::create_dir_all(out.join("runs")).with_context(|| format!("cannot create {}", out.display()))?;
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
        "study {}: {} point(s) × {} repeat(s) = {} runs, ladder {:?}, {} thread(s) per rank, placement {}, into {}",
        spec.name,
        plan.points.len(),
        spec.repeat,
        plan.points.len() * spec.repeat,
        plan.ladder,
        plan.threads_per_rank,
        spec.placement
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
fn print_estimate(plan: &Plan, repeat: usize, timings: &BTreeMap<String, Result<estimate::Timing, String>>) {
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
                for p in points {
                    match estimate::point_seconds(p, t) {
                        Some(s) => {
                            println!("  {:<48} ~{s:.0} s per run", p.id);
                            total += s * repeat as f64;
                        }
                        None => unknown += 1,
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
fn finish(out: &Path, state: &State, plan: &Plan, repeat: usize, stopped: bool) {
    let failed: Vec<(&String, &PointOutcome)> = state.iter().filter(|(_, o)| o.status == "failed").collect();
    for (name, o) in &failed {
        eprintln!("failed point {name}: {}", o.error.as_deref().unwrap_or(""));
    }
    if stopped {
        eprintln!(
            "study interrupted: every finished point is in {}; run the same command again to resume",
            out.display()
        );
    }
    let args = ReduceArgs {
        runs: vec![out.join("runs")],
        baseline: None,
        out: Some(out.join("report")),
        no_plots: false,
        // A sweep the user ran into the study's folder (`ddpbench allreduce --out <study>/allreduce`).
        interconnect: out
            .join("allreduce")
            .join("allreduce_model.json")
            .is_file()
            .then(|| out.join("allreduce")),
        project_to: 1024,
    };
    if let Err(e) = crate::reduce::main(args) {
        eprintln!("the study's report could not be made: {e:#}");
    } else {
        match report::write(out, plan, repeat, state, true) {
            Ok(verdicts) => {
                println!();
                for v in verdicts {
                    println!("{v}");
                }
            }
            Err(e) => eprintln!("the study's summary could not be written: {e:#}"),
        }
        println!(
            "study: {} point(s), {} failed, {} skipped by plan; report in {}",
            plan.points.len(),
            failed.len(),
            plan.skipped.len(),
            out.join("report").display()
        );
    }
}
