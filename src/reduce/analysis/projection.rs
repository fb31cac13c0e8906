//! `projection.csv`: a workload's step time at more ranks than were measured, from one
//! measured run (its ranks' own work per step, its buckets, its backward time) and the
//! link model `ddpbench allreduce` fitted ([`crate::link::model`]).
//! Weak scaling keeps the measured per-rank batch; strong scaling splits the reference's
//! global batch over N ranks, a rank's own work at each per-rank batch taken from the
//! runs of the same configuration on the reference's ranks ([`own_at`]).
//!
//! At N = nodes × ranks-per-node ranks the projected step is
//!
//!   step(N) = E[max of N draws of a rank's own work] + exposed all-reduce(N)
//!
//! - a rank's own work is `step_s − comm_exposed_s` of every measured rank-step; the
//!   expected maximum of N draws from that distribution is the straggler cost, which
//!   grows with N;
//! - each bucket's all-reduce takes the model's time (anchored to the sweep's measured
//!   time where the sweep measured that size); without overlap all of it is
//!   exposed; with overlap, bucket b becomes ready when backward has produced its share
//!   of the gradient bytes (the last at backward's end), starts when it is ready and the
//!   previous bucket is done, and what runs past backward's end is exposed.
//!
//! The band scales the all-reduce times by 1 ± the measured iterations' spread where
//! the sweep measured the size, else the fit's largest relative error (doubled beyond
//! 8 × the largest measured rank count: extrapolation). Assumed: homogeneous
//! nodes, the ring (or tree where faster) all-reduce of the model, no congestion from
//! other jobs, compute per rank independent of N.

use super::interval::COVERAGE;
use super::scaling::samples_per_s;
use super::{advice, RunStats, StepBreakdown};
use crate::link::model::{Algorithm, LinkModel, MAX_FIT_REL_ERROR};
use crate::link::LinkModelFile;
use crate::record::{Backend, ComparisonKey, Phase};
use crate::stats::Sketch;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the held-out check of the projection found (BENCHMARKS.md, "The forecast held out
/// on the namespace pair"): stated beside every projection, refreshed when it is rerun.
pub(crate) const FORECAST_CHECKED_ERROR: &str = "Checked error (BENCHMARKS.md, \"The forecast held out on the namespace pair\", \
2026-11-29): 2 nodes × 1 rank projected from one node (5 repeats each of a 1-rank and a 2-rank reference) on two network \
namespaces of one 2-core machine, links shaped to 1 and 4 Gbit/s, 10 passes each: the expected step's median absolute \
error was 5.0 % through a sweep of the link and 9.3 % through its specification alone (efficiency assumed), and the \
measured step lay inside the band in 18 of 20 and 19 of 20 passes (median half-width 12 % and 22 %; with 3 repeats \
about 1.5× as wide). One small workload (mnist-cnn, 4.8 MB of gradients) on emulated nodes: read it as the order of \
the error, not a promise for your cluster.";

/// Beyond this many times the largest measured rank count a projection is an extrapolation.
pub(crate) const EXTRAPOLATION_FACTOR: usize = 8;

/// One row of `projection.csv`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProjectionRow {
    /// model/dataset/batch per rank, and the run projected from.
    pub workload: String,
    /// Everything else that must match for runs to be one workload (as in scaling.csv).
    pub comparison: String,
    /// The reference point's runs (its repeats, space-separated) and how many: every
    /// term projected from is taken over all of them.
    pub from_runs: String,
    pub from_repeats: usize,
    /// The inter-node link given by specification this row was projected through
    /// (`--link`, one projection each); empty without one.
    pub link: String,
    /// `measured`: the 1-rank row of a workload with a measured 1-rank point is that
    /// point (step, band: its geometric mean and interval); `projected` otherwise.
    pub step_basis: String,
    /// weak (the measured per-rank batch at every N) or strong (the global batch fixed).
    pub scaling: String,
    pub batch_per_rank: f64,
    pub global_batch: f64,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub ranks: usize,
    pub step_s: f64,
    pub step_low_s: f64,
    pub step_high_s: f64,
    pub samples_per_s: f64,
    /// Against the measured 1-rank run of the workload where there is one, else the
    /// projection at 1 rank (`speedup_against` says which); 1 at 1 rank by definition.
    pub speedup: f64,
    pub efficiency: f64,
    pub speedup_against: String,
    /// Without a measured 1-rank run: the exact command of the run to add
    /// ([`super::advice::reference_command`]); empty with one.
    pub missing_reference: String,
    /// A measured run at this shape: its throughput against the measured 1-rank run;
    /// None without one (a measured speedup is never against a projection).
    pub measured_speedup: Option<f64>,
    /// What if: the efficiency against the same 1-rank step with half the gradient bytes
    /// on the wire (fp16/bf16 gradients; None where they already travel at 2 bytes), and
    /// with all gradients in one bucket (nothing overlaps).
    pub efficiency_half_wire_bytes: Option<f64>,
    pub efficiency_one_bucket: f64,
    /// The own work the slowest of N ranks does: the step's common part plus the
    /// straggler term.
    pub own_work_s: f64,
    /// E[max of N draws] of a rank's deviation from its step's common part: how long the
    /// mean rank waits for the slowest, the projected wait for a late rank.
    pub straggler_s: f64,
    /// The expected all-reduce of every bucket (nominal levels at their expected fraction
    /// of line rate, times the contention measured at the reference), and the same at
    /// the bound (line rate, or a measured level as its sweep timed it alone).
    pub comm_s: f64,
    pub comm_bound_s: f64,
    pub comm_exposed_s: f64,
    /// The all-reduce inside training over the runs' probe of it alone, at the reference
    /// point (None: not measured; 1 is then assumed).
    pub contention_factor: Option<f64>,
    /// The link term's relative uncertainty, percent: the efficiency's range, the
    /// contention's interval and the sweep's spread, in quadrature.
    pub link_uncertainty_pct: f64,
    /// How the link levels used stand: `measured` (a sweep), `probe` (the runs' own
    /// all-reduce probe, one size), `nominal` (a specification) — joined with `+`.
    pub link_basis: String,
    /// Every bucket's all-reduce started from the sweep's measurement at its size
    /// (interpolated inside the sizes it measured), not from the fitted line.
    pub interpolated: bool,
    /// What the band's width is made of, in words.
    pub band_sources: String,
    /// Where this row lies outside what was measured, in words (`;`-separated): ranks or
    /// nodes beyond the workload's measured ones, bucket sizes outside a sweep's. Empty
    /// inside. report.md gives such rows to 2 digits.
    pub beyond_measured: String,
    /// The all-reduce algorithm the inter-node (or, on one node, intra-node) level assumes.
    pub algorithm: String,
    pub extrapolated: bool,
    /// Strong scaling: the per-rank batch lies outside the batches measured on the
    /// reference's ranks, so its own work is the nearest one's scaled by the batch.
    pub compute_extrapolated: bool,
    /// A measured run at this shape (same workload): its mean step and the projection's error.
    pub measured_step_s: Option<f64>,
    pub error_pct: Option<f64>,
    /// The measured runs' counterparts of `own_work_s` (per step, the largest own work
    /// of any rank), `straggler_s` (the wait for the last rank to enter the all-reduce,
    /// mean over rank-steps), `comm_s` (the all-reduce after the last rank entered) and
    /// `comm_exposed_s` (the exposed all-reduce without that wait), means over steps; the
    /// all-reduce figures None at 1 rank, which communicates with nobody.
    pub measured_own_work_s: Option<f64>,
    pub measured_wait_s: Option<f64>,
    pub measured_comm_s: Option<f64>,
    pub measured_comm_exposed_s: Option<f64>,
    /// The measured point at the largest rank count of a workload measured at three or
    /// more, left out of the choice of the reference: its error is a held-out error.
    pub held_out: bool,
    /// This shape is the reference's own: its error checks nothing but the model's
    /// reading of the run itself.
    pub is_reference: bool,
    /// The interconnect fits' largest relative error at the sizes of this workload's
    /// buckets, percent.
    pub fit_error_pct: f64,
    /// That error exceeds [`MAX_FIT_REL_ERROR`]: the step, speedup and band here rest on a
    /// fit that does not follow the sweep at these sizes.
    pub unreliable: bool,
    /// A fit used has α or β clamped to 0 (a free fit wanted it negative).
    pub fit_clamped: bool,
    /// The band is 100 % or more: its low end is the own work alone (a free all-reduce).
    pub band_low_clamped: bool,
}

