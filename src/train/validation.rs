//! Validation after each epoch: loss and accuracy on the test split.

use crate::data::Dataset;
use crate::model::Net;
use crate::world::Group;
use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use tch::{Device, Kind, Tensor};

/// Input bytes one validation chunk may hold.
pub(super) const CHUNK_INPUT_BYTES: usize = 256 << 20;

/// Samples per validation chunk for a training batch of `batch` samples of
/// `sample_bytes` each: at most the batch, since a forward pass without gradients needs
/// less memory than the training step that already ran with it (activations, not inputs,
/// dominate: resnet18 at 224 × 224 takes about 13 MB per image); at most
/// [`CHUNK_INPUT_BYTES`] of input; at least 1.
pub(super) fn chunk_len(batch: usize, sample_bytes: usize) -> usize {
    batch.min(CHUNK_INPUT_BYTES / sample_bytes.max(1)).max(1)
}

/// Test samples validated after an epoch: `asked` (`--val-samples`) when given, else as
/// many as the epoch trained over all ranks (`trained`), so that validation, a forward
/// pass without gradients over them, takes less time than the epoch's steps did; at
/// most the test split. With why, for the log line.
pub(super) fn samples_to_validate(asked: Option<usize>, trained: usize, test_len: usize) -> (usize, &'static str) {
    match asked {
        Some(n) => (n.min(test_len), "--val-samples"),
        None if trained < test_len => (trained, "as many as the epoch trained; --val-samples sets another number"),
        None => (test_len, "the whole test split, fewer samples than the epoch trained"),
    }
}

/// Loss and accuracy on the first `n` test samples, each rank taking every size-th
/// sample, in chunks of at most `batch` ([`chunk_len`]), rank 0 drawing a bar of its
/// share; (NaN, NaN, 0) when there are none.
pub(super) fn evaluate(g: &Group, net: &dyn Net, data: &Dataset, device: Device, n: usize, batch: usize) -> Result<(f64, f64, usize)> {
    let n = data.test.len().min(n);
    // Samples rank, rank + size, ... below n, a chunk at a time: nothing held grows with n.
    let mine = n.saturating_sub(g.rank).div_ceil(g.size);
    let chunk = chunk_len(batch, data.test.sample_bytes());
    let (mut loss_sum, mut correct) = (0.0f64, 0.0f64);
    let bar = crate::progress::Bar::new("validation", mine as u64, "samples (rank 0's share)");
    tch::no_grad(|| -> Result<()> {
        for first in (0..mine).step_by(chunk) {
            bar.set(first as u64, format!("chunks of {chunk}"));
            // Each chunk is progress: only one that never ends is a stall.
            crate::flight::phase(Some(crate::flight::Activity::Validation));
            let idx: Vec<i64> = (first..(first + chunk).min(mine)).map(|k| (g.rank + k * g.size) as i64).collect();
            let (x, y) = data.test.batch(&Tensor::from_slice(&idx), device)?;
            let (loss, right) = batch_loss_and_correct(net, &x, &y)?;
            loss_sum += loss;
            correct += right;
        }
        Ok(())
    })?;
    drop(bar);
    crate::flight::phase(None);
    let mine = [loss_sum, correct, mine as f64];
    let mut total = [0f64; 3];
    let _f = crate::flight::enter("all-reduce", "validation");
    g.comm.all_reduce_into(&mine[..], &mut total[..], SystemOperation::sum());
    if total[2] == 0.0 {
        return Ok((f64::NAN, f64::NAN, 0));
    }
    Ok((total[0] / total[2], total[1] / total[2], total[2] as usize))
}

/// The summed loss and the correct predictions of one batch (a TorchScript model's
/// own loss gives no predictions: NaN).
fn batch_loss_and_correct(net: &dyn Net, x: &Tensor, y: &Tensor) -> Result<(f64, f64)> {
    if let Some(script) = net.script() {
        return script.evaluate(x, y);
    }
    let out = net.forward_t(x, false);
    let loss = out.nll_loss(y).double_value(&[]) * x.size()[0] as f64;
    Ok((loss, out.argmax(-1, false).eq_tensor(y).sum(Kind::Int64).int64_value(&[]) as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_the_training_batch_within_the_input_budget() {
        let image = 3 * 224 * 224 * 4;
        // resnet18 at 224 × 224, batch 4: chunks of 4 (the old 1,000 took 13.4 GB).
        assert_eq!(chunk_len(4, image), 4);
        // A batch larger than 256 MiB of input: 445 images of 602,112 bytes.
        assert_eq!(chunk_len(1024, image), 445);
        assert!(chunk_len(1024, image) * image <= CHUNK_INPUT_BYTES);
        // MNIST-sized samples: the batch.
        assert_eq!(chunk_len(64, 28 * 28 * 4), 64);
        // A sample larger than the budget still validates, one at a time.
        assert_eq!(chunk_len(8, CHUNK_INPUT_BYTES + 1), 1);
        assert_eq!(chunk_len(8, 0), 8);
    }

    /// 3 steps of batch 2 on 2 ranks trained 12 samples: 12 are validated, not 10,000.
    #[test]
    fn validation_takes_as_many_samples_as_the_epoch_trained_unless_asked() {
        assert_eq!(samples_to_validate(None, 12, 10_000).0, 12);
        assert_eq!(samples_to_validate(None, 60_000, 10_000).0, 10_000);
        assert_eq!(samples_to_validate(Some(500), 12, 10_000), (500, "--val-samples"));
        assert_eq!(samples_to_validate(Some(0), 12, 10_000).0, 0);
        assert_eq!(samples_to_validate(Some(20_000), 12, 10_000).0, 10_000);
    }
}
