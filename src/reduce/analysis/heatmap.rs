//! The per-rank × step picture of a run: each rank's own work per step (its step time
//! less the exposed all-reduce, what the others wait for when it is late), kept in a
//! grid of bounded size while the rows stream past. A run with more ranks than
//! [`HeatmapLimits::rows`] puts consecutive ranks into one row; a run with more steps
//! than [`HeatmapLimits::columns`] doubles the steps per column (merging neighbours) as
//! often as it needs, so memory and the page's size never grow with the rows.
//! A cell holds the largest value of the rank-steps in it: a late rank is never
//! averaged away by its neighbours.

use serde::Serialize;

/// How large the grid may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeatmapLimits {
    /// Rows (groups of ranks) at most.
    pub rows: usize,
    /// Columns (groups of steps) at most.
    pub columns: usize,
}

/// What report.html draws: 64 rows × 200 columns, 12,800 cells (about 1.2 MB of SVG).
pub(crate) const HEATMAP_LIMITS: HeatmapLimits = HeatmapLimits { rows: 64, columns: 200 };

/// Own work per rank and step, binned.
#[derive(Debug, Clone, Serialize)]
pub struct StepHeatmap {
    /// Ranks per row: row r holds ranks `r * ranks_per_row ..` (the last row may hold fewer).
    pub ranks_per_row: usize,
    /// Counted steps per column (a power of two).
    pub steps_per_column: u64,
    /// The global step of the first counted step.
    pub first_step: u64,
    /// The ranks of the run.
    pub ranks: usize,
    /// Counted steps seen.
    pub steps: u64,
    /// `cells[row][column]`: the largest own work in seconds there (NaN: nothing yet).
    pub cells_s: Vec<Vec<f64>>,
    #[serde(skip)]
    limits: HeatmapLimits,
}

impl Default for StepHeatmap {
    /// An empty heatmap of one rank at [`HEATMAP_LIMITS`].
    fn default() -> StepHeatmap {
        StepHeatmap::new(1, HEATMAP_LIMITS)
    }
}

impl StepHeatmap {
    pub(crate) fn new(ranks: usize, limits: HeatmapLimits) -> StepHeatmap {
        let rows = limits.rows.max(1);
        let ranks_per_row = ranks.div_ceil(rows).max(1);
        StepHeatmap {
            ranks_per_row,
            steps_per_column: 1,
            first_step: 0,
            ranks,
            steps: 0,
            cells_s: vec![Vec::new(); ranks.div_ceil(ranks_per_row).max(1)],
            limits: HeatmapLimits {
                rows,
                columns: limits.columns.max(2),
            },
        }
    }

    /// Adds one counted step: `own_s[i]` is rank i's own work.
    pub(crate) fn push(&mut self, global_step: u64, own_s: &[f64]) {
        if self.steps == 0 {
            self.first_step = global_step;
        }
        let column = (self.steps / self.steps_per_column) as usize;
        if column >= self.limits.columns {
            self.halve();
        }
        let column = (self.steps / self.steps_per_column) as usize;
        let last_row = self.cells_s.len() - 1;
        for (i, &v) in own_s.iter().enumerate() {
            let row = &mut self.cells_s[(i / self.ranks_per_row).min(last_row)];
            if row.len() <= column {
                row.resize(column + 1, f64::NAN);
            }
            if v.is_finite() && !(row[column] >= v) {
                row[column] = v;
            }
        }
        self.steps += 1;
    }

    /// Twice the steps per column: each pair of columns becomes one.
    fn halve(&mut self) {
        self.steps_per_column *= 2;
        for row in &mut self.cells_s {
            *row = row.chunks(2).map(|c| c.iter().copied().fold(f64::NAN, f64::max)).collect();
        }
    }

    /// The same grid binned further to fit `limits`: neighbouring columns merged in
    /// pairs until at most `limits.columns` are left (the steps per column stay a power
    /// of two), groups of neighbouring rows merged into one until at most `limits.rows`
    /// are left. A cell keeps the largest value of the cells merged into it: still the
    /// largest own work of the rank-steps it covers. Its columns are the ones
    /// [`StepHeatmap::new`] with `limits` would have built from the same rows.
    pub(crate) fn coarsened(&self, limits: HeatmapLimits) -> StepHeatmap {
        let (rows, columns) = (limits.rows.max(1), limits.columns.max(1));
        let mut h = self.clone();
        while h.columns() > columns {
            h.halve();
        }
        let merge = h.cells_s.len().div_ceil(rows);
        if merge > 1 {
            h.ranks_per_row *= merge;
            h.cells_s = h
                .cells_s
                .chunks(merge)
                .map(|group| {
                    let width = group.iter().map(Vec::len).max().unwrap_or(0);
                    (0..width)
                        .map(|c| group.iter().filter_map(|r| r.get(c)).copied().fold(f64::NAN, f64::max))
                        .collect()
                })
                .collect();
        }
        h.limits = HeatmapLimits {
            rows,
            columns: columns.max(2),
        };
        h
    }

