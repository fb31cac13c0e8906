//! Where a rank runs: its device first (its GPU decides the cores), then the cores it
//! is bound to, then the size of libtorch's thread pool; and the node type it reports.

use super::config::{PlacementConfig, TrainConfig};
use crate::device::{self, cuda};
use crate::record::RankInfo;
use crate::topology::{self, BindPolicy, Binding, NodeInfo};
use crate::world::{agree, launcher_env, Group};
use anyhow::{anyhow, Result};
use tch::Device;
use tracing::warn;

/// One rank's device, binding and node.
pub struct Placement {
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
}

impl Placement {
    /// Chooses the device (agreed across ranks), binds this process with hwloc and
    /// sizes libtorch's thread pool.
    pub fn establish(g: &Group, cfg: &TrainConfig) -> Result<Placement> {
        let pc: &PlacementConfig = &cfg.placement;
        let device = agree(g, device::resolve_device(pc.device, g.local_rank))?;
        let mut hw = hwloc2::Topology::new().ok_or_else(|| anyhow!("hwloc could not read the topology"));
        let cores = hw.as_ref().map(topology::discover_cores).unwrap_or_default();
        let (gpu_bus_id, gpu_near) = match device {
            Device::Cuda(i) => gpu_places(i),
            _ => (None, Err(anyhow!("training on CPU"))),
        };
        let binding = match (&gpu_near, pc.bind) {
            (Ok(near), BindPolicy::Auto) => topology::plan_gpu_bindings(&cores, near, g.local_size).swap_remove(g.local_rank),
            _ => topology::plan_binding(&cores, pc.bind, g.local_rank, g.local_size),
        };
        let binding_note = match (&device, &gpu_near) {
            (Device::Cuda(_), Err(e)) => Some(format!("not bound by GPU locality: {e:#}")),
            _ => binding.fallback.clone(),
        };
        if let Some(n) = binding_note.as_ref().filter(|_| g.local_rank == 0 && device != Device::Cpu) {
            warn!("{n}");
        }
        if let Ok(hw) = hw.as_mut() {
            if let Err(e) = topology::apply_binding(hw, &binding) {
                warn!("{e:#}; running unbound");
            }
        }
        if binding.shared {
            warn!(
                "{} local ranks share {} cores: timings will include contention{}",
                g.local_size,
                cores.len(),
                if binding.pus.is_empty() { " (ranks left unbound)" } else { "" }
            );
        }
        tch::set_num_threads(pc.threads.unwrap_or(binding.threads) as i32);
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
        })
    }

    /// This rank's entry in the manifest.
    pub fn rank_info(&self, g: &Group, bind: BindPolicy) -> Result<RankInfo> {
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
            launcher_env: launcher_env(),
        })
    }
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
