//! Where a rank runs: the MPI world (rank, size, local rank, host), the node's
//! hardware and its node type, and the hwloc core binding each rank gets.
//!
//! The binding plans are pure functions of a core list ([`plan_binding`], and
//! [`plan_gpu_binding`] for the cores nearest a GPU) so they are tested without
//! hardware; hwloc only supplies the core list and applies the plan. hwloc2 2.2.0
//! predates hwloc 2.x for NUMA and I/O objects (see toolchain notes), so only
//! Package/Core/PU objects are asked of it; NUMA nodes are counted from sysfs, and
//! a GPU's locality comes from the audited hwloc FFI in `topology/pci.rs` ([`pci_locality`]).

mod pci;

pub use pci::{parse_pci_bus_id, pci_locality, GpuPlace, PciBusId};

use crate::cli::TopoArgs;
use crate::telemetry::{gpu_inventory, GpuInfo, NVML_LIBRARY};
use anyhow::{Context, Result};
use hwloc2::{CpuBindFlags, CpuSet, ObjectType, Topology};
use mpi::topology::{Communicator, SimpleCommunicator};
use serde::Serialize;
use std::collections::BTreeSet;

use clap::ValueEnum;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BindPolicy {
    /// Spread local ranks over packages, give each a disjoint set of cores.
    Auto,
    /// One core per local rank.
    Core,
    /// One whole package (socket) per local rank.
    Socket,
    /// Leave binding to the launcher or the OS.
    None,
}

/// One physical core: the package it sits in and its hardware threads (OS indexes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CoreSlot {
    pub package: usize,
    pub pus: Vec<u32>,
}

/// What a rank was (or would be) bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub policy: BindPolicy,
    /// Indexes into the node's core list; empty for `none`.
    pub cores: Vec<usize>,
    /// OS indexes of the hardware threads in the binding.
    pub pus: Vec<u32>,
    /// Packages the binding touches.
    pub packages: Vec<usize>,
    /// True when more local ranks than cores forced ranks to share cores.
    pub shared: bool,
    /// Intra-op threads this binding supports: its core count (or cores / local ranks for `none`).
    pub threads: usize,
    /// Set when a GPU-near plan ([`plan_gpu_binding`]) could not use the GPU's cores and
    /// fell back to [`plan_binding`]: why. Always `None` from [`plan_binding`].
    pub fallback: Option<String>,
}

/// Splits `items` into `parts` contiguous runs whose lengths differ by at most one.
fn split_even(items: &[usize], parts: usize, index: usize) -> Vec<usize> {
    let base = items.len() / parts;
    let extra = items.len() % parts;
    let start = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    items[start..start + len].to_vec()
}

/// The cores local rank `local_rank` of `local_size` gets under `policy`.
///
/// `auto` first spreads ranks over packages (rank r goes to package r·P/n) and then
/// splits that package's cores evenly and disjointly among the ranks placed on it;
/// with fewer ranks than packages a rank takes several whole packages. When ranks
/// outnumber cores, `auto` leaves them unbound (pinned busy-polling ranks sharing a
/// core can starve each other) and sets `shared`; `core` and `socket` share round-robin.
pub fn plan_binding(cores: &[CoreSlot], policy: BindPolicy, local_rank: usize, local_size: usize) -> Binding {
    assert!(local_size > 0 && local_rank < local_size);
    let packages: Vec<usize> = cores.iter().map(|c| c.package).collect::<BTreeSet<_>>().into_iter().collect();
    let cores_of = |pkgs: &[usize]| -> Vec<usize> { (0..cores.len()).filter(|&i| pkgs.contains(&cores[i].package)).collect() };
    let (chosen, shared) = match policy {
        BindPolicy::None => (Vec::new(), false),
        _ if cores.is_empty() => (Vec::new(), false),
        BindPolicy::Core => (vec![local_rank % cores.len()], local_size > cores.len()),
        BindPolicy::Socket => (cores_of(&[packages[local_rank % packages.len()]]), local_size > packages.len()),
        BindPolicy::Auto => {
            let p = packages.len();
            if local_size <= p {
                let first = local_rank * p / local_size;
                let last = (local_rank + 1) * p / local_size;
                (cores_of(&packages[first..last]), false)
            } else {
                let pkg_slot = local_rank * p / local_size;
                let peers: Vec<usize> = (0..local_size).filter(|&r| r * p / local_size == pkg_slot).collect();
                let pkg_cores = cores_of(&[packages[pkg_slot]]);
                let my_index = peers.iter().position(|&r| r == local_rank).unwrap();
                if peers.len() <= pkg_cores.len() {
                    (split_even(&pkg_cores, peers.len(), my_index), false)
                } else {
                    // More ranks than cores: pinning two busy-polling MPI ranks to one
                    // core can starve one of them; leave placement to the OS scheduler.
                    (Vec::new(), true)
                }
            }
        }
    };
    let pus = chosen.iter().flat_map(|&i| cores[i].pus.clone()).collect();
    let pkgs = chosen
        .iter()
        .map(|&i| cores[i].package)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let threads = if chosen.is_empty() {
        (cores.len() / local_size).max(1)
    } else {
        chosen.len()
    };
    Binding {
        policy,
        cores: chosen,
        pus,
        packages: pkgs,
        shared,
        threads,
        fallback: None,
    }
}

