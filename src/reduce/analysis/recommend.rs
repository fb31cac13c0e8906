//! The recommendation per workload: from its weak-scaling projection (the measured
//! per-rank batch at every shape), the largest shape that keeps a target efficiency,
//! the shape with the shortest epoch, and per shape the epoch's time, GPU-hours and
//! cost. The sentence that says the decision is made from the same rows as the table
//! ([`Recommendation::shapes`]), with the same figures.

use super::projection::{ProjectionRow, EXTRAPOLATION_FACTOR};
use crate::bounds::MAX_RANKS;
use serde::Serialize;

/// Nodes × ranks per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Shape {
    pub nodes: usize,
    pub ranks_per_node: usize,
}

impl Shape {
    /// `16x4` (or `16×4`): 16 nodes of 4 ranks each; Err says the form.
    pub(crate) fn parse(s: &str) -> Result<Shape, String> {
        let why = || format!("'{s}' is no shape: give NODESxRANKS_PER_NODE, both 1 or more, e.g. 16x4 (16 nodes of 4 ranks)");
        let (n, p) = s.trim().split_once(['x', 'X', '×']).ok_or_else(why)?;
        let (Ok(nodes), Ok(ranks_per_node)) = (n.trim().parse::<usize>(), p.trim().parse::<usize>()) else {
            return Err(why());
        };
        if nodes == 0 || ranks_per_node == 0 {
            return Err(why());
        }
        if nodes.saturating_mul(ranks_per_node) > MAX_RANKS {
            return Err(format!("'{s}': more than {MAX_RANKS} ranks"));
        }
        Ok(Shape { nodes, ranks_per_node })
    }

    /// The ladder up to this shape: 1 × 1, 1 × 2, 1 × 4 … 1 × p (ranks per node
    /// doubling), then 2 × p, 4 × p … n × p (nodes doubling); p and n are on it.
    pub(crate) fn ladder(self) -> Vec<(usize, usize)> {
        let doubling = |top: usize| {
            let mut v: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
                .take_while(|&k| k < top)
                .collect();
            v.push(top);
            v
        };
        let p = self.ranks_per_node;
        let mut out: Vec<(usize, usize)> = doubling(p).into_iter().map(|k| (1, k)).collect();
        out.extend(doubling(self.nodes).into_iter().skip(1).map(|m| (m, p)));
        out
    }

    pub(crate) fn label(self) -> String {
        format!("{} × {}", self.nodes, self.ranks_per_node)
    }
}

/// The shapes of every ladder, ordered by ranks then nodes, each once.
pub(crate) fn ladders(shapes: &[Shape]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = shapes.iter().flat_map(|s| s.ladder()).collect();
    out.sort_unstable_by_key(|&(m, p)| (m * p, m));
    out.dedup();
    out
}

/// One shape of the recommendation's table.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShapeCost {
    pub shape: Shape,
    pub ranks: usize,
    pub step_s: f64,
    /// Against the one reference every column shares (the projection's 1-rank row: the
    /// measured 1-rank point where there is one); efficiency = speedup / ranks.
    pub speedup: f64,
    pub efficiency: f64,
    /// The band of the efficiency (its ends from the step's band).
    pub efficiency_low: f64,
    pub efficiency_high: f64,
    /// Samples of an epoch / the projected samples per second, and its band (the epoch is
    /// in proportion to the step).
    pub epoch_s: f64,
    pub epoch_low_s: f64,
    pub epoch_high_s: f64,
    /// ranks × epoch_s / 3600, and its band.
    pub gpu_hours_per_epoch: f64,
    pub gpu_hours_low: f64,
    pub gpu_hours_high: f64,
    /// gpu_hours_per_epoch × `--price-per-gpu-hour`.
    pub cost_per_epoch: Option<f64>,
    /// Against the shape before it in the table: the part of the epoch saved (weak
    /// scaling: 1 − speedup(before) / speedup(this)), and the GPU-hours as a multiple.
    pub epoch_saved_fraction: Option<f64>,
    pub gpu_hours_ratio: Option<f64>,
    pub extrapolated: bool,
    pub unreliable: bool,
    /// The row lies outside what was measured ([`ProjectionRow::beyond_measured`]).
    pub beyond_measured: bool,
    pub measured_step_s: Option<f64>,
    /// With runs trained to a target loss ([`Recommendation::time_to_target`]): this
    /// shape's global batch's predicted samples to the target over the 1-rank batch's (the
    /// statistical cost of the larger batch), hours and GPU-hours to the target (samples ÷
    /// this shape's samples/s), the hours' band (the step's band and the prediction's
    /// checked error), and whether the batch lies outside the batches the prediction was
    /// checked at (below B0, or beyond 16 × B0). None without a target.
    pub samples_to_target_ratio: Option<f64>,
    pub hours_to_target: Option<f64>,
    pub hours_to_target_low: Option<f64>,
    pub hours_to_target_high: Option<f64>,
    pub gpu_hours_to_target: Option<f64>,
    pub target_batch_extrapolated: bool,
}

