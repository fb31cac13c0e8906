//! Keeping the ranks' models identical: rank 0's values broadcast to all, and a
//! checksum of all parameters compared across ranks after each epoch.

use crate::world::{AgreedError, Group};
use anyhow::Result;
use mpi::collective::{CommunicatorCollectives, Root};
use mpi::topology::Communicator;
use tch::{Device, Kind, Tensor};

/// Copies rank 0's values of `vars` to every rank: parameters at the start (as DDP does at
/// construction), BatchNorm statistics before validation.
pub fn broadcast_from_rank0(g: &Group, vars: &[(String, Tensor)]) {
    let _f = crate::flight::enter("broadcast", "rank 0's values");
    let root = g.comm.process_at_rank(0);
    for (_, p) in vars {
        let n = p.numel();
        let mut buf = vec![0f32; n];
        if g.rank == 0 {
            p.to_device(Device::Cpu).to_kind(Kind::Float).copy_data(&mut buf, n);
        }
        root.broadcast_into(&mut buf[..]);
        let src = Tensor::from_slice(&buf).view(p.size().as_slice()).to_device(p.device());
        tch::no_grad(|| {
            let mut p = p.shallow_clone();
            p.copy_(&src);
        });
    }
}

/// (L2 norm, plain sum) of all parameters, in f64.
fn param_checksum(params: &[(String, Tensor)]) -> [f64; 2] {
    tch::no_grad(|| {
        let mut sq = 0.0;
        let mut sum = 0.0;
        for (_, p) in params {
            let d = p.to_kind(Kind::Double);
            sq += d.square().sum(Kind::Double).double_value(&[]);
            sum += d.sum(Kind::Double).double_value(&[]);
        }
        [sq.sqrt(), sum]
    })
}

/// The L2 norm of all parameters.
pub fn param_l2(params: &[(String, Tensor)]) -> f64 {
    param_checksum(params)[0]
}

/// Every rank must hold the same parameters; a difference names the ranks. Returns the
/// parameters' L2 norm.
pub fn check_in_sync(g: &Group, params: &[(String, Tensor)], epoch: usize) -> Result<f64> {
    let mine = param_checksum(params);
    let mut all = vec![0f64; 2 * g.size];
    let f = crate::flight::enter("all-gather", "parameter checksum");
    g.comm.all_gather_into(&mine[..], &mut all[..]);
    drop(f);
    let reference = [all[0], all[1]];
    let diverged: Vec<String> = all
        .chunks(2)
        .enumerate()
        .filter(|(_, c)| (0..2).any(|k| (c[k] - reference[k]).abs() > 1e-9 * reference[k].abs().max(1.0)))
        .map(|(r, c)| format!("rank {r} (l2 {:.12}, sum {:.12})", c[0], c[1]))
        .collect();
    if !diverged.is_empty() {
        return Err(AgreedError {
            rank: g.rank,
            message: format!(
                "parameters diverged after epoch {epoch}: rank 0 has l2 {:.12}, sum {:.12}; {}. \
                 Gradients were not averaged identically on every rank",
                reference[0],
                reference[1],
                diverged.join("; ")
            ),
        }
        .into());
    }
    Ok(reference[0])
}