/// The cores a rank gets near its GPU: ranks whose GPUs share one locality (the same
/// `near_pus`, e.g. two GPUs behind one socket, or two ranks on one GPU) split those
/// cores evenly and disjointly; this rank is number `local_rank_among_sharers` of `sharers`.
///
/// A core is near when all its PUs are in `near_pus` ([`GpuPlace::pus`]). When no core is
/// near, or there are fewer near cores than sharers, it falls back to
/// `plan_binding(cores, Auto, local_rank, local_size)` and says why in [`Binding::fallback`].
pub fn plan_gpu_binding(
    cores: &[CoreSlot],
    near_pus: &[u32],
    local_rank_among_sharers: usize,
    sharers: usize,
    local_rank: usize,
    local_size: usize,
) -> Binding {
    assert!(sharers > 0 && local_rank_among_sharers < sharers);
    let near: Vec<usize> = (0..cores.len())
        .filter(|&i| !cores[i].pus.is_empty() && cores[i].pus.iter().all(|p| near_pus.contains(p)))
        .collect();
    let why = if near.is_empty() {
        Some(format!(
            "no core of this node lies within the GPU's near PUs ({})",
            if near_pus.is_empty() {
                "none".to_string()
            } else {
                compact_list(near_pus)
            }
        ))
    } else if near.len() < sharers {
        Some(format!(
            "{sharers} ranks share the GPU-near cores but there are only {}",
            near.len()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return Binding {
            fallback: Some(why),
            ..plan_binding(cores, BindPolicy::Auto, local_rank, local_size)
        };
    }
    let chosen = split_even(&near, sharers, local_rank_among_sharers);
    Binding {
        policy: BindPolicy::Auto,
        pus: chosen.iter().flat_map(|&i| cores[i].pus.clone()).collect(),
        packages: chosen
            .iter()
            .map(|&i| cores[i].package)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        shared: false,
        threads: chosen.len(),
        cores: chosen,
        fallback: None,
    }
}

/// GPU-near bindings for all `local_size` local ranks of a node: local rank `r` takes
/// GPU `r % gpus` (`gpu_near_pus[g]` is GPU g's [`GpuPlace::pus`]), and ranks whose GPUs
/// have the same near set share its cores ([`plan_gpu_binding`]). With no GPU, every
/// rank gets [`plan_binding`]'s `auto` plan with a `fallback` saying so.
pub fn plan_gpu_bindings(cores: &[CoreSlot], gpu_near_pus: &[Vec<u32>], local_size: usize) -> Vec<Binding> {
    if gpu_near_pus.is_empty() {
        return (0..local_size)
            .map(|r| Binding {
                fallback: Some("no GPU on this node".into()),
                ..plan_binding(cores, BindPolicy::Auto, r, local_size)
            })
            .collect();
    }
    let locality = |r: usize| -> BTreeSet<u32> { gpu_near_pus[r % gpu_near_pus.len()].iter().copied().collect() };
    (0..local_size)
        .map(|r| {
            let mine = locality(r);
            let sharers: Vec<usize> = (0..local_size).filter(|&q| locality(q) == mine).collect();
            let index = sharers.iter().position(|&q| q == r).expect("a rank shares with itself");
            plan_gpu_binding(cores, &gpu_near_pus[r % gpu_near_pus.len()], index, sharers.len(), r, local_size)
        })
        .collect()
}

/// The node's cores in hwloc's logical order, each with its package and PUs.
pub fn discover_cores(topo: &Topology) -> Vec<CoreSlot> {
    let packages = topo.objects_with_type(&ObjectType::Package).unwrap_or_default();
    let package_sets: Vec<Vec<u32>> = packages
        .iter()
        .map(|p| p.cpuset().map(|s| s.into_iter().collect()).unwrap_or_default())
        .collect();
    let cores = topo.objects_with_type(&ObjectType::Core).unwrap_or_default();
    let mut slots: Vec<CoreSlot> = cores
        .iter()
        .map(|c| {
            let pus: Vec<u32> = c.cpuset().map(|s| s.into_iter().collect()).unwrap_or_default();
            let package = pus
                .first()
                .and_then(|pu| package_sets.iter().position(|s| s.contains(pu)))
                .unwrap_or(0);
            CoreSlot { package, pus }
        })
        .filter(|c| !c.pus.is_empty())
        .collect();
    if slots.is_empty() {
        // Some containers hide cores; fall back to one slot per PU.
        let pus = topo.objects_with_type(&ObjectType::PU).unwrap_or_default();
        slots = pus
            .iter()
            .map(|p| CoreSlot {
                package: 0,
                pus: vec![p.os_index()],
            })
            .collect();
    }
    slots
}

/// Binds the calling process to `binding.pus`. Returns a description of the outcome.
pub fn apply_binding(topo: &mut Topology, binding: &Binding) -> Result<()> {
    if binding.pus.is_empty() {
        return Ok(());
    }
    let set: CpuSet = binding.pus.iter().copied().collect();
    topo.set_cpubind(set, CpuBindFlags::CPUBIND_PROCESS)
        .map_err(|e| anyhow::anyhow!("hwloc could not bind to PUs {:?}: {e:?}", binding.pus))
}

/// Hardware facts of one node, from /proc, /sys and hwloc.
#[derive(Debug, Clone, Serialize)]
pub struct NodeInfo {
    pub cpu_model: String,
    pub packages: usize,
    pub cores: usize,
    pub pus: usize,
    pub numa_nodes: usize,
    pub memory_bytes: u64,
    /// GPU labels ([`gpu_label`], e.g. `A40-48GB`), one entry per GPU the node has.
    pub gpus: Vec<String>,
    /// The GPUs themselves ([`gpu_inventory`]): index, bus id, name, memory.
    pub gpu_devices: Vec<GpuInfo>,
}

impl NodeInfo {
    /// Reads /proc, /sys and the GPU inventory (NVML when it loads, else the driver's procfs).
    pub fn detect(cores: &[CoreSlot]) -> NodeInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':'])))
            .unwrap_or("unknown CPU")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        let numa_nodes = std::fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.starts_with("node") && n[4..].parse::<u32>().is_ok()
                    })
                    .count()
            })
            .unwrap_or(0)
            .max(1);
        let gpu_devices = gpu_inventory();
        NodeInfo {
            cpu_model,
            packages: cores.iter().map(|c| c.package).collect::<BTreeSet<_>>().len(),
            cores: cores.len(),
            pus: cores.iter().map(|c| c.pus.len()).sum(),
            numa_nodes,
            memory_bytes,
            gpus: gpu_devices.iter().map(|g| gpu_label(&g.name, g.memory_bytes)).collect(),
            gpu_devices,
        }
    }

    /// A short label that is equal for nodes of equal hardware, e.g.
    /// `AMD EPYC 7B13 64c 503GiB 4xA40-48GB` (mixed GPUs joined by `+`).
    pub fn node_type(&self) -> String {
        let mut s = format!(
            "{} {}c {}GiB",
            self.cpu_model,
            self.cores,
            (self.memory_bytes as f64 / (1u64 << 30) as f64).round() as u64
        );
        if let Some(first) = self.gpus.first() {
            let same = self.gpus.iter().all(|g| g == first);
            if same {
                s.push_str(&format!(" {}x{}", self.gpus.len(), first));
            } else {
                s.push_str(&format!(" {}", self.gpus.join("+")));
            }
        }
        s
    }
}

