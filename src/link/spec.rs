//! Links by specification: a named preset or a bandwidth and a latency, for one level
//! of the link model. A spec becomes the same α–β [`LevelFit`] a sweep fits, with no
//! residuals and marked nominal, so every projection path serves both; with the same
//! α and β a spec projects what the sweep path projects where that path uses its line
//! (outside the sweep's sizes, or with interpolation off), not where it starts from
//! the sweep's measurements.
//!
//! A nominal link's line rate is an optimistic bound on the link term: an all-reduce
//! does not reach it (protocol overheads, the reduction itself, congestion). A spec
//! therefore carries the fraction of line rate an all-reduce is expected to reach on it
//! ([`Efficiency`]: the spec's `efficiency=F`, a preset's published or assumed figure,
//! else [`ASSUMED`]), which the projection's expected step uses; the line rate stays
//! the band's optimistic end.

use super::model::{physical, Efficiency, EfficiencyBasis, LevelFit, LinkModel, FORMULA, MAX_ALPHA_S};
use super::{LinkModelFile, RouteLinkModel};
use crate::bounds::{shown, MAX_BYTES_PER_STEP};
use crate::record::{Backend, Memory};

/// A named interconnect: its nominal per-direction bandwidth and a latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Preset {
    pub name: &'static str,
    /// What it is, in words (and what the preset assumes of it).
    pub describe: &'static str,
    /// Nominal bandwidth per direction, bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Latency of one message step, seconds.
    pub alpha_s: f64,
    /// The fraction of line rate an all-reduce reaches on it at large messages: expected,
    /// low, high, and whether published measurements stand behind it (nccl-tests and
    /// OSU results; docs/link-efficiency.md quotes them, results/README.md lists them) or
    /// it is assumed (none found, or only NCCL's built-in bandwidth constants).
    pub efficiency: Efficiency,
}

/// The fraction of line rate assumed where no measurement was read: a wide range.
pub(crate) const ASSUMED: Efficiency = Efficiency {
    expected: 0.7,
    low: 0.5,
    high: 0.9,
    basis: EfficiencyBasis::Assumed,
};

const GBIT: f64 = 1e9 / 8.0;
const GBYTE: f64 = 1e9;
const US: f64 = 1e-6;

