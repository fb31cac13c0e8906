//! The networks. Each model is a small struct implementing `nn::ModuleT`; its
//! parameters are listed in one fixed order ([`ordered_parameters`]) because
//! `VarStore::variables()` is a HashMap whose order differs between processes.

use crate::cli::ModelKind;
use tch::nn::{self, ModuleT};
use tch::Tensor;

/// PyTorch examples/mnist `Net`: conv 1→32 3×3, conv 32→64 3×3, max-pool 2,
/// dropout 0.25, fc 9216→128, dropout 0.5, fc 128→10, log-softmax.
#[derive(Debug)]
pub struct MnistCnn {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
    fc1: nn::Linear,
    fc2: nn::Linear,
    dropout: bool,
}

impl MnistCnn {
    pub fn new(p: &nn::Path, dropout: bool) -> MnistCnn {
        MnistCnn {
            conv1: nn::conv2d(p / "conv1", 1, 32, 3, Default::default()),
            conv2: nn::conv2d(p / "conv2", 32, 64, 3, Default::default()),
            fc1: nn::linear(p / "fc1", 9216, 128, Default::default()),
            fc2: nn::linear(p / "fc2", 128, 10, Default::default()),
            dropout,
        }
    }
}

impl ModuleT for MnistCnn {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let drop = train && self.dropout;
        xs.apply(&self.conv1)
            .relu()
            .apply(&self.conv2)
            .relu()
            .max_pool2d_default(2)
            .dropout(0.25, drop)
            .flatten(1, -1)
            .apply(&self.fc1)
            .relu()
            .dropout(0.5, drop)
            .apply(&self.fc2)
            .log_softmax(-1, tch::Kind::Float)
    }
}

/// Static facts of a model.
pub struct ModelSpec {
    pub input_shape: [i64; 3],
    pub classes: i64,
}

pub fn spec(kind: ModelKind) -> ModelSpec {
    match kind {
        ModelKind::MnistCnn => ModelSpec { input_shape: [1, 28, 28], classes: 10 },
    }
}

/// Builds `kind` under `p`. The network returns log-probabilities.
pub fn build(kind: ModelKind, p: &nn::Path, dropout: bool) -> Box<dyn ModuleT> {
    match kind {
        ModelKind::MnistCnn => Box::new(MnistCnn::new(p, dropout)),
    }
}

/// Trainable parameters sorted by name: the one order all ranks agree on.
pub fn ordered_parameters(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mnist_cnn_matches_pytorch_parameter_count_and_shapes() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let net = build(ModelKind::MnistCnn, &vs.root(), true);
        let params = ordered_parameters(&vs);
        let count: i64 = params.iter().map(|(_, t)| t.numel() as i64).sum();
        assert_eq!(count, 1_199_882);
        let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight", "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
        let out = net.forward_t(&Tensor::zeros([3, 1, 28, 28], (tch::Kind::Float, tch::Device::Cpu)), false);
        assert_eq!(out.size(), [3, 10]);
    }
}
