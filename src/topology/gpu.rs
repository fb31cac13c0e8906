//! The node's GPUs: NVML's list when it loads, else the driver's procfs, else none.

use super::parse_pci_bus_id;
use crate::device::nvml::{Nvml, NvmlGpuEntry};
use serde::Serialize;
use std::path::Path;

/// One GPU of this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GpuInfo {
    /// NVML's index (PCI bus id order; ignores `CUDA_VISIBLE_DEVICES`).
    pub index: usize,
    /// Canonical PCI bus id, e.g. `0000:3b:00.0`.
    pub bus_id: String,
    /// Model name as the driver reports it, e.g. `NVIDIA A40`.
    pub name: String,
    /// Total device memory; `None` when only procfs was available.
    pub memory_bytes: Option<u64>,
}

/// The node's GPUs: from NVML when it loads, else names and bus ids from the
/// driver's `/proc/driver/nvidia/gpus/*/information`, else none. Never fails.
pub(crate) fn gpu_inventory() -> Vec<GpuInfo> {
    match Nvml::load().and_then(|n| n.inventory()) {
        Ok(gpus) => gpus.into_iter().map(GpuInfo::from_nvml).collect(),
        Err(_) => inventory_from_procfs(Path::new("/proc/driver/nvidia/gpus")),
    }
}

/// GPUs listed under the driver's procfs folder (`<bus id>/information`), in bus id order.
fn inventory_from_procfs(root: &Path) -> Vec<GpuInfo> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<(String, String)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("information")).ok()?;
            let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
            let name = field("Model:")?;
            let raw = field("Bus Location:").unwrap_or_else(|| e.file_name().to_string_lossy().into_owned());
            let bus_id = parse_pci_bus_id(&raw).map(|b| b.to_string()).unwrap_or(raw);
            Some((bus_id, name))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .enumerate()
        .map(|(index, (bus_id, name))| GpuInfo {
            index,
            bus_id,
            name,
            memory_bytes: None,
        })
        .collect()
}

impl GpuInfo {
    /// NVML's entry with its bus id in canonical form.
    fn from_nvml(e: NvmlGpuEntry) -> GpuInfo {
        GpuInfo {
            index: e.index,
            bus_id: parse_pci_bus_id(&e.bus_id).map(|b| b.to_string()).unwrap_or(e.bus_id),
            name: e.name,
            memory_bytes: e.memory_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_reads_the_driver_procfs() {
        let dir = tempfile::tempdir().unwrap();
        for (bus, model) in [("0000:af:00.0", "NVIDIA A40"), ("0000:3b:00.0", "NVIDIA A40")] {
            let d = dir.path().join(bus);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t\t {model}\nIRQ:   \t\t 130\nBus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t 0\n"),
            )
            .unwrap();
        }
        std::fs::create_dir(dir.path().join("junk")).unwrap();
        let gpus = inventory_from_procfs(dir.path());
        assert_eq!(
            gpus,
            vec![
                GpuInfo {
                    index: 0,
                    bus_id: "0000:3b:00.0".into(),
                    name: "NVIDIA A40".into(),
                    memory_bytes: None
                },
                GpuInfo {
                    index: 1,
                    bus_id: "0000:af:00.0".into(),
                    name: "NVIDIA A40".into(),
                    memory_bytes: None
                },
            ]
        );
        assert!(inventory_from_procfs(&dir.path().join("absent")).is_empty());
        // On this machine: whatever is there, no panic; nothing when there is no driver.
        let here = gpu_inventory();
        if Nvml::load().is_err() && !Path::new("/proc/driver/nvidia/gpus").exists() {
            assert!(here.is_empty());
        }
    }
}