/// The presets; their sources are listed in results/README.md.
pub(crate) const PRESETS: [Preset; 12] = [
    Preset {
        name: "eth-10g",
        describe: "10 Gigabit Ethernet, TCP",
        bandwidth_bytes_per_s: 10.0 * GBIT,
        alpha_s: 20.0 * US,
        efficiency: ASSUMED,
    },
    Preset {
        name: "eth-25g",
        describe: "25 Gigabit Ethernet, TCP",
        bandwidth_bytes_per_s: 25.0 * GBIT,
        alpha_s: 15.0 * US,
        efficiency: Efficiency {
            expected: 0.6,
            low: 0.45,
            high: 0.98,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "eth-100g",
        describe: "100 Gigabit Ethernet, TCP",
        bandwidth_bytes_per_s: 100.0 * GBIT,
        alpha_s: 10.0 * US,
        efficiency: Efficiency {
            expected: 0.4,
            low: 0.32,
            high: 0.48,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "roce-100g",
        describe: "RoCEv2 over 100 Gb/s Ethernet",
        bandwidth_bytes_per_s: 100.0 * GBIT,
        alpha_s: 5.0 * US,
        efficiency: Efficiency {
            expected: 0.8,
            low: 0.58,
            high: 0.96,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "ib-hdr",
        describe: "InfiniBand HDR, 200 Gb/s per port",
        bandwidth_bytes_per_s: 200.0 * GBIT,
        alpha_s: 1.0 * US,
        efficiency: Efficiency {
            expected: 0.93,
            low: 0.8,
            high: 0.975,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "ib-ndr",
        describe: "InfiniBand NDR, 400 Gb/s per port",
        bandwidth_bytes_per_s: 400.0 * GBIT,
        alpha_s: 1.0 * US,
        efficiency: Efficiency {
            expected: 0.95,
            low: 0.92,
            high: 0.98,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "pcie3-x16",
        describe: "PCIe 3.0 x16 (8 GT/s per lane, 128b/130b), GPU to GPU through the host bridge",
        bandwidth_bytes_per_s: 15.75 * GBYTE,
        alpha_s: 5.0 * US,
        efficiency: Efficiency {
            expected: 0.76,
            low: 0.25,
            high: 0.78,
            basis: EfficiencyBasis::Assumed,
        },
    },
    Preset {
        name: "pcie4-x16",
        describe: "PCIe 4.0 x16 (16 GT/s per lane)",
        bandwidth_bytes_per_s: 31.5 * GBYTE,
        alpha_s: 5.0 * US,
        efficiency: Efficiency {
            expected: 0.77,
            low: 0.76,
            high: 0.78,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "pcie5-x16",
        describe: "PCIe 5.0 x16 (32 GT/s per lane)",
        bandwidth_bytes_per_s: 63.0 * GBYTE,
        alpha_s: 5.0 * US,
        efficiency: Efficiency {
            expected: 0.6,
            low: 0.44,
            high: 0.71,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "nvlink-v100",
        describe: "NVLink 2 of a V100 SXM2 node: 6 links x 25 GB/s per GPU, all taken as one uniform level \
                   (the hybrid cube-mesh is not: some GPU pairs share fewer links)",
        bandwidth_bytes_per_s: 150.0 * GBYTE,
        alpha_s: 3.0 * US,
        efficiency: Efficiency {
            expected: 0.8,
            low: 0.6,
            high: 0.85,
            basis: EfficiencyBasis::Assumed,
        },
    },
    Preset {
        name: "nvlink-a100",
        describe: "NVLink 3 of an A100 SXM4 node through NVSwitch: 12 links x 25 GB/s per GPU",
        bandwidth_bytes_per_s: 300.0 * GBYTE,
        alpha_s: 3.0 * US,
        efficiency: Efficiency {
            expected: 0.77,
            low: 0.67,
            high: 0.83,
            basis: EfficiencyBasis::Published,
        },
    },
    Preset {
        name: "nvlink-h100",
        describe: "NVLink 4 of an H100 SXM5 node through NVSwitch: 18 links x 25 GB/s per GPU",
        bandwidth_bytes_per_s: 450.0 * GBYTE,
        alpha_s: 3.0 * US,
        efficiency: Efficiency {
            expected: 0.82,
            low: 0.81,
            high: 0.82,
            basis: EfficiencyBasis::Published,
        },
    },
];

/// A link given by specification (`--link`, `--link-intra`).
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    /// The preset's name, or the text given (`100Gbit/s,5us`).
    pub name: String,
    pub bandwidth_bytes_per_s: f64,
    pub alpha_s: f64,
    /// The fraction of line rate expected of an all-reduce on it: the preset's, the
    /// spec's `efficiency=F`, else [`ASSUMED`].
    pub efficiency: Efficiency,
}

/// The forms a spec takes, for messages and `--help`.
pub(crate) const ACCEPTED_FORMS: &str = "a preset name, or BANDWIDTH,LATENCY with BANDWIDTH a positive number and one of \
bit/s kbit/s Mbit/s Gbit/s Tbit/s (also Gb/s) or B/s kB/s MB/s GB/s TB/s (decimal prefixes), and LATENCY a number from 0 \
to 1 s and one of ns us µs ms s (e.g. 100Gbit/s,5us or 25GB/s,2us); either may end in ,efficiency=F: the fraction of line \
rate an all-reduce reaches on it, above 0 and at most 1 (e.g. 100Gbit/s,5us,efficiency=0.85 or roce-100g,efficiency=0.8)";

pub(crate) fn preset_names() -> String {
    PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

/// `text` split into its number and its unit (`100Gbit/s` → 100, "Gbit/s"); an
/// exponent is part of the number only where digits follow its `e`.
fn number_and_unit(text: &str) -> Option<(f64, &str)> {
    let t = text.trim();
    let b = t.as_bytes();
    let digits_at = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let mut end = usize::from(matches!(b.first(), Some(b'-' | b'+')));
    while end < b.len() && (b[end].is_ascii_digit() || b[end] == b'.') {
        end += 1;
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(b.get(end + 1), Some(b'-' | b'+')));
        if digits_at(end + 1 + sign) {
            end += 1 + sign;
            while digits_at(end) {
                end += 1;
            }
        }
    }
    let (num, unit) = t.split_at(end);
    Some((num.parse::<f64>().ok()?, unit.trim()))
}

fn bytes_per_s(text: &str) -> Result<f64, String> {
    let (v, unit) = number_and_unit(text).ok_or_else(|| format!("'{text}' is not a bandwidth"))?;
    let per = match unit {
        "bit/s" | "b/s" => 1.0 / 8.0,
        "kbit/s" | "Kbit/s" | "kb/s" | "Kb/s" => 1e3 / 8.0,
        "Mbit/s" | "Mb/s" => 1e6 / 8.0,
        "Gbit/s" | "Gb/s" => 1e9 / 8.0,
        "Tbit/s" | "Tb/s" => 1e12 / 8.0,
        "B/s" => 1.0,
        "kB/s" | "KB/s" => 1e3,
        "MB/s" => 1e6,
        "GB/s" => 1e9,
        "TB/s" => 1e12,
        _ => return Err(format!("'{text}' has no bandwidth unit")),
    };
    let b = v * per;
    if !(b.is_finite() && b > 0.0) {
        return Err(format!("'{text}': a bandwidth is above 0"));
    }
    Ok(b)
}

fn seconds(text: &str) -> Result<f64, String> {
    let (v, unit) = number_and_unit(text).ok_or_else(|| format!("'{text}' is not a latency"))?;
    let per = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("'{text}' has no latency unit")),
    };
    let s = v * per;
    if !(s.is_finite() && (0.0..=MAX_ALPHA_S).contains(&s)) {
        return Err(format!("'{text}': a latency lies from 0 to 1 s (a link slower than that is down)"));
    }
    Ok(s)
}

impl LinkSpec {
    /// A preset by name or `BANDWIDTH,LATENCY`; Err says what was wrong, the accepted
    /// forms and the presets.
    pub(crate) fn parse(text: &str) -> Result<LinkSpec, String> {
        let full = text.trim();
        let (t, given) = match split_efficiency(full) {
            Ok(v) => v,
            Err(why) => return Err(format!("{why}: a link is {ACCEPTED_FORMS}; presets: {}", preset_names())),
        };
        let parsed = if let Some(p) = PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(t)) {
            Ok(LinkSpec {
                name: p.name.into(),
                bandwidth_bytes_per_s: p.bandwidth_bytes_per_s,
                alpha_s: p.alpha_s,
                efficiency: p.efficiency,
            })
        } else if let Some((bw, lat)) = t.split_once(',') {
            bytes_per_s(bw).and_then(|b| {
                let alpha_s = seconds(lat)?;
                // The range a link_model.json's fit is held to: one check for both.
                physical(alpha_s, 1.0 / b).map_err(|e| format!("'{t}' is {} B/s and {} s: {e}", shown(b), shown(alpha_s)))?;
                Ok(LinkSpec {
                    name: t.into(),
                    bandwidth_bytes_per_s: b,
                    alpha_s,
                    efficiency: ASSUMED,
                })
            })
        } else if t.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            Err(format!("'{t}' has no latency"))
        } else {
            Err(format!("'{t}' is no preset"))
        };
        parsed
            .map(|mut spec| {
                if let Some(e) = given {
                    spec.efficiency = e;
                    spec.name = full.into();
                }
                spec
            })
            .map_err(|why| format!("{why}: a link is {ACCEPTED_FORMS}; presets: {}", preset_names()))
    }

    /// The spec in words: `roce-100g (12.5 GB/s, 5 µs)`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} ({:.3} GB/s per direction, {:.2} µs)",
            self.name,
            self.bandwidth_bytes_per_s / 1e9,
            self.alpha_s * 1e6
        )
    }

    /// The α–β model of one level with this spec's α and β: no residuals, no error, the
    /// sizes of any step, marked nominal.
    pub(crate) fn level_fit(&self, level: &str, backend: Backend, dtype: &str) -> LevelFit {
        LevelFit {
            level: level.into(),
            backend,
            dtype: dtype.into(),
            ranks: 2,
            alpha_s: self.alpha_s,
            beta_s_per_byte: 1.0 / self.bandwidth_bytes_per_s,
            bandwidth_bytes_per_s: self.bandwidth_bytes_per_s,
            min_bytes: 1,
            max_bytes: MAX_BYTES_PER_STEP,
            residuals: Vec::new(),
            max_abs_rel_error: 0.0,
            rms_rel_error: 0.0,
            nominal: Some(self.describe()),
            efficiency: Some(self.efficiency),
            probe: None,
        }
    }
}

