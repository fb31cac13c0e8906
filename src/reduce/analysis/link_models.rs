//! The link models a projection uses: a sweep's measured levels, with the levels that
//! `--link`/`--link-intra` name replaced by their specifications, and a level neither
//! measured nor given taken from the runs' own all-reduce probes.

use super::RunStats;
use crate::link::model::LevelFit;
use crate::link::{spec as link_spec, LinkModelFile};
use crate::record::{Backend, DeviceKind, Memory};

/// The link models of a projection where `--link` (`inter`) or `--link-intra` (`intra`)
/// name a level: the sweep's (`measured`) with those levels replaced, else one per route
/// the runs used. `ranks_per_node` is the first `--project-shape`'s, when one is given.
pub(crate) fn with_specs(
    inter: Option<&link_spec::LinkSpec>,
    intra: Option<&link_spec::LinkSpec>,
    ranks_per_node: Option<usize>,
    measured: Option<LinkModelFile>,
    runs: &[&RunStats],
) -> LinkModelFile {
    let mut routes: Vec<(Backend, Memory)> = runs
        .iter()
        .filter(|r| r.manifest.comm_backend != Backend::None)
        .map(|r| {
            let device = DeviceKind::of_ranks(r.manifest.ranks.get(..1).unwrap_or_default());
            (r.manifest.comm_backend, Memory::of_device(device))
        })
        .collect();
    routes.sort_by_key(|&(b, m)| (b.to_string(), m));
    routes.dedup();
    let per_node = match (ranks_per_node, &measured) {
        (Some(n), _) => n,
        (None, Some(m)) => m.models.iter().map(|m| m.model.ranks_per_node).max().unwrap_or(1),
        (None, None) => runs
            .iter()
            .map(|r| r.manifest.world_size / r.manifest.nodes.max(1))
            .max()
            .unwrap_or(1),
    };
    let probes = |backend: Backend, memory: Memory, dtype: &str| probe_level(runs, backend, memory, dtype);
    link_spec::with_specs(measured, inter, intra, &routes, per_node, &probes)
}

/// The intra-node level the runs' own probes give on `backend` and `memory`: from the
/// runs on one node with the most ranks there ([`link_spec::probe_level`]).
fn probe_level(runs: &[&RunStats], backend: Backend, memory: Memory, dtype: &str) -> Option<LevelFit> {
    let on_route: Vec<&RunStats> = runs
        .iter()
        .copied()
        .filter(|r| {
            let m = &r.manifest;
            let device = DeviceKind::of_ranks(m.ranks.get(..1).unwrap_or_default());
            m.comm_backend == backend && Memory::of_device(device) == memory && m.nodes == 1 && m.world_size >= 2
        })
        .filter(|r| r.manifest.allreduce_probe.is_some())
        .collect();
    let most = on_route.iter().map(|r| r.manifest.world_size).max()?;
    let probes: Vec<(usize, u64, f64)> = on_route
        .iter()
        .filter(|r| r.manifest.world_size == most)
        .filter_map(|r| r.manifest.allreduce_probe.as_ref().map(|p| (most, p.bytes, p.median_s)))
        .collect();
    link_spec::probe_level(&probes, backend, dtype)
}
