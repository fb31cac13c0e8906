//! The link model (α–β) fitted to a sweep's out-of-place times, per route and level.

use crate::link::model::{LevelFit, LinkModel};
use crate::link::{Route, RouteLinkModel};
use crate::record::{Backend, Buffer, Memory, SweepRow};
use anyhow::{bail, Context, Result};

/// One model per route swept (backend and memory): the intra-node and inter-node fits of
/// its out-of-place times.
pub(super) fn fit_models(rows: &[SweepRow], nodes: usize, per_node: usize, node_type: &str) -> Vec<Result<RouteLinkModel>> {
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
                let fitted = crate::link::model::fit(level, b, &first.dtype, first.ranks, &points).map(|mut f| {
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
                    formula: crate::link::model::FORMULA.into(),
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