/// What a run's rows say about its workload, for projecting it.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    pub own_work: Sketch,
    /// Per step, the mean own work over ranks, averaged; and each rank's deviation from
    /// it (empty: the straggler term comes from `own_work` as independent draws).
    pub own_common_s: f64,
    pub own_deviation: Sketch,
    pub backward_s: f64,
    /// Wire bytes of each bucket, in launch order.
    pub bucket_bytes: Vec<u64>,
    /// When each bucket is ready, as a fraction of backward (recorded by the run; empty:
    /// in proportion to the bytes backward has produced).
    pub ready_fraction: Vec<f64>,
    pub overlap: bool,
    pub batch_per_rank: usize,
    /// Own work and backward scaled by this (strong scaling: another per-rank batch).
    pub own_scale: f64,
    /// Gradients travel at 4 bytes an element (fp32): halving them is a what-if.
    pub fp32_wire: bool,
    /// The repeats the own work stands on, and the relative half-width within which one
    /// more run's own work falls ([`repeat_prediction_half_width`]; None with one
    /// repeat: the band then holds no run-to-run spread).
    pub repeats: usize,
    pub own_half_width: Option<f64>,
}

/// One figure over the repeats of a point: the geometric mean of each run's figure, the
/// estimator scaling.csv's throughputs use (0 where a run's figure is 0; NaN without runs).
pub(crate) fn over_repeats(runs: &[&RunStats], f: impl Fn(&RunStats) -> f64) -> f64 {
    let v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
    if v.contains(&0.0) {
        return 0.0;
    }
    crate::stats::geometric_mean(&v)
}

/// The relative half-width within which one more run's figure falls: the [`COVERAGE`]
/// prediction interval from k repeats, `exp(t(df = k − 1) · s · √(1 + 1/k)) − 1`
/// with s the sample standard deviation of the log figures. A forecast is of a run at the shape asked, which
/// varies as one run does, not as the mean of k; None with fewer than 2 repeats.
pub(crate) fn repeat_prediction_half_width(runs: &[&RunStats], f: impl Fn(&RunStats) -> f64) -> Option<f64> {
    let values: Vec<f64> = runs.iter().map(|r| f(r)).collect();
    let k = values.len() as f64;
    // The mean's half-width on the log scale, widened from 1/√k to √(1 + 1/k).
    half_width_of(&values).map(|h| ((1.0 + h).ln() * (k + 1.0).sqrt()).exp() - 1.0)
}

/// The run-to-run relative half-width of the geometric mean of positive values: the
/// [`COVERAGE`] t-interval, `exp(t(df = k − 1) · s / √k) − 1`; None with fewer than 2,
/// or one not above 0.
fn half_width_of(values: &[f64]) -> Option<f64> {
    let logs: Vec<f64> = values.iter().filter(|v| **v > 0.0).map(|v| v.ln()).collect();
    if logs.len() < 2 || logs.len() < values.len() {
        return None;
    }
    let (_, variance) = crate::stats::mean_variance(&logs);
    let k = logs.len() as f64;
    let t = crate::stats::student_t_quantile(0.5 + COVERAGE / 2.0, k - 1.0);
    Some((t * (variance / k).sqrt()).exp() - 1.0)
}

impl Workload {
    /// The workload of a point's repeats (runs of one configuration and shape), every
    /// term over all of them: the common own work and backward as the geometric mean of
    /// the runs' means ([`over_repeats`]); the deviations and own work pooled over every
    /// rank-step of every repeat; the buckets (one configuration: the same) of the first.
    pub(crate) fn of_point(runs: &[&RunStats]) -> Workload {
        let mut w = Workload::of(runs[0]);
        let mut own_work = Sketch::new();
        let mut own_deviation = Sketch::new();
        for r in runs {
            own_work.merge(&r.local_work);
            own_deviation.merge(&r.own_deviation);
        }
        w.own_work = own_work;
        w.own_deviation = own_deviation;
        w.own_common_s = over_repeats(runs, |r| r.own_common.mean());
        w.backward_s = over_repeats(runs, |r| r.phase_mean(Phase::Backward));
        w.repeats = runs.len();
        w.own_half_width = repeat_prediction_half_width(runs, |r| r.own_common.mean());
        w
    }

    pub(crate) fn of(run: &RunStats) -> Workload {
        let m = &run.manifest;
        let bucket_bytes = if m.comm.bucket_bytes.is_empty() {
            // Older runs: the step's bytes split evenly over its buckets.
            let n = m.buckets.max(1) as u64;
            vec![run.bytes_per_step / n; n as usize]
        } else {
            m.comm.bucket_bytes.clone()
        };
        let ready_fraction = if m.comm.bucket_ready_fraction.len() == bucket_bytes.len() {
            m.comm.bucket_ready_fraction.clone()
        } else {
            Vec::new()
        };
        Workload {
            ready_fraction,
            own_work: run.local_work.clone(),
            own_common_s: run.own_common.mean(),
            own_deviation: run.own_deviation.clone(),
            backward_s: run.phase_mean(Phase::Backward),
            bucket_bytes,
            overlap: m.comm.overlap && !m.comm.overlap_shares_core,
            batch_per_rank: m.batch_size_per_rank,
            own_scale: 1.0,
            fp32_wire: matches!(m.comm.grad_dtype.as_str(), "" | "fp32"),
            repeats: 1,
            own_half_width: None,
        }
    }

    /// The same with half the bytes of every bucket on the wire (fp16/bf16 gradients);
    /// None where they already travel at 2 bytes.
    pub(crate) fn half_wire_bytes(&self) -> Option<Workload> {
        self.fp32_wire.then(|| Workload {
            bucket_bytes: self.bucket_bytes.iter().map(|b| b / 2).collect(),
            fp32_wire: false,
            ..self.clone()
        })
    }

    /// The same with every gradient in one bucket, ready only when backward ends.
    pub(crate) fn one_bucket(&self) -> Workload {
        Workload {
            bucket_bytes: vec![self.bucket_bytes.iter().sum()],
            ready_fraction: Vec::new(),
            overlap: false,
            ..self.clone()
        }
    }
}

/// E[max of n draws] from the distribution a sketch holds, by its quantile function:
/// the integral of Q(u) d(uⁿ) on a grid of 2,000 cells.
pub(crate) fn expected_max(s: &Sketch, n: usize) -> f64 {
    if s.count() == 0 {
        return f64::NAN;
    }
    if n <= 1 {
        return s.mean();
    }
    const CELLS: usize = 2000;
    let mut total = 0.0;
    let mut prev = 0.0f64;
    for k in 1..=CELLS {
        let u = k as f64 / CELLS as f64;
        let w = u.powi(n as i32);
        total += s.quantile((k as f64 - 0.5) / CELLS as f64) * (w - prev);
        prev = w;
    }
    total
}

