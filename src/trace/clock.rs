//! `clock.csv` as the merge reads it: each rank's offset to rank 0 at each estimate,
//! interpolated linearly between estimates and held beyond them, the correction `reduce`
//! applies to the same file. Read here rather than through `reduce` so that `train`,
//! which writes traces, and `reduce` do not depend on each other through this module.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Rows read at most: an estimate per rank and epoch of a very long run.
const MAX_ROWS: usize = 1 << 20;
/// An offset or a time larger than this (a year, in seconds) is no clock ddpbench read.
const MAX_ABS_S: f64 = 3.2e7;

#[derive(Deserialize)]
struct Row {
    rank: usize,
    /// `rank0_elapsed_s` before schema 3.
    #[serde(alias = "rank0_elapsed_s")]
    rank0_at_s: f64,
    offset_s: f64,
}

/// Per rank, (rank 0's clock, offset) at each estimate, in time order.
#[derive(Debug, Default)]
pub struct Offsets {
    by_rank: BTreeMap<usize, Vec<(f64, f64)>>,
}

impl Offsets {
    /// Reads `run_dir/clock.csv` of a run of `world_size` ranks (no file: no offsets).
    pub fn read(run_dir: &Path, world_size: usize) -> Result<Offsets> {
        let path = run_dir.join("clock.csv");
        let mut by_rank: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
        if !path.exists() {
            return Ok(Offsets::default());
        }
        let mut r = csv::Reader::from_path(&path).with_context(|| format!("cannot read {}", path.display()))?;
        for (i, row) in r.deserialize::<Row>().enumerate() {
            let at = format!("{} row {}", path.display(), i + 1);
            if i >= MAX_ROWS {
                bail!("{at}: more than {MAX_ROWS} rows: not a file ddpbench wrote");
            }
            let row = row.with_context(|| format!("{at}: not a clock estimate"))?;
            let finite = |v: f64| v.is_finite() && v.abs() <= MAX_ABS_S;
            if row.rank >= world_size || !finite(row.rank0_at_s) || !finite(row.offset_s) {
                bail!(
                    "{at}: rank {} of {world_size}, time {} s, offset {} s: not an estimate of this run",
                    row.rank,
                    row.rank0_at_s,
                    row.offset_s
                );
            }
            by_rank.entry(row.rank).or_default().push((row.rank0_at_s, row.offset_s));
        }
        for v in by_rank.values_mut() {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(Offsets { by_rank })
    }

    /// Rank `rank`'s time `t` (seconds) on rank 0's clock.
    pub fn correct(&self, rank: usize, t: f64) -> f64 {
        let Some(p) = self.by_rank.get(&rank).filter(|p| !p.is_empty()) else {
            return t;
        };
        let i = p.partition_point(|x| x.0 <= t);
        let offset = match i {
            0 => p[0].1,
            i if i == p.len() => p[i - 1].1,
            i if p[i].0 > p[i - 1].0 => p[i - 1].1 + (p[i].1 - p[i - 1].1) * (t - p[i - 1].0) / (p[i].0 - p[i - 1].0),
            i => p[i].1,
        };
        t + offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_interpolate_and_bad_rows_are_named() {
        let d = tempfile::tempdir().unwrap();
        let head = "sync,rank,rank0_at_s,offset_s,error_s\n";
        std::fs::write(d.path().join("clock.csv"), format!("{head}0,1,0,0.001,0\n1,1,10,0.003,0\n")).unwrap();
        let o = Offsets::read(d.path(), 2).unwrap();
        assert!((o.correct(1, 5.0) - 5.002).abs() < 1e-12);
        assert!((o.correct(1, 20.0) - 20.003).abs() < 1e-12);
        assert_eq!(o.correct(0, 7.0), 7.0);
        std::fs::write(d.path().join("clock.csv"), format!("{head}0,5,0,0.001,0\n")).unwrap();
        let e = Offsets::read(d.path(), 2).unwrap_err().to_string();
        assert!(e.contains("row 1") && e.contains("rank 5 of 2"), "{e}");
    }
}