/// A GPU model as a node-type word: `NVIDIA `/`Tesla ` prefixes stripped, spaces as
/// `-`, and `-{N}GB` (N = memory in decimal GB, rounded) appended unless the name
/// already carries a size: `NVIDIA A40` with 48,305,799,168 bytes -> `A40-48GB`,
/// `Tesla V100-SXM2-32GB` -> `V100-SXM2-32GB`, `NVIDIA H100 80GB HBM3` -> `H100-80GB-HBM3`.
pub fn gpu_label(name: &str, memory_bytes: Option<u64>) -> String {
    let mut rest = name.trim();
    while let Some(r) = ["NVIDIA ", "Tesla "].iter().find_map(|p| rest.strip_prefix(p)) {
        rest = r.trim_start();
    }
    let mut label = rest.split_whitespace().collect::<Vec<_>>().join("-");
    if label.is_empty() {
        label = "GPU".into();
    }
    let has_size = label.split('-').any(|w| {
        w.strip_suffix("GB")
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    });
    if let (false, Some(bytes)) = (has_size, memory_bytes) {
        label.push_str(&format!("-{}GB", (bytes as f64 / 1e9).round() as u64));
    }
    label
}

/// The MPI world as a rank sees it.
pub struct World {
    pub universe: mpi::environment::Universe,
    pub world: SimpleCommunicator,
    pub rank: usize,
    pub size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub host: String,
    /// Number of distinct nodes (shared-memory domains) in the job.
    pub nodes: usize,
    /// MPI's thread support as granted.
    pub threading: mpi::Threading,
}