/// Seconds of all-reduce past backward's end, given each bucket's all-reduce time and
/// when it is ready (`ready`: fractions of backward; empty: in proportion to the bytes
/// produced). The last bucket is ready at backward's end.
pub(crate) fn exposed_s(bucket_s: &[f64], bucket_bytes: &[u64], ready: &[f64], backward_s: f64, overlap: bool) -> f64 {
    let total: f64 = bucket_s.iter().sum();
    if !overlap || bucket_s.is_empty() {
        return total;
    }
    let all_bytes: f64 = bucket_bytes.iter().map(|&b| b as f64).sum::<f64>().max(1.0);
    let mut ready_bytes = 0.0;
    let mut end = 0.0f64;
    for (i, (&t, &b)) in bucket_s.iter().zip(bucket_bytes).enumerate() {
        ready_bytes += b as f64;
        let fraction = match ready.get(i) {
            _ if i + 1 == bucket_s.len() => 1.0,
            Some(&f) => f.clamp(0.0, 1.0),
            None => ready_bytes / all_bytes,
        };
        end = end.max(backward_s * fraction) + t;
    }
    (end - backward_s).max(0.0)
}

/// The link models of one projection: the bound (the model as given: a nominal level
/// at its line rate, a measured level as its sweep timed the all-reduce alone), and
/// each nominal level at the fraction of its line rate expected of an all-reduce and at
/// the low end of what it is known to reach ([`crate::link::model::Efficiency`]).
#[derive(Debug, Clone)]
pub(crate) struct Links {
    pub bound: LinkModel,
    pub expected: LinkModel,
    pub slow: LinkModel,
    /// Start from the sweep's measurements inside the sizes it measured (false: its line
    /// alone, as a spec with the same α and β).
    pub interpolate: bool,
}

impl Links {
    pub(crate) fn of(model: &LinkModel, interpolate: bool) -> Links {
        Links {
            bound: model.clone(),
            expected: model.at_efficiency(|e| e.expected),
            slow: model.at_efficiency(|e| e.low),
            interpolate,
        }
    }
}

/// How much longer the all-reduce of a step ran inside training than alone, at the
/// reference point: each repeat's transfer per step (after the last rank entered) over
/// its own probe of the same buckets before training (`allreduce_probe`, the median of
/// its iterations), over the repeats as every figure ([`over_repeats`]). Compute and
/// communication contend for the node's cores and memory in training; the probe runs
/// alone. What contention adds is the host's (or device's) work of the all-reduce
/// slowed, not the wire: it is carried to other shapes as the seconds it added per step
/// at the reference ([`Contention::extra_s`]), whatever the link, and assumed the same
/// at every shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Contention {
    /// 1 where not measured (a 1-rank reference, runs without a probe).
    pub factor: f64,
    /// Its run-to-run 95 % relative half-width (0 with one repeat or not measured).
    pub rel_half_width: f64,
    /// Repeats it stands on (0: not measured).
    pub repeats: usize,
    /// The probes' time alone over the repeats (0 where not measured).
    pub probe_s: f64,
}

impl Contention {
    pub(crate) const NONE: Contention = Contention {
        factor: 1.0,
        rel_half_width: 0.0,
        repeats: 0,
        probe_s: 0.0,
    };

    /// Seconds per step contention added to the all-reduce at the reference: (factor −
    /// 1) × the probe's time alone (negative where training ran it faster).
    pub(crate) fn extra_s(&self) -> f64 {
        (self.factor - 1.0) * self.probe_s
    }

    /// The run-to-run 95 % half-width of [`Contention::extra_s`], seconds.
    pub(crate) fn extra_uncertainty_s(&self) -> f64 {
        self.factor * self.rel_half_width * self.probe_s
    }