/// What the time to a target loss at each shape stands on, and the shapes it names.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimeToTarget {
    /// The target: `target_loss` or `target_accuracy` in report.json.
    #[serde(flatten)]
    pub goal: crate::record::TargetGoal,
    /// B0 and its measured median samples to the target.
    pub batch0: usize,
    pub samples0: f64,
    /// The prediction's checked error, as a fraction (the band's part for it).
    pub checked_error: f64,
    pub soonest: Shape,
    pub cheapest: Shape,
}

/// What to run, for one workload.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recommendation {
    pub workload: String,
    pub from_runs: String,
    pub batch_per_rank: f64,
    pub target_efficiency: f64,
    /// Samples one epoch trains on (the reference's steps per epoch × its global batch).
    pub epoch_samples: f64,
    /// The inter-node (or, on one node, intra-node) link, in words.
    pub link: String,
    /// A level used is nominal (a link's specification, an optimistic bound).
    pub nominal: bool,
    /// What efficiency is against (the measured 1-rank run, else the projection at 1 rank).
    pub against: String,
    pub shapes: Vec<ShapeCost>,
    /// The largest shape whose efficiency is at least the target (None: none beyond 1 rank).
    pub keeps_target: Option<Shape>,
    pub shortest_epoch: Shape,
    /// `--epoch-time-target` (seconds): the shape of fewest GPU-hours per epoch whose
    /// expected epoch meets it (None: none does, or no target).
    pub epoch_time_target_s: Option<f64>,
    pub cheapest_meeting_epoch_target: Option<Shape>,
    /// `--gpu-hour-budget` (GPU-hours per epoch): the shape of the shortest expected epoch
    /// within it (None: none fits, or no budget).
    pub gpu_hour_budget: Option<f64>,
    pub fastest_within_budget: Option<Shape>,
    /// Time to a target loss per shape, where the runs were trained to one.
    pub time_to_target: Option<TimeToTarget>,
    /// A row up to the shapes named is extrapolated or unreliable: figures to 2 digits.
    pub rough: bool,
    /// Where the largest projected shape's step loses against the ideal (the
    /// reference's step), when it loses: own work (a rank's compute and data under
    /// contention, and the wait for a late rank) against the exposed all-reduce.
    pub loss_cause: Option<LossCause>,
    pub sentence: String,
}

/// The split of a projected step's loss against the ideal step into own work and link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossCause {
    pub shape: Shape,
    /// step − the ideal step (the reference's step at this batch per rank), seconds.
    pub loss_s: f64,
    /// Of it, the exposed all-reduce (the link's part), seconds.
    pub link_s: f64,
    /// The rest: own work past the reference's step and the wait for a late rank.
    pub own_work_s: f64,
}

impl LossCause {
    /// The split at `r`, when its step is longer than the ideal one (weak scaling: the
    /// ideal step is the reference's, step × efficiency).
    fn of(r: &ProjectionRow) -> Option<LossCause> {
        let ideal_s = r.step_s * r.efficiency;
        let loss_s = r.step_s - ideal_s;
        (r.ranks > 1 && loss_s > 0.0 && loss_s.is_finite()).then(|| LossCause {
            shape: Shape {
                nodes: r.nodes,
                ranks_per_node: r.ranks_per_node,
            },
            loss_s,
            link_s: r.comm_exposed_s.clamp(0.0, loss_s),
            own_work_s: loss_s - r.comm_exposed_s.clamp(0.0, loss_s),
        })
    }

