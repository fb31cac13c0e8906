//! Synthetic data: random-normal images (or random token ids) of the model's input
//! shape and random labels, seeded. Samples are drawn from a pool held in memory of at
//! most [`POOL_BYTES`] (all of them when they fit): sample i is pool row i mod rows, so
//! a data set of any size costs no more memory than the pool (the order of its samples
//! is computed, not stored: [`super::sampler`]), and the same `--seed` gives the same
//! samples.

use super::{Dataset, Split};
use crate::model::{Input, ModelSpec};
use tch::{Device, Kind, Tensor};

/// Memory for each split's pool of distinct samples.
pub(crate) const POOL_BYTES: usize = 256 << 20;

/// Rows of a pool of samples shaped `input`, at most `samples`.
fn pool_rows(input: &Input, samples: usize) -> usize {
    let bytes = match *input {
        Input::Image([c, h, w]) => (c * h * w) as usize * 4,
        Input::Tokens { seq_len, .. } => seq_len as usize * 8,
    };
    samples.min((POOL_BYTES / bytes.max(1)).max(1))
}

/// A split of `samples` samples; its pool is drawn from libtorch's generator.
fn split(spec: &ModelSpec, samples: usize) -> Split {
    let rows = pool_rows(&spec.input, samples) as i64;
    let inputs = match spec.input {
        Input::Image([c, h, w]) => Tensor::randn([rows, c, h, w], (Kind::Float, Device::Cpu)),
        Input::Tokens { seq_len, vocab } => Tensor::randint_low(2, vocab.max(3), [rows, seq_len], (Kind::Int64, Device::Cpu)),
    };
    let labels = Tensor::randint(spec.classes, [rows], (Kind::Int64, Device::Cpu));
    Split::pooled(inputs, labels, samples)
}

/// `samples` training samples and a sixth as many test samples, seeded by `seed`.
pub(crate) fn load(samples: usize, spec: &ModelSpec, seed: u64) -> Dataset {
    let _seeded = crate::torch_seed::seed(seed as i64 ^ 0x5eed);
    let n = samples.max(1);
    Dataset {
        stream: None,
        name: "synthetic".into(),
        source: String::new(),
        train: split(spec, n),
        test: split(spec, (n / 6).max(1)),
        classes: spec.classes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{self, ModelKind, ModelOptions};

    #[test]
    fn a_large_set_costs_only_its_pool_and_repeats_by_seed() {
        let spec = model::spec(ModelKind::Resnet18, &ModelOptions::default());
        // One million 3×224×224 images would take 602 GB; the pool holds 445 of them.
        let ds = load(1_000_000, &spec, 7);
        assert_eq!(ds.train.len(), 1_000_000);
        assert_eq!(ds.train.inputs.size()[0], (POOL_BYTES / (3 * 224 * 224 * 4)) as i64);
        assert_eq!(ds.test.sample_bytes(), 3 * 224 * 224 * 4);
        let idx = Tensor::from_slice(&[0i64, 1, 999_999, 445]);
        let (x, y) = ds.train.batch(&idx, Device::Cpu).unwrap();
        assert_eq!(x.size(), [4, 3, 224, 224]);
        assert_eq!(y.size(), [4]);
        // Sample i is pool row i mod 445: 445 repeats 0; 0 and 1 differ.
        assert!(x.get(0).equal(&x.get(3)));
        assert!(!x.get(0).equal(&x.get(1)));
        // The same seed gives the same samples.
        let again = load(1_000_000, &spec, 7);
        assert!(again.train.batch(&idx, Device::Cpu).unwrap().0.equal(&x));
        assert!(!load(1_000_000, &spec, 8).train.batch(&idx, Device::Cpu).unwrap().0.equal(&x));
    }

    #[test]
    fn a_small_set_is_held_whole() {
        let spec = model::spec(ModelKind::MnistCnn, &ModelOptions::default());
        let ds = load(600, &spec, 1);
        assert_eq!((ds.train.len(), ds.test.len()), (600, 100));
        assert_eq!(ds.train.inputs.size(), [600, 1, 28, 28]);
    }
}