/// The latency assumed for an intra-node level set from the runs' probe (one size
/// cannot separate α from β); at the megabyte buckets of training it is a small part.
pub(crate) const PROBE_ALPHA_S: f64 = 2.0 * US;

/// An intra-node level from the runs' own all-reduce probes (`allreduce_probe`: the
/// median time of all buckets at once over the run's ranks, before training), as
/// `(ranks, bytes, median seconds)` of runs on one node at one rank count: α assumed
/// ([`PROBE_ALPHA_S`]), β the median over the probes of what each implies at that α
/// (the ring's time solved for β), the probes' largest relative distance from it as
/// the fit's error. None without a probe that leaves time for the bytes.
pub(crate) fn probe_level(probes: &[(usize, u64, f64)], backend: Backend, dtype: &str) -> Option<LevelFit> {
    let betas: Vec<f64> = probes
        .iter()
        .filter(|&&(n, bytes, t)| n >= 2 && bytes > 0 && t.is_finite() && t > 0.0)
        .map(|&(n, bytes, t)| {
            let nf = n as f64;
            (t - 2.0 * (nf - 1.0) * PROBE_ALPHA_S) / (2.0 * (nf - 1.0) / nf * bytes as f64)
        })
        .filter(|b| b.is_finite() && *b > 0.0)
        .collect();
    if betas.is_empty() {
        return None;
    }
    let beta = crate::stats::median(&betas);
    let error = betas.iter().map(|b| (b / beta - 1.0).abs()).fold(0.0, f64::max);
    let (n, bytes, t) = probes[0];
    physical(PROBE_ALPHA_S, beta).ok()?;
    Some(LevelFit {
        level: "intra-node".into(),
        backend,
        dtype: dtype.into(),
        ranks: n,
        alpha_s: PROBE_ALPHA_S,
        beta_s_per_byte: beta,
        bandwidth_bytes_per_s: 1.0 / beta,
        min_bytes: 1,
        max_bytes: MAX_BYTES_PER_STEP,
        residuals: Vec::new(),
        max_abs_rel_error: error.min(crate::link::model::MAX_REL),
        rms_rel_error: error.min(crate::link::model::MAX_REL),
        nominal: None,
        efficiency: None,
        probe: Some(format!(
            "the runs' own all-reduce probe ({} of {} run(s) on one node, e.g. {} B over {n} ranks in {:.3} ms): its bandwidth, \
             the latency assumed {:.0} µs",
            betas.len(),
            probes.len(),
            bytes,
            t * 1e3,
            PROBE_ALPHA_S * 1e6
        )),
    })
}

