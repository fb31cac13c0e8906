//! The sweep itself: every rank agrees on the device, routes and levels, then each
//! (route, level) is a numbered part of the job in which every size is measured out of
//! place and in place, until the end or a stop signal.

use super::args::{dtype_name, sizes, AllreduceArgs, Level};
use super::file::{prepare_out, write_interrupted, write_whole, SweepFile, Swept};
use super::print::{print_header, print_line};
use super::sweep::{self, SweepIters};
use crate::bandwidth::{algbw, busbw};
use crate::comm::transport::{mpi::Mpi, nccl::Nccl, Transport};
use crate::comm::GradDtype;
use crate::job::watchdog::{self, Watchdog, WatchdogRun};
use crate::job::{self, signals, JobOptions};
use crate::link::Route;
use crate::record::{Backend, Buffer, Memory, RunStatus, SweepRow};
use crate::world::{agree, Group};
use anyhow::{bail, Result};
use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use std::path::PathBuf;
use tch::Device;

/// Entry point of `ddpbench allreduce`.
pub fn main(args: AllreduceArgs) -> Result<()> {
    job::check_before_mpi(args.validate())?;
    let options = JobOptions {
        watchdog_limit_s: args.watchdog_s,
        teardown_limit_s: args.watchdog_s.min(watchdog::TEARDOWN_LIMIT_S),
        flags: args.launch_flags(),
    };
    job::run_job(options, |job| run_on(job.group, &args, Some(job.watchdog)).map(|_| ()))
}

/// The sweep on `g` (every member calls it), its files under `args.out`; `watchdog`, when
/// given, writes its flight records there. A stop signal ends it after the size in
/// progress ([`Swept::Interrupted`]).
pub(crate) fn run_on(g: &Group, args: &AllreduceArgs, watchdog: Option<&Watchdog>) -> Result<Swept> {
    agree(g, args.validate())?;
    let device = agree(g, crate::device::resolve_device(args.device, g.local_rank))?;
    let max_bytes = agree(g, args.sweep_max_bytes(device))?;
    if device == Device::Cpu {
        agree(g, host_memory_fits(max_bytes, g.local_size))?;
    }
    let cores = hwloc2::Topology::new()
        .as_ref()
        .map(crate::topology::discover_cores)
        .unwrap_or_default();
    let node_type = crate::topology::NodeInfo::detect(&cores).node_type();
    let mut notes = Vec::new();
    let per_node = ranks_per_node(g, &mut notes);
    let levels = if args.levels.is_empty() {
        distinct_levels(g.nodes, per_node)
    } else {
        args.levels.clone()
    };
    let routes = agree(g, routes_for(args, device))?;

    // Rank 0's output folder, and its allreduce.csv, created exclusively: the one
    // sweep that made it writes the folder.
    let (out, csv) = agree(
        g,
        if g.rank == 0 {
            prepare_out(args.out.as_deref()).map(|(dir, csv)| (dir, Some(csv)))
        } else {
            Ok((PathBuf::new(), None))
        },
    )?;
    let out = PathBuf::from(crate::world::broadcast_string(g, &out.to_string_lossy()));
    if let Some(w) = watchdog {
        w.set_run(WatchdogRun {
            dir: out.clone(),
            run_id: "allreduce".into(),
        });
    }
    let mut sweep = Sweep {
        args,
        device,
        per_node,
        node_type: &node_type,
        sizes: sizes(args.min_bytes, max_bytes, args.factor, args.dtype.bytes() as u64),
        csv,
        rows: Vec::new(),
        notes,
        stopped: None,
    };
    sweep.run(g, &routes, &levels)?;
    let Sweep { rows, notes, stopped, .. } = sweep;
    if g.rank != 0 {
        return Ok(stopped.map_or(Swept::Whole, Swept::Interrupted));
    }
    let mut file = SweepFile {
        command_line: std::env::args().collect(),
        status: RunStatus::Completed,
        error: None,
        world_size: g.size,
        nodes: g.nodes,
        ranks_per_node: per_node,
        node_type,
        device: format!("{device:?}"),
        notes,
        rows,
    };
    match stopped {
        Some(sig) => write_interrupted(&out, &mut file, sig),
        None => write_whole(&out, &file),
    }
}

