//! Where a rank runs: its device first (its GPU decides the cores), then the cores it
//! is bound to, then the size of libtorch's thread pool; and the node type it reports.

use super::config::{PlacementConfig, TrainConfig};
use crate::device::nvml::Nvml;
use crate::device::{self, cuda};
use crate::record::GpuClocks;
use crate::record::RankInfo;
use crate::topology::{self, BindPolicy, Binding, NodeInfo};
use crate::world::{agree, gather_strings, launcher_env, Group};
use anyhow::{anyhow, Result};
use tch::Device;
use tracing::warn;

/// One rank's device, binding and node.
pub(super) struct Placement {
    pub device: Device,
    pub binding: Binding,
    /// Why the rank is not bound to the cores nearest its GPU, when it is not.
    pub binding_note: Option<String>,
    pub node: NodeInfo,
    pub node_type: String,
    /// PCI bus id of the rank's GPU.
    pub gpu_bus_id: Option<String>,
    /// libtorch's intra-op threads.
    pub threads: usize,
    /// Where an all-reduce thread (`--overlap` on the MPI path) would run.
    pub comm_core: CommCore,
    /// Set when batch workers and compute threads together exceed the rank's cores.
    pub workers_note: Option<String>,
    /// Hardware threads the launcher let the rank run on, before ddpbench first bound it.
    pub launcher_pus: usize,
}

/// Where the communication thread of an overlapped MPI all-reduce runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CommCore {
    /// Pinned to these PUs, a core of the binding that backward's threads do not use.
    Own(Vec<u32>),
    /// Unpinned, with a core to spare: the rank is unbound and runs fewer threads than
    /// its share of the node's cores, or it trains on a GPU and the CPU mostly waits.
    Free,
    /// Only on the cores backward's threads use: it would time-slice with backward.
    Shared { cores: usize, threads: usize },
}

impl CommCore {
    pub(super) fn describe(&self) -> String {
        match self {
            CommCore::Own(pus) => format!("own core (PUs {})", topology::compact_list(pus)),
            CommCore::Free => "unpinned, a core to spare".into(),
            CommCore::Shared { cores, threads } => format!("shares {cores} core(s) with {threads} compute thread(s)"),
        }
    }
}

impl Placement {
    /// Chooses the device (agreed across ranks), binds this process with hwloc and
    /// sizes libtorch's thread pool.
    pub(super) fn establish(g: &Group, cfg: &TrainConfig) -> Result<Placement> {
        let pc: &PlacementConfig = &cfg.placement;
        let launcher_pus = topology::launcher_pus().len();
        let device = agree(g, device::resolve_device(pc.device, g.local_rank))?;
        let mut hw = hwloc2::Topology::new().ok_or_else(|| anyhow!("hwloc could not read the topology"));
        let cores = hw.as_ref().map(topology::discover_cores).unwrap_or_default();
        // Ranks the node's cores are shared among: this group's, or more when a study keeps
        // every point's share of the node equal (`--node-slots`).
        let slots = pc.node_slots.unwrap_or(g.local_size).max(g.local_size);
        let (gpu_bus_id, gpu_near) = match device {
            Device::Cuda(i) => gpu_places(i),
            _ => (None, Err(anyhow!("training on CPU"))),
        };
        let binding = match (&gpu_near, pc.bind) {
            (Ok(near), BindPolicy::Auto) => topology::plan_gpu_bindings(&cores, near, slots).swap_remove(g.local_rank),
            _ => topology::plan_binding(&cores, pc.bind, g.local_rank, slots),
        };
        let binding_note = match (&device, &gpu_near) {
            (Device::Cuda(_), Err(e)) => Some(format!("not bound by GPU locality: {e:#}")),
            _ => binding.fallback.clone(),
        };
        if let Some(n) = binding_note.as_ref().filter(|_| g.local_rank == 0 && device != Device::Cpu) {
            warn!("{n}");
        }
        if binding.shared {
            // --node-slots counts the ranks a node holds in the job's largest point: a
            // point of fewer ranks is laid out for that many.
            let who = if slots > g.local_size {
                format!("{slots} rank slots on this node (--node-slots; {} in use)", g.local_size)
            } else {
                format!("{} local ranks", g.local_size)
            };
            warn!(
                "{who} share {} cores: timings will include contention{}",
                cores.len(),
                if binding.pus.is_empty() { " (ranks left unbound)" } else { "" }
            );
        }
        let threads = pc.threads.unwrap_or(binding.threads);
        let (binding, comm_core) = split_off_comm_core(binding, threads, cores.len() / slots.max(1), device);
        if let Ok(hw) = hw.as_mut() {
            if let Err(e) = topology::apply_binding(hw, &binding) {
                warn!("{e:#}; running unbound");
            }
        }
        tch::set_num_threads(threads as i32);
        if let Device::Cuda(_) = device {
            tch::Cuda::cudnn_set_benchmark(!cfg.schedule.deterministic);
        }
        let node = NodeInfo::detect(&cores);
        let node_type = pc.node_type.clone().unwrap_or_else(|| node.node_type());
        Ok(Placement {
            device,
            binding,
            binding_note,
            node,
            node_type,
            gpu_bus_id,
            threads: tch::get_num_threads() as usize,
            comm_core,
            workers_note: None,
            launcher_pus,
        })
    }

