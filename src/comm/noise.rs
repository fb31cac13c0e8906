//! The squared gradient norms the gradient noise scale ([`crate::noise_scale`]) is
//! estimated from, taken in the all-reduce's own buckets: this rank's gradient before the
//! all-reduce (batch b) and the averaged one after it (batch N·b). With one rank, the
//! first micro-batch of `--grad-accum` is the small batch and the step the big one.
//!
//! Each norm is a 0-dimensional tensor on the buckets' device, queued behind the step's
//! work: the host reads it when it reads the step's loss, a step late with device
//! events, so measuring never makes the host wait for the device.

use crate::noise_scale::NormPair;
use tch::{Kind, Tensor};

/// Which steps measure the two squared norms: defined with the comparison key, which
/// records it.
pub(crate) use crate::record::NoiseScaleMode;

/// Where a rank's two batch sizes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoisePath {
    /// Several ranks summed: this rank's gradient before the all-reduce, the mean after.
    Ranks,
    /// One rank (or no all-reduce) with `--grad-accum` ≥ 2: the first micro-batch's own
    /// gradient, and the step's.
    MicroBatches,
}

impl NoisePath {
    /// The path of a run summing gradients over `ranks_summed` ranks with
    /// `micro_batches` per step; None when the run has a single batch size.
    pub(crate) fn of(ranks_summed: usize, micro_batches: usize) -> Option<NoisePath> {
        if ranks_summed >= 2 {
            Some(NoisePath::Ranks)
        } else if micro_batches >= 2 {
            Some(NoisePath::MicroBatches)
        } else {
            None
        }
    }
}

/// One step's two squared norms as the buckets held them, their copies to host memory
/// queued behind the step's work, and what each buffer summed.
#[derive(Debug)]
pub(crate) struct NormsTaken {
    /// Squared norm of the small batch's buffer (fp64, host memory once the step is read).
    pub raw_small: Tensor,
    /// Squared norm of the big batch's buffer.
    pub raw_big: Tensor,
    /// Samples behind each.
    pub batch_small: usize,
    pub batch_big: usize,
    /// Micro-batch gradients summed in each buffer (over all ranks for the big one).
    pub summed_small: usize,
    pub summed_big: usize,
}

impl NormsTaken {
    /// The squared norms of the two mean gradients, for a step whose loss was multiplied
    /// by `loss_factor` and by fp16 AMP's `amp_scale` (1 without). Reads the copies: call
    /// once the step's device work is done.
    pub(crate) fn read(&self, loss_factor: f64, amp_scale: f64) -> NormPair {
        NormPair {
            batch_small: self.batch_small as f64,
            batch_big: self.batch_big as f64,
            sq_small: mean_grad_sq(self.raw_small.double_value(&[]), loss_factor, amp_scale, self.summed_small),
            sq_big: mean_grad_sq(self.raw_big.double_value(&[]), loss_factor, amp_scale, self.summed_big),
        }
    }
}

/// The squared L2 norm of all gradients in `buckets`: each bucket's norm taken in fp32
/// (fp16 and bf16 buckets widened, fp64 ones kept in fp64), squared and summed in fp64. A 0-dimensional fp64 tensor on the
/// buckets' device; nothing waits for it.
pub(crate) fn squared_norm(buckets: &[Tensor]) -> Tensor {
    let per_bucket: Vec<Tensor> = buckets
        .iter()
        .map(|b| {
            let at_least_fp32 = if b.kind() == Kind::Double { Kind::Double } else { Kind::Float };
            b.norm_scalaropt_dtype(2, at_least_fp32).to_kind(Kind::Double).square()
        })
        .collect();
    Tensor::stack(&per_bucket, 0).sum(Kind::Double)
}

