//! `ddpbench allreduce`: an nccl-tests-style sweep of all-reduce sizes on every backend
//! the node supports, at every level of the allocation (within a node, across nodes with
//! one rank per node, the whole world), each sum checked, and the link model (α–β) fitted to
//! each level ([`model`]), which `reduce` uses to project a workload to more nodes. Every
//! size runs through the transport training uses ([`crate::comm::transport`]), and
//! [`probe`] times a training run's own buckets the same way.

pub(crate) mod link_model;
pub(crate) mod link_spec;
pub(crate) mod probe;
pub(crate) mod sweep;

pub use link_model::{LevelFit, LinkModel, FORMULA};

use crate::bandwidth::{algbw, busbw};
use crate::comm::transport::{mpi::Mpi, nccl::Nccl, Transport};
use crate::comm::GradDtype;
use crate::device::DeviceChoice;
use crate::job::same_flags::LaunchFlags;
use crate::job::watchdog::{self, Watchdog, WatchdogRun};
use crate::job::{self, signals, JobOptions};
use crate::record::{Backend, Buffer, DeviceKind, Memory, RunStatus, SweepRow};
use crate::world::{agree, Group};
use anyhow::{bail, Context, Result};
use clap::Args;
use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use sweep::{Idle, Route, SweepIters};
use tch::Device;

#[derive(Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
mpirun -n 2 ddpbench allreduce --max-bytes 64M          # two ranks on this node, host memory\n  \
srun -N 2 --ntasks-per-node 4 ddpbench allreduce        # intra-node, inter-node and the whole job\n  \
ddpbench reduce --interconnect results/allreduce-<time> results/<runs>   # project to more nodes\n\n\
Columns as nccl-tests prints them: time is the mean per all-reduce over the timed loop (averaged \
over ranks), algbw = size / time, busbw = algbw × 2(n−1)/n, #wrong = elements whose sum differs \
from the exact expected sum, over all ranks.")]
pub struct AllreduceArgs {
    /// Smallest message, bytes (K, M, G suffixes: powers of 1024). Every size is rounded
    /// down to whole elements of --dtype (at least one), and sizes that round alike are
    /// swept once.
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: u64,
    /// Largest message, bytes: at least one element of --dtype.
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    pub max_bytes: u64,
    /// Each size is this many times the previous one.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    pub factor: u64,
    /// Timed iterations per size at most (fewer for large sizes, see --budget-s). Small
    /// messages need many: at 20, a 64 KiB all-reduce's mean swings by ±50 % between
    /// runs on a shared machine.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub iters: u64,
    /// Untimed iterations before each size's timed loop.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub warmup_iters: u64,
    /// Seconds one size's timed loop may take: the warm-up's time decides the iterations
    /// (between 3 and --iters).
    #[arg(long, default_value_t = 1.0)]
    pub budget_s: f64,
    /// Milliseconds every rank leaves the link idle before each timed all-reduce (after
    /// a barrier; never part of a time), or `auto`: as long as one all-reduce of the size
    /// took in the warm-up, at most 50 ms. Training leaves the link idle while it
    /// computes, and a link that queues back-to-back traffic (a shaping qdisc, a deep
    /// switch buffer, a cloud NIC's rate limit) is faster after idle than when kept busy:
    /// `auto` measures what a training step sees. 0: back to back, as nccl-tests and a
    /// plain MPI_Allreduce loop time it. The idle counts against --budget-s.
    #[arg(long = "idle-ms", default_value = "auto", value_parser = Idle::parse_ms)]
    pub idle: Idle,
    /// Element type.
    #[arg(long, value_enum, default_value_t = GradDtype::Fp32)]
    pub dtype: GradDtype,
    /// Backends to sweep, comma-separated: mpi, nccl (default: every one the ranks'
    /// device supports). On a GPU, mpi is swept on host memory and on device memory
    /// staged through pinned host buffers (the path `train --allreduce mpi` runs there);
    /// `staged`, its name before, is read as mpi.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub backends: Vec<Backend>,
    /// Levels to sweep, comma-separated (default: every level that differs from the
    /// others on this allocation).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub levels: Vec<Level>,
    /// Where the device-memory buffers (nccl, and mpi staged through the host) live.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Seconds a rank may wait in one phase of one size (warm-up, timed loop, check)
    /// before the job is declared hung: the watchdog names the ranks that never came,
    /// writes rank-NNNNN.flight.json into the output folder and aborts the job. The job's
    /// teardown (MPI_Finalize) is watched with it too, at most 300 s.
    #[arg(long, default_value_t = watchdog::WARMUP_LIMIT_S)]
    pub watchdog_s: f64,
    /// Output folder (default: results/allreduce-<time>[-j<job id>]-<4 random hex
    /// digits>): allreduce.csv, allreduce.json, link_model.json. A folder that holds any
    /// of them (or a rank's flight record) is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The `allreduce` flags that may differ between the ranks of one job: none, since every
/// flag shapes the sweep every rank takes part in.
pub const RANK_LOCAL: &[(&str, &str)] = &[];

/// The `allreduce` flags every rank of a job must be given alike (compared at start-up).
pub const SAME_ON_EVERY_RANK: &[&str] = &[
    "--min-bytes",
    "--max-bytes",
    "--factor",
    "--iters",
    "--warmup-iters",
    "--budget-s",
    "--idle-ms",
    "--dtype",
    "--backends",
    "--levels",
    "--device",
    "--watchdog-s",
    "--out",
];

impl AllreduceArgs {
    /// The command and flags compared across ranks at start-up.
    pub fn launch_flags(&self) -> LaunchFlags {
        let idle = match self.idle {
            Idle::Auto => "auto".to_string(),
            Idle::Fixed(s) => format!("{}", s * 1e3),
        };
        LaunchFlags::new("allreduce", RANK_LOCAL)
            .with("--min-bytes", json!(self.min_bytes))
            .with("--max-bytes", json!(self.max_bytes))
            .with("--factor", json!(self.factor))
            .with("--iters", json!(self.iters))
            .with("--warmup-iters", json!(self.warmup_iters))
            .with("--budget-s", json!(self.budget_s))
            .with("--idle-ms", json!(idle))
            .with("--dtype", json!(self.dtype))
            .with("--backends", json!(self.backends))
            .with("--levels", json!(self.levels))
            .with("--device", json!(self.device))
            .with("--watchdog-s", json!(self.watchdog_s))
            .with("--out", json!(self.out))
    }

