//! The study as a job: the plan agreed by every rank, each scheduled point run on a
//! sub-communicator of exactly its ranks while the others wait, its outcome told to every
//! rank, and rank 0's report at the end.

use super::args::{launch_flags, spec_of, StudyArgs};
use super::book::{Book, PointRow};
use super::broadcast::{broadcast_from, wait_without_spinning};
use super::finish::finish;
use super::folder::open_folder;
use super::idle::IdleMeter;
use super::layout::Layout;
use super::plan::{self, Plan, Point};
use super::point::run_point;
use super::print::{announce, print_estimate, print_plan};
use super::spec::StudySpec;
use super::state::{self, Decision, PointOutcome, State};
use super::{estimate, peer};
use crate::allreduce::Swept;
use crate::job::{self, signals, watchdog, watchdog::Watchdog, JobOptions};
use crate::record::{self, CsvLog, RunStatus, StudyRun};
use crate::world::{agree, all_strings, broadcast_string, gather_strings, AgreedError, Group};
use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Color, Communicator};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracing::{info, warn};

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

/// The allocation `--nodes N --ranks-per-node P` asks a dry run to plan for: hosts
/// node000, node001, … with P ranks each.
fn planned_layout(nodes: usize, per_node: usize) -> Layout {
    let hosts: Vec<String> = (0..nodes * per_node).map(|r| format!("node{:03}", r / per_node)).collect();
    Layout::from_hosts(&hosts)
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
    let (layout, cores) = match (args.nodes, args.ranks_per_node) {
        (Some(n), Some(p)) => (planned_layout(n as usize, p as usize), layout(g)?.1),
        _ => layout(g)?,
    };
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
        if let (Some(n), Some(p), 0) = (args.nodes, args.ranks_per_node, g.rank) {
            println!(
                "planned for {n} node(s) × {p} rank(s) (--nodes, --ranks-per-node), not this job's {} rank(s); \
                 threads per rank from this machine's {cores} core(s): give `threads_per_rank` for the cluster's",
                g.size
            );
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
    // points.csv is opened with the folder, so that a file there that cannot be appended
    // to (a FIFO, a link) stops every rank with one message before the first point.
    let opened = if g.rank == 0 {
        open_folder(&out, spec, &plan, &resolved, &layout, &names, args.break_lock).and_then(|(s, l)| {
            let rows = CsvLog::<PointRow>::append_or_create(&out.join("points.csv"))?;
            Ok((s, Some(l), Some(rows)))
        })
    } else {
        Ok((State::new(), None, None))
    };
    // Rank 0 holds the study folder's lock until the study ends (dropped on return).
    let (state, _lock, rows) = agree(g, opened)?;
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
        rows,
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
            let study_run = StudyRun {
                point: point.id.clone(),
                repeat: rep,
            };
            let outcome = match run_point(&pg, point, Some(study_run), &dir, watchdog) {
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
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .map_or_else(|| "load average unknown".into(), |l| format!("load average {l} (1 min)"));
        println!(
            "\ntiming each workload on rank 0 of this machine ({} steps of its fewest-rank point at its batch per rank, \
             no validation; --budget-s {budget_s}), under {load} with {} core(s) for this rank: a busy machine times the steps long ...",
            estimate::TIMED_STEPS,
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
    }
    let timings = estimate::time_workloads(g, plan, budget_s, watchdog);
    if g.rank == 0 {
        print_estimate(plan, spec.repeats, &timings);
    }
}

/// The all-reduce sweep into `<out>/allreduce`, unless a resumed study has it (one a
/// stop signal ended has no model, and is swept again).
fn sweep(g: &Group, out: &Path) -> Result<Swept> {
    let sweep_dir = out.join("allreduce");
    let done = g.rank == 0 && crate::link::link_model_path(&sweep_dir).is_some();
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
