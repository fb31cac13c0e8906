//! The link model: Hockney's latency–bandwidth (α–β) model of an all-reduce,
//! fitted per level (within a node, across nodes) to a sweep's timings, and combined
//! into the hierarchical all-reduce of N = nodes × ranks-per-node ranks.
//!
//! Over n ranks, an all-reduce of S bytes takes
//!
//! - ring:  t = 2(n−1)·α + 2(n−1)/n · S·β
//! - tree (recursive halving/doubling, Rabenseifner): t = 2⌈log₂ n⌉·α + 2(n−1)/n · S·β
//!
//! (the two agree at n = 2, where the sweep measures). A projection takes the faster of
//! the two at each level and says which. The hierarchical all-reduce of N = m nodes × p
//! ranks is a reduce-scatter within each node, all-reduces across the m nodes, and an
//! all-gather within each node:
//!
//!   t(m, p, S) = t_intra(p, S) + t_inter(m, S)
//!
//! where t_intra is the intra-node level's all-reduce over p ranks (reduce-scatter plus
//! all-gather move what one all-reduce moves), and t_inter is the inter-node level's over
//! m nodes on the whole S: the p ranks of a node each all-reduce S/p at once through the
//! node's link, which the inter-node level measured with one rank per node.
//!
//! A level's time at a size the sweep measured starts from that measurement and is
//! scaled to n ranks by the model's ratio ([`LevelFit::time_s`]): an α–β line cannot
//! follow a cache cliff or a token bucket's burst, the measurement can; the model
//! carries it to rank counts that were not measured.

use crate::bounds::{self, shown, MAX_BYTES_PER_STEP, MAX_RANKS, MAX_RUN_S};
use crate::record::Backend;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The longest idle before an all-reduce: what `allreduce --idle-ms` takes and a fit
/// read back may hold.
pub(crate) const MAX_IDLE_S: f64 = 10.0;

/// The latency of one message step: at most 1 s (a link slower than that is down).
pub(crate) const MAX_ALPHA_S: f64 = 1.0;
/// Seconds per byte: at most 1 (a link of 1 byte/s).
pub(crate) const MAX_BETA_S_PER_BYTE: f64 = 1.0;
/// Err unless a link's latency (`alpha_s`) and time per byte (`beta_s_per_byte`, 1 /
/// its bandwidth) lie in the one physical range every link model is held to, from a
/// sweep's fit or from a specification: α from 0 to [`MAX_ALPHA_S`], β from 0 (a fit
/// may clamp it to 0) to [`MAX_BETA_S_PER_BYTE`], so that a projected time is finite.
pub(crate) fn physical(alpha_s: f64, beta_s_per_byte: f64) -> std::result::Result<(), String> {
    if !(0.0..=MAX_ALPHA_S).contains(&alpha_s) {
        return Err(format!(
            "alpha_s is {}: a latency (s) lies from 0 to {} (a link slower than that is down)",
            shown(alpha_s),
            shown(MAX_ALPHA_S)
        ));
    }
    if !(0.0..=MAX_BETA_S_PER_BYTE).contains(&beta_s_per_byte) {
        return Err(format!(
            "beta_s_per_byte is {}: a time per byte (s) lies from 0 to {} (a bandwidth of at least 1 byte/s)",
            shown(beta_s_per_byte),
            shown(MAX_BETA_S_PER_BYTE)
        ));
    }
    Ok(())
}

/// A relative error or spread: a ratio of measured times (from a nanosecond to 10^3 s),
/// so at most 10^12. Real sweeps on a busy node reach spreads of 10^3 (the 90th
/// percentile of tiny messages thousands of times their median): such a fit is noisy,
/// not damaged, and is kept.
pub(crate) const MAX_REL: f64 = 1e12;

/// A level's fit is off by more than this (relative, at the measured sizes nearest the
/// bytes a workload all-reduces): projections through it are marked unreliable.
pub(crate) const MAX_FIT_REL_ERROR: f64 = 0.25;

