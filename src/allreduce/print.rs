//! What `ddpbench allreduce` prints: nccl-tests' columns per size, and each fitted link
//! model with its errors.

use super::args::{dtype_name, Level};
use crate::comm::GradDtype;
use crate::link::{Route, RouteLinkModel};
use crate::record::{Buffer, SweepRow};

pub(super) fn print_header(route: Route, level: Level, ranks: usize, nodes: usize, dtype: GradDtype) {
    println!(
        "\n# all-reduce sum, {} ({} rank(s) on {} node(s)), backend {}, {}",
        level.name(),
        ranks,
        nodes,
        route.label(),
        dtype_name(dtype)
    );
    println!("#{:>39}  {:>29}  out-of-place  {:>29}  in-place", "", "", "");
    println!(
        "#{:>12} {:>12} {:>8}  {:>10} {:>8} {:>8} {:>6}  {:>10} {:>8} {:>8} {:>6}",
        "size (B)", "count", "type", "time (us)", "algbw", "busbw", "#wrong", "time (us)", "algbw", "busbw", "#wrong"
    );
    println!(
        "#{:>12} {:>12} {:>8}  {:>10} {:>8} {:>8} {:>6}  {:>10} {:>8} {:>8} {:>6}",
        "", "(elements)", "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "(GB/s)", ""
    );
}

pub(super) fn print_line(pair: &[SweepRow]) {
    let (o, i) = (&pair[0], &pair[1]);
    println!(
        " {:>12} {:>12} {:>8}  {:>10.2} {:>8.3} {:>8.3} {:>6}  {:>10.2} {:>8.3} {:>8.3} {:>6}",
        o.bytes,
        o.count,
        o.dtype,
        o.time_s * 1e6,
        o.algbw_bytes_per_s / 1e9,
        o.busbw_bytes_per_s / 1e9,
        o.wrong,
        i.time_s * 1e6,
        i.algbw_bytes_per_s / 1e9,
        i.busbw_bytes_per_s / 1e9,
        i.wrong
    );
}

pub(super) fn print_model(bm: &RouteLinkModel, rows: &[SweepRow]) {
    for f in [&bm.model.intra, &bm.model.inter].into_iter().flatten() {
        println!(
            "{}, {} link model over {} ranks: alpha {:.2} us, bandwidth {:.3} GB/s (1/beta), |error| max {:.1} % rms {:.1} % over {}..{} B",
            bm.route().label(),
            f.level,
            f.ranks,
            f.alpha_s * 1e6,
            f.bandwidth_bytes_per_s / 1e9,
            f.max_abs_rel_error * 100.0,
            f.rms_rel_error * 100.0,
            f.min_bytes,
            f.max_bytes
        );
        if let Some(w) = f.warning() {
            crate::stderr::line(format!("{}, {w}\n", bm.route().label()).into_bytes());
        }
    }
    // The whole world measured against the two levels combined: the model's own check.
    let world: Vec<&SweepRow> = rows
        .iter()
        .filter(|r| r.backend == bm.backend && r.memory == bm.memory && r.level == "world" && r.buffer == Buffer::OutOfPlace)
        .collect();
    let errors: Vec<f64> = world
        .iter()
        .filter_map(|r| {
            let p = bm.model.time_s(r.nodes, r.ranks_per_node, r.bytes as f64).ok()?;
            let measured = r.time_s;
            Some((p.time_s - measured) / measured)
        })
        .collect();
    if !errors.is_empty() {
        let abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        println!(
            "{}, world ({} ranks) against the hierarchical link model: |error| median {:.1} %, max {:.1} % over {} sizes",
            bm.route().label(),
            world[0].ranks,
            crate::stats::median(&abs) * 100.0,
            abs.iter().copied().fold(0.0, f64::max) * 100.0,
            abs.len()
        );
    }
}
