//! The hardware a rank runs on, independent of MPI: the node's cores and packages,
//! its GPUs and where they attach, its node type, and the hwloc core binding each
//! local rank gets.
//!
//! The binding plans are pure functions of a core list ([`plan_binding`], and
//! [`plan_gpu_binding`](binding::plan_gpu_binding) for the cores nearest a GPU) so they are tested without
//! hardware; hwloc only supplies the core list and applies the plan. hwloc2 2.2.0
//! predates hwloc 2.x (its NUMA and I/O object types are wrong or panic), so only
//! Package/Core/PU objects are asked of it; NUMA nodes are counted from sysfs, and
//! a GPU's locality comes from the audited hwloc FFI in `topology/pci.rs` ([`pci_locality`]).

mod binding;
mod gpu;
mod node;
mod pci;
mod report;

pub(crate) use binding::{allowed_pus, apply_binding, launcher_pus, pin_this_thread, plan_binding, plan_gpu_bindings, BindPolicy, Binding};
pub(crate) use node::NodeInfo;
pub(crate) use pci::{parse_pci_bus_id, pci_locality};
pub use report::{main, TopoArgs};
// Lists of ids as text are a file format: `record` owns it.
pub(crate) use crate::record::compact_list;

use hwloc2::{ObjectType, Topology};
use serde::Serialize;

/// One physical core: the package it sits in and its hardware threads (OS indexes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct CoreSlot {
    pub package: usize,
    pub pus: Vec<u32>,
}

/// The node's cores in hwloc's logical order, each with its package and PUs.
pub(crate) fn discover_cores(topo: &Topology) -> Vec<CoreSlot> {
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

/// Hardware threads online on this node (not only those this process may run on).
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}
