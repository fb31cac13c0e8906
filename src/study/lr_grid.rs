//! `[lr_grid]` of a study file: learning rates paired with each point's global batch by
//! a rule, not crossed with it. A point of global batch B trains at
//! `base × rule(B / base_batch) × factor` for each factor, with `--lr-scaling none` (the
//! rule already scales with the global batch) and, when given, the warm-up as a fraction
//! of an epoch (`--warmup-epochs`). Each factor is its own point, labelled `lrx<factor>`,
//! so a study trained to a target (`target_loss`) finds the best rate per batch.

use anyhow::{anyhow, bail, ensure, Result};

/// How the learning rate follows the global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LrRule {
    /// In proportion to B / base_batch (SGD's usual rule).
    Linear,
    /// In proportion to √(B / base_batch) (Adam's usual rule).
    Sqrt,
    /// The same rate at every batch.
    None,
}

impl LrRule {
    const NAMES: [(&'static str, LrRule); 3] = [("linear", LrRule::Linear), ("sqrt", LrRule::Sqrt), ("none", LrRule::None)];

    fn name(self) -> &'static str {
        LrRule::NAMES.iter().find(|(_, r)| *r == self).map_or("linear", |(n, _)| n)
    }

    /// The multiple of the base rate at `ratio` = B / base_batch.
    fn scale(self, ratio: f64) -> f64 {
        match self {
            LrRule::Linear => ratio,
            LrRule::Sqrt => ratio.sqrt(),
            LrRule::None => 1.0,
        }
    }
}

/// The keys of `[lr_grid]`.
const KEYS: [&str; 5] = ["base", "base_batch", "rule", "factors", "warmup_fraction"];

/// A study's learning-rate grid.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LrGrid {
    /// The learning rate at global batch `base_batch`.
    pub base: f64,
    pub base_batch: usize,
    pub rule: LrRule,
    /// Multiples of the rule's rate, each a point.
    pub factors: Vec<f64>,
    /// The learning rate's warm-up, in epochs (`--warmup-epochs`); None leaves train's.
    pub warmup_fraction: Option<f64>,
}

fn positive(key: &str, v: &toml::Value) -> Result<f64> {
    let x = v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    match x {
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => bail!("study key `lr_grid.{key}`: {v} is not a number above 0"),
    }
}

impl LrGrid {
    /// Reads `[lr_grid]`; every key but `base` and `base_batch` has a default (rule
    /// linear, factors \[1\], train's warm-up).
    pub(crate) fn from_toml(v: &toml::Value) -> Result<LrGrid> {
        let t = v.as_table().ok_or_else(|| {
            anyhow!("study key `lr_grid` is a table: [lr_grid] base = 0.005, base_batch = 64, rule = \"linear\", factors = [0.5, 1, 2]")
        })?;
        if let Some(k) = t.keys().find(|k| !KEYS.contains(&k.as_str())) {
            bail!("unknown key `lr_grid.{k}`: the keys of [lr_grid] are {}", KEYS.join(", "));
        }
        let need = |k: &str| t.get(k).ok_or_else(|| anyhow!("[lr_grid] needs `{k}` ({})", Self::meaning(k)));
        let base = positive("base", need("base")?)?;
        let base_batch = match need("base_batch")?.as_integer() {
            Some(n) if n >= 1 => n as usize,
            _ => bail!(
                "study key `lr_grid.base_batch`: {} is not a whole number of at least 1",
                t["base_batch"]
            ),
        };
        let rule = match t.get("rule") {
            None => LrRule::Linear,
            Some(r) => {
                let s = r.as_str().unwrap_or_default();
                LrRule::NAMES
                    .iter()
                    .find(|(n, _)| *n == s)
                    .map(|(_, r)| *r)
                    .ok_or_else(|| anyhow!("study key `lr_grid.rule`: {r} is not one of linear, sqrt, none"))?
            }
        };
        let factors = match t.get("factors") {
            None => vec![1.0],
            Some(toml::Value::Array(a)) => a.iter().map(|f| positive("factors", f)).collect::<Result<Vec<f64>>>()?,
            Some(f) => vec![positive("factors", f)?],
        };
        ensure!(!factors.is_empty(), "study key `lr_grid.factors` is an empty list");
        for (i, f) in factors.iter().enumerate() {
            ensure!(
                !factors[..i].contains(f),
                "study key `lr_grid.factors` names {f} twice: each factor is one point"
            );
        }
        let warmup_fraction = match t.get("warmup_fraction") {
            None => None,
            Some(w) => match w.as_float().or_else(|| w.as_integer().map(|i| i as f64)) {
                Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Some(x),
                _ => bail!("study key `lr_grid.warmup_fraction`: {w} is not a fraction of an epoch from 0 to 1"),
            },
        };
        Ok(LrGrid {
            base,
            base_batch,
            rule,
            factors,
            warmup_fraction,
        })
    }