    /// Checks what needs no other rank: every rank finds the same answer, so rank 0 can
    /// say it before MPI starts.
    pub fn validate(&self) -> Result<()> {
        if self.min_bytes > self.max_bytes {
            bail!("--min-bytes {} is larger than --max-bytes {}", self.min_bytes, self.max_bytes);
        }
        let element = self.dtype.bytes() as u64;
        if self.max_bytes < element {
            bail!(
                "--max-bytes {} is smaller than one {} element ({element} bytes): nothing to all-reduce; raise --max-bytes",
                self.max_bytes,
                dtype_name(self.dtype)
            );
        }
        if !(self.budget_s.is_finite() && self.budget_s > 0.0) {
            bail!("--budget-s {} must be a positive number of seconds", self.budget_s);
        }
        if !(self.watchdog_s.is_finite() && self.watchdog_s > 0.0) {
            bail!("--watchdog-s {} must be a positive number of seconds", self.watchdog_s);
        }
        Ok(())
    }

    /// The sweep a study runs before its points: 8 B to 64 MiB by 2, a short budget per
    /// size, every backend the ranks' device supports, into `out`.
    pub fn for_study(out: PathBuf) -> AllreduceArgs {
        AllreduceArgs {
            min_bytes: 8,
            max_bytes: 64 << 20,
            factor: 2,
            iters: 100,
            warmup_iters: 5,
            budget_s: 0.5,
            idle: Idle::Auto,
            dtype: GradDtype::Fp32,
            backends: Vec::new(),
            levels: Vec::new(),
            device: DeviceChoice::Auto,
            watchdog_s: watchdog::WARMUP_LIMIT_S,
            out: Some(out),
        }
    }
}

/// Parses "4096", "64K", "16M", "1G" (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size in bytes (e.g. 4096, 64K, 16M, 1G)"))?;
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("'{s}': a size must be 1 byte or more and fit in 64 bits"))
}