    /// Batch-preparing threads: `asked`, or [`default_workers`]; and a note when workers
    /// and compute threads together exceed the cores the rank is bound to. Workers
    /// inherit the rank's binding.
    pub(super) fn workers_for(&self, asked: Option<usize>, image_files: bool) -> (usize, Option<String>) {
        let cores = if self.binding.cores.is_empty() {
            self.binding.threads
        } else {
            self.binding.cores.len()
        }
        .max(1);
        let gpu = self.device != Device::Cpu;
        let compute = if gpu { 1 } else { self.threads };
        let workers = asked.unwrap_or_else(|| default_workers(cores, compute, gpu, image_files));
        let note = (workers > 0 && workers + compute > cores).then(|| {
            format!(
                "{workers} batch worker(s) and {compute} compute thread(s) share {cores} core(s): preparing batches time-slices \
                 with compute (lower --workers or --threads, or bind more cores per rank)"
            )
        });
        (workers, note)
    }

    /// This rank's entry in the manifest.
    pub(super) fn rank_info(&self, g: &Group, bind: BindPolicy) -> Result<RankInfo> {
        let bound = if self.binding.pus.is_empty() {
            "unbound".into()
        } else {
            topology::compact_list(&self.binding.pus)
        };
        Ok(RankInfo {
            rank: g.rank,
            local_rank: g.local_rank,
            host: g.host.clone(),
            node_type: self.node_type.clone(),
            device: format!("{:?}", self.device),
            binding: format!("{}: {bound}", serde_json::to_value(bind)?.as_str().unwrap_or("")),
            threads: self.threads,
            cpu_model: self.node.cpu_model.clone(),
            gpus: self.node.gpus.clone(),
            gpu_bus_id: self.gpu_bus_id.clone(),
            binding_note: self.binding_note.clone(),
            comm_thread: Some(self.comm_core.describe()),
            workers_note: self.workers_note.clone(),
            launcher_env: launcher_env(),
            nccl_env: crate::device::cuda::nccl_env(),
            run_env: super::faults::run_env(),
            cuda_driver_version: match self.device {
                Device::Cuda(_) => crate::device::cuda::driver().ok().map(|d| d.version()),
                _ => None,
            },
            gpu_driver_version: self.gpu_bus_id.as_ref().and_then(|_| Nvml::load().ok()?.driver_version()),
            gpu_clocks_start: self.gpu_clocks(),
            gpu_clocks_end: None,
            trace_stopped_before_step: None,
        })
    }

    /// This rank's GPU clocks and throttle reasons now, when it has a GPU NVML can read.
    pub(super) fn gpu_clocks(&self) -> Option<GpuClocks> {
        let bus = self.gpu_bus_id.as_ref()?;
        let id = topology::parse_pci_bus_id(bus).ok()?.to_string();
        Nvml::load().ok()?.clocks(&id).ok()
    }
}