/// A fitted α–β model of one level.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LevelFit {
    /// "intra-node" or "inter-node".
    pub level: String,
    pub backend: Backend,
    pub dtype: String,
    /// Ranks the sweep ran on at this level.
    pub ranks: usize,
    /// Latency per message step, seconds.
    pub alpha_s: f64,
    /// Seconds per byte (1 / the link's bandwidth).
    pub beta_s_per_byte: f64,
    /// 1/β, bytes per second (JSON null when β is 0: no finite number says it).
    #[serde(deserialize_with = "infinite_if_null")]
    pub bandwidth_bytes_per_s: f64,
    /// The sizes the fit saw: it is valid between them.
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Per size: measured and modelled time, and the relative error (model − measured) / measured.
    pub residuals: Vec<Residual>,
    pub max_abs_rel_error: f64,
    pub rms_rel_error: f64,
    /// The link specification this level was made from (`--link`, `--link-intra`):
    /// nominal α and β, no sweep behind them, an optimistic bound. Absent for a fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal: Option<String>,
    /// A nominal level: the fraction of its line rate an all-reduce is expected to reach
    /// ([`Efficiency`]). Absent for a fit (a sweep measured what the library reaches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
    /// A level set from the runs' own all-reduce probe (one size), in words. Absent for
    /// a sweep's fit or a specification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
}

/// The fraction of a link's line rate an all-reduce reaches at large messages (the
/// library's bus bandwidth over the line rate): expected, and the range of what it is
/// known to reach, with where that comes from (a published measurement, the spec, or
/// assumed).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Efficiency {
    pub expected: f64,
    pub low: f64,
    pub high: f64,
    pub basis: EfficiencyBasis,
}

/// Where an [`Efficiency`] comes from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EfficiencyBasis {
    /// Stated in the spec (`efficiency=0.85`).
    Given,
    /// Published measurements of a collective library on that fabric (results/README.md
    /// cites them per preset).
    Published,
    /// No measurement read: an assumption, with a wide range.
    Assumed,
}

impl EfficiencyBasis {
    pub(crate) fn word(self) -> &'static str {
        match self {
            EfficiencyBasis::Given => "given",
            EfficiencyBasis::Published => "published",
            EfficiencyBasis::Assumed => "assumed",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Residual {
    pub bytes: u64,
    pub measured_s: f64,
    pub model_s: f64,
    pub rel_error: f64,
    /// Half the spread of the single iterations, (p90 − p10) / 2, relative to their median.
    #[serde(default)]
    pub rel_spread: f64,
    /// Seconds the link was left idle before each timed iteration (0: back to back, as
    /// in files from before the sweep could idle).
    #[serde(default)]
    pub idle_before_s: f64,
}

/// JSON has no infinity: serde_json writes it as null, which reads back as one.
fn infinite_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

impl LevelFit {
    /// A warning when the fit is off by more than [`MAX_FIT_REL_ERROR`] at some measured
    /// size: which, by how much, and what it means for projections.
    pub(crate) fn warning(&self) -> Option<String> {
        let worst = self
            .residuals
            .iter()
            .max_by(|a, b| a.rel_error.abs().total_cmp(&b.rel_error.abs()))?;
        (worst.rel_error.abs() > MAX_FIT_REL_ERROR).then(|| {
            format!(
                "warning: the {} fit is off by {:.1} % at {} B (beyond {:.0} %): it does not follow the sweep there, and \
                 `ddpbench reduce` marks projections through it unreliable at those sizes; sweep again with more --iters, \
                 or on a quieter machine",
                self.level,
                worst.rel_error.abs() * 100.0,
                worst.bytes,
                MAX_FIT_REL_ERROR * 100.0
            )
        })
    }

    /// Err names the first key whose value no link has (`key is value: why`): α and β
    /// finite and from 0 (a fit may clamp them to 0) to [`MAX_ALPHA_S`] and
    /// [`MAX_BETA_S_PER_BYTE`], 2 or more ranks, sizes within a step's bytes, measured
    /// times positive, errors and spreads finite and at most [`MAX_REL`].
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        let within = |key: &str, v: f64, max: f64, what: &str| {
            if (0.0..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("{key} is {}: {what} lies from 0 to {}", shown(v), shown(max)))
            }
        };
        physical(self.alpha_s, self.beta_s_per_byte)?;
        if !(2..=MAX_RANKS).contains(&self.ranks) {
            return Err(format!("ranks is {}: a fit is over 2 to {MAX_RANKS} ranks", self.ranks));
        }
        bounds::at_most("max_bytes", self.max_bytes, MAX_BYTES_PER_STEP, "bytes")?;
        if self.min_bytes > self.max_bytes {
            return Err(format!("min_bytes is {}: above max_bytes ({})", self.min_bytes, self.max_bytes));
        }
        if let Some(e) = &self.efficiency {
            let ok = |v: f64| v > 0.0 && v <= 1.0;
            if !(ok(e.low) && ok(e.expected) && ok(e.high) && e.low <= e.expected && e.expected <= e.high) {
                return Err(format!(
                    "efficiency is {} ({} … {}): a fraction of line rate lies above 0 and at most 1, low ≤ expected ≤ high",
                    shown(e.expected),
                    shown(e.low),
                    shown(e.high)
                ));
            }
        }
        within("max_abs_rel_error", self.max_abs_rel_error, MAX_REL, "a relative error")?;
        within("rms_rel_error", self.rms_rel_error, MAX_REL, "a relative error")?;
        for (i, r) in self.residuals.iter().enumerate() {
            let key = |k: &str| format!("residuals[{i}].{k}");
            bounds::at_most(&key("bytes"), r.bytes, MAX_BYTES_PER_STEP, "bytes")?;
            if !(r.measured_s > 0.0 && r.measured_s <= MAX_RUN_S) {
                return Err(format!(
                    "{} is {}: a measured time lies above 0 and at most {} s",
                    key("measured_s"),
                    shown(r.measured_s),
                    shown(MAX_RUN_S)
                ));
            }
            within(&key("rel_spread"), r.rel_spread, MAX_REL, "a relative spread")?;
            within(
                &key("idle_before_s"),
                r.idle_before_s,
                MAX_IDLE_S,
                "an idle before an all-reduce (s)",
            )?;
        }
        Ok(())
    }
}