/// The part of the allocation a sweep runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// All ranks of the job.
    World,
    /// The ranks of each node among themselves (every node at once; rank 0's node reported).
    IntraNode,
    /// One rank per node.
    InterNode,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::World => "world",
            Level::IntraNode => "intra-node",
            Level::InterNode => "inter-node",
        }
    }
}

/// `allreduce.json`: the sweep and what it ran on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepFile {
    pub command_line: Vec<String>,
    /// `completed`, or `interrupted` (a stop signal ended the sweep after a size; `rows`
    /// hold the sizes measured). Files written before this field were complete.
    #[serde(default = "completed")]
    pub status: RunStatus,
    /// What stopped an interrupted sweep: the signal and the last size measured.
    #[serde(default)]
    pub error: Option<String>,
    pub world_size: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub node_type: String,
    pub device: String,
    pub notes: Vec<String>,
    pub rows: Vec<SweepRow>,
}

fn completed() -> RunStatus {
    RunStatus::Completed
}

/// `link_model.json` (`allreduce_model.json` before schema 4): the link model, α–β fits
/// per level, of each route swept. "Model" alone is the network trained.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkModelFile {
    pub formula: String,
    pub models: Vec<RouteLinkModel>,
}

/// The fits of one all-reduce path: a backend, and where its buffers lived.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "RouteLinkModelAsRead")]
pub struct RouteLinkModel {
    pub backend: Backend,
    pub memory: Memory,
    #[serde(flatten)]
    pub model: LinkModel,
}

impl RouteLinkModel {
    pub fn route(&self) -> Route {
        Route {
            backend: self.backend,
            memory: self.memory,
        }
    }
}

/// A [`RouteLinkModel`] as any schema wrote it: before schema 4, `backend` was `mpi` (host
/// buffers), `staged` (device buffers through host) or `nccl`, and `memory` was absent.
#[derive(Deserialize)]
struct RouteLinkModelAsRead {
    backend: String,
    memory: Option<Memory>,
    #[serde(flatten)]
    model: LinkModel,
}

impl TryFrom<RouteLinkModelAsRead> for RouteLinkModel {
    type Error = String;

    fn try_from(m: RouteLinkModelAsRead) -> std::result::Result<RouteLinkModel, String> {
        let backend = Backend::from_name(&m.backend).map_err(|e| format!("backend {e}"))?;
        let memory = match (m.memory, m.backend.as_str(), backend) {
            (Some(memory), _, _) => memory,
            (None, "staged", _) | (None, _, Backend::Nccl) => Memory::Device,
            (None, _, _) => Memory::Host,
        };
        Ok(RouteLinkModel {
            backend,
            memory,
            model: m.model,
        })
    }
}

impl LinkModelFile {
    /// Reads `link_model.json` (or a folder's `allreduce_model.json`, its name before
    /// schema 4) from a file or a sweep folder, no larger than
    /// [`crate::bounds::MAX_JSON_BYTES`], and checks every fit ([`LinkModel::check`]);
    /// Err names the file, and the key that no link has.
    pub fn read(path: &Path) -> Result<LinkModelFile> {
        let file = if path.is_dir() {
            link_model_path(path).unwrap_or_else(|| path.join(LINK_MODEL_FILE))
        } else {
            path.to_path_buf()
        };
        let text =
            crate::bounds::read_json_text(&file).map_err(|e| anyhow::anyhow!("{e} (a folder written by `ddpbench allreduce` holds it)"))?;
        let mf: LinkModelFile = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a link model written by `ddpbench allreduce`", file.display()))?;
        for (i, m) in mf.models.iter().enumerate() {
            m.model
                .check()
                .map_err(|e| anyhow::anyhow!("{}: models[{i}] ({}): {e}: the file is damaged", file.display(), m.backend))?;
        }
        Ok(mf)
    }

    /// The model for a run that all-reduced with `backend` from gradients on `device`.
    pub fn for_run(&self, backend: Backend, device: DeviceKind) -> Option<&RouteLinkModel> {
        let memory = Memory::of_device(device);
        self.models.iter().find(|m| m.backend == backend && m.memory == memory)
    }

