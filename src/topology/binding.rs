//! The cores each local rank is bound to. The plans are pure functions of a core
//! list ([`plan_binding`], and [`plan_gpu_binding`] for the cores nearest a GPU), so
//! they are tested without hardware; hwloc only supplies the core list and applies
//! the plan ([`apply_binding`]).

use super::{compact_list, CoreSlot};
use anyhow::Result;
use clap::ValueEnum;
use hwloc2::{CpuBindFlags, CpuSet, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// What a rank was (or would be) bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Binding {
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
pub(crate) fn plan_binding(cores: &[CoreSlot], policy: BindPolicy, local_rank: usize, local_size: usize) -> Binding {
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
/// A core is near when all its PUs are in `near_pus` ([`GpuPlace::pus`](super::pci::GpuPlace::pus)). When no core is
/// near, or there are fewer near cores than sharers, it falls back to
/// `plan_binding(cores, Auto, local_rank, local_size)` and says why in [`Binding::fallback`].
pub(crate) fn plan_gpu_binding(
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
/// GPU `r % gpus` (`gpu_near_pus[g]` is GPU g's [`GpuPlace::pus`](super::pci::GpuPlace::pus)), and ranks whose GPUs
/// have the same near set share its cores ([`plan_gpu_binding`]). With no GPU, every
/// rank gets [`plan_binding`]'s `auto` plan with a `fallback` saying so.
pub(crate) fn plan_gpu_bindings(cores: &[CoreSlot], gpu_near_pus: &[Vec<u32>], local_size: usize) -> Vec<Binding> {
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

/// Binds the calling process to `binding.pus`. Returns a description of the outcome.
pub(crate) fn apply_binding(topo: &mut Topology, binding: &Binding) -> Result<()> {
    if binding.pus.is_empty() {
        return Ok(());
    }
    let set: CpuSet = binding.pus.iter().copied().collect();
    topo.set_cpubind(set, CpuBindFlags::CPUBIND_PROCESS)
        .map_err(|e| anyhow::anyhow!("hwloc could not bind to PUs {:?}: {e:?}", binding.pus))
}

/// Binds the calling thread (only it) to the hardware threads `pus`; on failure the
/// thread runs where the OS puts it.
pub(crate) fn pin_this_thread(pus: &[u32]) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes within it for indexes below
    // CPU_SETSIZE; sched_setaffinity(0, ..) affects the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &p in pus.iter().filter(|&&p| (p as usize) < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(p as usize, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The hardware threads the launcher let this process run on: [`allowed_pus`] at the
/// first call, which comes before ddpbench binds the process (a study binds it anew for
/// every point, so later readings would be the previous point's binding).
pub(crate) fn launcher_pus() -> &'static [u32] {
    static LAUNCHER: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    LAUNCHER.get_or_init(allowed_pus)
}

/// The hardware threads the calling thread may run on (all the machine's when the
/// affinity cannot be read).
pub(crate) fn allowed_pus() -> Vec<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism().map_or(1, |n| n.get()) as u32).collect();
        }
        (0..libc::CPU_SETSIZE as u32)
            .filter(|&c| libc::CPU_ISSET(c as usize, &set))
            .collect()
    }
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
}