    /// The sentence when own work is most of the loss; None when the link is.
    fn own_work_sentence(&self) -> Option<String> {
        (self.own_work_s > self.link_s).then(|| {
            format!(
                " At {} the step loses {} ms against the ideal: {:.0} % of it is own work (a rank's compute and data \
                 under contention, and the wait for a late rank) and {:.0} % the exposed all-reduce, so the link is not \
                 what limits it: a faster link would not change this decision.",
                self.shape.label(),
                sig(self.loss_s * 1e3, 3),
                100.0 * self.own_work_s / self.loss_s,
                100.0 * self.link_s / self.loss_s
            )
        })
    }
}

/// The inputs of a recommendation that are not the rows.
pub(crate) struct Ask<'a> {
    pub epoch_samples: f64,
    pub target_efficiency: f64,
    pub price_per_gpu_hour: Option<f64>,
    pub link: &'a str,
    pub nominal: bool,
    pub epoch_time_target_s: Option<f64>,
    pub gpu_hour_budget: Option<f64>,
}

/// A number to `digits` significant digits, as text.
fn sig(v: f64, digits: i32) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}");
    }
    let decimals = (digits - 1 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
}

/// The figures of the table and the sentence, written one way for both.
pub(crate) struct Figures {
    pub rough: bool,
}

impl Figures {
    fn digits(&self) -> i32 {
        if self.rough {
            2
        } else {
            3
        }
    }
    pub(crate) fn epoch(&self, s: f64) -> String {
        let (v, unit) = if s >= 7200.0 {
            (s / 3600.0, "h")
        } else if s >= 120.0 {
            (s / 60.0, "min")
        } else {
            (s, "s")
        };
        format!("{} {unit}", sig(v, self.digits()))
    }
    pub(crate) fn gpu_hours(&self, h: f64) -> String {
        sig(h, self.digits())
    }
    pub(crate) fn efficiency(&self, e: f64) -> String {
        format!("{} %", sig(e * 100.0, self.digits()))
    }
    pub(crate) fn fraction(&self, f: f64) -> String {
        format!("{} %", sig(f * 100.0, 2))
    }
    pub(crate) fn ratio(&self, r: f64) -> String {
        format!("{}×", sig(r, 2))
    }
    pub(crate) fn money(&self, c: f64) -> String {
        sig(c, self.digits())
    }
    /// A figure and its band: `85.0 % (80.1–88.2 %)`, `15.2 s (14.1–16.3 s)`.
    pub(crate) fn banded(&self, show: impl Fn(f64) -> String, v: f64, low: f64, high: f64) -> String {
        let (v, lo, hi) = (show(v), show(low), show(high));
        // The unit once, after the band, where all three share it.
        let unit = |t: &str| t.rsplit_once(' ').map(|(_, u)| u.to_string()).unwrap_or_default();
        let bare = |t: &str| t.rsplit_once(' ').map(|(n, _)| n.to_string()).unwrap_or_else(|| t.to_string());
        if unit(&lo) == unit(&hi) && !unit(&hi).is_empty() {
            format!("{v} ({}–{hi})", bare(&lo))
        } else {
            format!("{v} ({lo}–{hi})")
        }
    }
    pub(crate) fn efficiency_band(&self, s: &ShapeCost) -> String {
        self.banded(|e| self.efficiency(e), s.efficiency, s.efficiency_low, s.efficiency_high)
    }
    pub(crate) fn epoch_band(&self, s: &ShapeCost) -> String {
        self.banded(|e| self.epoch(e), s.epoch_s, s.epoch_low_s, s.epoch_high_s)
    }
    pub(crate) fn gpu_hours_band(&self, s: &ShapeCost) -> String {
        self.banded(|h| self.gpu_hours(h), s.gpu_hours_per_epoch, s.gpu_hours_low, s.gpu_hours_high)
    }
}

