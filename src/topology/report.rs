//! `ddpbench topo`: the node, its GPUs and where they attach, and the binding each
//! local rank would get.

use super::binding::{plan_binding, plan_gpu_bindings, BindPolicy, Binding};
use super::gpu::GpuInfo;
use super::node::NodeInfo;
use super::{compact_list, discover_cores, parse_pci_bus_id, pci_locality, CoreSlot};
use crate::device::nvml::NVML_LIBRARY;
use anyhow::{Context, Result};
use clap::Args;
use hwloc2::Topology;

/// `ddpbench topo` options.
#[derive(Args, Debug, Clone)]
pub struct TopoArgs {
    /// Number of local ranks to show a binding for.
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,

    /// Binding policy to show.
    #[arg(long, value_enum, default_value_t = BindPolicy::Auto)]
    pub bind: BindPolicy,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