impl World {
    pub fn init() -> Result<World> {
        // Serialized: the all-reduce thread of --overlap makes MPI calls while the main
        // thread makes none.
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .context("MPI could not be initialised (already initialised?). Launch with mpirun or srun")?;
        let world = universe.world();
        let local = world.split_shared(0);
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "unknown".into());
        let is_leader = u32::from(local.rank() == 0);
        let mut nodes = 0u32;
        mpi::collective::CommunicatorCollectives::all_reduce_into(&world, &is_leader, &mut nodes, mpi::collective::SystemOperation::sum());
        Ok(World {
            rank: world.rank() as usize,
            size: world.size() as usize,
            local_rank: local.rank() as usize,
            local_size: local.size() as usize,
            host,
            nodes: nodes as usize,
            threading,
            world,
            universe,
        })
    }
}

/// Launcher variables worth keeping with a run (Open MPI, Slurm, CUDA).
pub fn launcher_env() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("OMPI_COMM_WORLD_")
                || k.starts_with("SLURM_")
                || k == "CUDA_VISIBLE_DEVICES"
                || k == "PMIX_RANK"
                || k == "OMP_NUM_THREADS"
        })
        .collect();
    vars.sort();
    vars
}

/// `ddpbench topo`: the node, its cores, and the binding each local rank would get.
pub fn main(args: TopoArgs) -> Result<()> {
    anyhow::ensure!(args.ranks > 0, "--ranks must be at least 1");
    let topo = Topology::new().context("hwloc could not read this machine's topology")?;
    let cores = discover_cores(&topo);
    let info = NodeInfo::detect(&cores);
    println!("node type : {}", info.node_type());
    println!("cpu       : {}", info.cpu_model);
    println!(
        "layout    : {} package(s), {} NUMA node(s), {} core(s), {} hardware thread(s)",
        info.packages, info.numa_nodes, info.cores, info.pus
    );
    println!("memory    : {:.1} GiB", info.memory_bytes as f64 / (1u64 << 30) as f64);
    print!("{}", placement_report(&cores, &info.gpu_devices, &info.gpus, args.ranks, args.bind));
    Ok(())
}