/// `link_model.json`: the fits and how they were obtained.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkModel {
    /// The formulas, in words.
    pub formula: String,
    /// Ranks per node and nodes of the job the sweep ran in.
    pub ranks_per_node: usize,
    pub nodes: usize,
    pub intra: Option<LevelFit>,
    pub inter: Option<LevelFit>,
    /// Node type of the job's ranks (the model describes this kind of node).
    pub node_type: String,
}

pub const FORMULA: &str = "ring: t = 2(n-1)*alpha + 2(n-1)/n*S*beta; tree: t = 2*ceil(log2 n)*alpha + 2(n-1)/n*S*beta; \
N = nodes x ranks_per_node: t = t_intra(ranks_per_node, S) + t_inter(nodes, S); fitted by least squares on relative error";

/// Which all-reduce algorithm a time assumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Algorithm {
    Ring,
    Tree,
}

impl Algorithm {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
        }
    }
}

/// Ring all-reduce time of `bytes` over `n` ranks.
pub(crate) fn ring_s(n: usize, bytes: f64, alpha_s: f64, beta: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n_f = n as f64;
    2.0 * (n_f - 1.0) * alpha_s + 2.0 * (n_f - 1.0) / n_f * bytes * beta
}

/// Recursive halving/doubling all-reduce time of `bytes` over `n` ranks.
pub(crate) fn tree_s(n: usize, bytes: f64, alpha_s: f64, beta: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n_f = n as f64;
    let steps = (n as f64).log2().ceil();
    2.0 * steps * alpha_s + 2.0 * (n_f - 1.0) / n_f * bytes * beta
}

impl LevelFit {
    /// The model's time over `n` ranks with the faster algorithm, and which it is.
    pub(crate) fn model_s(&self, n: usize, bytes: f64) -> (f64, Algorithm) {
        let ring = ring_s(n, bytes, self.alpha_s, self.beta_s_per_byte);
        let tree = tree_s(n, bytes, self.alpha_s, self.beta_s_per_byte);
        if tree < ring {
            (tree, Algorithm::Tree)
        } else {
            (ring, Algorithm::Ring)
        }
    }

    /// The time over `n` ranks used for projections, its relative band and algorithm.
    /// Within the sizes the sweep measured, it starts from the measured time at `bytes`
    /// (log-log interpolation between the neighbouring sizes) and scales it by the
    /// model's ratio t(n) / t(ranks measured): exact where it was measured, the model's
    /// shape beyond; the band is the measured iterations' spread there. Outside them, the
    /// model alone, with its largest relative error as the band.
    /// With `interpolate` false, the model alone at every size.
    pub(crate) fn time_s(&self, n: usize, bytes: f64, interpolate: bool) -> (f64, f64, Algorithm) {
        let (model, alg) = self.model_s(n, bytes);
        match self.measured_at(bytes).filter(|_| interpolate) {
            Some((measured, spread)) => {
                let at_fit = ring_s(self.ranks, bytes, self.alpha_s, self.beta_s_per_byte);
                let scale = if at_fit > 0.0 { model / at_fit } else { 1.0 };
                (measured * scale, spread, alg)
            }
            None => (model, self.max_abs_rel_error, alg),
        }
    }

