//! The element types gradients are all-reduced in. A gradient bucket holds one dtype,
//! its parameters' own (as c10d keys its buckets by dtype), and is summed in that dtype:
//! fp32 and fp64 are MPI's and NCCL's native floats, fp16 and bf16 NCCL's half types
//! and two sums of ddpbench's own on MPI ([`super::transport::mpi`]). `--grad-dtype`
//! casts fp32 buckets for the wire only; buckets of another dtype travel as they are.
//!
//! A parameter of any other dtype (complex, or a float type neither library sums)
//! cannot be all-reduced: [`gradient_dtypes`] refuses the model before training with
//! one message naming it.

use super::GradDtype;
use crate::model::dtype_name;
use anyhow::{bail, Result};
use serde::Serialize;
use tch::{Kind, Tensor};

/// A dtype the gradient all-reduce sums: what a bucket holds, and what it carries on
/// the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ReduceDtype {
    Fp32,
    Fp64,
    Fp16,
    Bf16,
}

impl ReduceDtype {
    /// Every dtype the all-reduce sums.
    #[cfg(test)]
    pub(crate) const ALL: [ReduceDtype; 4] = [ReduceDtype::Fp32, ReduceDtype::Fp64, ReduceDtype::Fp16, ReduceDtype::Bf16];

    /// The reducible dtype of libtorch's `kind`; None where the all-reduce cannot sum it.
    pub(crate) fn of(kind: Kind) -> Option<ReduceDtype> {
        match kind {
            Kind::Float => Some(ReduceDtype::Fp32),
            Kind::Double => Some(ReduceDtype::Fp64),
            Kind::Half => Some(ReduceDtype::Fp16),
            Kind::BFloat16 => Some(ReduceDtype::Bf16),
            _ => None,
        }
    }

    /// libtorch's dtype.
    pub(crate) fn kind(self) -> Kind {
        match self {
            ReduceDtype::Fp32 => Kind::Float,
            ReduceDtype::Fp64 => Kind::Double,
            ReduceDtype::Fp16 => Kind::Half,
            ReduceDtype::Bf16 => Kind::BFloat16,
        }
    }

    /// Bytes per element.
    pub(crate) fn bytes(self) -> usize {
        match self {
            ReduceDtype::Fp64 => 8,
            ReduceDtype::Fp32 => 4,
            ReduceDtype::Fp16 | ReduceDtype::Bf16 => 2,
        }
    }

    /// What a bucket of this dtype carries on the wire with `--grad-dtype wire`: the
    /// wire dtype for fp32 buckets, the bucket's own dtype for every other (an fp64
    /// gradient is not rounded to 16 bits, a 16-bit one is not widened).
    pub(crate) fn on_wire(self, wire: GradDtype) -> ReduceDtype {
        match self {
            ReduceDtype::Fp32 => wire.into(),
            other => other,
        }
    }
}

impl From<GradDtype> for ReduceDtype {
    fn from(d: GradDtype) -> ReduceDtype {
        match d {
            GradDtype::Fp32 => ReduceDtype::Fp32,
            GradDtype::Fp16 => ReduceDtype::Fp16,
            GradDtype::Bf16 => ReduceDtype::Bf16,
        }
    }
}

/// The dtype of each trainable parameter of `params` (named, in training order), or one
/// error naming every parameter whose gradient the all-reduce cannot sum, with its dtype.
pub(crate) fn gradient_dtypes(params: &[(String, Tensor)]) -> Result<Vec<ReduceDtype>> {
    let mut dtypes = Vec::with_capacity(params.len());
    let mut refused: Vec<String> = Vec::new();
    for (name, t) in params {
        // A dtype newer than the Rust bindings has no `Kind`: refused as well.
        match t.f_kind() {
            Ok(kind) => match ReduceDtype::of(kind) {
                Some(d) => dtypes.push(d),
                None => refused.push(format!("`{name}` is {}", dtype_name(kind))),
            },
            Err(_) => refused.push(format!("`{name}` has a dtype ddpbench's libtorch bindings do not know")),
        }
    }
    if !refused.is_empty() {
        let shown = refused.len().min(5);
        let more = match refused.len() - shown {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        bail!(
            "trainable parameter {}{more}: the gradient all-reduce sums float32, float64, float16 and bfloat16 \
             gradients only; make such a parameter one of these dtypes, or a buffer (requires_grad=False) \
             when it is not trained",
            refused[..shown].join(", ")
        );
    }
    Ok(dtypes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(kinds: &[(&str, Kind)]) -> Vec<(String, Tensor)> {
        kinds
            .iter()
            .map(|(n, k)| (n.to_string(), Tensor::zeros([3], (*k, tch::Device::Cpu))))
            .collect()
    }

    #[test]
    fn each_float_dtype_is_reducible_in_itself() {
        let got = gradient_dtypes(&named(&[
            ("a", Kind::Float),
            ("b", Kind::Half),
            ("c", Kind::Double),
            ("d", Kind::BFloat16),
        ]))
        .unwrap();
        assert_eq!(got, [ReduceDtype::Fp32, ReduceDtype::Fp16, ReduceDtype::Fp64, ReduceDtype::Bf16]);
        for d in ReduceDtype::ALL {
            assert_eq!(ReduceDtype::of(d.kind()), Some(d));
            assert_eq!(d.bytes(), d.kind().elt_size_in_bytes(), "{d:?}");
        }
    }

    #[test]
    fn complex_and_other_dtypes_are_refused_in_one_message_naming_each() {
        let e = gradient_dtypes(&named(&[
            ("fc.weight", Kind::Float),
            ("z", Kind::ComplexFloat),
            ("q", Kind::Float8e4m3fn),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("`z` is complex64, `q` is float8_e4m3fn:"), "{e}");
        assert!(!e.contains("fc.weight"), "{e}");
    }

    #[test]
    fn the_wire_dtype_casts_fp32_buckets_only() {
        assert_eq!(ReduceDtype::Fp32.on_wire(GradDtype::Bf16), ReduceDtype::Bf16);
        assert_eq!(ReduceDtype::Fp32.on_wire(GradDtype::Fp32), ReduceDtype::Fp32);
        for wire in [GradDtype::Fp32, GradDtype::Fp16, GradDtype::Bf16] {
            assert_eq!(ReduceDtype::Fp64.on_wire(wire), ReduceDtype::Fp64);
            assert_eq!(ReduceDtype::Fp16.on_wire(wire), ReduceDtype::Fp16);
            assert_eq!(ReduceDtype::Bf16.on_wire(wire), ReduceDtype::Bf16);
        }
    }
}