/// The GPU map (per GPU: index, bus id, label, packages, NUMA nodes, nearest PUs) and
/// the binding table of `ranks` local ranks (with `auto` and GPUs: each rank near GPU
/// `local_rank % gpus`), as `ddpbench topo` prints them. `labels[i]` labels `gpus[i]`.
fn placement_report(cores: &[CoreSlot], gpus: &[GpuInfo], labels: &[String], ranks: usize, bind: BindPolicy) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let list = |ids: &[usize]| {
        if ids.is_empty() {
            "-".to_string()
        } else {
            compact_list(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>())
        }
    };
    // Each GPU's nearest PUs; empty when hwloc cannot place it (the plan then falls back).
    let mut gpu_near: Vec<Vec<u32>> = Vec::new();
    if gpus.is_empty() {
        let _ = writeln!(out, "gpus      : none seen (through {NVML_LIBRARY} or /proc/driver/nvidia/gpus)");
    } else {
        let _ = writeln!(out, "\ngpus and where they attach:");
        let _ = writeln!(
            out,
            "{:>3}  {:<12}  {:<22}  {:>8}  {:>5}  nearest pus",
            "gpu", "bus_id", "label", "packages", "numa"
        );
        for (g, label) in gpus.iter().zip(labels) {
            let place = parse_pci_bus_id(&g.bus_id).and_then(|id| pci_locality(&id));
            let (pk, numa, pus) = match &place {
                Ok(p) => (list(&p.packages), list(&p.numa_nodes), compact_list(&p.pus)),
                Err(e) => ("-".into(), "-".into(), format!("unknown: {e:#}")),
            };
            let _ = writeln!(out, "{:>3}  {:<12}  {label:<22}  {pk:>8}  {numa:>5}  {pus}", g.index, g.bus_id);
            gpu_near.push(place.map(|p| p.pus).unwrap_or_default());
        }
    }
    let near_gpu = !gpu_near.is_empty() && bind == BindPolicy::Auto;
    let _ = writeln!(
        out,
        "\nbinding for {} local rank(s), policy {:?}{}:",
        ranks,
        bind,
        if near_gpu {
            ", cores nearest each rank's GPU (local_rank % gpus)"
        } else {
            ""
        }
    );
    let bindings: Vec<Binding> = if near_gpu {
        plan_gpu_bindings(cores, &gpu_near, ranks)
    } else {
        (0..ranks).map(|r| plan_binding(cores, bind, r, ranks)).collect()
    };
    let _ = writeln!(
        out,
        "{:>10}  {:>3}  {:>8}  {:>7}  {:<24}  note",
        "local_rank", "gpu", "packages", "threads", "pus"
    );
    for (r, b) in bindings.iter().enumerate() {
        let pus = if b.pus.is_empty() {
            "(unbound)".to_string()
        } else {
            compact_list(&b.pus)
        };
        let gpu = if gpu_near.is_empty() {
            "-".to_string()
        } else {
            (r % gpu_near.len()).to_string()
        };
        let mut notes: Vec<String> = Vec::new();
        if b.shared {
            notes.push("shares cores (more ranks than cores)".into());
        }
        if let Some(why) = &b.fallback {
            notes.push(format!("node-wide plan: {why}"));
        }
        let _ = writeln!(
            out,
            "{r:>10}  {gpu:>3}  {:>8}  {:>7}  {pus:<24}  {}",
            list(&b.packages),
            b.threads,
            notes.join("; ")
        );
    }
    out
}