/// Ranks per node (this node's), with a note when nodes differ: the levels then mean
/// rank 0's node. Every rank takes part.
fn ranks_per_node(g: &Group, notes: &mut Vec<String>) -> usize {
    use mpi::collective::SystemOperation;
    let mut per_node_min = 0u64;
    let mut per_node_max = 0u64;
    g.comm
        .all_reduce_into(&(g.local_size as u64), &mut per_node_min, SystemOperation::min());
    g.comm
        .all_reduce_into(&(g.local_size as u64), &mut per_node_max, SystemOperation::max());
    if per_node_min != per_node_max {
        notes.push(format!(
            "nodes hold {per_node_min} to {per_node_max} ranks: the intra-node level is rank 0's node, and the link model assumes {} per node",
            g.local_size
        ));
    }
    g.local_size
}

/// The routes of the backends asked for (every one the device supports when none is):
/// MPI on host memory, and on a GPU MPI staged from device memory and NCCL; NCCL on CPU
/// is refused.
fn routes_for(args: &AllreduceArgs, device: Device) -> Result<Vec<Route>> {
    let backends = if args.backends.is_empty() {
        match device {
            Device::Cuda(_) => vec![Backend::Mpi, Backend::Nccl],
            _ => vec![Backend::Mpi],
        }
    } else {
        let mut asked: Vec<Backend> = Vec::new();
        for &b in &args.backends {
            if !asked.contains(&b) {
                asked.push(b);
            }
        }
        asked
    };
    let on_gpu = matches!(device, Device::Cuda(_));
    let mut routes = Vec::new();
    for backend in backends {
        match (backend, on_gpu) {
            (Backend::Mpi, _) => routes.push(Route {
                backend,
                memory: Memory::Host,
            }),
            (Backend::Nccl, false) => {
                bail!("--backends nccl: needs GPU buffers and this run is on CPU (--device cuda on a GPU node)")
            }
            (Backend::Nccl, true) => {}
            (Backend::None, _) => bail!("--backends none: nothing to sweep; name mpi or nccl"),
            (Backend::Gloo, _) => bail!("--backends gloo: PyTorch's all-reduce, which ddpbench does not run; name mpi or nccl"),
        }
        if on_gpu {
            routes.push(Route {
                backend,
                memory: Memory::Device,
            });
        }
    }
    Ok(routes)
}

/// Collective numbers of the sweep's parts: part p starts at p << PART_SHIFT (well below
/// the numbers a study gives its points, 1 << 32 and up, so a study's parts stay aligned).
const PART_SHIFT: u32 = 24;

/// The levels that differ on an allocation of `nodes` × `per_node` ranks.
pub(super) fn distinct_levels(nodes: usize, per_node: usize) -> Vec<Level> {
    match (nodes > 1, per_node > 1) {
        (false, _) => vec![Level::IntraNode],
        (true, false) => vec![Level::InterNode],
        (true, true) => vec![Level::IntraNode, Level::InterNode, Level::World],
    }
}

/// One sweep in progress: what it runs and what it has measured so far.
struct Sweep<'a> {
    args: &'a AllreduceArgs,
    device: Device,
    per_node: usize,
    node_type: &'a str,
    sizes: Vec<u64>,
    /// Rank 0's allreduce.csv.
    csv: Option<crate::record::CsvLog<SweepRow>>,
    rows: Vec<SweepRow>,
    notes: Vec<String>,
    /// The stop signal that ended the sweep early, agreed by every rank.
    stopped: Option<i32>,
}

