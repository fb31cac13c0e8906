//! `ddpbench reduce`: reads a run folder's rank files and summarises them per node
//! type. Rows are streamed: memory grows with the number of steps kept per rank for
//! medians, never with the text of the files.

use crate::cli::ReduceArgs;
use crate::record::{Manifest, StepRow};
use crate::stats::{median, quantile};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The phases a step is split into, in CSV column order.
pub const PHASES: [&str; 6] = ["data", "forward", "backward", "comm", "optimizer", "other"];

/// Timings of one rank's non-warm-up steps.
#[derive(Debug, Default, Clone)]
pub struct RankSteps {
    pub rank: usize,
    pub node_type: String,
    pub step_s: Vec<f64>,
    /// Per phase (see [`PHASES`]), one value per step.
    pub phase_s: [Vec<f64>; 6],
    pub samples: u64,
    pub bytes: Vec<f64>,
    pub warmup_steps: usize,
}

/// Reads one rank file, keeping steps with warmup == 0.
pub fn read_rank_file(path: &Path) -> Result<RankSteps> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = RankSteps::default();
    for (i, row) in reader.deserialize::<StepRow>().enumerate() {
        let row = row.with_context(|| format!("{}: row {} is malformed (truncated or edited?)", path.display(), i + 2))?;
        out.rank = row.rank;
        out.node_type = row.node_type.clone();
        if row.warmup != 0 {
            out.warmup_steps += 1;
            continue;
        }
        out.step_s.push(row.step_s);
        for (k, v) in [row.data_s, row.forward_s, row.backward_s, row.comm_s, row.optimizer_s, row.other_s].into_iter().enumerate() {
            out.phase_s[k].push(v);
        }
        out.samples += row.samples as u64;
        out.bytes.push(row.bytes as f64);
    }
    Ok(out)
}

/// One row of summary.csv: one node type of one run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeTypeSummary {
    pub run_id: String,
    pub node_type: String,
    pub ranks: usize,
    /// Steps counted over all ranks of this type (warm-up excluded).
    pub steps: usize,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub step_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub step_s_p95: f64,
    /// Samples per second of all ranks of this type together.
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub samples_per_s: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub data_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub data_share: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub forward_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub forward_share: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub backward_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub backward_share: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub comm_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub comm_share: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub optimizer_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub optimizer_share: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub other_s_median: f64,
    #[serde(serialize_with = "crate::record::plain_decimal")]
    pub other_share: f64,
}

/// Summaries per node type from the ranks' step timings.
pub fn summarise(run_id: &str, ranks: &[RankSteps]) -> Vec<NodeTypeSummary> {
    let mut by_type: BTreeMap<&str, Vec<&RankSteps>> = BTreeMap::new();
    for r in ranks {
        by_type.entry(r.node_type.as_str()).or_default().push(r);
    }
    by_type
        .into_iter()
        .map(|(node_type, rs)| {
            let steps: Vec<f64> = rs.iter().flat_map(|r| r.step_s.iter().copied()).collect();
            let phase = |k: usize| -> f64 { median(&rs.iter().flat_map(|r| r.phase_s[k].iter().copied()).collect::<Vec<_>>()) };
            let m: Vec<f64> = (0..6).map(phase).collect();
            let step_median = median(&steps);
            // Each rank's own rate (its samples over its summed step time), added over ranks.
            let samples_per_s = rs
                .iter()
                .map(|r| {
                    let t: f64 = r.step_s.iter().sum();
                    if t > 0.0 { r.samples as f64 / t } else { 0.0 }
                })
                .sum();
            let share = |v: f64| if step_median > 0.0 { v / step_median } else { f64::NAN };
            NodeTypeSummary {
                run_id: run_id.to_string(),
                node_type: node_type.to_string(),
                ranks: rs.len(),
                steps: steps.len(),
                step_s_median: step_median,
                step_s_p95: quantile(&steps, 0.95),
                samples_per_s,
                data_s_median: m[0],
                data_share: share(m[0]),
                forward_s_median: m[1],
                forward_share: share(m[1]),
                backward_s_median: m[2],
                backward_share: share(m[2]),
                comm_s_median: m[3],
                comm_share: share(m[3]),
                optimizer_s_median: m[4],
                optimizer_share: share(m[4]),
                other_s_median: m[5],
                other_share: share(m[5]),
            }
        })
        .collect()
}

/// A run folder's rank files, checked against the manifest's world size.
pub fn read_run(dir: &Path) -> Result<(Manifest, Vec<RankSteps>)> {
    let manifest = Manifest::read(dir)?;
    let mut ranks = Vec::with_capacity(manifest.world_size);
    let mut missing = Vec::new();
    for r in 0..manifest.world_size {
        let path = dir.join(crate::record::rank_file_name(r));
        if !path.is_file() {
            missing.push(r);
            continue;
        }
        ranks.push(read_rank_file(&path)?);
    }
    if !missing.is_empty() {
        bail!(
            "{}: incomplete run: rank file(s) missing for rank(s) {:?} of {}",
            dir.display(),
            missing,
            manifest.world_size
        );
    }
    if manifest.status != "completed" {
        tracing::warn!("{}: run status is {:?}, not completed", dir.display(), manifest.status);
    }
    Ok((manifest, ranks))
}