    pub(crate) fn of(runs: &[&RunStats]) -> Contention {
        let ratio = |r: &RunStats| -> Option<f64> {
            let probe = r.manifest.allreduce_probe.as_ref()?;
            (r.manifest.world_size > 1 && probe.median_s > 0.0 && r.transfer.count() > 0)
                .then(|| r.transfer.mean() / probe.median_s)
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let v: Vec<f64> = runs.iter().filter_map(|r| ratio(r)).collect();
        if v.len() < runs.len() || v.is_empty() {
            return Contention::NONE;
        }
        Contention {
            factor: crate::stats::geometric_mean(&v),
            rel_half_width: half_width_of(&v).unwrap_or(0.0),
            repeats: v.len(),
            probe_s: over_repeats(runs, |r| r.manifest.allreduce_probe.as_ref().map_or(0.0, |p| p.median_s)),
        }
    }
}

/// The projected step at `nodes` × `per_node` ranks and its terms.
struct Step {
    /// The band's centre (the expected step), and its ends.
    step_s: f64,
    low_s: f64,
    high_s: f64,
    own_s: f64,
    /// The expected all-reduce of every bucket, and at the bound (line rate, or the
    /// sweep's all-reduce alone).
    comm_s: f64,
    comm_bound_s: f64,
    exposed_s: f64,
    straggler_s: f64,
    algorithm: Algorithm,
    /// The link term's relative uncertainty (efficiency range, contention, sweep spread).
    link_rel_uncertainty: f64,
    /// The fits' largest relative error over the buckets' sizes; a clamped fit used; a
    /// link uncertainty of 100 % or more (the band's low end is then the bound).
    fit_rel_error: f64,
    clamped: bool,
    band_low_clamped: bool,
    /// Every bucket started from the sweep's measurements; a level used was nominal; one
    /// was set from the runs' probe.
    interpolated: bool,
    nominal: bool,
    probe: bool,
    measured: bool,
}

/// What a projection stands on besides the workload: the link models and the
/// contention measured at the reference point.
#[derive(Debug, Clone)]
pub(crate) struct Basis {
    pub links: Links,
    pub contention: Contention,
}

fn project(w: &Workload, basis: &Basis, nodes: usize, per_node: usize, widen: f64) -> anyhow::Result<Step> {
    let links = &basis.links;
    let n = nodes * per_node;
    // Noise that hits every rank in a step slows all of them: only the deviation from
    // the step's common part makes one rank the straggler.
    let (own_s, straggler_s) = if w.own_deviation.count() > 0 {
        let d = expected_max(&w.own_deviation, n);
        ((w.own_common_s + d) * w.own_scale, d * w.own_scale)
    } else {
        let o = expected_max(&w.own_work, n);
        (o * w.own_scale, (o - w.own_work.mean()) * w.own_scale)
    };
    let backward_s = w.backward_s * w.own_scale;
    let (mut bound, mut expected, mut spread) = (Vec::new(), Vec::new(), Vec::new());
    let band_of = |rel_band: f64| rel_band * widen;
    let mut band = 0.0f64;
    let mut algorithm = Algorithm::Ring;
    let (mut fit_rel_error, mut clamped) = (0.0f64, false);
    let (mut interpolated, mut nominal, mut probe, mut measured) = (true, false, false, false);
    for &b in &w.bucket_bytes {
        let p = links.bound.time_s_with(nodes, per_node, b as f64, links.interpolate)?;
        let e = links.expected.time_s_with(nodes, per_node, b as f64, links.interpolate)?.time_s;
        let slow = links.slow.time_s_with(nodes, per_node, b as f64, links.interpolate)?.time_s;
        bound.push(p.time_s);
        expected.push(e);
        // The efficiency's range and the sweep's spread, relative to the expected time.
        let range = if e > 0.0 { (slow / e - 1.0).max(0.0) } else { 0.0 };
        spread.push(range.hypot(band_of(p.rel_band)));
        band = band.max(band_of(p.rel_band));
        algorithm = p.algorithm;
        fit_rel_error = fit_rel_error.max(p.fit_rel_error);
        clamped |= p.clamped;
        interpolated &= p.interpolated;
        nominal |= p.nominal;
        probe |= p.probe;
        measured |= p.measured;
    }
    // Contention's seconds per step shared by the buckets as their bytes; independent
    // sources of each bucket's width (efficiency and spread; contention) in quadrature.
    let all_bytes = w.bucket_bytes.iter().sum::<u64>().max(1) as f64;
    // A single rank all-reduces with nobody: nothing to contend.
    let c = if n > 1 { basis.contention } else { Contention::NONE };
    let (mut centre_b, mut dev_b) = (Vec::new(), Vec::new());
    for (i, &b) in w.bucket_bytes.iter().enumerate() {
        let share = b as f64 / all_bytes;
        centre_b.push((expected[i] + c.extra_s() * share).max(bound[i]));
        dev_b.push((expected[i] * spread[i]).hypot(c.extra_uncertainty_s() * share));
    }
    let comm_s: f64 = centre_b.iter().sum();
    let h_link = if comm_s > 0.0 { dev_b.iter().sum::<f64>() / comm_s } else { 0.0 };
    let shifted = |sign: f64| {
        centre_b
            .iter()
            .zip(&dev_b)
            .map(|(t, d)| (t + sign * d).max(0.0))
            .collect::<Vec<_>>()
    };
    let scaled = |v: &[f64], f: f64| v.iter().map(|t| t * f).collect::<Vec<_>>();
    let exposed = |v: &[f64]| exposed_s(v, &w.bucket_bytes, &w.ready_fraction, backward_s, w.overlap);
    let centre = exposed(&centre_b);
    let link_high = exposed(&shifted(1.0)) - centre;
    let link_low = centre - exposed(&shifted(-1.0));
    // The own work's run-to-run interval, on the log scale as the repeats' geometric mean.
    let own_factor = 1.0 + w.own_half_width.unwrap_or(0.0);
    let (own_high, own_low) = (own_s * own_factor - own_s, own_s - own_s / own_factor);
    let step_s = own_s + centre;
    // The optimistic end never passes the bound: the own work's low end and the link at
    // line rate (or as the sweep timed it alone, less its spread).
    let bound_step = own_s - own_low + exposed(&scaled(&bound, (1.0 - band).max(0.0)));
    Ok(Step {
        step_s,
        low_s: (step_s - own_low.hypot(link_low)).max(bound_step),
        high_s: step_s + own_high.hypot(link_high),
        own_s,
        comm_s,
        comm_bound_s: bound.iter().sum(),
        exposed_s: centre,
        straggler_s,
        algorithm,
        link_rel_uncertainty: h_link,
        fit_rel_error,
        clamped,
        band_low_clamped: dev_b.iter().zip(&centre_b).any(|(d, t)| d >= t),
        interpolated: interpolated && !w.bucket_bytes.is_empty(),
        nominal,
        probe,
        measured,
    })
}

/// The projections of every workload among `runs` that the model covers, to `project_to`
/// ranks (or at the shapes of `ladder`, nodes × ranks per node, where it is not empty),
/// with every measured point of the workload compared with its projection. Second:
/// notes on workloads that could not be projected.
pub(crate) fn projections_on(
    runs: &[&RunStats],
    models: &LinkModelFile,
    project_to: usize,
    ladder: &[(usize, usize)],
) -> (Vec<ProjectionRow>, Vec<String>) {
    let mut groups: BTreeMap<(ComparisonKey, usize), Vec<&RunStats>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.manifest.comm_backend != Backend::None) {
        if let Some(key) = &r.key {
            groups.entry((key.clone(), r.manifest.batch_size_per_rank)).or_default().push(r);
        }
    }
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for ((key, batch), group) in groups {
        let label = format!("{}/{}/b{}", key.model, key.dataset, batch);
        // Measured at three or more rank counts: the largest is held out of the choice
        // of the reference, so its error checks the projection on a point it never saw.
        let held_out_ranks = held_out_ranks(&group);
        let candidates: Vec<&RunStats> = group
            .iter()
            .copied()
            .filter(|r| Some(r.manifest.world_size) != held_out_ranks)
            .collect();
        // The reference: one node, the most ranks on it (then the longest run).
        let Some(reference) = candidates
            .iter()
            .filter(|r| r.manifest.nodes == 1)
            .max_by_key(|r| (r.manifest.world_size, r.steps))
            .or_else(|| candidates.iter().min_by_key(|r| (r.manifest.nodes, std::cmp::Reverse(r.steps))))
        else {
            continue;
        };
        let bm = match models.for_manifest(&reference.manifest) {
            Ok(bm) => bm,
            Err(missing) => {
                notes.push(format!("{label}: {missing}"));
                continue;
            }
        };
        let model = &bm.model;
        // The reference point: every repeat at the reference's shape.
        let reference_runs: Vec<&RunStats> = candidates.iter().copied().filter(|r| shape_of(r) == shape_of(reference)).collect();
        let w = Workload::of_point(&reference_runs);
        let basis = Basis {
            links: Links::of(model, true),
            contention: Contention::of(&reference_runs),
        };
        let band_sources = band_sources(&w, &basis);
        if reference_runs.len() < 2 {
            notes.push(format!(
                "warning: {label}: projected from a single run at {} node(s) × {}: its band holds no run-to-run spread (add repeats of that point)",
                shape_of(reference).0,
                shape_of(reference).1
            ));
        }
        let measured_max = group.iter().map(|r| r.manifest.world_size).max().unwrap_or(1);
        let measured_nodes = group.iter().map(|r| r.manifest.nodes).max().unwrap_or(1);
        let shapes = shapes_of(&group, model.ranks_per_node.max(1), project_to, ladder);
        let single = match project(&w, &basis, 1, 1, 1.0) {
            Ok(s) => s.step_s,
            Err(_) => continue,
        };
        let one_rank: Vec<&RunStats> = group.iter().copied().filter(|r| r.manifest.world_size == 1).collect();
        let (single_samples_per_s, against) = match throughput(&one_rank) {
            Some(t) => (t, AGAINST_MEASURED),
            None => (w.batch_per_rank as f64 / single, AGAINST_PROJECTED),
        };
        let single_half_width = repeat_prediction_half_width(&one_rank, samples_per_s);
        let missing_reference = if against == AGAINST_MEASURED {
            String::new()
        } else {
            advice::reference_command(reference, &key, w.batch_per_rank).describe()
        };
        for &(nodes, p) in &shapes {
            let ranks = nodes * p;
            let extrapolated = ranks > EXTRAPOLATION_FACTOR * measured_max;
            let s = match project(&w, &basis, nodes, p, if extrapolated { 2.0 } else { 1.0 }) {
                Ok(s) => s,
                Err(e) => {
                    // The same reason leaves out every larger shape: say it once.
                    let why = format!("{label}: not projected from {nodes} node(s) × {p} on: {e:#}");
                    let reason = format!("{e:#}");
                    if !notes.iter().any(|n| n.starts_with(&format!("{label}: ")) && n.ends_with(&reason)) {
                        notes.push(why);
                    }
                    continue;
                }
            };
            let measured: Vec<&RunStats> = group.iter().copied().filter(|r| shape_of(r) == (nodes, p)).collect();
            let global = (ranks * w.batch_per_rank) as f64;
            let spec = RowSpec {
                label: label.clone(),
                key: &key,
                reference_runs: &reference_runs,
                scaling: "weak",
                global,
                single_samples_per_s,
                single_half_width,
                against,
                missing_reference: missing_reference.clone(),
                band_sources: band_sources.clone(),
                contention: basis.contention,
                held_out_ranks,
                extrapolated,
                compute_extrapolated: false,
                measured_ranks: measured_max,
                measured_nodes,
            };
            let what_if = what_if_steps(&w, &basis, nodes, p, if extrapolated { 2.0 } else { 1.0 });
            rows.push(spec.row(nodes, p, &s, what_if, &measured));
        }
        // Strong scaling of the reference's global batch over the same shapes.
        let same_key: Vec<&RunStats> = runs.iter().copied().filter(|r| r.key.as_ref() == Some(&key)).collect();
        rows.extend(strong_rows(
            &label,
            &key,
            &reference_runs,
            &same_key,
            &w,
            &basis,
            &band_sources,
            &shapes,
            measured_max,
        ));
    }
    (rows, notes)
}