/// Where an all-reduce thread can run. On CPU, when the rank is bound to more cores than
/// it runs compute threads on, the process keeps the first `threads` cores and the thread
/// gets the rest; an unbound rank has a core to spare when `threads` is below its share
/// of the node (`share_cores`); a GPU rank's CPU mostly waits for the device.
fn split_off_comm_core(binding: Binding, threads: usize, share_cores: usize, device: Device) -> (Binding, CommCore) {
    if device != Device::Cpu {
        return (binding, CommCore::Free);
    }
    if binding.pus.is_empty() {
        let core = if threads < share_cores {
            CommCore::Free
        } else {
            CommCore::Shared {
                cores: share_cores.max(1),
                threads,
            }
        };
        return (binding, core);
    }
    let cores = binding.cores.len();
    if threads >= cores {
        return (binding, CommCore::Shared { cores, threads });
    }
    // PUs of the binding's cores, in order, grouped per core.
    let per_core = binding.pus.len() / cores.max(1);
    let (compute, spare) = binding.pus.split_at(threads * per_core);
    let core = CommCore::Own(spare.to_vec());
    let compute = Binding {
        pus: compute.to_vec(),
        cores: binding.cores[..threads].to_vec(),
        ..binding
    };
    (compute, core)
}

/// This rank's GPU's PCI bus id, and the hardware threads nearest each visible GPU in
/// CUDA's numbering (rank r takes GPU r % visible), from hwloc.
fn gpu_places(ordinal: usize) -> (Option<String>, Result<Vec<Vec<u32>>>) {
    let driver = match cuda::driver() {
        Ok(d) => d,
        Err(e) => return (None, Err(e)),
    };
    let mine = driver.pci_bus_id(ordinal).ok();
    let near = (0..tch::Cuda::device_count().max(0) as usize)
        .map(|g| {
            let bus = topology::parse_pci_bus_id(&driver.pci_bus_id(g)?)?;
            Ok(topology::pci_locality(&bus)?.pus)
        })
        .collect::<Result<Vec<_>>>();
    (mine.map(|b| b.to_lowercase()), near)
}

/// Every rank's placement, gathered on rank 0 (empty elsewhere).
pub(super) fn gathered_rank_infos(g: &Group, place: &Placement, cfg: &TrainConfig) -> Result<Vec<RankInfo>> {
    let mine = serde_json::to_string(&place.rank_info(g, cfg.placement.bind)?)?;
    Ok(gather_strings(g, &mine)
        .unwrap_or_default()
        .iter()
        .map(|s| serde_json::from_str(s))
        .collect::<Result<_, _>>()?)
}

/// The default number of batch workers of a rank with `cores` cores of which `compute`
/// threads compute. Image files: every core beyond the compute threads, at least 1 (JPEG
/// decoding is the bottleneck). Data held in memory: none on a CPU (batches are cheap
/// gathers, and every core computes); on a GPU up to 2 on cores the host thread does not
/// use, so that batches are gathered into page-locked memory and copied without the
/// host waiting, instead of the host gathering and staging a pageable copy while the
/// device idles (ResNet-50 fp16 at batch 64 on an H200: 33 ms a step inline, 19 ms with
/// 2 workers).
pub(super) fn default_workers(cores: usize, compute: usize, gpu: bool, image_files: bool) -> usize {
    let spare = cores.saturating_sub(compute);
    match (image_files, gpu) {
        (true, _) => spare.max(1),
        (false, true) => spare.min(2),
        (false, false) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::default_workers;

    #[test]
    fn in_memory_data_gets_workers_on_a_gpu_only() {
        // A CPU rank computes on every core: batches are gathered inline.
        assert_eq!(default_workers(16, 16, false, false), 0);
        // A GPU rank's host thread uses one core: two workers where two cores are spare,
        // one where one is, none on a single core (a worker would time-slice the host thread).
        assert_eq!(default_workers(16, 1, true, false), 2);
        assert_eq!(default_workers(2, 1, true, false), 1);
        assert_eq!(default_workers(1, 1, true, false), 0);
    }

    #[test]
    fn image_files_get_every_spare_core_and_at_least_one_worker() {
        assert_eq!(default_workers(16, 1, true, true), 15);
        assert_eq!(default_workers(4, 4, false, true), 1);
        assert_eq!(default_workers(8, 2, false, true), 6);
    }
}