/// The squared norm of a mean gradient from the squared norm `raw_sq` of a buffer that
/// holds `summed` micro-batch gradients, each of a loss multiplied by `loss_factor`
/// (the pre-division by ranks × micro-batches) and by fp16 AMP's `amp_scale` (1
/// without): the buffer is `loss_factor · amp_scale · summed` times the mean.
pub(crate) fn mean_grad_sq(raw_sq: f64, loss_factor: f64, amp_scale: f64, summed: usize) -> f64 {
    raw_sq / (loss_factor * amp_scale * summed as f64).powi(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_print_and_pick_steps() {
        assert_eq!("off".parse(), Ok(NoiseScaleMode::Off));
        assert_eq!("on".parse(), Ok(NoiseScaleMode::Every(1)));
        assert_eq!("every:8".parse(), Ok(NoiseScaleMode::Every(8)));
        for bad in ["every:0", "every:x", "sometimes", "every:-1"] {
            let e = bad.parse::<NoiseScaleMode>().unwrap_err();
            assert!(e.contains("--noise-scale") && e.contains("every:K"), "{e}");
        }
        for m in [NoiseScaleMode::Off, NoiseScaleMode::Every(1), NoiseScaleMode::Every(8)] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
        let steps: Vec<usize> = (0..20).filter(|&s| NoiseScaleMode::Every(8).measures(s)).collect();
        assert_eq!(steps, [0, 8, 16]);
        assert!(!(0..20).any(|s| NoiseScaleMode::Off.measures(s)));
    }

    #[test]
    fn the_norm_covers_every_bucket_of_every_dtype_in_fp32() {
        let b32 = Tensor::from_slice(&[3.0f32, 4.0]);
        let b16 = Tensor::from_slice(&[1.0f32, 2.0]).to_kind(Kind::Half);
        let b64 = Tensor::from_slice(&[2.0f64]);
        // Each bucket's norm is an fp32 (fp64) square root: equal to a few ulps.
        let close = |got: f64, want: f64| assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
        close(squared_norm(&[b32, b16, b64]).double_value(&[]), 25.0 + 5.0 + 4.0);
        // fp16 values whose squares overflow fp16 (> 65504) are squared in fp32.
        let big = Tensor::from_slice(&[300.0f32, 400.0]).to_kind(Kind::Half);
        close(squared_norm(&[big]).double_value(&[]), 250_000.0);
    }

    #[test]
    fn amp_scale_and_loss_pre_division_are_taken_out() {
        // A loss of mean gradient g = [1, 2] (|g|² = 5), pre-divided by 4 (2 ranks × 2
        // micro-batches), scaled by 1024, its gradient summed over 2 micro-batches.
        let (factor, scale) = (0.25, 1024.0);
        let params = Tensor::from_slice(&[0.0f32, 0.0]).set_requires_grad(true);
        for _ in 0..2 {
            let loss = (&params * Tensor::from_slice(&[1.0f32, 2.0])).sum(Kind::Float);
            (loss * factor * scale).backward();
        }
        let raw = squared_norm(&[params.grad()]).double_value(&[]);
        let got = mean_grad_sq(raw, factor, scale, 2);
        assert!((got - 5.0).abs() < 1e-6, "{got}");
    }

    /// The gradient of a loss over `x` (samples in rows) for weights `w`, pre-divided by
    /// `factor`, accumulated into `w`'s `.grad`.
    fn backward(w: &Tensor, x: &Tensor, factor: f64) {
        let y = x.matmul(w).sin().mean(Kind::Float);
        (y * factor).backward();
    }

    #[test]
    fn micro_batch_and_rank_paths_give_the_same_norms_for_the_same_samples() {
        tch::manual_seed(5);
        let x = Tensor::randn([8, 3], (Kind::Float, tch::Device::Cpu));
        let (first, second) = (x.narrow(0, 0, 4), x.narrow(0, 4, 4));
        let new_w = || Tensor::from_slice(&[0.3f32, -0.2, 0.5]).set_requires_grad(true);
        // One rank, two micro-batches: the loss pre-divided by 2; the first micro-batch's
        // buffer, then the step's.
        let w = new_w();
        backward(&w, &first, 0.5);
        let after_first = squared_norm(&[w.grad()]);
        backward(&w, &second, 0.5);
        let accum = NormsTaken {
            raw_small: after_first,
            raw_big: squared_norm(&[w.grad()]),
            batch_small: 4,
            batch_big: 8,
            summed_small: 1,
            summed_big: 2,
        }
        .read(0.5, 1.0);
        // Two ranks of one micro-batch each: pre-divided by 2, rank 0's buffer, the sum.
        let (w0, w1) = (new_w(), new_w());
        backward(&w0, &first, 0.5);
        backward(&w1, &second, 0.5);
        let ranks = NormsTaken {
            raw_small: squared_norm(&[w0.grad()]),
            raw_big: squared_norm(&[w0.grad() + w1.grad()]),
            batch_small: 4,
            batch_big: 8,
            summed_small: 1,
            summed_big: 2,
        }
        .read(0.5, 1.0);
        // Both are the norms of the mean gradients over the first 4 and all 8 samples.
        let mean_grad = |x: &Tensor| {
            let w = new_w();
            backward(&w, x, 1.0);
            squared_norm(&[w.grad()]).double_value(&[])
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs();
        for p in [accum, ranks] {
            assert!(close(p.sq_small, mean_grad(&first)), "{p:?}");
            assert!(close(p.sq_big, mean_grad(&x)), "{p:?}");
        }
    }

    #[test]
    fn the_two_batch_sizes_come_from_ranks_or_micro_batches() {
        assert_eq!(NoisePath::of(2, 1), Some(NoisePath::Ranks));
        assert_eq!(NoisePath::of(4, 2), Some(NoisePath::Ranks));
        assert_eq!(NoisePath::of(1, 2), Some(NoisePath::MicroBatches));
        assert_eq!(NoisePath::of(1, 1), None);
    }
}