/// `[0,1,2,3,8]` -> `0-3,8`.
pub fn compact_list(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `packages` × `per_package` cores with 2 hardware threads each (Linux numbering).
    fn machine(packages: usize, per_package: usize) -> Vec<CoreSlot> {
        let n = (packages * per_package) as u32;
        (0..packages * per_package)
            .map(|i| CoreSlot {
                package: i / per_package,
                pus: vec![i as u32, i as u32 + n],
            })
            .collect()
    }

    fn all(cores: &[CoreSlot], policy: BindPolicy, n: usize) -> Vec<Binding> {
        (0..n).map(|r| plan_binding(cores, policy, r, n)).collect()
    }

    #[test]
    fn auto_spreads_over_packages_with_disjoint_cores() {
        let m = machine(2, 24);
        let b = all(&m, BindPolicy::Auto, 4);
        assert_eq!(
            b.iter().map(|b| b.packages.clone()).collect::<Vec<_>>(),
            vec![vec![0], vec![0], vec![1], vec![1]]
        );
        assert!(b.iter().all(|b| b.threads == 12 && !b.shared));
        let mut seen = BTreeSet::new();
        for x in &b {
            for c in &x.cores {
                assert!(seen.insert(*c), "core {c} given twice");
            }
        }
        assert_eq!(seen.len(), 48);
        // Two ranks on a two-socket node: one socket each.
        let b = all(&m, BindPolicy::Auto, 2);
        assert_eq!(b[0].packages, vec![0]);
        assert_eq!(b[1].packages, vec![1]);
        // One rank takes the whole node.
        assert_eq!(plan_binding(&m, BindPolicy::Auto, 0, 1).threads, 48);
    }

    #[test]
    fn auto_uneven_split_and_oversubscription() {
        let m = machine(1, 5);
        let b = all(&m, BindPolicy::Auto, 2);
        assert_eq!(b[0].cores, vec![0, 1, 2]);
        assert_eq!(b[1].cores, vec![3, 4]);
        let m = machine(1, 2);
        let b = all(&m, BindPolicy::Auto, 3);
        assert!(
            b.iter().all(|b| b.shared && b.threads == 1 && b.pus.is_empty()),
            "oversubscribed auto leaves ranks unbound"
        );
    }

    #[test]
    fn core_socket_none_policies() {
        let m = machine(2, 4);
        let b = all(&m, BindPolicy::Core, 3);
        assert_eq!(
            b.iter().map(|b| b.cores.clone()).collect::<Vec<_>>(),
            vec![vec![0], vec![1], vec![2]]
        );
        assert_eq!(b[1].pus, vec![1, 9]);
        let b = all(&m, BindPolicy::Socket, 3);
        assert_eq!(b[2].packages, vec![0]);
        assert!(b[2].shared);
        let b = plan_binding(&m, BindPolicy::None, 1, 2);
        assert!(b.pus.is_empty());
        assert_eq!(b.threads, 4);
    }

    #[test]
    fn gpu_near_binding_splits_the_near_cores() {
        // Two packages of 8 cores; GPUs 0,1 behind package 0, GPUs 2,3 behind package 1.
        let m = machine(2, 8);
        let near0: Vec<u32> = (0..8).chain(16..24).collect();
        let near1: Vec<u32> = (8..16).chain(24..32).collect();
        let gpus = vec![near0.clone(), near0.clone(), near1.clone(), near1.clone()];
        let b = plan_gpu_bindings(&m, &gpus, 4);
        assert_eq!(
            b.iter().map(|b| b.cores.clone()).collect::<Vec<_>>(),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11], vec![12, 13, 14, 15]]
        );
        assert_eq!(b[2].packages, vec![1]);
        assert_eq!(b[2].pus, vec![8, 24, 9, 25, 10, 26, 11, 27]);
        assert!(b
            .iter()
            .all(|b| b.fallback.is_none() && !b.shared && b.threads == 4 && b.policy == BindPolicy::Auto));
        // Eight ranks on four GPUs: four ranks share each package's cores, disjointly.
        let b = plan_gpu_bindings(&m, &gpus, 8);
        let mut seen = BTreeSet::new();
        for (r, x) in b.iter().enumerate() {
            assert_eq!(x.threads, 2);
            assert_eq!(
                x.packages,
                vec![usize::from(r % 4 >= 2)],
                "rank {r} on GPU {} sits by its GPU",
                r % 4
            );
            for c in &x.cores {
                assert!(seen.insert(*c), "core {c} given twice");
            }
        }
        assert_eq!(seen.len(), 16);
        // A GPU whose locality is the whole node (one-socket machine): plain even split.
        let m1 = machine(1, 5);
        let all_pus: Vec<u32> = (0..10).collect();
        let b = plan_gpu_binding(&m1, &all_pus, 1, 2, 1, 2);
        assert_eq!(b.cores, vec![3, 4]);
        assert!(b.fallback.is_none());
    }

    #[test]
    fn gpu_near_binding_falls_back_and_says_why() {
        let m = machine(2, 2);
        // No locality known (hwloc could not place the GPU).
        let b = plan_gpu_binding(&m, &[], 0, 1, 1, 2);
        let plain = plan_binding(&m, BindPolicy::Auto, 1, 2);
        assert_eq!((b.cores.clone(), b.pus.clone()), (plain.cores, plain.pus));
        assert!(b.fallback.as_deref().unwrap().contains("no core"), "{:?}", b.fallback);
        // Near PUs that cover no whole core (only one hardware thread of core 0).
        let b = plan_gpu_binding(&m, &[0], 0, 1, 0, 1);
        assert!(b.fallback.is_some());
        assert_eq!(b.threads, 4, "the node-wide plan for one rank takes every core");
        // Three ranks share package 0's two cores: too few, node-wide plan.
        let near0 = vec![0, 1, 4, 5];
        let b = plan_gpu_bindings(&m, &[near0], 3);
        assert!(b.iter().all(|b| b.fallback.as_deref().unwrap().contains("only 2")), "{b:?}");
        assert_eq!(
            b[2],
            Binding {
                fallback: b[2].fallback.clone(),
                ..plan_binding(&m, BindPolicy::Auto, 2, 3)
            }
        );
        // No GPU at all.
        let b = plan_gpu_bindings(&m, &[], 2);
        assert_eq!(b[1].fallback.as_deref(), Some("no GPU on this node"));
        assert_eq!(b[1].cores, plan_binding(&m, BindPolicy::Auto, 1, 2).cores);
    }

    #[test]
    fn gpu_labels() {
        assert_eq!(gpu_label("NVIDIA A40", Some(48_305_799_168)), "A40-48GB");
        assert_eq!(gpu_label("Tesla V100-SXM2-32GB", Some(34_089_730_048)), "V100-SXM2-32GB");
        assert_eq!(gpu_label("NVIDIA H100 80GB HBM3", Some(85_520_809_984)), "H100-80GB-HBM3");
        assert_eq!(gpu_label("NVIDIA A100-SXM4-80GB", None), "A100-SXM4-80GB");
        assert_eq!(gpu_label("NVIDIA Tesla T4", Some(15_843_721_216)), "T4-16GB");
        assert_eq!(gpu_label("NVIDIA RTX A6000", Some(51_527_024_640)), "RTX-A6000-52GB");
        assert_eq!(gpu_label("NVIDIA A40", None), "A40");
        assert_eq!(gpu_label("", Some(8_000_000_000)), "GPU-8GB");
        // "GB" alone or inside a word is not a size.
        assert_eq!(gpu_label("NVIDIA GB200", Some(191_000_000_000)), "GB200-191GB");
    }

    #[test]
    fn node_type_with_gpus() {
        let mut n = NodeInfo {
            cpu_model: "AMD EPYC 7B13".into(),
            packages: 2,
            cores: 64,
            pus: 128,
            numa_nodes: 2,
            memory_bytes: 503 << 30,
            gpus: vec!["A40-48GB".into(); 4],
            gpu_devices: Vec::new(),
        };
        assert_eq!(n.node_type(), "AMD EPYC 7B13 64c 503GiB 4xA40-48GB");
        n.gpus = vec!["A40-48GB".into(), "A100-SXM4-80GB".into()];
        assert_eq!(n.node_type(), "AMD EPYC 7B13 64c 503GiB A40-48GB+A100-SXM4-80GB");
        n.gpus.clear();
        assert_eq!(n.node_type(), "AMD EPYC 7B13 64c 503GiB");
    }

    #[test]
    fn placement_report_maps_gpus_to_cores() {
        // Stand-in GPUs at this machine's first two real PCI addresses, and one that is absent.
        let mut real: Vec<String> = std::fs::read_dir("/sys/bus/pci/devices")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        real.sort();
        if real.len() < 2 {
            eprintln!("skipped: fewer than 2 PCI devices");
            return;
        }
        let topo = Topology::new().unwrap();
        let cores = discover_cores(&topo);
        let gpu = |index: usize, bus_id: &str| GpuInfo {
            index,
            bus_id: bus_id.into(),
            name: "NVIDIA A40".into(),
            memory_bytes: Some(48_305_799_168),
        };
        let gpus = vec![gpu(0, &real[0]), gpu(1, &real[1])];
        let labels = vec!["A40-48GB".to_string(); 2];
        let text = placement_report(&cores, &gpus, &labels, 2, BindPolicy::Auto);
        eprintln!("{text}");
        let near0 = pci_locality(&parse_pci_bus_id(&real[0]).unwrap()).unwrap();
        assert!(text.contains(&format!("{}  A40-48GB", real[0])), "{text}");
        assert!(text.contains(&compact_list(&near0.pus)), "{text}");
        assert!(text.contains("cores nearest each rank's GPU"), "{text}");
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("local_rank")).skip(1).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(rows[1].split_whitespace().nth(1) == Some("1"), "rank 1 takes GPU 1: {text}");
        // An unknown GPU is reported, and its ranks fall back to the node-wide plan.
        let text = placement_report(&cores, &[gpu(0, "0000:ff:1f.7")], &labels[..1], 1, BindPolicy::Auto);
        eprintln!("{text}");
        assert!(text.contains("unknown: PCI device 0000:ff:1f.7 not found"), "{text}");
        assert!(text.contains("node-wide plan: no core"), "{text}");
        // No GPU: one line saying so, and the plain table.
        let text = placement_report(&cores, &[], &[], 2, BindPolicy::Auto);
        assert!(text.starts_with("gpus      : none seen"), "{text}");
        assert!(!text.contains("node-wide plan"), "{text}");
    }

    #[test]
    fn compact_lists() {
        assert_eq!(compact_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(compact_list(&[]), "");
    }
}