    /// The fit's largest |relative error| at the measured sizes around `bytes` (the two
    /// neighbours, or the nearest one outside the sizes measured); 0 without residuals.
    pub(crate) fn rel_error_at(&self, bytes: f64) -> f64 {
        let mut pts: Vec<&Residual> = self.residuals.iter().collect();
        pts.sort_by_key(|r| r.bytes);
        let hi = pts.partition_point(|r| (r.bytes as f64) < bytes);
        let near = [hi.checked_sub(1), (hi < pts.len()).then_some(hi)];
        near.into_iter()
            .flatten()
            .map(|i| pts[i].rel_error.abs())
            .filter(|e| e.is_finite())
            .fold(0.0, f64::max)
    }

    /// The parameters the fit clamped to 0 (a best fit would have made them negative).
    pub(crate) fn clamped(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.alpha_s == 0.0 {
            out.push("α");
        }
        if self.beta_s_per_byte == 0.0 {
            out.push("β");
        }
        out
    }

    /// The measured time and spread at `bytes`, interpolated; None outside the sizes measured.
    fn measured_at(&self, bytes: f64) -> Option<(f64, f64)> {
        let mut pts: Vec<&Residual> = self.residuals.iter().filter(|r| r.measured_s > 0.0 && r.bytes > 0).collect();
        pts.sort_by_key(|r| r.bytes);
        let first = pts.first()?;
        let last = pts.last()?;
        if bytes < first.bytes as f64 || bytes > last.bytes as f64 {
            return None;
        }
        let hi = pts.iter().position(|r| r.bytes as f64 >= bytes)?;
        let (b, a) = (pts[hi], pts[hi.saturating_sub(1)]);
        if b.bytes == a.bytes || b.bytes as f64 == bytes {
            return Some((b.measured_s, b.rel_spread));
        }
        let f = (bytes.ln() - (a.bytes as f64).ln()) / ((b.bytes as f64).ln() - (a.bytes as f64).ln());
        let t = (a.measured_s.ln() + f * (b.measured_s.ln() - a.measured_s.ln())).exp();
        Some((t, a.rel_spread.max(b.rel_spread)))
    }
}