/// An efficiency in words: `85 % of line rate (given)`, `70 % (50–90 %) of line rate
/// (assumed)`.
pub(crate) fn efficiency_words(e: &Efficiency) -> String {
    let pct = |v: f64| format!("{:.0}", v * 100.0);
    if e.low == e.high {
        format!("{} % of line rate ({})", pct(e.expected), e.basis.word())
    } else {
        format!(
            "{} % ({}–{} %) of line rate ({})",
            pct(e.expected),
            pct(e.low),
            pct(e.high),
            e.basis.word()
        )
    }
}

/// `text` without a trailing `,efficiency=F`, and that efficiency (given: low = high =
/// F); Err where F is not a number above 0 and at most 1.
fn split_efficiency(text: &str) -> Result<(&str, Option<Efficiency>), String> {
    let Some((head, tail)) = text.rsplit_once(',') else {
        return Ok((text, None));
    };
    let Some(v) = tail.trim().strip_prefix("efficiency=") else {
        return Ok((text, None));
    };
    match v.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok((
            head.trim(),
            Some(Efficiency {
                expected: f,
                low: f,
                high: f,
                basis: EfficiencyBasis::Given,
            }),
        )),
        _ => Err(format!(
            "'{text}': efficiency={} is no fraction of line rate (it lies above 0 and at most 1)",
            v.trim()
        )),
    }
}