/// The recommendation from one workload's weak-scaling rows; None without rows.
pub(crate) fn recommend(rows: &[&ProjectionRow], ask: &Ask) -> Option<Recommendation> {
    let mut rows: Vec<&ProjectionRow> = rows.to_vec();
    rows.sort_by_key(|r| (r.ranks, r.nodes));
    let first = *rows.first()?;
    let mut shapes: Vec<ShapeCost> = Vec::new();
    for r in &rows {
        let epoch_s = ask.epoch_samples / r.samples_per_s;
        let gpu_hours_per_epoch = r.ranks as f64 * epoch_s / 3600.0;
        // The band: epoch and GPU-hours in proportion to the step, efficiency inversely.
        let (lo, hi) = (r.step_low_s / r.step_s, r.step_high_s / r.step_s);
        let before = shapes.last();
        shapes.push(ShapeCost {
            shape: Shape {
                nodes: r.nodes,
                ranks_per_node: r.ranks_per_node,
            },
            ranks: r.ranks,
            step_s: r.step_s,
            speedup: r.speedup,
            efficiency: r.efficiency,
            efficiency_low: r.efficiency / hi,
            efficiency_high: r.efficiency / lo,
            epoch_s,
            epoch_low_s: epoch_s * lo,
            epoch_high_s: epoch_s * hi,
            gpu_hours_per_epoch,
            gpu_hours_low: gpu_hours_per_epoch * lo,
            gpu_hours_high: gpu_hours_per_epoch * hi,
            cost_per_epoch: ask.price_per_gpu_hour.map(|p| p * gpu_hours_per_epoch),
            epoch_saved_fraction: before.map(|b| 1.0 - epoch_s / b.epoch_s),
            gpu_hours_ratio: before.map(|b| gpu_hours_per_epoch / b.gpu_hours_per_epoch),
            extrapolated: r.extrapolated,
            unreliable: r.unreliable,
            beyond_measured: !r.beyond_measured.is_empty(),
            measured_step_s: r.measured_step_s,
            samples_to_target_ratio: None,
            hours_to_target: None,
            hours_to_target_low: None,
            hours_to_target_high: None,
            gpu_hours_to_target: None,
            target_batch_extrapolated: false,
        });
    }
    let keep = shapes.iter().rposition(|s| s.ranks > 1 && s.efficiency >= ask.target_efficiency);
    let fastest = (0..shapes.len()).min_by(|&a, &b| shapes[a].epoch_s.total_cmp(&shapes[b].epoch_s))?;
    let cheapest = ask.epoch_time_target_s.and_then(|t| {
        (0..shapes.len())
            .filter(|&i| shapes[i].epoch_s <= t)
            .min_by(|&a, &b| shapes[a].gpu_hours_per_epoch.total_cmp(&shapes[b].gpu_hours_per_epoch))
    });
    let within = ask.gpu_hour_budget.and_then(|b| {
        (0..shapes.len())
            .filter(|&i| shapes[i].gpu_hours_per_epoch <= b)
            .min_by(|&a, &b| shapes[a].epoch_s.total_cmp(&shapes[b].epoch_s))
    });
    let named = [keep, Some(fastest), cheapest, within].into_iter().flatten().max().unwrap_or(0);
    let rough = shapes[..=named].iter().any(|s| s.extrapolated || s.unreliable || s.beyond_measured);
    let mut rec = Recommendation {
        workload: first.workload.clone(),
        from_runs: first.from_runs.clone(),
        batch_per_rank: first.batch_per_rank,
        target_efficiency: ask.target_efficiency,
        epoch_samples: ask.epoch_samples,
        link: ask.link.into(),
        nominal: ask.nominal,
        against: first.speedup_against.clone(),
        keeps_target: keep.map(|i| shapes[i].shape),
        shortest_epoch: shapes[fastest].shape,
        epoch_time_target_s: ask.epoch_time_target_s,
        cheapest_meeting_epoch_target: cheapest.map(|i| shapes[i].shape),
        gpu_hour_budget: ask.gpu_hour_budget,
        fastest_within_budget: within.map(|i| shapes[i].shape),
        time_to_target: None,
        shapes,
        rough,
        loss_cause: rows.last().and_then(|r| LossCause::of(r)),
        sentence: String::new(),
    };
    rec.sentence = sentence(&rec, keep, fastest, cheapest, within);
    if let Some(s) = rec.loss_cause.and_then(|c| c.own_work_sentence()) {
        rec.sentence += &s;
    }
    Some(rec)
}

