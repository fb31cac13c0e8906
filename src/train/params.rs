//! Keeping the ranks' models identical: rank 0's values broadcast to all, and a
//! checksum of all parameters compared across ranks after each epoch. Both work on
//! every tensor in its own dtype and in pieces of at most [`PIECE_BYTES`], so neither
//! holds a second copy of a large parameter.

use crate::comm::dtype::gradient_dtypes;
use crate::comm::ReduceDtype;
use crate::record::AmpMode;
use crate::world::{AgreedError, Group};
use anyhow::{bail, Result};
use mpi::collective::{CommunicatorCollectives, Root};
use mpi::topology::Communicator;
use tch::{Device, Kind, Tensor};

/// The largest piece of a tensor broadcast, staged or checksummed at once.
pub(super) const PIECE_BYTES: usize = 64 << 20;

/// Err with one message when a trainable parameter of `params` cannot be trained here:
/// its gradient's dtype is one the all-reduce cannot sum, or it is float16 under
/// `--amp fp16`, whose loss scaler unscales fp32 gradients (as torch.amp.GradScaler,
/// which refuses float16 gradients too).
pub(super) fn check_dtypes(params: &[(String, Tensor)], amp: AmpMode) -> Result<()> {
    let dtypes = gradient_dtypes(params)?;
    if amp == AmpMode::Fp16 {
        let half: Vec<&str> = params
            .iter()
            .zip(&dtypes)
            .filter(|(_, d)| **d == ReduceDtype::Fp16)
            .map(|((n, _), _)| n.as_str())
            .collect();
        if let Some(first) = half.first() {
            bail!(
                "trainable parameter `{first}`{} is float16, and --amp fp16 keeps float32 parameters whose loss-scaled \
                 gradients it unscales (torch.amp.GradScaler refuses float16 gradients too): use --amp bf16 or off, \
                 or keep such parameters in float32",
                match half.len() {
                    1 => String::new(),
                    n => format!(" (and {} more)", n - 1),
                }
            );
        }
    }
    Ok(())
}

/// Tensor `t` as one flat run of its elements in memory order, when its layout is dense
/// (row-major, channels-last, any order of dimensions without gaps): a view, no copy.
fn flat_in_memory(t: &Tensor) -> Option<Tensor> {
    let strides = crate::comm::bucket_strides(t);
    (strides == t.stride()).then(|| t.as_strided([t.numel() as i64], [1], None))
}

/// Copies rank 0's values of `vars` to every rank: parameters at the start (as DDP does at
/// construction), buffers before validation. Each tensor travels as its own bytes, so
/// every dtype (fp64, fp16, integers, complex) arrives exactly; a dense tensor on the
/// host is received straight into its own memory, any other in pieces of at most
/// [`PIECE_BYTES`] staged through the host.
pub(super) fn broadcast_from_rank0(g: &Group, vars: &[(String, Tensor)]) {
    let _f = crate::flight::enter("broadcast", "rank 0's values");
    let root = g.comm.process_at_rank(0);
    // No view or copy made here is part of a graph.
    tch::no_grad(|| {
        for (_, t) in vars {
            if t.numel() == 0 {
                continue;
            }
            let (kind, elem) = (t.kind(), t.kind().elt_size_in_bytes());
            // A tensor with gaps goes through a dense copy of itself (written back below).
            let (flat, gapped) = match flat_in_memory(t) {
                Some(flat) => (flat, false),
                None => (t.contiguous().view([-1]), true),
            };
            let numel = flat.numel();
            let piece = (PIECE_BYTES / elem).max(1);
            let mut start = 0usize;
            while start < numel {
                let len = piece.min(numel - start);
                let mut part = flat.narrow(0, start as i64, len as i64);
                let host = match (part.device(), g.rank) {
                    (Device::Cpu, _) => part.shallow_clone(),
                    (_, 0) => part.to_device(Device::Cpu),
                    _ => Tensor::empty([len as i64], (kind, Device::Cpu)),
                };
                // SAFETY: `host` is a dense run of `len` elements of `elem` bytes on the
                // host, alive until the broadcast returns; nothing else touches it meanwhile.
                let bytes = unsafe { std::slice::from_raw_parts_mut(host.data_ptr() as *mut u8, len * elem) };
                root.broadcast_into(bytes);
                if g.rank != 0 && part.device() != Device::Cpu {
                    part.copy_(&host);
                }
                start += len;
            }
            if gapped && g.rank != 0 {
                t.shallow_clone().copy_(&flat.view(t.size().as_slice()));
            }
        }
    })
}