impl Sweep<'_> {
    /// Every (route, level), each a part of the job whose collectives are numbered alike
    /// on every rank, and in which ranks outside the level's communicator are idle, so the
    /// watchdog judges a hang among the ranks that take part.
    fn run(&mut self, g: &Group, routes: &[Route], levels: &[Level]) -> Result<()> {
        // Whether ranks share a GPU (NCCL cannot then run), asked of all ranks once.
        let bus_id = match self.device {
            Device::Cuda(i) => crate::device::cuda::driver().and_then(|d| d.pci_bus_id(i)).ok(),
            _ => None,
        };
        let shared = crate::comm::transport::nccl::shared_gpu(g, self.device, bus_id.as_deref());
        // The communicators of each level (None where this rank sits a level out).
        let intra = g.comm.split_shared(0);
        let leaders = g.comm.split_by_color(if g.local_rank == 0 {
            Color::with_value(0)
        } else {
            Color::undefined()
        });
        let mut part = 0u64;
        for &route in routes {
            for &level in levels {
                part += 1;
                let base = part << PART_SHIFT;
                let comm: Option<&SimpleCommunicator> = match level {
                    Level::World => Some(&g.comm),
                    Level::IntraNode => Some(&intra),
                    Level::InterNode => leaders.as_ref(),
                };
                // Whether this backend can run here, agreed by every rank.
                if let Err(e) = agree(g, backend_usable(route.backend, self.device, shared.as_deref())) {
                    if g.rank == 0 {
                        let why = format!("{} at {} level skipped: {e:#}", route.label(), level.name());
                        eprintln!("{why}");
                        self.notes.push(why);
                    }
                    continue;
                }
                let shape = LevelShape::of(g, level, self.per_node);
                if g.rank == 0 {
                    print_header(route, level, shape.ranks, shape.nodes, self.args.dtype);
                }
                crate::flight::recorder().begin_part(base, comm.is_none());
                if let Some(comm) = comm {
                    self.sizes_on(comm, route, level, shape, g.rank == 0)?;
                }
                // Ranks that sat this level out wait here for the others.
                {
                    let _f = crate::flight::enter("barrier", &format!("after the {} sweep", level.name()));
                    g.comm.barrier();
                }
                crate::flight::recorder().begin_part(base + (1 << (PART_SHIFT - 1)), false);
                // A stop signal ends the sweep on every rank after the same size.
                self.stopped = stop_signal(&g.comm);
                if self.stopped.is_some() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Every size, out of place and in place, on one backend over `comm`.
    fn sizes_on(&mut self, comm: &SimpleCommunicator, route: Route, level: Level, shape: LevelShape, print: bool) -> Result<()> {
        let timing = SweepIters {
            warmup_iters: self.args.warmup_iters as usize,
            iters: self.args.iters as usize,
            budget_s: self.args.budget_s,
            min_iters: 3,
            idle: self.args.idle,
        };
        let (mut transport, device) = make_transport(route, comm, self.device)?;
        let mut target = sweep::Target {
            comm,
            device,
            transport: transport.as_mut(),
        };
        let bar = crate::progress::Bar::new(&format!("all-reduce {}", route.label()), self.sizes.len() as u64, "sizes");
        for (done, &bytes) in self.sizes.iter().enumerate() {
            bar.set(done as u64, format!("{bytes} bytes"));
            let mut pair = Vec::new();
            for in_place in [false, true] {
                let m = sweep::measure(&mut target, bytes, self.args.dtype, in_place, timing)?;
                let row = to_row(level, route, self.args.dtype, &m, shape, self.node_type);
                if let Some(log) = self.csv.as_mut() {
                    log.write(&row)?;
                    log.flush()?;
                }
                pair.push(row);
            }
            if print {
                crate::progress::suspend(|| print_line(&pair));
            }
            self.rows.extend(pair);
            if stop_signal(comm).is_some() {
                break;
            }
        }
        Ok(())
    }
}

/// The ranks of one level: how many, the nodes they span, and ranks per node.
#[derive(Debug, Clone, Copy)]
struct LevelShape {
    ranks: usize,
    nodes: usize,
    ranks_per_node: usize,
}

impl LevelShape {
    fn of(g: &Group, level: Level, per_node: usize) -> LevelShape {
        match level {
            Level::World => LevelShape {
                ranks: g.size,
                nodes: g.nodes,
                ranks_per_node: per_node,
            },
            Level::IntraNode => LevelShape {
                ranks: per_node,
                nodes: 1,
                ranks_per_node: per_node,
            },
            Level::InterNode => LevelShape {
                ranks: g.nodes,
                nodes: g.nodes,
                ranks_per_node: 1,
            },
        }
    }
}

/// The stop signal any rank of `comm` received, agreed by all of them (a collective of
/// `comm`), so that they stop after the same size as `train` stops after the same step.
fn stop_signal(comm: &SimpleCommunicator) -> Option<i32> {
    use mpi::collective::SystemOperation;
    let mine = signals::received().unwrap_or(0);
    let mut any = 0i32;
    let _f = crate::flight::enter("all-reduce", "stop check");
    comm.all_reduce_into(&mine, &mut any, SystemOperation::max());
    (any != 0).then_some(any)
}

/// Whether `local_ranks` ranks of this node can each hold a send and a receive buffer of
/// `max_bytes` (the largest size) in the memory the kernel says is available.
fn host_memory_fits(max_bytes: u64, local_ranks: usize) -> Result<()> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let available = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024);
    let needed = (max_bytes as u128) * 2 * local_ranks as u128;
    match available {
        Some(a) if needed > a as u128 => bail!(
            "--max-bytes {max_bytes}: {local_ranks} rank(s) on this node need {:.1} GiB for their buffers and {:.1} GiB is \
             available: lower --max-bytes",
            needed as f64 / (1u64 << 30) as f64,
            a as f64 / (1u64 << 30) as f64
        ),
        _ => Ok(()),
    }
}