    fn meaning(key: &str) -> &'static str {
        match key {
            "base" => "the learning rate at global batch base_batch, e.g. 0.005",
            _ => "the global batch the base rate is for, e.g. 64",
        }
    }

    /// The study's train options that set what the grid sets: refused beside it.
    pub(crate) fn check_train_keys(&self, train: &[(String, Vec<toml::Value>)]) -> Result<()> {
        let mut owned = vec!["lr", "lr-scaling"];
        if self.warmup_fraction.is_some() {
            owned.push("warmup-epochs");
        }
        if let Some((k, _)) = train.iter().find(|(k, _)| owned.contains(&k.as_str())) {
            bail!(
                "study key `{}` sets what [lr_grid] sets (each point's --lr{}): drop `{}` or [lr_grid]",
                k.replace('-', "_"),
                if k == "warmup-epochs" {
                    " and --warmup-epochs"
                } else {
                    " and --lr-scaling none"
                },
                k.replace('-', "_")
            );
        }
        Ok(())
    }

    /// The learning rate at global batch `global_batch` and `factor`.
    pub(crate) fn lr(&self, global_batch: usize, factor: f64) -> f64 {
        self.base * self.rule.scale(global_batch as f64 / self.base_batch as f64) * factor
    }

    /// The `train` arguments of a point of `global_batch` at `factor`.
    pub(crate) fn args(&self, global_batch: usize, factor: f64) -> Vec<String> {
        let mut a = vec![format!("--lr={}", self.lr(global_batch, factor)), "--lr-scaling=none".into()];
        if let Some(w) = self.warmup_fraction {
            a.push(format!("--warmup-epochs={w}"));
        }
        a
    }

    /// A factor's part of a workload's name.
    pub(crate) fn label(factor: f64) -> String {
        format!("lrx{factor}")
    }

    /// `[lr_grid]` as the resolved study.toml holds it: every key explicit.
    pub(crate) fn to_toml(&self) -> toml::Value {
        let mut t = toml::Table::new();
        t.insert("base".into(), self.base.into());
        t.insert("base_batch".into(), (self.base_batch as i64).into());
        t.insert("rule".into(), self.rule.name().into());
        t.insert(
            "factors".into(),
            toml::Value::Array(self.factors.iter().map(|&f| f.into()).collect()),
        );
        if let Some(w) = self.warmup_fraction {
            t.insert("warmup_fraction".into(), w.into());
        }
        toml::Value::Table(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(text: &str) -> Result<LrGrid> {
        let t: toml::Table = toml::from_str(text).unwrap();
        LrGrid::from_toml(&t["lr_grid"])
    }

    /// The rules pair a rate with each batch; the factors multiply it; the resolved
    /// form reads back as the same grid.
    #[test]
    fn the_rule_pairs_a_rate_with_each_batch() {
        let g = grid("[lr_grid]\nbase = 0.005\nbase_batch = 64\nfactors = [0.5, 1, 2]\nwarmup_fraction = 0.1\n").unwrap();
        assert_eq!(g.rule, LrRule::Linear);
        assert!((g.lr(256, 1.0) - 0.02).abs() < 1e-15);
        assert!((g.lr(1024, 0.5) - 0.04).abs() < 1e-15);
        assert_eq!(g.args(64, 2.0), ["--lr=0.01", "--lr-scaling=none", "--warmup-epochs=0.1"]);
        let sqrt = grid("[lr_grid]\nbase = 0.001\nbase_batch = 64\nrule = \"sqrt\"\n").unwrap();
        assert_eq!((sqrt.factors.clone(), sqrt.warmup_fraction), (vec![1.0], None));
        assert!((sqrt.lr(256, 1.0) - 0.002).abs() < 1e-15);
        let none = grid("[lr_grid]\nbase = 0.1\nbase_batch = 8\nrule = \"none\"\n").unwrap();
        assert_eq!(none.lr(4096, 1.0), 0.1);
        let mut resolved = toml::Table::new();
        resolved.insert("lr_grid".into(), g.to_toml());
        assert_eq!(LrGrid::from_toml(&resolved["lr_grid"]).unwrap(), g);
    }

    /// Each bad grid is refused with the key it is about.
    #[test]
    fn a_bad_grid_is_refused_by_its_key() {
        for (text, says) in [
            ("lr_grid = 1", "is a table"),
            ("[lr_grid]\nbase_batch = 64", "needs `base`"),
            ("[lr_grid]\nbase = 0.1", "needs `base_batch`"),
            ("[lr_grid]\nbase = -1\nbase_batch = 64", "lr_grid.base"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 0", "lr_grid.base_batch"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 64\nrule = \"cubic\"", "linear, sqrt, none"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 64\nfactors = []", "empty list"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 64\nfactors = [1, 0]", "lr_grid.factors"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 64\nfactors = [1, 1.0]", "twice"),
            ("[lr_grid]\nbase = 0.1\nbase_batch = 64\nwarmup_fraction = 2", "warmup_fraction"),
            (
                "[lr_grid]\nbase = 0.1\nbase_batch = 64\nfactor = [1]",
                "unknown key `lr_grid.factor`",
            ),
        ] {
            let e = grid(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        let g = grid("[lr_grid]\nbase = 0.1\nbase_batch = 64\nwarmup_fraction = 0.1").unwrap();
        for key in ["lr", "lr-scaling", "warmup-epochs"] {
            let e = g.check_train_keys(&[(key.into(), vec![1.into()])]).unwrap_err().to_string();
            assert!(e.contains(&format!("study key `{}`", key.replace('-', "_"))), "{e}");
        }
        assert!(g.check_train_keys(&[("epochs".into(), vec![1.into()])]).is_ok());
    }
}
