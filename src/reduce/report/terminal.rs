//! The tables printed on the terminal.

use super::{gbs, ms, pct};
use crate::reduce::analysis::{ScalingRow, TypeSummary};

pub fn print_tables(summaries: &[TypeSummary], scaling: &[ScalingRow]) {
    println!(
        "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11} {:>6} {:>6} {:>7} {:>9}",
        "run", "node type", "ranks", "steps", "step ms", "p95 ms", "samples/s", "fwd%", "bwd%", "comm%", "busbw GB/s"
    );
    for s in summaries {
        let nt: String = s.node_type.chars().take(28).collect();
        let run: String = s.run_id.chars().take(34).collect();
        println!(
            "{:<34} {:<28} {:>5} {:>7} {:>9} {:>9} {:>11.1} {:>6.0} {:>6.0} {:>7.0} {:>9}",
            run,
            nt,
            s.ranks,
            s.rank_steps,
            ms(s.step_s_median),
            ms(s.step_s_p95),
            s.samples_per_s,
            s.forward_share * 100.0,
            s.backward_share * 100.0,
            s.comm_exposed_share * 100.0,
            gbs(s.busbw_bytes_per_s)
        );
    }
    if scaling.iter().any(|r| r.scaling_mode != "baseline") {
        println!(
            "\n{:<34} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
            "point", "ranks", "mode", "repeats", "speedup", "interval", "efficiency"
        );
        for r in scaling {
            let run: String = r.run_ids.chars().take(34).collect();
            let num = |v: f64| if v.is_finite() { format!("{v:.3}") } else { "-".into() };
            let ci = if r.speedup_low.is_finite() {
                format!("{:.3}-{:.3}", r.speedup_low, r.speedup_high)
            } else {
                "-".into()
            };
            println!(
                "{:<34} {:>5} {:>8} {:>7} {:>8} {:>17} {:>10}",
                run,
                r.ranks,
                r.scaling_mode,
                r.repeats,
                num(r.speedup),
                ci,
                pct(r.efficiency)
            );
        }
    }
}