/// How the levels a row used stand, joined with `+`: `measured`, `probe`, `nominal`.
fn link_basis(s: &Step) -> String {
    let mut out = Vec::new();
    if s.measured {
        out.push("measured");
    }
    if s.probe {
        out.push("probe");
    }
    if s.nominal {
        out.push("nominal");
    }
    out.join("+")
}

/// What a workload's band is made of, in words: the own work's run-to-run interval, each
/// nominal level's efficiency range, the contention and the sweep's spread.
fn band_sources(w: &Workload, basis: &Basis) -> String {
    let mut out = vec![match w.own_half_width {
        Some(h) => format!("own work ±{:.1} % (95 % for one run, from {} repeats)", h * 100.0, w.repeats),
        None => "own work from one run (no run-to-run spread)".to_string(),
    }];
    for f in [&basis.links.bound.intra, &basis.links.bound.inter].into_iter().flatten() {
        if let Some(e) = &f.efficiency {
            out.push(format!("{} at {}", f.level, crate::link::spec::efficiency_words(e)));
        }
        if let Some(p) = &f.probe {
            out.push(format!("{} from {p}", f.level));
        }
    }
    let c = basis.contention;
    out.push(if c.repeats > 0 {
        format!(
            "contention: the all-reduce {:.2}× as long in training as its probe alone at the reference, {:+.2} ms per step \
             (±{:.2} ms, {} repeat(s)), those seconds assumed at every shape",
            c.factor,
            c.extra_s() * 1e3,
            c.extra_uncertainty_s() * 1e3,
            c.repeats
        )
    } else {
        "contention not measured (no probe, or a 1-rank reference): assumed none".to_string()
    });
    if [&basis.links.bound.intra, &basis.links.bound.inter]
        .into_iter()
        .flatten()
        .any(|f| f.nominal.is_none() && f.probe.is_none())
    {
        out.push("the sweep's spread at each size (its fit's error outside them)".into());
    }
    out.join("; ")
}

/// The shapes to project a workload of `group` to: the ladder's, else powers of two up
/// to `project_to` ranks filling nodes of `per_node` ranks; and every measured shape.
fn shapes_of(group: &[&RunStats], per_node: usize, project_to: usize, ladder: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut shapes: Vec<(usize, usize)> = ladder.to_vec();
    let mut n = 1;
    while ladder.is_empty() && n <= project_to.max(1) {
        shapes.push(if n < per_node { (1, n) } else { (n / per_node, per_node) });
        n *= 2;
    }
    for r in group {
        shapes.push(shape_of(r));
    }
    shapes.sort_unstable_by_key(|&(m, p)| (m * p, m));
    shapes.dedup();
    shapes
}

/// The steps at `nodes` × `p` of the what-ifs: with half the wire bytes (None where the
/// gradients already travel at 2 bytes, or the model cannot project it) and with one
/// bucket (NaN where the model cannot project it).
fn what_if_steps(w: &Workload, basis: &Basis, nodes: usize, p: usize, widen: f64) -> (Option<f64>, f64) {
    let half = w
        .half_wire_bytes()
        .and_then(|h| project(&h, basis, nodes, p, widen).ok())
        .map(|s| s.step_s);
    let one = project(&w.one_bucket(), basis, nodes, p, widen).map_or(f64::NAN, |s| s.step_s);
    (half, one)
}

/// Mean over rank-steps of the wait for the last rank to enter the all-reduce.
fn mean_wait(r: &RunStats) -> f64 {
    let steps = r.ranks.iter().map(|x| x.steps).sum::<u64>().max(1) as f64;
    r.ranks.iter().map(|x| x.wait_sum).sum::<f64>() / steps
}

/// What speedup is against: a measured 1-rank run, or the projection at 1 rank.
pub(crate) const AGAINST_MEASURED: &str = "measured 1-rank run";
pub(crate) const AGAINST_PROJECTED: &str = "projection at 1 rank (no 1-rank run measured)";

/// The largest rank count of a workload measured at three or more rank counts.
fn held_out_ranks(group: &[&RunStats]) -> Option<usize> {
    let mut counts: Vec<usize> = group.iter().map(|r| r.manifest.world_size).collect();
    counts.sort_unstable();
    counts.dedup();
    (counts.len() >= 3).then(|| counts[counts.len() - 1])
}

/// The runs' mean steps over the repeats ([`over_repeats`]); None without runs.
fn mean_step(runs: &[&RunStats]) -> Option<f64> {
    mean_of(runs, |r| r.job_step.mean())
}

/// The runs' throughputs over the repeats, scaling.csv's figure; None without runs.
fn throughput(runs: &[&RunStats]) -> Option<f64> {
    mean_of(runs, samples_per_s)
}

/// A figure of each run over the repeats ([`over_repeats`]); None without runs.
fn mean_of(runs: &[&RunStats], f: impl Fn(&RunStats) -> f64) -> Option<f64> {
    (!runs.is_empty()).then(|| over_repeats(runs, f))
}

/// A run's shape: (nodes, ranks per node).
fn shape_of(r: &RunStats) -> (usize, usize) {
    (r.manifest.nodes, r.manifest.world_size / r.manifest.nodes.max(1))
}

/// What a projected shape's row shares with the other shapes of its workload and mode.
struct RowSpec<'a> {
    label: String,
    key: &'a ComparisonKey,
    /// The reference point's repeats.
    reference_runs: &'a [&'a RunStats],
    scaling: &'static str,
    /// Samples per step of all ranks.
    global: f64,
    /// The throughput at 1 rank speedup is against, and what it is; the measured one's
    /// run-to-run half-width (None: one run, or against the projection).
    single_samples_per_s: f64,
    single_half_width: Option<f64>,
    against: &'static str,
    /// Against the projection: the command of the 1-rank run to add.
    missing_reference: String,
    /// What the band's width is made of, and the contention measured.
    band_sources: String,
    contention: Contention,
    held_out_ranks: Option<usize>,
    extrapolated: bool,
    compute_extrapolated: bool,
    /// The most ranks and nodes any run of the workload was measured at.
    measured_ranks: usize,
    measured_nodes: usize,
}