    /// The model for the run of `manifest`: its backend, from rank 0's device; else what
    /// is missing and the sweep that measures it.
    pub fn for_manifest(&self, manifest: &crate::record::Manifest) -> Result<&RouteLinkModel, String> {
        let device = DeviceKind::of_ranks(manifest.ranks.get(..1).unwrap_or_default());
        self.for_run(manifest.comm_backend, device).ok_or_else(|| {
            let (backend, memory) = (manifest.comm_backend, Memory::of_device(device));
            let flag = if memory == Memory::Device { " --device cuda" } else { "" };
            format!(
                "no link model for its all-reduce ({backend} on {} memory): sweep it with `ddpbench allreduce --backends {backend}{flag}`",
                memory.name()
            )
        })
    }
}

/// The link model's file in a sweep folder.
pub const LINK_MODEL_FILE: &str = "link_model.json";

/// The link model's file in sweep folder `dir`, under its name or the one before schema 4
/// (`allreduce_model.json`); None when there is neither.
pub fn link_model_path(dir: &Path) -> Option<PathBuf> {
    [LINK_MODEL_FILE, "allreduce_model.json"]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

/// Collective numbers of the sweep's parts: part p starts at p << PART_SHIFT (well below
/// the numbers a study gives its points, 1 << 32 and up, so a study's parts stay aligned).
const PART_SHIFT: u32 = 24;

/// The levels that differ on an allocation of `nodes` × `per_node` ranks.
pub fn distinct_levels(nodes: usize, per_node: usize) -> Vec<Level> {
    match (nodes > 1, per_node > 1) {
        (false, _) => vec![Level::IntraNode],
        (true, false) => vec![Level::InterNode],
        (true, true) => vec![Level::IntraNode, Level::InterNode, Level::World],
    }
}

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
pub fn run_on(g: &Group, args: &AllreduceArgs, watchdog: Option<&Watchdog>) -> Result<Swept> {
    agree(g, args.validate())?;
    let device = agree(g, crate::device::resolve_device(args.device, g.local_rank))?;
    if device == Device::Cpu {
        agree(g, host_memory_fits(args.max_bytes, g.local_size))?;
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
        sizes: sizes(args.min_bytes, args.max_bytes, args.factor, args.dtype.bytes() as u64),
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

/// Rank 0's end of a whole sweep: `allreduce.json`, the models fitted to it in
/// `link_model.json`, each printed.
fn write_whole(out: &Path, file: &SweepFile) -> Result<Swept> {
    crate::record::write_atomic(&out.join("allreduce.json"), &(serde_json::to_string_pretty(file)? + "\n"))?;
    let rows = &file.rows;
    let models = fit_models(rows, file.nodes, file.ranks_per_node, &file.node_type);
    let mf = LinkModelFile {
        formula: link_model::FORMULA.into(),
        models: models.iter().filter_map(|m| m.as_ref().ok().cloned()).collect(),
    };
    println!();
    for m in &models {
        match m {
            Ok(bm) => print_model(bm, rows),
            Err(e) => println!("no link model: {e:#}"),
        }
    }
    crate::record::write_atomic(&out.join(LINK_MODEL_FILE), &(serde_json::to_string_pretty(&mf)? + "\n"))?;
    println!("\nwrote {}/{{allreduce.csv, allreduce.json, {LINK_MODEL_FILE}}}", out.display());
    check_sums(rows)?;
    Ok(Swept::Whole)
}

/// How a sweep ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swept {
    /// Every size of every backend and level.
    Whole,
    /// A stop signal (its number) ended it on every rank after the same size.
    Interrupted(i32),
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

/// Rank 0's end of a sweep that signal `sig` stopped: `allreduce.json` says so and holds
/// the sizes measured; no model is fitted, since the sizes not reached would be
/// extrapolated (and a study takes a folder with a model as a finished sweep).
fn write_interrupted(out: &Path, file: &mut SweepFile, sig: i32) -> Result<Swept> {
    let signal = signals::name(sig);
    let why = match file.rows.last() {
        Some(r) => format!("{signal} after {} B of {} at {} level", r.bytes, r.backend, r.level),
        None => format!("{signal} before any size was measured"),
    };
    file.status = RunStatus::Interrupted;
    file.error = Some(why.clone());
    crate::record::write_atomic(&out.join("allreduce.json"), &(serde_json::to_string_pretty(&file)? + "\n"))?;
    tracing::warn!(
        "interrupted by {why}: the {} measurements so far are in {}/{{allreduce.csv, allreduce.json}}; no link model is fitted \
         from part of a sweep (run it again whole)",
        file.rows.len(),
        out.display()
    );
    check_sums(&file.rows)?;
    Ok(Swept::Interrupted(sig))
}

/// Err when any sum of `rows` was wrong on any rank.
fn check_sums(rows: &[SweepRow]) -> Result<()> {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        bail!("{wrong} element(s) of the all-reduce results were wrong (column wrong in allreduce.csv): the sums are not to be trusted");
    }
    Ok(())
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

/// Sizes from `min` to `max`, each `factor` times the previous, rounded down to whole
/// elements of `element` bytes (at least one), each size once: 1, 2 and 4 bytes of fp32
/// are one 4-byte all-reduce, measured once.
pub fn sizes(min: u64, max: u64, factor: u64, element: u64) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut s = min;
    while s <= max {
        let whole = (s / element).max(1) * element;
        if out.last() != Some(&whole) {
            out.push(whole);
        }
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    out
}

/// The sweep's folder (`--out`, else a new one under `results/`, made exclusively so
/// that two sweeps started in the same second never share one) and its allreduce.csv.
/// A folder that holds a file a sweep writes is refused, naming it.
fn prepare_out(out: Option<&Path>) -> Result<(PathBuf, crate::record::CsvLog<SweepRow>)> {
    let dir = match out {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create output folder {} (choose another --out)", d.display()))?;
            d.to_path_buf()
        }
        None => {
            let parent = Path::new("results");
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
            let job = crate::record::lock::scheduler_job()
                .map(|(_, id)| format!("-j{id}"))
                .unwrap_or_default();
            let stem = format!("allreduce-{}{job}", crate::record::compact_utc(std::time::SystemTime::now()));
            crate::files::create_dir_fresh(parent, &stem, 2, 0o777)
                .with_context(|| format!("cannot create a sweep folder in {} (give --out)", parent.display()))?
        }
    };
    let held = |name: &str| std::fs::symlink_metadata(dir.join(name)).is_ok();
    if held("allreduce.csv") {
        bail!(
            "{} already holds a sweep (allreduce.csv): choose another --out or move it away",
            dir.display()
        );
    }
    let written = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list output folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .find(|n| n == "allreduce.json" || n == LINK_MODEL_FILE || n.starts_with("rank-"));
    if let Some(name) = written {
        bail!(
            "{} already holds {name}, a file a sweep writes (ddpbench overwrites no file and writes through no link): \
             choose another --out or move it away",
            dir.display()
        );
    }
    let csv = crate::record::CsvLog::create_new(&dir.join("allreduce.csv"))
        .with_context(|| format!("{} is being written by another sweep: choose another --out", dir.display()))?;
    Ok((dir, csv))
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

fn to_row(level: Level, route: Route, dtype: GradDtype, m: &sweep::Measured, shape: LevelShape, node_type: &str) -> SweepRow {
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

fn dtype_name(d: GradDtype) -> &'static str {
    match d {
        GradDtype::Fp32 => "float",
        GradDtype::Fp16 => "half",
        GradDtype::Bf16 => "bfloat16",
    }
}

fn print_header(route: Route, level: Level, ranks: usize, nodes: usize, dtype: GradDtype) {
    println!(
        "\n# all-reduce sum, {} ({} rank(s) on {} node(s)), backend {}, {}",
        level.name(),
        ranks,
        nodes,
        route.label(),
        dtype_name(dtype)
    );
    println!("#{:>39}  {:>29}  out-of-place  {:>29}  in-place", "", "", "");
    println!(
        "#{:>12} {:>12} {:>8}  {:>10} {:>8} {:>8} {:>6}  {:>10} {:>8} {:>8} {:>6}",
        "size (B)", "count", "type", "time (us)", "algbw", "busbw", "#wrong", "time (us)", "algbw", "busbw", "#wrong"
    );
    println!(
        "#{:>12} {:>12} {:>8}  {:>10} {:>8} {:>8} {:>6}  {:>10} {:>8} {:>8} {:>6}",
        "", "(elements)", "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "(GB/s)", ""
    );
}

fn print_line(pair: &[SweepRow]) {
    let (o, i) = (&pair[0], &pair[1]);
    println!(
        " {:>12} {:>12} {:>8}  {:>10.2} {:>8.3} {:>8.3} {:>6}  {:>10.2} {:>8.3} {:>8.3} {:>6}",
        o.bytes,
        o.count,
        o.dtype,
        o.time_s * 1e6,
        o.algbw_bytes_per_s / 1e9,
        o.busbw_bytes_per_s / 1e9,
        o.wrong,
        i.time_s * 1e6,
        i.algbw_bytes_per_s / 1e9,
        i.busbw_bytes_per_s / 1e9,
        i.wrong
    );
}

/// One model per route swept (backend and memory): the intra-node and inter-node fits of
/// its out-of-place times.
pub fn fit_models(rows: &[SweepRow], nodes: usize, per_node: usize, node_type: &str) -> Vec<Result<RouteLinkModel>> {
    let mut routes: Vec<(Backend, Memory)> = rows.iter().map(|r| (r.backend, r.memory)).collect();
    routes.sort_unstable();
    routes.dedup();
    routes
        .into_iter()
        .map(|(b, memory)| {
            let route = Route { backend: b, memory }.label();
            let level_fit = |level: &str| -> Option<Result<LevelFit>> {
                let pts: Vec<&SweepRow> = rows
                    .iter()
                    .filter(|r| r.backend == b && r.memory == memory && r.level == level && r.buffer == Buffer::OutOfPlace)
                    .collect();
                let first = pts.first()?;
                let points: Vec<(u64, f64)> = pts.iter().map(|r| (r.bytes, r.time_s)).collect();
                let fitted = link_model::fit(level, b, &first.dtype, first.ranks, &points).map(|mut f| {
                    for (res, row) in f.residuals.iter_mut().zip(&pts) {
                        res.idle_before_s = row.idle_before_s;
                        if row.iter_median_s > 0.0 {
                            res.rel_spread = (row.iter_p90_s - row.iter_p10_s) / 2.0 / row.iter_median_s;
                        }
                    }
                    f
                });
                Some(fitted)
            };
            let intra = level_fit("intra-node").transpose().with_context(|| format!("backend {route}"))?;
            let inter = level_fit("inter-node").transpose().with_context(|| format!("backend {route}"))?;
            if intra.is_none() && inter.is_none() {
                bail!("backend {route}: neither the intra-node nor the inter-node level was swept");
            }
            Ok(RouteLinkModel {
                backend: b,
                memory,
                model: LinkModel {
                    formula: link_model::FORMULA.into(),
                    ranks_per_node: per_node,
                    nodes,
                    intra,
                    inter,
                    node_type: node_type.into(),
                },
            })
        })
        .collect()
}

fn print_model(bm: &RouteLinkModel, rows: &[SweepRow]) {
    for f in [&bm.model.intra, &bm.model.inter].into_iter().flatten() {
        println!(
            "{}, {} link model over {} ranks: alpha {:.2} us, bandwidth {:.3} GB/s (1/beta), |error| max {:.1} % rms {:.1} % over {}..{} B",
            bm.route().label(),
            f.level,
            f.ranks,
            f.alpha_s * 1e6,
            f.bandwidth_bytes_per_s / 1e9,
            f.max_abs_rel_error * 100.0,
            f.rms_rel_error * 100.0,
            f.min_bytes,
            f.max_bytes
        );
        if let Some(w) = f.warning() {
            crate::stderr::line(format!("{}, {w}\n", bm.route().label()).into_bytes());
        }
    }
    // The whole world measured against the two levels combined: the model's own check.
    let world: Vec<&SweepRow> = rows
        .iter()
        .filter(|r| r.backend == bm.backend && r.memory == bm.memory && r.level == "world" && r.buffer == Buffer::OutOfPlace)
        .collect();
    let errors: Vec<f64> = world
        .iter()
        .filter_map(|r| {
            let p = bm.model.time_s(r.nodes, r.ranks_per_node, r.bytes as f64).ok()?;
            let measured = r.time_s;
            Some((p.time_s - measured) / measured)
        })
        .collect();
    if !errors.is_empty() {
        let abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        println!(
            "{}, world ({} ranks) against the hierarchical link model: |error| median {:.1} %, max {:.1} % over {} sizes",
            bm.route().label(),
            world[0].ranks,
            crate::stats::median(&abs) * 100.0,
            abs.iter().copied().fold(0.0, f64::max) * 100.0,
            abs.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `allreduce` flag is compared across ranks (or says why it may differ).
    #[test]
    fn every_allreduce_flag_is_compared_across_ranks_or_says_why_not() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        #[command(name = "allreduce")]
        struct Line {
            #[command(flatten)]
            args: AllreduceArgs,
        }
        let args = Line::try_parse_from(["allreduce"]).unwrap().args;
        crate::job::same_flags::assert_every_flag_decided(&Line::command(), RANK_LOCAL, SAME_ON_EVERY_RANK, &args.launch_flags());
    }

    #[test]
    fn sizes_and_byte_suffixes() {
        assert_eq!(sizes(8, 64, 2, 4), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 4, 4), vec![8, 32]);
        assert_eq!(sizes(u64::MAX / 2, u64::MAX, 4, 1), vec![u64::MAX / 2]);
        // Below and between whole elements: rounded down, each once.
        assert_eq!(sizes(1, 16, 2, 4), vec![4, 8, 16]);
        assert_eq!(sizes(3, 27, 3, 2), vec![2, 8, 26]);
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err() && parse_bytes("12Q").is_err() && parse_bytes("99999999999G").is_err());
    }

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

    /// A link model file of the schema-3 binary (`mpi` on host memory, `staged` from a
    /// GPU's memory) joins runs as before: a CPU run to the host fit, a GPU run with
    /// `--allreduce mpi` to the staged one; a new file says `memory` itself.
    #[test]
    fn old_model_files_map_staged_to_mpi_on_device_memory() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2/sweep/allreduce_model.json");
        let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let mut staged = file["models"][0].clone();
        staged["backend"] = "staged".into();
        staged["intra"]["backend"] = "staged".into();
        staged["ranks_per_node"] = 7.into();
        file["models"].as_array_mut().unwrap().push(staged);
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("allreduce_model.json"), file.to_string()).unwrap();
        let mf = LinkModelFile::read(d.path()).unwrap();
        let cpu = mf.for_run(Backend::Mpi, DeviceKind::Cpu).unwrap();
        assert_eq!((cpu.memory, cpu.model.ranks_per_node), (Memory::Host, 2));
        let gpu = mf.for_run(Backend::Mpi, DeviceKind::Cuda).unwrap();
        assert_eq!((gpu.memory, gpu.model.ranks_per_node), (Memory::Device, 7));
        assert_eq!(gpu.model.intra.as_ref().unwrap().backend, Backend::Mpi);
        assert!(mf.for_run(Backend::Nccl, DeviceKind::Cuda).is_none());
        let written = serde_json::to_value(gpu).unwrap();
        assert_eq!(
            (written["backend"].as_str(), written["memory"].as_str()),
            (Some("mpi"), Some("device"))
        );
        // A name no schema wrote is refused, named.
        file["models"][0]["backend"] = "gloo".into();
        std::fs::write(d.path().join("allreduce_model.json"), file.to_string()).unwrap();
        let e = format!("{:#}", LinkModelFile::read(d.path()).unwrap_err());
        assert!(e.contains("\"gloo\": not an all-reduce"), "{e}");
    }

    #[test]
    fn only_levels_that_differ_are_swept_by_default() {
        assert_eq!(distinct_levels(1, 2), vec![Level::IntraNode]);
        assert_eq!(distinct_levels(1, 1), vec![Level::IntraNode]);
        assert_eq!(distinct_levels(2, 1), vec![Level::InterNode]);
        assert_eq!(distinct_levels(2, 4), vec![Level::IntraNode, Level::InterNode, Level::World]);
    }
}