/// Whether `backend` can run on this rank (CPU runs only reach here with `mpi`): NCCL
/// needs a GPU of its own (`shared`: why it has none) and NCCL loaded.
fn backend_usable(backend: Backend, device: Device, shared: Option<&str>) -> Result<()> {
    match (backend, device, shared) {
        (Backend::Nccl, _, Some(why)) => bail!("{why}"),
        (Backend::Nccl, Device::Cuda(i), None) => crate::comm::transport::nccl::prepare(i).map(|_| ()),
        _ => Ok(()),
    }
}

/// The transport training uses for `route`'s backend, over `comm`, and the device its
/// buffers live on: MPI on host memory, or on the rank's GPU through pinned host
/// buffers; NCCL on the GPU (joined here, every member of `comm` taking part).
fn make_transport<'a>(route: Route, comm: &'a SimpleCommunicator, device: Device) -> Result<(Box<dyn Transport + 'a>, Device)> {
    Ok(match (route.backend, route.memory, device) {
        (Backend::Mpi, Memory::Host, _) => (Box::new(Mpi::new(comm)), Device::Cpu),
        (Backend::Mpi, Memory::Device, d) => (Box::new(Mpi::new(comm)), d),
        // A failure to make the unique id on rank 0 ends the job (the caller's error path),
        // so it is not agreed over the level's communicator.
        (Backend::Nccl, _, Device::Cuda(i)) => (Box::new(Nccl::join(comm, i, |id| id)?), device),
        (Backend::Nccl, _, _) => bail!("nccl needs a GPU"),
        (Backend::None, _, _) => bail!("`none` all-reduces nothing"),
        (Backend::Gloo, _, _) => bail!("gloo is PyTorch's all-reduce, which ddpbench does not run"),
    })
}

/// The row of `allreduce.csv` for one measurement.
fn to_row(level: Level, route: Route, dtype: GradDtype, m: &sweep::SizeResult, shape: LevelShape, node_type: &str) -> SweepRow {
    SweepRow {
        level: level.name().into(),
        backend: route.backend,
        memory: route.memory,
        dtype: dtype_name(dtype).into(),
        buffer: if m.in_place { Buffer::InPlace } else { Buffer::OutOfPlace },
        ranks: shape.ranks,
        nodes: shape.nodes,
        ranks_per_node: shape.ranks_per_node,
        bytes: m.bytes,
        count: m.count,
        iters: m.iters,
        idle_before_s: m.idle_before_s,
        time_s: m.time_s,
        time_max_rank_s: m.time_max_rank_s,
        iter_p10_s: m.iter_p10_s,
        iter_median_s: m.iter_median_s,
        iter_p90_s: m.iter_p90_s,
        algbw_bytes_per_s: algbw(m.bytes as f64, m.time_s),
        busbw_bytes_per_s: busbw(m.bytes as f64, shape.ranks, m.time_s),
        wrong: m.wrong,
        node_type: node_type.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One backend name everywhere: MPI is swept on host memory, and on a GPU also on
    /// device memory (the staged path), NCCL only on a GPU; `staged` is read as mpi.
    #[test]
    fn routes_name_a_backend_and_where_its_buffers_live() {
        let route = |backend, memory| Route { backend, memory };
        let mut args = AllreduceArgs::for_study(PathBuf::new());
        assert_eq!(routes_for(&args, Device::Cpu).unwrap(), vec![route(Backend::Mpi, Memory::Host)]);
        assert_eq!(
            routes_for(&args, Device::Cuda(0)).unwrap(),
            vec![
                route(Backend::Mpi, Memory::Host),
                route(Backend::Mpi, Memory::Device),
                route(Backend::Nccl, Memory::Device)
            ]
        );
        args.backends = vec![<Backend as clap::ValueEnum>::from_str("staged", false).unwrap()];
        assert_eq!(routes_for(&args, Device::Cpu).unwrap(), vec![route(Backend::Mpi, Memory::Host)]);
        args.backends = vec![Backend::Nccl];
        let e = routes_for(&args, Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("--backends nccl: needs GPU buffers"), "{e}");
        assert!(<Backend as clap::ValueEnum>::from_str("none", false).is_err());
    }

    #[test]
    fn only_levels_that_differ_are_swept_by_default() {
        assert_eq!(distinct_levels(1, 2), vec![Level::IntraNode]);
        assert_eq!(distinct_levels(1, 1), vec![Level::IntraNode]);
        assert_eq!(distinct_levels(2, 1), vec![Level::InterNode]);
        assert_eq!(distinct_levels(2, 4), vec![Level::IntraNode, Level::InterNode, Level::World]);
    }
}