/// Joins the time to `curve`'s target loss to `rec`: per shape (weak scaling, global batch
/// = batch per rank × ranks) the predicted samples to the target, the hours and
/// GPU-hours to it at the shape's throughput, with a band from the step's band and
/// `checked_error`; the soonest and the cheapest shape, said in the sentence.
pub(crate) fn join_time_to_target(
    rec: &mut Recommendation,
    curve: &crate::reduce::analysis::samples_to_target::TargetCurve,
    checked: crate::reduce::analysis::samples_to_target::CheckedError,
) {
    let checked_error = checked.fraction;
    use crate::reduce::analysis::samples_to_target::CHECKED_MULTIPLE;
    let Some(base) = curve.samples_at(rec.batch_per_rank) else { return };
    for s in &mut rec.shapes {
        let batch = rec.batch_per_rank * s.ranks as f64;
        let Some(samples) = curve.samples_at(batch) else { continue };
        let hours = samples * s.step_s / batch / 3600.0;
        let (lo, hi) = (s.epoch_low_s / s.epoch_s, s.epoch_high_s / s.epoch_s);
        s.samples_to_target_ratio = Some(samples / base);
        s.hours_to_target = Some(hours);
        s.hours_to_target_low = Some(hours * lo * (1.0 - checked_error).max(0.0));
        s.hours_to_target_high = Some(hours * hi * (1.0 + checked_error));
        s.gpu_hours_to_target = Some(hours * s.ranks as f64);
        let b0 = curve.batch0 as f64;
        s.target_batch_extrapolated = batch < b0 || batch > CHECKED_MULTIPLE * b0;
    }
    let pick = |f: fn(&ShapeCost) -> Option<f64>| {
        rec.shapes
            .iter()
            .filter(|s| f(s).is_some())
            .min_by(|a, b| f(a).unwrap().total_cmp(&f(b).unwrap()))
            .map(|s| s.shape)
    };
    let (Some(soonest), Some(cheapest)) = (pick(|s| s.hours_to_target), pick(|s| s.gpu_hours_to_target)) else {
        return;
    };
    let t = TimeToTarget {
        goal: curve.goal,
        batch0: curve.batch0,
        samples0: curve.samples0,
        checked_error,
        soonest,
        cheapest,
    };
    let f = Figures { rough: rec.rough };
    let at = |shape: Shape| rec.shapes.iter().find(|s| s.shape == shape).expect("a shape of the table");
    let (a, b) = (at(soonest), at(cheapest));
    let hours = |s: &ShapeCost| {
        f.banded(
            |h| f.epoch(h * 3600.0),
            s.hours_to_target.unwrap_or(f64::NAN),
            s.hours_to_target_low.unwrap_or(f64::NAN),
            s.hours_to_target_high.unwrap_or(f64::NAN),
        )
    };
    let extrapolated = |s: &ShapeCost| {
        if s.target_batch_extrapolated {
            ", its batch outside the checked B0 – 16 × B0"
        } else {
            ""
        }
    };
    rec.sentence += &format!(
        " To {} (the samples from B0 = {}'s training, integrated over its noise scale, ±{:.0} % {}): \
         soonest at {} ({}, {}× the samples of 1 rank{}), cheapest at {} ({} GPU-hours{}).",
        t.goal,
        t.batch0,
        checked_error * 100.0,
        checked.covers,
        soonest.label(),
        hours(a),
        sig(a.samples_to_target_ratio.unwrap_or(f64::NAN), 2),
        extrapolated(a),
        cheapest.label(),
        f.gpu_hours(b.gpu_hours_to_target.unwrap_or(f64::NAN)),
        extrapolated(b)
    );
    rec.time_to_target = Some(t);
}