fn write_summary(path: &Path, rows: &[NodeTypeSummary]) -> Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("cannot write {}", path.display()))?;
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(())
}

fn print_table(manifest: &Manifest, rows: &[NodeTypeSummary]) {
    println!(
        "\nrun {}: {} × {} on {} rank(s), {} node(s), batch {} per rank",
        manifest.run_id, manifest.model, manifest.dataset, manifest.world_size, manifest.nodes, manifest.batch_size_per_rank
    );
    println!(
        "{:<40} {:>5} {:>6} {:>10} {:>10} {:>12}   {}",
        "node type", "ranks", "steps", "step ms", "p95 ms", "samples/s", "phase medians ms (share of step)"
    );
    for r in rows {
        let phases = [
            ("data", r.data_s_median, r.data_share),
            ("fwd", r.forward_s_median, r.forward_share),
            ("bwd", r.backward_s_median, r.backward_share),
            ("comm", r.comm_s_median, r.comm_share),
            ("opt", r.optimizer_s_median, r.optimizer_share),
            ("other", r.other_s_median, r.other_share),
        ]
        .iter()
        .map(|(n, v, s)| format!("{n} {:.2} ({:.0}%)", v * 1e3, s * 100.0))
        .collect::<Vec<_>>()
        .join(", ");
        let name: String = r.node_type.chars().take(40).collect();
        println!(
            "{:<40} {:>5} {:>6} {:>10.2} {:>10.2} {:>12.1}   {}",
            name, r.ranks, r.steps, r.step_s_median * 1e3, r.step_s_p95 * 1e3, r.samples_per_s, phases
        );
    }
    if let Some(p) = &manifest.allreduce_probe {
        println!(
            "raw MPI_Allreduce of the gradient buckets ({} B): median {:.3} ms, busbw {:.2} GB/s",
            p.bytes,
            p.median_s * 1e3,
            p.busbw_bytes_per_s / 1e9
        );
    }
}

/// Entry point of `ddpbench reduce`.
pub fn main(args: ReduceArgs) -> Result<()> {
    let mut usable = 0;
    let mut failures = Vec::new();
    for dir in &args.runs {
        match read_run(dir) {
            Ok((manifest, ranks)) => {
                let rows = summarise(&manifest.run_id, &ranks);
                print_table(&manifest, &rows);
                let out: PathBuf = match &args.out {
                    Some(o) => {
                        std::fs::create_dir_all(o).with_context(|| format!("cannot create {}", o.display()))?;
                        o.join(format!("summary-{}.csv", manifest.run_id))
                    }
                    None => dir.join("summary.csv"),
                };
                write_summary(&out, &rows)?;
                println!("wrote {}", out.display());
                usable += 1;
            }
            Err(e) => {
                eprintln!("skipped: {e:#}");
                failures.push(e);
            }
        }
    }
    if usable == 0 {
        bail!("no usable run among {} folder(s)", args.runs.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, node_type: &str, steps: &[f64], comm: f64) -> RankSteps {
        let mut r = RankSteps { rank, node_type: node_type.into(), ..Default::default() };
        for &s in steps {
            r.step_s.push(s);
            for (k, v) in [0.1, 0.2, 0.3, comm, 0.05, s - 0.65 - comm].into_iter().enumerate() {
                r.phase_s[k].push(v * s);
            }
            r.samples += 32;
        }
        r
    }

    #[test]
    fn summary_per_node_type_matches_hand_values() {
        let ranks = vec![
            rank(0, "A", &[1.0, 2.0, 3.0], 0.2),
            rank(1, "A", &[1.0, 2.0, 3.0], 0.2),
            rank(2, "B", &[4.0, 4.0], 0.1),
        ];
        let rows = summarise("r", &ranks);
        assert_eq!(rows.len(), 2);
        let a = &rows[0];
        assert_eq!((a.node_type.as_str(), a.ranks, a.steps), ("A", 2, 6));
        assert_eq!(a.step_s_median, 2.0);
        // p95 of [1,1,2,2,3,3]: position 4.75 -> 3.
        assert_eq!(a.step_s_p95, 3.0);
        // Each rank: 96 samples in 6 s = 16/s; two ranks: 32/s.
        assert!((a.samples_per_s - 32.0).abs() < 1e-12);
        // comm is 0.2 of each step: median of [0.2,0.2,0.4,0.4,0.6,0.6] = 0.4, share 0.2.
        assert!((a.comm_s_median - 0.4).abs() < 1e-12);
        assert!((a.comm_share - 0.2).abs() < 1e-12);
        let b = &rows[1];
        assert_eq!((b.ranks, b.steps, b.step_s_median), (1, 2, 4.0));
        assert!((b.samples_per_s - 8.0).abs() < 1e-12);
    }
}