    /// Cells drawn: rows × columns filled so far.
    pub(crate) fn cell_count(&self) -> usize {
        self.cells_s.len() * self.columns()
    }

    /// Columns filled so far.
    pub(crate) fn columns(&self) -> usize {
        self.cells_s.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The ranks of row `r` as text: "3" or "64–127".
    pub(crate) fn row_label(&self, r: usize) -> String {
        let first = r * self.ranks_per_row;
        let last = ((r + 1) * self.ranks_per_row).min(self.ranks).saturating_sub(1);
        if first >= last {
            first.to_string()
        } else {
            format!("{first}–{last}")
        }
    }

    /// The first global step of column `c`.
    pub(crate) fn column_step(&self, c: usize) -> u64 {
        self.first_step + c as u64 * self.steps_per_column
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_runs_are_drawn_cell_by_cell() {
        let mut h = StepHeatmap::new(3, HeatmapLimits { rows: 4, columns: 8 });
        for s in 0..5 {
            h.push(10 + s, &[1.0, 2.0 + s as f64, 0.5]);
        }
        assert_eq!((h.ranks_per_row, h.steps_per_column, h.first_step), (1, 1, 10));
        assert_eq!(h.cells_s.len(), 3);
        assert_eq!(h.cells_s[1], [2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(h.row_label(2), "2");
    }

    #[test]
    fn coarsening_gives_the_grid_smaller_limits_would_have_built() {
        let own = |s: u64| -> Vec<f64> { (0..10).map(|r| ((s * 7 + r * 13) % 23) as f64).collect() };
        let mut fine = StepHeatmap::new(10, HeatmapLimits { rows: 10, columns: 64 });
        let mut direct = StepHeatmap::new(10, HeatmapLimits { rows: 3, columns: 5 });
        for s in 0..50u64 {
            fine.push(100 + s, &own(s));
            direct.push(100 + s, &own(s));
        }
        assert_eq!((fine.ranks_per_row, fine.steps_per_column, fine.columns()), (1, 1, 50));
        let coarse = fine.coarsened(HeatmapLimits { rows: 3, columns: 5 });
        // 10 rows into at most 3: 4 ranks a row; 50 columns into at most 5: 16 steps a column.
        assert_eq!((coarse.ranks_per_row, coarse.steps_per_column), (4, 16));
        assert_eq!((coarse.cells_s.len(), coarse.columns(), coarse.cell_count()), (3, 4, 12));
        assert_eq!(coarse.cells_s, direct.cells_s);
        assert_eq!(
            (coarse.ranks_per_row, coarse.steps_per_column),
            (direct.ranks_per_row, direct.steps_per_column)
        );
        assert_eq!(coarse.row_label(2), "8–9");
        assert_eq!(coarse.column_step(1), 116);
        // Within its limits already: unchanged.
        assert_eq!(fine.coarsened(HeatmapLimits { rows: 64, columns: 200 }).cells_s, fine.cells_s);
    }

    #[test]
    fn large_runs_are_binned_and_keep_the_late_rank() {
        // 10 ranks, 100 steps into at most 3 rows and 8 columns.
        let mut h = StepHeatmap::new(10, HeatmapLimits { rows: 3, columns: 8 });
        for s in 0..100u64 {
            let mut own = vec![1.0; 10];
            if s == 57 {
                own[9] = 40.0;
            }
            h.push(s, &own);
        }
        assert_eq!(h.ranks_per_row, 4);
        assert_eq!(h.cells_s.len(), 3);
        assert_eq!(h.row_label(0), "0–3");
        assert_eq!(h.row_label(2), "8–9");
        // 100 steps over 8 columns: 16 steps per column, 7 columns filled.
        assert_eq!(h.steps_per_column, 16);
        assert_eq!(h.columns(), 7);
        assert!(h.cells_s.iter().all(|r| r.len() <= 8));
        // Step 57 is in column 3 (steps 48–63) of the last row, and only there.
        assert_eq!(h.cells_s[2][3], 40.0);
        assert_eq!(h.column_step(3), 48);
        let big: usize = h.cells_s.iter().flatten().filter(|v| **v > 1.0).count();
        assert_eq!(big, 1);
    }
}