/// Fits α and β of a ring all-reduce over `ranks` ranks to `points` (bytes, seconds),
/// minimising the sum of squared relative errors, so that small messages (where α
/// shows) count as much as large ones (where β does). Both are kept ≥ 0.
pub(crate) fn fit(level: &str, backend: Backend, dtype: &str, ranks: usize, points: &[(u64, f64)]) -> Result<LevelFit> {
    let mut sizes: Vec<u64> = points.iter().map(|p| p.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() < 4 {
        bail!(
            "the {level} fit needs timings at 4 or more message sizes, and has {}: widen --min-bytes/--max-bytes or lower --factor",
            sizes.len()
        );
    }
    if ranks < 2 {
        bail!("the {level} fit needs 2 or more ranks (an all-reduce over 1 rank moves nothing)");
    }
    if let Some(bad) = points.iter().find(|p| !(p.1.is_finite() && p.1 > 0.0)) {
        bail!("the {level} fit got a time of {} s at {} B: times must be positive", bad.1, bad.0);
    }
    // t = a + b·S with a = 2(n−1)α and b = 2(n−1)/n·β; weighted rows [1, S]/t against 1.
    // S is scaled to its largest value so the normal equations stay well conditioned.
    let scale = *sizes.last().expect("4 sizes") as f64;
    let (mut s11, mut s12, mut s22, mut r1, mut r2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(bytes, t) in points {
        let (x1, x2) = (1.0 / t, bytes as f64 / scale / t);
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        r1 += x1;
        r2 += x2;
    }
    let det = s11 * s22 - s12 * s12;
    let (mut a, mut b) = if det.abs() > 1e-300 {
        ((r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det)
    } else {
        (r1 / s11, 0.0)
    };
    if a < 0.0 {
        a = 0.0;
        b = r2 / s22;
    }
    if b < 0.0 {
        b = 0.0;
        a = r1 / s11;
    }
    let n = ranks as f64;
    let alpha_s = a / (2.0 * (n - 1.0));
    let beta = b / scale * n / (2.0 * (n - 1.0));
    let residuals: Vec<Residual> = points
        .iter()
        .map(|&(bytes, t)| {
            let model_s = ring_s(ranks, bytes as f64, alpha_s, beta);
            Residual {
                bytes,
                measured_s: t,
                model_s,
                rel_error: (model_s - t) / t,
                rel_spread: 0.0,
                idle_before_s: 0.0,
            }
        })
        .collect();
    let max_abs_rel_error = residuals.iter().map(|r| r.rel_error.abs()).fold(0.0, f64::max);
    let rms_rel_error = (residuals.iter().map(|r| r.rel_error * r.rel_error).sum::<f64>() / residuals.len() as f64).sqrt();
    Ok(LevelFit {
        level: level.into(),
        backend,
        dtype: dtype.into(),
        ranks,
        alpha_s,
        beta_s_per_byte: beta,
        bandwidth_bytes_per_s: if beta > 0.0 { 1.0 / beta } else { f64::INFINITY },
        min_bytes: sizes[0],
        max_bytes: *sizes.last().expect("4 sizes"),
        residuals,
        max_abs_rel_error,
        rms_rel_error,
        nominal: None,
        efficiency: None,
        probe: None,
    })
}

/// One all-reduce of `bytes` over `nodes` × `ranks_per_node` ranks, as the model has it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Projected {
    pub time_s: f64,
    /// The relative band of the levels used: the measured spread where the sweep measured
    /// the size, else the fit's largest relative error.
    pub rel_band: f64,
    /// The algorithm of the inter-node level (or of the intra-node level on one node).
    pub algorithm: Algorithm,
    /// The largest relative error of the levels' fits at this size ([`LevelFit::rel_error_at`]).
    pub fit_rel_error: f64,
    /// A level used has α or β clamped to 0.
    pub clamped: bool,
    /// Every level used started from the sweep's measurement at this size (interpolated
    /// between the sizes it measured), not from its line.
    pub interpolated: bool,
    /// A level used is nominal (a specification), set from the runs' probe, or measured
    /// by a sweep.
    pub nominal: bool,
    pub probe: bool,
    pub measured: bool,
}

impl LinkModel {
    /// The same model with each nominal level's bandwidth at the fraction of its line
    /// rate `pick` chooses from its [`Efficiency`] (levels without one, measured by a
    /// sweep, unchanged): the expected all-reduce, where the model as given is the bound.
    pub(crate) fn at_efficiency(&self, pick: impl Fn(&Efficiency) -> f64) -> LinkModel {
        let scale = |f: &Option<LevelFit>| {
            f.clone().map(|mut f| {
                if let Some(e) = f.efficiency {
                    let frac = pick(&e).clamp(f64::MIN_POSITIVE, 1.0);
                    f.beta_s_per_byte /= frac;
                    f.bandwidth_bytes_per_s *= frac;
                }
                f
            })
        };
        LinkModel {
            intra: scale(&self.intra),
            inter: scale(&self.inter),
            ..self.clone()
        }
    }

    /// Err names the first key (`intra.alpha_s`, `nodes`, ...) that no allocation or link
    /// has ([`LevelFit::check`]).
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        for (key, n) in [("ranks_per_node", self.ranks_per_node), ("nodes", self.nodes)] {
            if !(1..=MAX_RANKS).contains(&n) {
                return Err(format!("{key} is {n}: an allocation has 1 to {MAX_RANKS}"));
            }
        }
        if self.ranks_per_node.saturating_mul(self.nodes) > MAX_RANKS {
            return Err(format!(
                "nodes × ranks_per_node is {} × {}: more than {MAX_RANKS} ranks",
                self.nodes, self.ranks_per_node
            ));
        }
        for (key, fit) in [("intra", &self.intra), ("inter", &self.inter)] {
            if let Some(f) = fit {
                f.check().map_err(|e| format!("{key}.{e}"))?;
            }
        }
        Ok(())
    }

    /// The hierarchical all-reduce time; Err names the level the model lacks.
    pub(crate) fn time_s(&self, nodes: usize, ranks_per_node: usize, bytes: f64) -> Result<Projected> {
        self.time_s_with(nodes, ranks_per_node, bytes, true)
    }

    /// [`LinkModel::time_s`], with `interpolate` false: every level's line alone, never
    /// its measurements (how a spec with the same α and β projects).
    pub(crate) fn time_s_with(&self, nodes: usize, ranks_per_node: usize, bytes: f64, interpolate: bool) -> Result<Projected> {
        let levels = [
            (
                ranks_per_node,
                &self.intra,
                "intra-node fit: run `ddpbench allreduce` with 2 or more ranks per node, or give `reduce --link-intra`",
            ),
            (
                nodes,
                &self.inter,
                "inter-node fit: run `ddpbench allreduce` on 2 or more nodes, or give `reduce --link`",
            ),
        ];
        let mut time_s = 0.0;
        let mut rel_band: f64 = 0.0;
        let mut algorithm = Algorithm::Ring;
        let (mut fit_rel_error, mut clamped) = (0.0f64, false);
        let (mut interpolated, mut nominal, mut probe, mut measured) = (interpolate, false, false, false);
        for (n, fit, missing) in levels.into_iter().filter(|(n, _, _)| *n > 1) {
            let Some(fit) = fit else {
                bail!("the link model has no {missing}");
            };
            interpolated &= fit.measured_at(bytes).is_some();
            nominal |= fit.nominal.is_some();
            probe |= fit.probe.is_some();
            measured |= fit.nominal.is_none() && fit.probe.is_none();
            let (t, band, alg) = fit.time_s(n, bytes, interpolate);
            time_s += t;
            rel_band = rel_band.max(band);
            algorithm = alg;
            fit_rel_error = fit_rel_error.max(fit.rel_error_at(bytes));
            clamped |= !fit.clamped().is_empty();
        }
        Ok(Projected {
            time_s,
            rel_band,
            algorithm,
            fit_rel_error,
            clamped,
            interpolated,
            nominal,
            probe,
            measured,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timings of a ring all-reduce over `n` ranks from known α, β, each multiplied by
    /// (1 + noise·u) with u uniform in [−1, 1) from a seeded generator.
    fn synthetic(n: usize, alpha: f64, beta: f64, noise: f64, seed: u64) -> Vec<(u64, f64)> {
        let mut rng = crate::stats::Rng(seed);
        let mut out = Vec::new();
        let mut bytes = 8u64;
        while bytes <= 1 << 30 {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            out.push((bytes, ring_s(n, bytes as f64, alpha, beta) * (1.0 + noise * u)));
            bytes *= 2;
        }
        out
    }

    /// A sweep on a busy 2-core machine (tests/fixtures/schema4-967f27a) fitted a line
    /// 39.8 % off at 1 MiB: the sweep says so when it prints the fit; a fit within
    /// [`MAX_FIT_REL_ERROR`] gets no warning.
    #[test]
    fn a_fit_beyond_its_error_is_warned_when_the_sweep_writes_it() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema4-967f27a/sweep/link_model.json");
        let file = super::super::LinkModelFile::read(&path).unwrap();
        let bad = file.models[0].model.intra.clone().unwrap();
        let w = bad.warning().expect("a fit 39.8 % off is warned");
        assert!(w.contains("off by 39.8 % at 1048576 B (beyond 25 %)"), "{w}");
        assert!(w.contains("marks projections through it unreliable"), "{w}");
        let good = fit("intra-node", Backend::Mpi, "fp32", 2, &synthetic(2, 5e-6, 1e-10, 0.03, 1)).unwrap();
        assert_eq!(good.warning(), None, "{}", good.max_abs_rel_error);
    }

    #[test]
    fn the_fit_recovers_alpha_and_beta_from_noisy_timings() {
        for (n, alpha, bw, seed) in [(2, 5e-6, 10e9, 1), (4, 20e-6, 1.25e9, 2), (8, 1.5e-6, 100e9, 3)] {
            let pts = synthetic(n, alpha, 1.0 / bw, 0.03, seed);
            let f = fit("inter-node", Backend::Mpi, "fp32", n, &pts).unwrap();
            assert!((f.alpha_s / alpha - 1.0).abs() < 0.05, "n={n}: alpha {} vs {alpha}", f.alpha_s);
            assert!(
                (f.bandwidth_bytes_per_s / bw - 1.0).abs() < 0.05,
                "n={n}: bw {} vs {bw}",
                f.bandwidth_bytes_per_s
            );
            assert!(f.max_abs_rel_error < 0.07 && f.rms_rel_error > 0.0);
            assert_eq!((f.min_bytes, f.max_bytes), (8, 1 << 30));
        }
    }

    #[test]
    fn fit_errors_at_a_size_and_clamped_parameters_are_told() {
        let res = |bytes: u64, rel_error: f64| Residual {
            bytes,
            measured_s: 1e-3,
            model_s: 1e-3 * (1.0 + rel_error),
            rel_error,
            rel_spread: 0.0,
            idle_before_s: 0.0,
        };
        let f = LevelFit {
            alpha_s: 0.0,
            residuals: vec![res(1024, -0.995), res(1 << 20, 0.05), res(1 << 22, 0.10)],
            ..fit("inter-node", Backend::Mpi, "fp32", 2, &synthetic(2, 1e-5, 1e-9, 0.0, 1)).unwrap()
        };
        // Between 1 MiB and 4 MiB: the larger of the two neighbours; beyond: the nearest.
        assert!((f.rel_error_at(2e6) - 0.10).abs() < 1e-12);
        assert!((f.rel_error_at(1e9) - 0.10).abs() < 1e-12);
        assert!((f.rel_error_at(100.0) - 0.995).abs() < 1e-12);
        assert!(f.rel_error_at(2e6) < MAX_FIT_REL_ERROR && f.rel_error_at(2000.0) > MAX_FIT_REL_ERROR);
        assert_eq!(f.clamped(), vec!["α"]);
        let m = LinkModel {
            formula: FORMULA.into(),
            ranks_per_node: 1,
            nodes: 2,
            intra: None,
            inter: Some(f),
            node_type: "t".into(),
        };
        let p = m.time_s(2, 1, 2000.0).unwrap();
        assert!(p.clamped && (p.fit_rel_error - 0.995).abs() < 1e-12);
    }

    #[test]
    fn the_fit_is_exact_without_noise_and_refuses_too_few_sizes() {
        let pts = synthetic(2, 3e-6, 1e-9, 0.0, 9);
        let f = fit("intra-node", Backend::Mpi, "fp32", 2, &pts).unwrap();
        assert!((f.alpha_s / 3e-6 - 1.0).abs() < 1e-9 && (f.beta_s_per_byte / 1e-9 - 1.0).abs() < 1e-9);
        assert!(f.max_abs_rel_error < 1e-9);
        let e = fit("intra-node", Backend::Mpi, "fp32", 2, &pts[..3]).unwrap_err().to_string();
        assert!(e.contains("4 or more message sizes") && e.contains("has 3"), "{e}");
        // Repeats of one size are one size.
        let same = vec![(64u64, 1e-5); 6];
        assert!(fit("intra-node", Backend::Mpi, "fp32", 2, &same).is_err());
        assert!(fit("intra-node", Backend::Mpi, "fp32", 1, &pts)
            .unwrap_err()
            .to_string()
            .contains("2 or more ranks"));
    }

    #[test]
    fn a_fit_clamped_to_zero_reads_back_and_impossible_links_are_named() {
        // β clamped to 0: 1/β is infinite, which JSON writes as null.
        let mut f = fit("intra-node", Backend::Mpi, "fp32", 2, &synthetic(2, 3e-6, 1e-9, 0.0, 9)).unwrap();
        f.beta_s_per_byte = 0.0;
        f.bandwidth_bytes_per_s = f64::INFINITY;
        let back: LevelFit = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back.bandwidth_bytes_per_s, f64::INFINITY);
        assert_eq!(back.check(), Ok(()));
        let broken = |change: fn(&mut LevelFit), needle: &str| {
            let mut g = back.clone();
            change(&mut g);
            let e = g.check().unwrap_err();
            assert!(e.contains(needle), "{e}");
        };
        broken(|g| g.alpha_s = -1e-3, "alpha_s is -0.001");
        broken(|g| g.alpha_s = 2.0, "alpha_s is 2");
        broken(|g| g.beta_s_per_byte = 1e300, "beta_s_per_byte is 1e300");
        broken(|g| g.ranks = 1, "ranks is 1");
        broken(|g| g.residuals[0].measured_s = 0.0, "residuals[0].measured_s is 0");
        broken(|g| g.max_abs_rel_error = f64::NAN, "max_abs_rel_error is NaN");
        broken(|g| g.residuals[0].rel_spread = -1.0, "rel_spread is -1");
        broken(|g| g.residuals[0].idle_before_s = f64::NAN, "residuals[0].idle_before_s is NaN");
        broken(|g| g.residuals[0].idle_before_s = 11.0, "idle_before_s is 11");
        // A sweep on a busy node measures spreads in the thousands: noisy, not damaged.
        let mut noisy = back.clone();
        noisy.residuals[0].rel_spread = 1903.4;
        noisy.max_abs_rel_error = 12.0;
        assert_eq!(noisy.check(), Ok(()));
    }

    #[test]
    fn measured_sizes_anchor_the_projection_and_the_model_scales_it() {
        let pts = synthetic(2, 5e-6, 1e-9, 0.0, 4);
        let mut f = fit("inter-node", Backend::Mpi, "fp32", 2, &pts).unwrap();
        // The sweep measured 2× the model's time from 1 KiB to 4 KiB (a slow path).
        for r in f.residuals.iter_mut().filter(|r| (1024..=4096).contains(&r.bytes)) {
            r.measured_s *= 2.0;
            r.rel_spread = 0.05;
        }
        let model = |n: usize, b: f64| ring_s(n, b, f.alpha_s, f.beta_s_per_byte);
        // At a measured size and the measured ranks: the measurement, its spread as the band.
        let (t, band, _) = f.time_s(2, 1024.0, true);
        assert!((t / (2.0 * model(2, 1024.0)) - 1.0).abs() < 1e-9 && band == 0.05);
        // Between two measured sizes: log-log interpolation.
        let (t, _, _) = f.time_s(2, 1500.0, true);
        assert!((t / (2.0 * model(2, 1500.0)) - 1.0).abs() < 0.05, "{t}");
        // At 8 ranks the measurement scales with the model's ratio.
        let (t8, _, _) = f.time_s(8, 1024.0, true);
        assert!((t8 / (2.0 * f.model_s(8, 1024.0).0) - 1.0).abs() < 1e-9);
        // Beyond the sizes measured: the model alone, with the fit's error as the band.
        let (t, band, _) = f.time_s(2, 4e9, true);
        assert_eq!((t, band), (model(2, 4e9), f.max_abs_rel_error));
    }

    #[test]
    fn hand_worked_times_of_ring_tree_and_hierarchy() {
        // Ring over 4 ranks, 1 MB, α = 10 µs, β = 1 ns/B: 6·10 µs + 1.5·1 ms = 1.56 ms.
        assert!((ring_s(4, 1e6, 10e-6, 1e-9) - 1.56e-3).abs() < 1e-12);
        // Tree over 4 ranks: 2·2·10 µs + 1.5 ms = 1.54 ms.
        assert!((tree_s(4, 1e6, 10e-6, 1e-9) - 1.54e-3).abs() < 1e-12);
        assert_eq!(ring_s(1, 1e6, 1.0, 1.0), 0.0);
        let level = |name: &str, alpha_s: f64, beta: f64, err: f64| LevelFit {
            level: name.into(),
            backend: crate::record::Backend::Mpi,
            dtype: "fp32".into(),
            ranks: 2,
            alpha_s,
            beta_s_per_byte: beta,
            bandwidth_bytes_per_s: 1.0 / beta,
            min_bytes: 8,
            max_bytes: 1 << 30,
            residuals: Vec::new(),
            max_abs_rel_error: err,
            rms_rel_error: err,
            nominal: None,
            efficiency: None,
            probe: None,
        };
        let m = LinkModel {
            formula: FORMULA.into(),
            ranks_per_node: 4,
            nodes: 2,
            intra: Some(level("intra-node", 1e-6, 0.1e-9, 0.02)),
            inter: Some(level("inter-node", 10e-6, 1e-9, 0.05)),
            node_type: "x".into(),
        };
        // 2 nodes × 4: intra over 4 (tree 2·2·1 µs + 1.5·0.1 ms = 0.154 ms, faster than
        // ring's 0.156) + inter over 2 on the whole 1 MB (2·10 µs + 1 ms = 1.02 ms).
        let p = m.time_s(2, 4, 1e6).unwrap();
        assert!((p.time_s - (0.154e-3 + 1.02e-3)).abs() < 1e-12, "{}", p.time_s);
        assert_eq!(p.rel_band, 0.05);
        // 64 nodes, small message: the tree's 12 latency steps beat the ring's 126.
        let p = m.time_s(64, 1, 1e3).unwrap();
        assert_eq!(p.algorithm, Algorithm::Tree);
        assert!((p.time_s - (12.0 * 10e-6 + 2.0 * 63.0 / 64.0 * 1e3 * 1e-9)).abs() < 1e-12);
        // A level the model lacks is named.
        let one_node = LinkModel { inter: None, ..m };
        assert!(one_node.time_s(2, 4, 1e6).unwrap_err().to_string().contains("inter-node"));
        assert_eq!(one_node.time_s(1, 1, 1e6).unwrap().time_s, 0.0);
    }
}