impl RowSpec<'_> {
    /// [`ProjectionRow::beyond_measured`] at `nodes` × `ranks`.
    fn beyond_measured(&self, nodes: usize, ranks: usize, s: &Step) -> String {
        let mut out = Vec::new();
        if ranks > self.measured_ranks {
            out.push(format!("{ranks} ranks, beyond the {} measured", self.measured_ranks));
        }
        if nodes > self.measured_nodes {
            out.push(format!("{nodes} nodes, beyond the {} measured", self.measured_nodes));
        }
        if s.measured && !s.interpolated && ranks > 1 {
            out.push("bucket sizes outside the sweep's".to_string());
        }
        out.join("; ")
    }

    /// The row of `nodes` × `p` ranks projected as `s` (its what-if steps `what_if`, as
    /// [`what_if_steps`] gives them), with the `measured` runs of that shape.
    fn row(&self, nodes: usize, p: usize, s: &Step, what_if: (Option<f64>, f64), measured: &[&RunStats]) -> ProjectionRow {
        let ranks = nodes * p;
        let against_measured = self.against == AGAINST_MEASURED;
        let measured_step_s = mean_step(measured);
        // One rank with a measured 1-rank point: the row is that point, by construction
        // (every other row's speedup is against it), its band the point's interval.
        let one_rank_measured = ranks == 1 && against_measured;
        let (step_s, step_low_s, step_high_s) = if one_rank_measured {
            let step = self.global / self.single_samples_per_s;
            let h = 1.0 + self.single_half_width.unwrap_or(0.0);
            (step, step / h, step * h)
        } else {
            (s.step_s, s.low_s, s.high_s)
        };
        let samples_per_s = self.global / step_s;
        // One rank against one rank: speedup and efficiency are 1 by definition; how far
        // the step projected there lies from the measured one is the error column's.
        let speedup = if ranks == 1 {
            1.0
        } else {
            samples_per_s / self.single_samples_per_s
        };
        let efficiency_at = |step_s: f64| self.global / step_s / self.single_samples_per_s / ranks as f64;
        let reference = self.reference_runs[0];
        let is_reference = (nodes, p) == shape_of(reference);
        let communicated = |v: Option<f64>| v.filter(|_| ranks > 1);
        ProjectionRow {
            workload: self.label.clone(),
            comparison: self.key.describe(),
            from_runs: self
                .reference_runs
                .iter()
                .map(|r| r.manifest.run_id.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            from_repeats: self.reference_runs.len(),
            link: String::new(),
            step_basis: if one_rank_measured { "measured" } else { "projected" }.into(),
            scaling: self.scaling.into(),
            batch_per_rank: self.global / ranks as f64,
            global_batch: self.global,
            nodes,
            ranks_per_node: p,
            ranks,
            step_s,
            step_low_s,
            step_high_s,
            samples_per_s,
            speedup,
            efficiency: speedup / ranks as f64,
            speedup_against: self.against.into(),
            missing_reference: self.missing_reference.clone(),
            measured_speedup: measured_step_s
                .filter(|_| against_measured)
                .map(|m| self.global / m / self.single_samples_per_s),
            // A single rank puts nothing on a wire: neither what-if changes its
            // efficiency, which is 1 by definition.
            efficiency_half_wire_bytes: what_if.0.map(|w| if ranks == 1 { 1.0 } else { efficiency_at(w) }),
            efficiency_one_bucket: if ranks == 1 { 1.0 } else { efficiency_at(what_if.1) },
            own_work_s: s.own_s,
            straggler_s: s.straggler_s,
            comm_s: s.comm_s,
            comm_bound_s: s.comm_bound_s,
            comm_exposed_s: s.exposed_s,
            contention_factor: (self.contention.repeats > 0).then_some(self.contention.factor),
            link_uncertainty_pct: s.link_rel_uncertainty * 100.0,
            link_basis: link_basis(s),
            interpolated: s.interpolated,
            band_sources: self.band_sources.clone(),
            beyond_measured: self.beyond_measured(nodes, ranks, s),
            algorithm: s.algorithm.name().into(),
            extrapolated: self.extrapolated,
            compute_extrapolated: self.compute_extrapolated,
            measured_step_s,
            error_pct: measured_step_s.filter(|_| !one_rank_measured).map(|m| (step_s - m) / m * 100.0),
            measured_own_work_s: mean_of(measured, |r| r.own_max.mean()),
            measured_wait_s: communicated(mean_of(measured, mean_wait)),
            measured_comm_s: communicated(mean_of(measured, |r| r.transfer.mean())),
            measured_comm_exposed_s: communicated(mean_of(measured, |r| StepBreakdown::of(r).transfer_s)),
            held_out: !is_reference && !measured.is_empty() && self.held_out_ranks == Some(ranks),
            is_reference,
            fit_error_pct: s.fit_rel_error * 100.0,
            unreliable: s.fit_rel_error > MAX_FIT_REL_ERROR,
            fit_clamped: s.clamped,
            band_low_clamped: s.band_low_clamped,
        }
    }
}

/// Mean own work per step at per-rank batch `b`, from (batch, own work) measured:
/// linear between the two measured batches around `b`; outside them, the nearest one's
/// scaled by the batch (true: extrapolated).
pub(crate) fn own_at(measured: &[(f64, f64)], b: f64) -> (f64, bool) {
    let mut pts = measured.to_vec();
    pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    pts.dedup_by(|x, y| x.0 == y.0);
    let (Some(&first), Some(&last)) = (pts.first(), pts.last()) else {
        return (f64::NAN, true);
    };
    if b < first.0 {
        return (first.1 * b / first.0, true);
    }
    if b > last.0 {
        return (last.1 * b / last.0, true);
    }
    let hi = pts.iter().position(|p| p.0 >= b).unwrap_or(pts.len() - 1);
    let (x1, y1) = pts[hi];
    if x1 == b || hi == 0 {
        return (y1, false);
    }
    let (x0, y0) = pts[hi - 1];
    (y0 + (y1 - y0) * (b - x0) / (x1 - x0), false)
}

