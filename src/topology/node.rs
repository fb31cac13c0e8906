//! What kind of node this is: CPU model, cores, memory and GPUs, summed up in a
//! node type label that is equal for nodes of equal hardware.

use super::gpu::{gpu_inventory, GpuInfo};
use super::CoreSlot;
use serde::Serialize;
use std::collections::BTreeSet;

/// Hardware facts of one node, from /proc, /sys and hwloc.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodeInfo {
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
    pub(crate) fn detect(cores: &[CoreSlot]) -> NodeInfo {
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
    pub(crate) fn node_type(&self) -> String {
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
pub(crate) fn gpu_label(name: &str, memory_bytes: Option<u64>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
