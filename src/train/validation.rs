//! Validation after each epoch: loss and accuracy on the test split.

use crate::data::Dataset;
use crate::model::Net;
use crate::world::Group;
use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use tch::{Device, Kind, Tensor};

/// Loss and accuracy on the first `limit` test samples (all by default), each rank
/// taking every size-th sample; (NaN, NaN, 0) when there are none.
pub fn evaluate(g: &Group, net: &dyn Net, data: &Dataset, device: Device, limit: Option<usize>) -> Result<(f64, f64, usize)> {
    let n = data.test.len().min(limit.unwrap_or(usize::MAX));
    let mine: Vec<i64> = (g.rank..n).step_by(g.size).map(|i| i as i64).collect();
    let (mut loss_sum, mut correct) = (0.0f64, 0.0f64);
    tch::no_grad(|| -> Result<()> {
        for chunk in mine.chunks(if data.test.files.is_some() { 64 } else { 1000 }) {
            let (x, y) = data.test.batch(&Tensor::from_slice(chunk), device)?;
            let out = net.forward_t(&x, false);
            loss_sum += out.nll_loss(&y).double_value(&[]) * chunk.len() as f64;
            correct += out.argmax(-1, false).eq_tensor(&y).sum(Kind::Int64).int64_value(&[]) as f64;
        }
        Ok(())
    })?;
    let mine = [loss_sum, correct, mine.len() as f64];
    let mut total = [0f64; 3];
    let _f = crate::flight::enter("all-reduce", "validation");
    g.comm.all_reduce_into(&mine[..], &mut total[..], SystemOperation::sum());
    if total[2] == 0.0 {
        return Ok((f64::NAN, f64::NAN, 0));
    }
    Ok((total[0] / total[2], total[1] / total[2], total[2] as usize))
}