/// The link models a projection uses: the sweep's (`measured`), with the inter-node
/// level replaced by `inter` and the intra-node one by `intra` where given. Without a
/// sweep, one model per route of `routes` (what the runs all-reduced over), with only
/// the levels given. `ranks_per_node` sets the shape the models describe.
pub(crate) fn with_specs(
    measured: Option<LinkModelFile>,
    inter: Option<&LinkSpec>,
    intra: Option<&LinkSpec>,
    routes: &[(Backend, Memory)],
    ranks_per_node: usize,
    probes: &dyn Fn(Backend, Memory, &str) -> Option<LevelFit>,
) -> LinkModelFile {
    let mut file = measured.unwrap_or_else(|| LinkModelFile {
        formula: FORMULA.into(),
        models: routes
            .iter()
            .map(|&(backend, memory)| RouteLinkModel {
                backend,
                memory,
                model: LinkModel {
                    formula: FORMULA.into(),
                    ranks_per_node,
                    nodes: 1,
                    intra: None,
                    inter: None,
                    node_type: String::new(),
                },
            })
            .collect(),
    });
    for m in &mut file.models {
        let dtype = [&m.model.intra, &m.model.inter]
            .into_iter()
            .flatten()
            .map(|f| f.dtype.clone())
            .next()
            .unwrap_or_else(|| "float".into());
        if let Some(s) = inter {
            m.model.inter = Some(s.level_fit("inter-node", m.backend, &dtype));
        }
        if let Some(s) = intra {
            m.model.intra = Some(s.level_fit("intra-node", m.backend, &dtype));
        }
        // No intra-node level measured or given: the runs' own probes set it.
        if m.model.intra.is_none() {
            m.model.intra = probes(m.backend, m.memory, &dtype);
        }
        m.model.ranks_per_node = ranks_per_node.max(1);
    }
    file
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::model::{fit, ring_s};

    /// `PRESETS` is the one list of presets: `reduce --link`'s help names each of them
    /// and no other, and results/README.md's preset table has a row for each and no other.
    #[test]
    fn the_link_help_and_the_results_readme_list_exactly_the_presets() {
        use clap::CommandFactory;
        let cmd = crate::cli::Cli::command();
        let reduce = cmd.find_subcommand("reduce").expect("the reduce command");
        let link = reduce.get_arguments().find(|a| a.get_id() == "link").expect("--link");
        let help = link.get_help().expect("--link's help").to_string();
        let from = help.find("a preset (").expect("the presets in --link's help") + "a preset (".len();
        let listed = help[from..].split(';').next().unwrap_or_default().to_string();
        let mut in_help: Vec<&str> = listed.split(',').map(str::trim).collect();
        let readme = include_str!("../../results/README.md");
        let table = &readme[readme.find("| preset | bandwidth per direction").expect("the preset table")..];
        let mut in_readme: Vec<&str> = table
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .filter_map(|l| l[3..].split('`').next())
            .collect();
        let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        for v in [&mut in_help, &mut in_readme, &mut names] {
            v.sort_unstable();
        }
        assert_eq!(in_help, names, "--link's help: {help}");
        assert_eq!(in_readme, names, "results/README.md's preset table");
    }

    #[test]
    fn every_preset_parses_into_the_model_the_sweep_would_fit_for_its_alpha_and_beta() {
        for p in PRESETS {
            let s = LinkSpec::parse(p.name).unwrap();
            let f = s.level_fit("inter-node", Backend::Mpi, "float");
            // The noiseless sweep of the same α and β over 2 ranks fits the same line.
            let pts: Vec<(u64, f64)> = (3..31)
                .map(|k| 1u64 << k)
                .map(|b| (b, ring_s(2, b as f64, p.alpha_s, 1.0 / p.bandwidth_bytes_per_s)))
                .collect();
            let swept = fit("inter-node", Backend::Mpi, "float", 2, &pts).unwrap();
            assert!((swept.alpha_s / f.alpha_s - 1.0).abs() < 1e-9, "{}", p.name);
            assert!((swept.beta_s_per_byte / f.beta_s_per_byte - 1.0).abs() < 1e-9, "{}", p.name);
            assert_eq!(f.check(), Ok(()), "{}", p.name);
            assert!(f.nominal.as_deref().unwrap().starts_with(p.name));
            assert!(f.residuals.is_empty() && swept.nominal.is_none());
        }
    }

    #[test]
    fn a_spec_with_a_sweeps_alpha_and_beta_gives_the_sweeps_link_times_where_it_uses_its_line() {
        let (alpha, beta) = (5e-6, 1.0 / 12.5e9);
        let pts: Vec<(u64, f64)> = (3..27).map(|k| 1u64 << k).map(|b| (b, ring_s(2, b as f64, alpha, beta))).collect();
        let swept = fit("inter-node", Backend::Mpi, "float", 2, &pts).unwrap();
        let spec = LinkSpec {
            name: "same".into(),
            bandwidth_bytes_per_s: 1.0 / swept.beta_s_per_byte,
            alpha_s: swept.alpha_s,
            efficiency: ASSUMED,
        };
        let model = |inter: LevelFit| LinkModel {
            formula: FORMULA.into(),
            ranks_per_node: 4,
            nodes: 2,
            intra: Some(spec.level_fit("intra-node", Backend::Mpi, "float")),
            inter: Some(inter),
            node_type: "t".into(),
        };
        let (by_sweep, by_spec) = (model(swept.clone()), model(spec.level_fit("inter-node", Backend::Mpi, "float")));
        for (nodes, per_node) in [(2, 1), (2, 4), (16, 4), (128, 8)] {
            // At the sizes the sweep measured (where it anchors to its measurements) and
            // beyond them (the line alone); between measured sizes the sweep path
            // interpolates its measurements, which a spec does not have.
            for bytes in [64.0, 262_144.0, 16_777_216.0, 1e9] {
                let (a, b) = (
                    by_sweep.time_s(nodes, per_node, bytes).unwrap(),
                    by_spec.time_s(nodes, per_node, bytes).unwrap(),
                );
                assert!((a.time_s / b.time_s - 1.0).abs() < 1e-12, "{nodes}x{per_node} {bytes}: {a:?} {b:?}");
                assert_eq!(a.algorithm, b.algorithm);
            }
        }
    }

    #[test]
    fn every_preset_states_an_efficiency_and_the_evidence_behind_a_published_one() {
        let evidence = include_str!("../../docs/link-efficiency.md");
        let readme = include_str!("../../results/README.md");
        for p in PRESETS {
            let e = p.efficiency;
            assert!(
                0.0 < e.low && e.low <= e.expected && e.expected <= e.high && e.high <= 1.0,
                "{}: {e:?}",
                p.name
            );
            // Every preset has its section of quoted sources (or of what was not found),
            // and results/README.md's table gives its efficiency as the code has it.
            assert!(
                evidence.contains(&format!("### {} (", p.name)),
                "{}: no section in docs/link-efficiency.md",
                p.name
            );
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", p.name)))
                .unwrap_or_else(|| panic!("{}: no row in results/README.md", p.name));
            assert!(
                row.contains(&efficiency_words(&e)),
                "{}: {row} lacks {}",
                p.name,
                efficiency_words(&e)
            );
        }
    }

    #[test]
    fn specs_read_in_bits_and_bytes_and_bad_ones_are_refused_with_the_forms() {
        let near = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        let s = LinkSpec::parse("100Gbit/s,5us").unwrap();
        assert!(near(s.bandwidth_bytes_per_s, 12.5e9) && near(s.alpha_s, 5e-6), "{s:?}");
        let s = LinkSpec::parse("25GB/s,2µs").unwrap();
        assert!(near(s.bandwidth_bytes_per_s, 25e9) && near(s.alpha_s, 2e-6), "{s:?}");
        let s = LinkSpec::parse("1.5e2 Mbit/s, 0.5ms").unwrap();
        assert!((s.bandwidth_bytes_per_s - 18.75e6).abs() < 1e-6 && (s.alpha_s - 5e-4).abs() < 1e-15);
        assert!(near(LinkSpec::parse("ROCE-100G").unwrap().alpha_s, 5e-6));
        // A stated efficiency, after a spec or a preset; without one the preset's or
        // the assumed range.
        let s = LinkSpec::parse("100Gbit/s,5us,efficiency=0.85").unwrap();
        assert!(near(s.bandwidth_bytes_per_s, 12.5e9) && s.efficiency.expected == 0.85 && s.efficiency.low == 0.85);
        assert_eq!(s.efficiency.basis, EfficiencyBasis::Given);
        let s = LinkSpec::parse("roce-100g, efficiency=1").unwrap();
        assert!(
            near(s.alpha_s, 5e-6) && s.efficiency.expected == 1.0 && s.name.contains("efficiency=1"),
            "{s:?}"
        );
        assert_eq!(LinkSpec::parse("1Gbit/s,50us").unwrap().efficiency, ASSUMED);
        let f = LinkSpec::parse("10GB/s,1us,efficiency=0.5")
            .unwrap()
            .level_fit("inter-node", Backend::Mpi, "float");
        assert_eq!(f.check(), Ok(()));
        for bad in [
            "10GB/s,1us,efficiency=0",
            "10GB/s,1us,efficiency=1.2",
            "roce-100g,efficiency=-0.5",
            "10GB/s,1us,efficiency=nan",
            "10GB/s,1us,efficiency=high",
            "10GB/s,1us,efficiency=inf",
        ] {
            let e = LinkSpec::parse(bad).unwrap_err();
            assert!(e.contains("no fraction of line rate") && e.contains("efficiency=F"), "{bad}: {e}");
        }
        for (bad, why) in [
            ("fast", "'fast' is no preset"),
            ("100Gbit", "'100Gbit' has no latency"),
            ("-1Gbit/s,5us", "a bandwidth is above 0"),
            ("0GB/s,5us", "a bandwidth is above 0"),
            ("10GB/s,2s", "a latency lies from 0 to 1 s"),
            ("10GB/s,-1us", "a latency lies from 0 to 1 s"),
            ("1e-320bit/s,0s", "beta_s_per_byte is inf"),
            ("0.5B/s,1us", "a bandwidth of at least 1 byte/s"),
            ("10GB/s,5", "has no latency unit"),
            ("10furlongs,5us", "has no bandwidth unit"),
            ("ib-xdr", "'ib-xdr' is no preset"),
        ] {
            let e = LinkSpec::parse(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("BANDWIDTH,LATENCY") && e.contains("roce-100g, ib-hdr"),
                "{bad}: {e}"
            );
        }
    }
}