/// The strong-scaling rows of one workload: the reference's global batch G split over
/// N ranks (per-rank batch G / N), the own work at that batch from the runs of the same
/// configuration on the reference's ranks, the all-reduce unchanged (the same gradients).
#[allow(clippy::too_many_arguments)]
fn strong_rows(
    label: &str,
    key: &ComparisonKey,
    reference_runs: &[&RunStats],
    same_key: &[&RunStats],
    w: &Workload,
    basis: &Basis,
    band_sources: &str,
    shapes: &[(usize, usize)],
    measured_max: usize,
) -> Vec<ProjectionRow> {
    let reference = reference_runs[0];
    let rm = &reference.manifest;
    let global = (rm.world_size * rm.batch_size_per_rank) as f64;
    // Own work per step at each per-rank batch measured on the reference's shape, over
    // the repeats at that batch.
    let mut by_batch: BTreeMap<usize, Vec<&RunStats>> = BTreeMap::new();
    for r in same_key
        .iter()
        .filter(|r| r.manifest.nodes == rm.nodes && r.manifest.world_size == rm.world_size && r.local_work.count() > 0)
    {
        by_batch.entry(r.manifest.batch_size_per_rank).or_default().push(r);
    }
    let measured: Vec<(f64, f64)> = by_batch
        .iter()
        .map(|(&b, runs)| (b as f64, over_repeats(runs, |r| r.local_work.mean())))
        .collect();
    let (own_ref, _) = own_at(&measured, rm.batch_size_per_rank as f64);
    let at = |ranks: usize| -> Option<(Workload, bool)> {
        let b = global / ranks as f64;
        if b < 1.0 || own_ref.is_nan() || own_ref <= 0.0 {
            return None;
        }
        let (own, extrapolated) = own_at(&measured, b);
        Some((
            Workload {
                own_scale: own / own_ref,
                ..w.clone()
            },
            extrapolated,
        ))
    };
    let Some((w1, _)) = at(1) else { return Vec::new() };
    let Ok(single) = project(&w1, basis, 1, 1, 1.0) else {
        return Vec::new();
    };
    let one_rank: Vec<&RunStats> = same_key
        .iter()
        .copied()
        .filter(|r| r.manifest.world_size == 1 && r.manifest.batch_size_per_rank as f64 == global)
        .collect();
    let (single_samples_per_s, against) = match throughput(&one_rank) {
        Some(t) => (t, AGAINST_MEASURED),
        None => (global / single.step_s, AGAINST_PROJECTED),
    };
    let single_half_width = repeat_prediction_half_width(&one_rank, samples_per_s);
    let accum = key.grad_accum.unwrap_or(1).max(1);
    let missing_reference = match against {
        AGAINST_MEASURED => String::new(),
        _ if rm.global_batch_size % accum == 0 => advice::reference_command(reference, key, rm.global_batch_size / accum).describe(),
        _ => format!(
            "none: --grad-accum {accum} does not divide the global batch {}",
            rm.global_batch_size
        ),
    };
    let mut rows = Vec::new();
    for &(nodes, p) in shapes {
        let ranks = nodes * p;
        let Some((wn, compute_extrapolated)) = at(ranks) else { continue };
        let extrapolated = ranks > EXTRAPOLATION_FACTOR * measured_max;
        let Ok(s) = project(&wn, basis, nodes, p, if extrapolated { 2.0 } else { 1.0 }) else {
            continue;
        };
        let measured: Vec<&RunStats> = same_key
            .iter()
            .copied()
            .filter(|r| shape_of(r) == (nodes, p) && (r.manifest.world_size * r.manifest.batch_size_per_rank) as f64 == global)
            .collect();
        let spec = RowSpec {
            label: format!("{label} strong G{global}"),
            key,
            reference_runs,
            scaling: "strong",
            global,
            single_samples_per_s,
            single_half_width,
            against,
            missing_reference: missing_reference.clone(),
            band_sources: band_sources.to_string(),
            contention: basis.contention,
            held_out_ranks: None,
            extrapolated,
            compute_extrapolated,
            measured_ranks: measured_max,
            measured_nodes: same_key.iter().map(|r| r.manifest.nodes).max().unwrap_or(1),
        };
        let what_if = what_if_steps(&wn, basis, nodes, p, if extrapolated { 2.0 } else { 1.0 });
        rows.push(spec.row(nodes, p, &s, what_if, &measured));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sketch(values: &[f64]) -> Sketch {
        let mut s = Sketch::new();
        for &v in values {
            s.push(v);
        }
        s
    }

    #[test]
    fn the_expected_maximum_grows_with_the_draws() {
        // Two equally likely values 1 and 3 (500 draws of each): the max of n draws is 1
        // only when all are 1.
        let draws: Vec<f64> = (0..1000).map(|i| if i % 2 == 0 { 1.0 } else { 3.0 }).collect();
        let s = sketch(&draws);
        for n in [1usize, 2, 4] {
            let want = 3.0 - 2.0 * 0.5f64.powi(n as i32);
            assert!(
                (expected_max(&s, n) - want).abs() < 1e-2,
                "n={n}: {} vs {want}",
                expected_max(&s, n)
            );
        }
        // A constant straggles nowhere.
        assert!((expected_max(&sketch(&[2.0; 10]), 1024) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn exposure_without_overlap_full_overlap_and_the_ring_dominating() {
        // No overlap: everything is exposed.
        assert_eq!(exposed_s(&[1.0, 2.0], &[10, 10], &[], 5.0, false), 3.0);
        // Full overlap: bucket 0 (ready at 2.5) ends at 3.5; the last starts at backward's
        // end (5) and takes 0.5: 0.5 exposed.
        assert!((exposed_s(&[1.0, 0.5], &[10, 10], &[], 5.0, true) - 0.5).abs() < 1e-12);
        // The all-reduce dominates: bucket 0 ready at 2.5 ends at 12.5, the last ends at
        // 22.5: 17.5 past backward.
        assert!((exposed_s(&[10.0, 10.0], &[10, 10], &[], 5.0, true) - 17.5).abs() < 1e-12);
        // Recorded readiness wins over the bytes: a big bucket ready at 10 % of backward
        // (0.5) ends at 4.5, before backward's end; the last one then takes 0.5 past it.
        assert!((exposed_s(&[4.0, 0.5], &[1000, 10], &[0.1, 0.9], 5.0, true) - 0.5).abs() < 1e-12);
        // In proportion to the bytes it would be ready at 1000/1010 of backward.
        assert!((exposed_s(&[4.0, 0.5], &[1000, 10], &[], 5.0, true) - (5.0 * 1000.0 / 1010.0 + 4.5 - 5.0)).abs() < 1e-9);
        // One bucket is ready only at backward's end: nothing hides.
        assert_eq!(exposed_s(&[2.0], &[10], &[], 5.0, true), 2.0);
    }

    #[test]
    fn own_work_between_and_beyond_the_measured_batches() {
        let m = [(32.0, 0.10), (64.0, 0.16), (128.0, 0.30)];
        assert_eq!(own_at(&m, 64.0), (0.16, false));
        // Half way between 32 and 64: linear.
        let (v, x) = own_at(&m, 48.0);
        assert!((v - 0.13).abs() < 1e-12 && !x);
        // Beyond: the nearest measured batch's, scaled by the batch, and said so.
        let (v, x) = own_at(&m, 16.0);
        assert!((v - 0.05).abs() < 1e-12 && x);
        let (v, x) = own_at(&m, 256.0);
        assert!((v - 0.60).abs() < 1e-12 && x);
        assert!(own_at(&[], 8.0).0.is_nan());
    }

    /// An inter-node level of α 10 µs and 1/β 1 GB/s, without residuals: its band is
    /// `max_abs_rel_error`.
    fn gigabyte_fit(max_abs_rel_error: f64) -> crate::link::model::LevelFit {
        crate::link::model::LevelFit {
            level: "inter-node".into(),
            backend: crate::record::Backend::Mpi,
            dtype: "float".into(),
            ranks: 2,
            alpha_s: 1e-5,
            beta_s_per_byte: 1e-9,
            bandwidth_bytes_per_s: 1e9,
            min_bytes: 8,
            max_bytes: 1 << 30,
            residuals: Vec::new(),
            max_abs_rel_error,
            rms_rel_error: max_abs_rel_error / 2.0,
            nominal: None,
            efficiency: None,
            probe: None,
        }
    }

    /// Two nodes of one rank over `inter`.
    fn two_nodes(inter: crate::link::model::LevelFit) -> LinkModel {
        LinkModel {
            formula: crate::link::model::FORMULA.into(),
            ranks_per_node: 1,
            nodes: 2,
            intra: None,
            inter: Some(inter),
            node_type: "t".into(),
        }
    }

    #[test]
    fn a_projection_by_hand() {
        let model = two_nodes(gigabyte_fit(0.1));
        let w = Workload {
            own_work: sketch(&[0.1; 8]),
            own_common_s: 0.1,
            own_deviation: Sketch::new(),
            backward_s: 0.05,
            bucket_bytes: vec![1_000_000],
            ready_fraction: Vec::new(),
            overlap: false,
            batch_per_rank: 32,
            own_scale: 1.0,
            fp32_wire: true,
            repeats: 1,
            own_half_width: None,
        };
        // 2 nodes: ring over 2 = 2·10 µs + 1 MB·1 ns = 1.02 ms, all exposed.
        let basis = Basis {
            links: Links::of(&model, true),
            contention: Contention::NONE,
        };
        let s = project(&w, &basis, 2, 1, 1.0).unwrap();
        assert!((s.comm_s - 1.02e-3).abs() < 1e-12 && (s.step_s - 0.10102).abs() < 1e-9);
        assert!((s.high_s - (0.1 + 1.02e-3 * 1.1)).abs() < 1e-9 && (s.low_s - (0.1 + 1.02e-3 * 0.9)).abs() < 1e-9);
        // The projection lies between own work alone and own work plus the whole all-reduce.
        assert!(s.step_s >= s.own_s && s.step_s <= s.own_s + s.comm_s + 1e-15);
        // No residuals: no error known, nothing clamped, a band under 100 %.
        assert!(s.fit_rel_error == 0.0 && !s.clamped && !s.band_low_clamped);
        // Half the wire bytes: 2·10 µs + 0.5 MB·1 ns = 0.52 ms; one bucket (there is one): the same step.
        let half = project(&w.half_wire_bytes().unwrap(), &basis, 2, 1, 1.0).unwrap();
        assert!((half.comm_s - 0.52e-3).abs() < 1e-12, "{}", half.comm_s);
        assert!((project(&w.one_bucket(), &basis, 2, 1, 1.0).unwrap().step_s - s.step_s).abs() < 1e-15);
        // Gradients already at 2 bytes are not halved again.
        assert!(Workload {
            fp32_wire: false,
            ..w.clone()
        }
        .half_wire_bytes()
        .is_none());
    }

    /// A workload of two buckets (1 MB ready at half of backward, 3 MB at its end), overlap on.
    fn two_buckets() -> Workload {
        Workload {
            own_work: sketch(&[0.1; 8]),
            own_common_s: 0.1,
            own_deviation: Sketch::new(),
            backward_s: 0.004,
            bucket_bytes: vec![1_000_000, 3_000_000],
            ready_fraction: vec![0.5, 1.0],
            overlap: true,
            batch_per_rank: 32,
            own_scale: 1.0,
            fp32_wire: true,
            repeats: 1,
            own_half_width: None,
        }
    }

    fn model_with(intra: crate::link::model::LevelFit, inter: crate::link::model::LevelFit) -> LinkModel {
        LinkModel {
            formula: crate::link::model::FORMULA.into(),
            ranks_per_node: 4,
            nodes: 2,
            intra: Some(intra),
            inter: Some(inter),
            node_type: "t".into(),
        }
    }

    #[test]
    fn a_spec_equal_to_the_sweeps_fit_projects_the_sweep_paths_rows_without_interpolation() {
        use crate::link::model::{fit, ring_s, EfficiencyBasis};
        use crate::link::spec::LinkSpec;
        use crate::record::Backend;
        // A sweep whose timings wander ±20 % around its line: inside its sizes the sweep
        // path starts from them, so it differs from the line where interpolation is on.
        let (alpha, beta) = (5e-6, 1.0 / 12.5e9);
        let pts: Vec<(u64, f64)> = (10..24)
            .map(|k| 1u64 << k)
            .enumerate()
            .map(|(i, b)| (b, ring_s(2, b as f64, alpha, beta) * if i % 2 == 0 { 1.2 } else { 0.8 }))
            .collect();
        let swept = fit("inter-node", Backend::Mpi, "float", 2, &pts).unwrap();
        let spec = |level: &str| {
            let text = format!("{}B/s,{}s,efficiency=1", 1.0 / swept.beta_s_per_byte, swept.alpha_s);
            let s = LinkSpec::parse(&text).unwrap();
            assert_eq!(s.efficiency.basis, EfficiencyBasis::Given);
            s.level_fit(level, Backend::Mpi, "float")
        };
        let mut intra_swept = swept.clone();
        intra_swept.level = "intra-node".into();
        let by_sweep = model_with(intra_swept, swept.clone());
        let by_spec = model_with(spec("intra-node"), spec("inter-node"));
        let w = two_buckets();
        let basis = |m: &LinkModel, interpolate: bool| Basis {
            links: Links::of(m, interpolate),
            contention: Contention {
                factor: 1.3,
                rel_half_width: 0.1,
                repeats: 3,
                probe_s: 0.002,
            },
        };
        for (nodes, per_node) in [(1, 2), (1, 4), (2, 1), (2, 4), (16, 4), (128, 8)] {
            let a = project(&w, &basis(&by_sweep, false), nodes, per_node, 1.0).unwrap();
            let b = project(&w, &basis(&by_spec, true), nodes, per_node, 1.0).unwrap();
            for (x, y, what) in [
                (a.step_s, b.step_s, "step"),
                (a.own_s, b.own_s, "own work"),
                (a.comm_s, b.comm_s, "all-reduce"),
                (a.comm_bound_s, b.comm_bound_s, "bound"),
                (a.exposed_s, b.exposed_s, "exposed"),
            ] {
                assert!((x / y - 1.0).abs() < 1e-9, "{nodes}x{per_node} {what}: {x} vs {y}");
            }
            assert_eq!(a.algorithm, b.algorithm);
            assert!(!a.interpolated && !b.interpolated && b.nominal && !a.nominal);
            // Interpolation on: the sweep path starts from its measurements, and says so.
            let c = project(&w, &basis(&by_sweep, true), nodes, per_node, 1.0).unwrap();
            assert!(
                c.interpolated && (c.comm_s / a.comm_s - 1.0).abs() > 0.01,
                "{nodes}x{per_node}: {c:?}",
                c = c.comm_s
            );
        }
    }

    #[test]
    fn the_forecast_sits_between_the_bound_and_the_slow_end_with_its_sources_named() {
        use crate::link::model::{Efficiency, EfficiencyBasis};
        // One 1 MB bucket over 2 nodes at a nominal 1 GB/s, 10 µs: the bound is
        // 2·10 µs + 1 MB·1 ns = 1.02 ms. Expected at 50 % of line rate: 20 µs + 2 ms; the
        // contention measured at the reference (1.5× a 2 ms probe, ±10 %) adds 1 ms
        // (±0.3 ms): 3.02 ms.
        let e = Efficiency {
            expected: 0.5,
            low: 0.4,
            high: 0.9,
            basis: EfficiencyBasis::Published,
        };
        let model = two_nodes(crate::link::model::LevelFit {
            nominal: Some("1GB/s,10us".into()),
            efficiency: Some(e),
            ..gigabyte_fit(0.0)
        });
        let w = Workload {
            bucket_bytes: vec![1_000_000],
            ready_fraction: Vec::new(),
            overlap: false,
            own_half_width: Some(0.05),
            repeats: 4,
            ..two_buckets()
        };
        let basis = Basis {
            links: Links::of(&model, true),
            contention: Contention {
                factor: 1.5,
                rel_half_width: 0.1,
                repeats: 4,
                probe_s: 0.002,
            },
        };
        let s = project(&w, &basis, 2, 1, 1.0).unwrap();
        assert!((s.comm_bound_s - 1.02e-3).abs() < 1e-12, "{}", s.comm_bound_s);
        assert!((s.comm_s - 3.02e-3).abs() < 1e-12, "{}", s.comm_s);
        assert!((s.step_s - (0.1 + s.comm_s)).abs() < 1e-12);
        // The link's width: at 40 % of line rate 20 µs + 2.5 ms, (2.52/2.02 − 1) of the
        // expected 2.02 ms, beside the contention's 0.3 ms, in quadrature.
        let dev = (2.02e-3 * (2.52f64 / 2.02 - 1.0)).hypot(3e-4);
        assert!(
            (s.link_rel_uncertainty - dev / 3.02e-3).abs() < 1e-9,
            "{} vs {}",
            s.link_rel_uncertainty,
            dev / 3.02e-3
        );
        let (own_hi, own_lo): (f64, f64) = (0.1 * 0.05, 0.1 - 0.1 / 1.05);
        assert!((s.high_s - (s.step_s + own_hi.hypot(dev))).abs() < 1e-12);
        assert!((s.low_s - (s.step_s - own_lo.hypot(dev))).abs() < 1e-12);
        // The optimistic end never passes the bound: own work's low end and line rate.
        assert!(s.low_s >= 0.1 / 1.05 + 1.02e-3 - 1e-15 && s.low_s < s.step_s && s.step_s < s.high_s);
        let words = band_sources(&w, &basis);
        for needle in [
            "own work ±5.0 % (95 % for one run, from 4 repeats)",
            "inter-node at 50 % (40–90 %) of line rate (published)",
            "1.50× as long in training",
            "+1.00 ms per step (±0.30 ms, 4 repeat(s))",
        ] {
            assert!(words.contains(needle), "{needle:?} not in {words}");
        }
        assert_eq!(link_basis(&s), "nominal");
        // No contention measured and a spec's own efficiency of 1: the bound itself.
        let plain = Basis {
            links: Links::of(&model.at_efficiency(|_| 1.0), true),
            contention: Contention::NONE,
        };
        let mut exact = model.clone();
        exact.inter.as_mut().unwrap().efficiency = None;
        let b = project(
            &w,
            &Basis {
                links: Links::of(&exact, true),
                ..plain
            },
            2,
            1,
            1.0,
        )
        .unwrap();
        assert!((b.comm_s - b.comm_bound_s).abs() < 1e-15 && (b.comm_s - 1.02e-3).abs() < 1e-12);
    }
}