/// The decision in one sentence, from the rows of the table, each figure with its band:
/// where the target holds, what each larger shape buys beyond it, the shortest epoch, and
/// the shapes that meet an epoch-time target and a GPU-hour budget where given.
fn sentence(rec: &Recommendation, keep: Option<usize>, fastest: usize, cheapest: Option<usize>, within: Option<usize>) -> String {
    let f = Figures { rough: rec.rough };
    let s = &rec.shapes;
    let target = format!("{:.0} %", rec.target_efficiency * 100.0);
    let mut out = format!("On {}, {} at batch {} per rank ", rec.link, rec.workload, rec.batch_per_rank);
    match keep {
        Some(k) => {
            let at = &s[k];
            out += &format!(
                "keeps ≥ {target} efficiency up to {} ({} efficiency, {} per epoch, {} GPU-hours per epoch)",
                at.shape.label(),
                f.efficiency_band(at),
                f.epoch_band(at),
                f.gpu_hours_band(at)
            );
            let beyond = &s[k + 1..];
            let saved = beyond
                .iter()
                .filter_map(|b| b.epoch_saved_fraction)
                .fold(f64::NEG_INFINITY, f64::max);
            let costs = beyond.iter().filter_map(|b| b.gpu_hours_ratio).fold(f64::INFINITY, f64::min);
            let doublings = s[k..].windows(2).all(|w| w[1].ranks == 2 * w[0].ranks);
            if beyond.is_empty() {
                out += ", the largest shape projected";
            } else if saved.is_finite() && costs.is_finite() {
                out += &format!(
                    "; beyond that each {} saves at most {} of the epoch for {} the GPU-hours or more",
                    if doublings { "doubling" } else { "larger shape" },
                    f.fraction(saved),
                    f.ratio(costs)
                );
            }
        }
        None => out += &format!("keeps ≥ {target} efficiency at no shape beyond 1 rank"),
    }
    let fast = &s[fastest];
    out += &format!(
        ". The shortest epoch is {} at {} ({} GPU-hours).",
        f.epoch_band(fast),
        fast.shape.label(),
        f.gpu_hours_band(fast)
    );
    if let Some(t) = rec.epoch_time_target_s {
        out += &match cheapest {
            Some(i) => format!(
                " The cheapest shape whose expected epoch meets the target of {} is {} ({} per epoch, {} GPU-hours){}.",
                f.epoch(t),
                s[i].shape.label(),
                f.epoch_band(&s[i]),
                f.gpu_hours_band(&s[i]),
                if s[i].epoch_high_s <= t {
                    ", the band's slow end meeting it too"
                } else {
                    "; the band's slow end misses it"
                }
            ),
            None => format!(" No shape projected meets the epoch-time target of {}.", f.epoch(t)),
        };
    }
    if let Some(b) = rec.gpu_hour_budget {
        out += &match within {
            Some(i) => format!(
                " The fastest shape within the budget of {} GPU-hours per epoch is {} ({} per epoch, {} GPU-hours){}.",
                f.gpu_hours(b),
                s[i].shape.label(),
                f.epoch_band(&s[i]),
                f.gpu_hours_band(&s[i]),
                if s[i].gpu_hours_high <= b {
                    ", the band's costly end within it too"
                } else {
                    "; the band's costly end exceeds it"
                }
            ),
            None => format!(" No shape projected fits the budget of {} GPU-hours per epoch.", f.gpu_hours(b)),
        };
    }
    if rec.rough {
        out += &format!(
            " Rough: rows up to these shapes are extrapolated (beyond {EXTRAPOLATION_FACTOR}× the ranks measured), beyond what was \
             measured, or rest on an unreliable fit, so the figures are given to 2 digits: trust the shapes' order, not the amounts."
        );
    }
    if rec.nominal {
        out += " A level is nominal (a link's specification): the figures expect an all-reduce at the fraction of line rate \
                the report states for it, and the band's optimistic end is the line rate itself.";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_into_ladders_and_bad_ones_say_the_form() {
        assert_eq!(
            Shape::parse("16x4").unwrap().ladder(),
            vec![(1, 1), (1, 2), (1, 4), (2, 4), (4, 4), (8, 4), (16, 4)]
        );
        assert_eq!(Shape::parse("3×3").unwrap().ladder(), vec![(1, 1), (1, 2), (1, 3), (2, 3), (3, 3)]);
        assert_eq!(
            ladders(&[Shape::parse("2x2").unwrap(), Shape::parse("1x4").unwrap()]),
            vec![(1, 1), (1, 2), (1, 4), (2, 2)]
        );
        for bad in ["16", "16x", "x4", "0x4", "4x0", "-1x4", "2.5x4", "4*4"] {
            let e = Shape::parse(bad).unwrap_err();
            assert!(e.contains("NODESxRANKS_PER_NODE"), "{bad}: {e}");
        }
        assert!(Shape::parse("1000000000x1000").unwrap_err().contains("more than"));
    }

    fn row(nodes: usize, per_node: usize, efficiency: f64) -> ProjectionRow {
        let ranks = nodes * per_node;
        // 100 samples/s at 1 rank; a batch of 10 per rank.
        let samples_per_s = 100.0 * ranks as f64 * efficiency;
        ProjectionRow {
            workload: "w/d/b10".into(),
            comparison: String::new(),
            from_runs: "r".into(),
            from_repeats: 1,
            link: String::new(),
            step_basis: "projected".into(),
            scaling: "weak".into(),
            batch_per_rank: 10.0,
            global_batch: 10.0 * ranks as f64,
            nodes,
            ranks_per_node: per_node,
            ranks,
            step_s: 10.0 * ranks as f64 / samples_per_s,
            step_low_s: 0.9 * 10.0 * ranks as f64 / samples_per_s,
            step_high_s: 1.1 * 10.0 * ranks as f64 / samples_per_s,
            samples_per_s,
            speedup: ranks as f64 * efficiency,
            efficiency,
            speedup_against: "measured 1-rank run".into(),
            measured_speedup: None,
            missing_reference: String::new(),
            efficiency_half_wire_bytes: None,
            efficiency_one_bucket: efficiency,
            measured_wait_s: None,
            own_work_s: 0.0,
            straggler_s: 0.0,
            comm_s: 0.0,
            comm_exposed_s: 0.0,
            comm_bound_s: 0.0,
            contention_factor: None,
            link_uncertainty_pct: 0.0,
            link_basis: "nominal".into(),
            interpolated: false,
            band_sources: String::new(),
            beyond_measured: String::new(),
            algorithm: "ring".into(),
            extrapolated: false,
            compute_extrapolated: false,
            measured_step_s: None,
            error_pct: None,
            measured_own_work_s: None,
            measured_comm_s: None,
            measured_comm_exposed_s: None,
            held_out: false,
            is_reference: false,
            fit_error_pct: 0.0,
            unreliable: false,
            fit_clamped: false,
            band_low_clamped: false,
        }
    }

    /// The largest shape's loss against the ideal step is split into own work and the
    /// exposed all-reduce; the sentence names own work only where it is most of it.
    #[test]
    fn a_loss_mostly_own_work_is_said_to_be_no_links() {
        let ask = Ask {
            epoch_samples: 360_000.0,
            target_efficiency: 0.8,
            price_per_gpu_hour: None,
            link: "roce-100g",
            nominal: true,
            epoch_time_target_s: None,
            gpu_hour_budget: None,
        };
        // 8 × 2 at efficiency 0.5: the step is 0.2 s against the ideal 0.1 s.
        let mut last = row(8, 2, 0.5);
        last.comm_exposed_s = 0.02;
        let rows = [row(1, 1, 1.0), row(1, 2, 0.9), last.clone()];
        let r = recommend(&rows.iter().collect::<Vec<_>>(), &ask).unwrap();
        let c = r.loss_cause.unwrap();
        assert_eq!((c.shape.nodes, c.shape.ranks_per_node), (8, 2));
        assert!((c.loss_s - 0.1).abs() < 1e-12 && (c.link_s - 0.02).abs() < 1e-12, "{c:?}");
        assert!((c.own_work_s - 0.08).abs() < 1e-12, "{c:?}");
        assert!(
            r.sentence
                .contains("At 8 × 2 the step loses 100 ms against the ideal: 80 % of it is own work"),
            "{}",
            r.sentence
        );
        assert!(
            r.sentence.contains("a faster link would not change this decision"),
            "{}",
            r.sentence
        );
        // The link's part the larger: split, but no own-work sentence.
        last.comm_exposed_s = 0.07;
        let rows = [row(1, 1, 1.0), row(1, 2, 0.9), last];
        let r = recommend(&rows.iter().collect::<Vec<_>>(), &ask).unwrap();
        assert!((r.loss_cause.unwrap().link_s - 0.07).abs() < 1e-12);
        assert!(!r.sentence.contains("faster link"), "{}", r.sentence);
        // No loss (efficiency 1): no split.
        let rows = [row(1, 1, 1.0), row(1, 2, 1.0)];
        assert_eq!(recommend(&rows.iter().collect::<Vec<_>>(), &ask).unwrap().loss_cause, None);
    }

    #[test]
    fn the_largest_shape_keeping_the_target_and_what_each_doubling_buys_beyond_it() {
        let rows = [row(1, 1, 1.0), row(1, 2, 0.95), row(2, 2, 0.85), row(4, 2, 0.7), row(8, 2, 0.45)];
        let refs: Vec<&ProjectionRow> = rows.iter().collect();
        let ask = Ask {
            epoch_samples: 360_000.0,
            target_efficiency: 0.8,
            price_per_gpu_hour: Some(2.0),
            link: "roce-100g",
            nominal: true,
            epoch_time_target_s: Some(1000.0),
            gpu_hour_budget: Some(1.1),
        };
        let r = recommend(&refs, &ask).unwrap();
        assert_eq!(
            r.keeps_target,
            Some(Shape {
                nodes: 2,
                ranks_per_node: 2
            })
        );
        // Epoch: 360,000 samples at 100·N·E samples/s; 1 rank: 3600 s, 1 GPU-hour.
        assert!((r.shapes[0].epoch_s - 3600.0).abs() < 1e-9 && (r.shapes[0].gpu_hours_per_epoch - 1.0).abs() < 1e-12);
        assert_eq!(r.shapes[0].cost_per_epoch, Some(2.0));
        // 4 → 8 ranks: the epoch goes from 900/0.85 to 450/0.7 s; GPU-hours (ranks × epoch)
        // from 1/0.85 to 1/0.7.
        let s = &r.shapes[3];
        assert!((s.epoch_saved_fraction.unwrap() - (1.0 - 0.85 / (2.0 * 0.7))).abs() < 1e-12);
        assert!((s.gpu_hours_ratio.unwrap() - 0.85 / 0.7).abs() < 1e-12);
        // One reference for every column: the epoch saved is 1 − speedup(before)/speedup(this).
        for w in r.shapes.windows(2) {
            let saved = 1.0 - w[0].speedup / w[1].speedup;
            assert!((w[1].epoch_saved_fraction.unwrap() - saved).abs() < 1e-12, "{w:?}");
        }
        // Epochs of 3600/(N·E) s and 1/E GPU-hours: within 1000 s the cheapest is 4 × 2
        // (643 s, 1.43 GPU-hours; its slow end 707 s too); within 1.1 GPU-hours the
        // fastest is 1 × 2 (1.05 GPU-hours, its costly end 1.16 beyond the budget).
        assert_eq!(
            r.cheapest_meeting_epoch_target,
            Some(Shape {
                nodes: 4,
                ranks_per_node: 2
            })
        );
        assert_eq!(
            r.fastest_within_budget,
            Some(Shape {
                nodes: 1,
                ranks_per_node: 2
            })
        );
        assert!(
            r.sentence.contains(
                "The cheapest shape whose expected epoch meets the target of 16.7 min is 4 × 2 (10.7 min (9.64–11.8 min) per epoch"
            ) && r.sentence.contains("the band's slow end meeting it too")
                && r.sentence
                    .contains("The fastest shape within the budget of 1.10 GPU-hours per epoch is 1 × 2")
                && r.sentence.contains("the band's costly end exceeds it"),
            "{}",
            r.sentence
        );
        // Each figure carries its band: the efficiency inversely to the step.
        let s2 = &r.shapes[2];
        assert!((s2.efficiency_low - 0.85 / 1.1).abs() < 1e-12 && (s2.efficiency_high - 0.85 / 0.9).abs() < 1e-12);
        assert!(r.sentence.contains("(85.0 % (77.3–94.4 %) efficiency"), "{}", r.sentence);
        // The shortest epoch is at the largest shape here, 8 × 2.
        assert_eq!(
            r.shortest_epoch,
            Shape {
                nodes: 8,
                ranks_per_node: 2
            }
        );
        assert!(
            r.sentence.contains("up to 2 × 2 (85.0 % (77.3–94.4 %) efficiency") && r.sentence.contains("each doubling saves at most"),
            "{}",
            r.sentence
        );
        assert!(r.sentence.contains("nominal") && !r.rough, "{}", r.sentence);
        // Extrapolated rows up to a shape named make the figures rough.
        let mut rows2 = rows.clone();
        rows2[4].extrapolated = true;
        let refs: Vec<&ProjectionRow> = rows2.iter().collect();
        let r = recommend(&refs, &Ask { nominal: false, ..ask }).unwrap();
        assert!(
            r.rough && r.sentence.contains("Rough") && r.sentence.contains("(85 % (77–94 %) efficiency"),
            "{}",
            r.sentence
        );
        // No shape beyond 1 rank keeps the target: said so.
        let low = [row(1, 1, 1.0), row(1, 2, 0.5)];
        let refs: Vec<&ProjectionRow> = low.iter().collect();
        let r = recommend(&refs, &ask).unwrap();
        assert!(
            r.keeps_target.is_none() && r.sentence.contains("at no shape beyond 1 rank"),
            "{}",
            r.sentence
        );
    }
}
