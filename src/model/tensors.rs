//! Tensor utilities for a network's variables: their one order on every rank, their
//! memory format, saving them, and dtype names.

use crate::record::MemoryFormat;
use tch::nn;
use tch::{Kind, Tensor};

/// The name a user knows a libtorch dtype by (PyTorch's, as `torch.complex64`).
pub(crate) fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Uint8 => "uint8",
        Kind::Int8 => "int8",
        Kind::Int16 => "int16",
        Kind::Int => "int32",
        Kind::Int64 => "int64",
        Kind::Half => "float16",
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::ComplexHalf => "complex32",
        Kind::ComplexFloat => "complex64",
        Kind::ComplexDouble => "complex128",
        Kind::Bool => "bool",
        Kind::QInt8 => "qint8",
        Kind::QUInt8 => "quint8",
        Kind::QInt32 => "qint32",
        Kind::BFloat16 => "bfloat16",
        Kind::Float8e5m2 => "float8_e5m2",
        Kind::Float8e4m3fn => "float8_e4m3fn",
        Kind::Float8e5m2fnuz => "float8_e5m2fnuz",
        Kind::Float8e4m3fnuz => "float8_e4m3fnuz",
    }
}

/// `t` in `format`: with channels-last strides (NHWC in memory, NCHW in shape) when it is
/// 4-d and the format asks for it, else `t` itself. tch has no memory-format API; this is
/// what `torch.channels_last` makes: the permuted tensor made dense, permuted back.
pub(crate) fn in_format(t: &Tensor, format: MemoryFormat) -> Tensor {
    if format == MemoryFormat::ChannelsLast && t.dim() == 4 {
        t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
    } else {
        t.shallow_clone()
    }
}

/// Lays out every 4-d variable of `vs` (convolution weights) in `format`, in place: the
/// variables keep their identity (modules and the optimizer see the new layout).
pub(crate) fn set_memory_format(vs: &nn::VarStore, format: MemoryFormat) {
    if format == MemoryFormat::Contiguous {
        return;
    }
    tch::no_grad(|| {
        for (_, mut t) in vs.variables() {
            if t.dim() == 4 {
                let laid = in_format(&t, format);
                t.set_data(&laid);
            }
        }
    });
}

/// Writes every variable of `vs` to `path` (safetensors), dense row-major whatever its
/// layout in training, as the format requires.
pub(crate) fn save(vs: &nn::VarStore, path: &std::path::Path) -> Result<(), tch::TchError> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(n, t)| (n, t.contiguous())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::write_safetensors(&vars, path)
}

/// Non-trainable variables (BatchNorm running statistics) sorted by name.
pub fn ordered_buffers(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| !t.requires_grad()).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Trainable parameters sorted by name: the one order all ranks agree on.
pub fn ordered_parameters(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{build, ModelKind, ModelOptions};

    #[test]
    fn channels_last_lays_out_convolution_weights_and_batches_and_nothing_else() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let net = build(ModelKind::Resnet18Cifar, &vs.root(), &ModelOptions::default());
        let before: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(n, t)| (n, t.copy())).collect();
        set_memory_format(&vs, MemoryFormat::ChannelsLast);
        let vars = vs.variables();
        let mut convs = 0;
        for (name, old) in &before {
            let t = &vars[name];
            assert!(t.equal(old), "{name}: the values stay");
            if t.dim() == 4 {
                let size = t.size();
                let [_, c, h, w] = size[..] else { unreachable!() };
                // NHWC in memory; a dimension of size 1 (1×1 kernels) is never stepped.
                let want = [h * w * c, 1, w * c, c];
                for d in (0..4).filter(|&d| size[d] > 1) {
                    assert_eq!(t.stride()[d], want[d], "{name}: {:?} strides {:?}", size, t.stride());
                }
                convs += 1;
            } else {
                assert!(t.is_contiguous(), "{name}");
            }
        }
        assert_eq!(convs, 20, "resnet18-cifar's convolutions, the shortcuts' included");
        // The parameters the modules use are the laid-out ones.
        let x = in_format(
            &Tensor::randn([2, 3, 32, 32], (Kind::Float, tch::Device::Cpu)),
            MemoryFormat::ChannelsLast,
        );
        assert_eq!(x.stride(), vec![3072, 1, 96, 3]);
        assert_eq!(net.forward_t(&x, false).size(), vec![2, 10]);
        let tokens = Tensor::zeros([2, 8], (Kind::Int64, tch::Device::Cpu));
        assert_eq!(in_format(&tokens, MemoryFormat::ChannelsLast).stride(), vec![8, 1], "2-d stays");
        assert!(ModelKind::Resnet50.is_convolutional() && !ModelKind::TransformerSmall.is_convolutional());
    }
}