/// (L2 norm, plain sum) of all parameters, in f64, each tensor read in pieces of at
/// most [`PIECE_BYTES`] of its own dtype (widened to f64 a piece at a time).
fn param_checksum(params: &[(String, Tensor)]) -> [f64; 2] {
    tch::no_grad(|| {
        let mut sq = 0.0;
        let mut sum = 0.0;
        for (_, p) in params {
            let flat = flat_in_memory(p).unwrap_or_else(|| p.reshape([-1]));
            let numel = flat.numel();
            let piece = (PIECE_BYTES / 8).max(1);
            let mut start = 0usize;
            while start < numel {
                let len = piece.min(numel - start);
                // A view of the parameter itself when it is fp64: never changed in place.
                let d = flat.narrow(0, start as i64, len as i64).to_kind(Kind::Double);
                sum += d.sum(Kind::Double).double_value(&[]);
                sq += d.square().sum(Kind::Double).double_value(&[]);
                start += len;
            }
        }
        [sq.sqrt(), sum]
    })
}

/// The L2 norm of all parameters.
pub(super) fn param_l2(params: &[(String, Tensor)]) -> f64 {
    param_checksum(params)[0]
}

/// Every rank must hold the same parameters; a difference names the ranks. Returns the
/// parameters' L2 norm.
pub(super) fn check_in_sync(g: &Group, params: &[(String, Tensor)], epoch: usize) -> Result<f64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_layouts_are_read_flat_in_place_and_gapped_ones_are_not() {
        let t = Tensor::arange(24, (Kind::Float, Device::Cpu)).view([2, 3, 4]);
        let flat = flat_in_memory(&t).unwrap();
        assert_eq!(flat.data_ptr(), t.data_ptr(), "a view");
        let cl = crate::model::in_format(&t.view([2, 3, 2, 2]), crate::record::MemoryFormat::ChannelsLast);
        let flat = flat_in_memory(&cl).unwrap();
        assert_eq!((flat.data_ptr(), flat.numel()), (cl.data_ptr(), 24));
        assert!(flat_in_memory(&t.narrow(2, 0, 2)).is_none(), "a gap");
    }

    #[test]
    fn the_checksum_widens_each_dtype_and_reads_large_tensors_in_pieces() {
        let piece = PIECE_BYTES / 8;
        // More elements than one piece holds, in fp16; fp64 values fp32 cannot hold.
        let big = Tensor::ones([piece as i64 + 3], (Kind::Half, Device::Cpu));
        let fine = Tensor::from_slice(&[1.0 + 2f64.powi(-40), -2.0]);
        let params = vec![("big".to_string(), big), ("fine".to_string(), fine)];
        let [l2, sum] = param_checksum(&params);
        let want_sum = (piece + 3) as f64 + 2f64.powi(-40) - 1.0;
        assert_eq!(sum, want_sum);
        let want_sq = (piece + 3) as f64 + (1.0 + 2f64.powi(-40)).powi(2) + 4.0;
        assert!((l2 - want_sq.sqrt()).abs() < 1e-9, "{l2} against {}", want_sq.sqrt());
    }

    #[test]
    fn fp16_parameters_are_refused_under_fp16_amp_only() {
        let params = vec![
            ("w".to_string(), Tensor::zeros([2], (Kind::Float, Device::Cpu))),
            ("h".to_string(), Tensor::zeros([2], (Kind::Half, Device::Cpu))),
        ];
        check_dtypes(&params, AmpMode::Off).unwrap();
        check_dtypes(&params, AmpMode::Bf16).unwrap();
        let e = check_dtypes(&params, AmpMode::Fp16).unwrap_err().to_string();
        assert!(e.starts_with("trainable parameter `h` is float16, and --amp fp16"), "{e}");
        let complex = vec![("z".to_string(), Tensor::zeros([2], (Kind::ComplexFloat, Device::Cpu)))];
        let e = check_dtypes(&complex, AmpMode::Off).unwrap_err().to_string();
        assert!(e.contains("`z` is complex64"), "{e}");
    }
}
