//! The built-in networks: PyTorch examples/mnist's CNN, torchvision's ResNets (tch's
//! port), ResNet-18 for CIFAR-10 and the transformer classifiers, each a [`Net`] that
//! returns log-probabilities.

use super::{Net, PAD_TOKEN};
use tch::nn;
use tch::{Kind, Tensor};

/// A network given as a list of stages applied in turn.
pub(crate) struct Stages {
    name: &'static str,
    stages: Vec<nn::FuncT<'static>>,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({} stages)", self.name, self.stages.len())
    }
}

impl Net for Stages {
    fn forward_cut(&self, xs: &Tensor, train: bool, cut: &mut dyn FnMut(Tensor) -> Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for (i, stage) in self.stages.iter().enumerate() {
            if i > 0 {
                h = cut(h);
            }
            h = h.apply_t(stage, train);
        }
        h
    }
}

/// PyTorch examples/mnist `Net`: conv 1→32 3×3, conv 32→64 3×3, max-pool 2,
/// dropout 0.25, fc 9216→128, dropout 0.5, fc 128→10, log-softmax.
#[derive(Debug)]
pub(crate) struct MnistCnn {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
    fc1: nn::Linear,
    fc2: nn::Linear,
    dropout: bool,
}

impl MnistCnn {
    pub(crate) fn new(p: &nn::Path, dropout: bool) -> MnistCnn {
        MnistCnn {
            conv1: nn::conv2d(p / "conv1", 1, 32, 3, Default::default()),
            conv2: nn::conv2d(p / "conv2", 32, 64, 3, Default::default()),
            fc1: nn::linear(p / "fc1", 9216, 128, Default::default()),
            fc2: nn::linear(p / "fc2", 128, 10, Default::default()),
            dropout,
        }
    }
}

impl Net for MnistCnn {
    fn forward_cut(&self, xs: &Tensor, train: bool, cut: &mut dyn FnMut(Tensor) -> Tensor) -> Tensor {
        let drop = train && self.dropout;
        let h = xs.apply(&self.conv1).relu();
        let h = cut(h)
            .apply(&self.conv2)
            .relu()
            .max_pool2d_default(2)
            .dropout(0.25, drop)
            .flatten(1, -1);
        let h = cut(h).apply(&self.fc1).relu().dropout(0.5, drop);
        cut(h).apply(&self.fc2).log_softmax(-1, tch::Kind::Float)
    }
}

fn conv_bn(p: &nn::Path, c_in: i64, c_out: i64, k: i64, stride: i64, padding: i64) -> (nn::Conv2D, nn::BatchNorm) {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ..Default::default()
    };
    (
        nn::conv2d(p / "conv", c_in, c_out, k, cfg),
        nn::batch_norm2d(p / "bn", c_out, Default::default()),
    )
}

/// ResNet-18 for 32×32 inputs (CIFAR): 3×3 stem at stride 1, no max-pool.
pub(super) fn resnet18_cifar(p: &nn::Path, classes: i64) -> Stages {
    let (stem, stem_bn) = conv_bn(&(p / "stem"), 3, 64, 3, 1, 1);
    let mut blocks: Vec<nn::FuncT<'static>> = Vec::new();
    let mut c_in = 64;
    for (layer, (c_out, stride)) in [(64, 1), (128, 2), (256, 2), (512, 2)].into_iter().enumerate() {
        for block in 0..2 {
            let q = p / format!("layer{}", layer + 1) / block.to_string();
            let s = if block == 0 { stride } else { 1 };
            let (c1, b1) = conv_bn(&(&q / "1"), c_in, c_out, 3, s, 1);
            let (c2, b2) = conv_bn(&(&q / "2"), c_out, c_out, 3, 1, 1);
            let short = (s != 1 || c_in != c_out).then(|| conv_bn(&(&q / "shortcut"), c_in, c_out, 1, s, 0));
            blocks.push(nn::func_t(move |xs, train| {
                let ys = xs.apply(&c1).apply_t(&b1, train).relu().apply(&c2).apply_t(&b2, train);
                let skip = match &short {
                    Some((c, b)) => xs.apply(c).apply_t(b, train),
                    None => xs.shallow_clone(),
                };
                (ys + skip).relu()
            }));
            c_in = c_out;
        }
    }
    let fc = nn::linear(p / "fc", 512, classes, Default::default());
    let mut stages = vec![nn::func_t(move |xs, train| xs.apply(&stem).apply_t(&stem_bn, train).relu())];
    stages.extend(blocks);
    stages.push(nn::func_t(move |xs, _| {
        xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&fc).log_softmax(-1, Kind::Float)
    }));
    Stages {
        name: "resnet18-cifar",
        stages,
    }
}

/// torchvision's ResNet (as tch's port, with the same variable names, so checkpoints
/// interchange): a stage for the stem, one per residual block, one for the head.
pub(super) fn resnet_torchvision(p: &nn::Path, classes: i64, bottleneck: bool, counts: [i64; 4]) -> Stages {
    let conv = |p: nn::Path, c_in: i64, c_out: i64, k: i64, padding: i64, stride: i64| {
        let cfg = nn::ConvConfig {
            stride,
            padding,
            bias: false,
            ..Default::default()
        };
        nn::conv2d(p, c_in, c_out, k, cfg)
    };
    let bn = |p: nn::Path, c: i64| nn::batch_norm2d(p, c, Default::default());
    let conv1 = conv(p / "conv1", 3, 64, 7, 3, 2);
    let bn1 = bn(p / "bn1", 64);
    let mut stages = vec![nn::func_t(move |xs, train| {
        xs.apply(&conv1)
            .apply_t(&bn1, train)
            .relu()
            .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)
    })];
    let expansion = if bottleneck { 4 } else { 1 };
    let mut c_in = 64;
    for (layer, (width, stride)) in [(64, 1), (128, 2), (256, 2), (512, 2)].into_iter().enumerate() {
        for block in 0..counts[layer] {
            let q = p / format!("layer{}", layer + 1) / block.to_string();
            let s = if block == 0 { stride } else { 1 };
            let c_out = width * expansion;
            let down = (s != 1 || c_in != c_out).then(|| {
                (
                    conv(&q / "downsample" / "0", c_in, c_out, 1, 0, s),
                    bn(&q / "downsample" / "1", c_out),
                )
            });
            let skip = move |xs: &Tensor, train: bool| match &down {
                Some((c, b)) => xs.apply(c).apply_t(b, train),
                None => xs.shallow_clone(),
            };
            if bottleneck {
                let (c1, b1) = (conv(&q / "conv1", c_in, width, 1, 0, 1), bn(&q / "bn1", width));
                let (c2, b2) = (conv(&q / "conv2", width, width, 3, 1, s), bn(&q / "bn2", width));
                let (c3, b3) = (conv(&q / "conv3", width, c_out, 1, 0, 1), bn(&q / "bn3", c_out));
                stages.push(nn::func_t(move |xs, train| {
                    let ys = xs
                        .apply(&c1)
                        .apply_t(&b1, train)
                        .relu()
                        .apply(&c2)
                        .apply_t(&b2, train)
                        .relu()
                        .apply(&c3)
                        .apply_t(&b3, train);
                    (skip(xs, train) + ys).relu()
                }));
            } else {
                let (c1, b1) = (conv(&q / "conv1", c_in, width, 3, 1, s), bn(&q / "bn1", width));
                let (c2, b2) = (conv(&q / "conv2", width, width, 3, 1, 1), bn(&q / "bn2", width));
                stages.push(nn::func_t(move |xs, train| {
                    let ys = xs.apply(&c1).apply_t(&b1, train).relu().apply(&c2).apply_t(&b2, train);
                    (skip(xs, train) + ys).relu()
                }));
            }
            c_in = c_out;
        }
    }
    let fc = nn::linear(p / "fc", 512 * expansion, classes, Default::default());
    stages.push(nn::func_t(move |xs, _| {
        xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&fc).log_softmax(-1, Kind::Float)
    }));
    Stages {
        name: if bottleneck { "resnet-bottleneck" } else { "resnet-basic" },
        stages,
    }
}

/// Transformer encoder classifier: embedding + sinusoidal positions, `layers`
/// post-norm encoder layers (multi-head self-attention and a ReLU feed-forward,
/// each followed by dropout, a residual connection and LayerNorm, as PyTorch's
/// `nn.TransformerEncoderLayer`), mean over positions, linear head.
pub(crate) struct TransformerClassifier {
    embed: nn::Embedding,
    positions: Tensor,
    layers: Vec<EncoderLayer>,
    head: nn::Linear,
    d_model: i64,
    dropout: f64,
}

struct EncoderLayer {
    qkv: nn::Linear,
    out: nn::Linear,
    ff1: nn::Linear,
    ff2: nn::Linear,
    norm1: nn::LayerNorm,
    norm2: nn::LayerNorm,
    heads: i64,
}

/// Shape of a transformer model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TransformerShape {
    pub d_model: i64,
    pub layers: i64,
    pub heads: i64,
    pub feed_forward: i64,
}

pub(crate) const TRANSFORMER_SMALL: TransformerShape = TransformerShape {
    d_model: 128,
    layers: 2,
    heads: 4,
    feed_forward: 512,
};
pub(crate) const TRANSFORMER_MEDIUM: TransformerShape = TransformerShape {
    d_model: 256,
    layers: 4,
    heads: 8,
    feed_forward: 1024,
};

impl TransformerClassifier {
    pub(crate) fn new(
        p: &nn::Path,
        shape: TransformerShape,
        vocab: i64,
        seq_len: i64,
        classes: i64,
        dropout: f64,
    ) -> TransformerClassifier {
        let d = shape.d_model;
        let pos = Tensor::arange(seq_len, (Kind::Float, p.device())).unsqueeze(1);
        let div = (Tensor::arange_start_step(0, d, 2, (Kind::Float, p.device())) * (-(10000f64.ln()) / d as f64)).exp();
        let angles = pos * div.unsqueeze(0);
        let positions = Tensor::stack(&[angles.sin(), angles.cos()], 2).view([seq_len, d]);
        let layers = (0..shape.layers)
            .map(|i| {
                let q = p / format!("layer{i}");
                EncoderLayer {
                    qkv: nn::linear(&q / "qkv", d, 3 * d, Default::default()),
                    out: nn::linear(&q / "out", d, d, Default::default()),
                    ff1: nn::linear(&q / "ff1", d, shape.feed_forward, Default::default()),
                    ff2: nn::linear(&q / "ff2", shape.feed_forward, d, Default::default()),
                    norm1: nn::layer_norm(&q / "norm1", vec![d], Default::default()),
                    norm2: nn::layer_norm(&q / "norm2", vec![d], Default::default()),
                    heads: shape.heads,
                }
            })
            .collect();
        TransformerClassifier {
            embed: nn::embedding(p / "embed", vocab, d, Default::default()),
            positions,
            layers,
            head: nn::linear(p / "head", d, classes, Default::default()),
            d_model: d,
            dropout,
        }
    }
}

impl EncoderLayer {
    fn forward(&self, x: &Tensor, pad: &Tensor, dropout: f64, train: bool) -> Tensor {
        let (b, t, d) = x.size3().unwrap();
        let hd = d / self.heads;
        let qkv = x.apply(&self.qkv).view([b, t, 3, self.heads, hd]).permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let scores = q.matmul(&k.transpose(-2, -1)) / (hd as f64).sqrt();
        // Padding positions are never attended to.
        let scores = scores.masked_fill(&pad.view([b, 1, 1, t]), f64::NEG_INFINITY);
        let attn = scores.softmax(-1, Kind::Float).dropout(dropout, train);
        let ctx = attn.matmul(&v).transpose(1, 2).contiguous().view([b, t, d]).apply(&self.out);
        let x = (x + ctx.dropout(dropout, train)).apply(&self.norm1);
        let ff = x.apply(&self.ff1).relu().dropout(dropout, train).apply(&self.ff2);
        (&x + ff.dropout(dropout, train)).apply(&self.norm2)
    }
}

impl std::fmt::Debug for TransformerClassifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TransformerClassifier(d_model={}, layers={})", self.d_model, self.layers.len())
    }
}

impl Net for TransformerClassifier {
    fn forward_cut(&self, tokens: &Tensor, train: bool, cut: &mut dyn FnMut(Tensor) -> Tensor) -> Tensor {
        let t = tokens.size()[1];
        let pad = tokens.eq(PAD_TOKEN);
        let mut x = tokens.apply(&self.embed) * (self.d_model as f64).sqrt() + self.positions.narrow(0, 0, t).unsqueeze(0);
        x = x.dropout(self.dropout, train);
        for layer in &self.layers {
            x = layer.forward(&cut(x), &pad, self.dropout, train);
        }
        let x = cut(x);
        // Mean over the non-padding positions.
        let keep = pad.logical_not().unsqueeze(-1).to_kind(Kind::Float);
        let pooled = (x * &keep).sum_dim_intlist([1i64].as_slice(), false, Kind::Float)
            / keep.sum_dim_intlist([1i64].as_slice(), false, Kind::Float).clamp_min(1.0);
        pooled.apply(&self.head).log_softmax(-1, Kind::Float)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tensors::ordered_parameters;
    use crate::model::{build, spec, Input, ModelKind, ModelOptions};

    #[test]
    fn mnist_cnn_matches_pytorch_parameter_count_and_shapes() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let net = build(ModelKind::MnistCnn, &vs.root(), &ModelOptions::default());
        let params = ordered_parameters(&vs);
        let count: i64 = params.iter().map(|(_, t)| t.numel() as i64).sum();
        assert_eq!(count, 1_199_882);
        let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "conv1.bias",
                "conv1.weight",
                "conv2.bias",
                "conv2.weight",
                "fc1.bias",
                "fc1.weight",
                "fc2.bias",
                "fc2.weight"
            ]
        );
        let out = net.forward_t(&Tensor::zeros([3, 1, 28, 28], (tch::Kind::Float, tch::Device::Cpu)), false);
        assert_eq!(out.size(), [3, 10]);
    }

    fn count(kind: ModelKind, o: &ModelOptions) -> (i64, Box<dyn Net>) {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let net = build(kind, &vs.root(), o);
        (ordered_parameters(&vs).iter().map(|(_, t)| t.numel() as i64).sum(), net)
    }

    #[test]
    fn resnets_match_torchvision_parameter_counts() {
        let o = ModelOptions::default();
        // torchvision: resnet18 11,689,512; resnet50 25,557,032 (1000 classes).
        assert_eq!(count(ModelKind::Resnet18, &o).0, 11_689_512);
        assert_eq!(count(ModelKind::Resnet50, &o).0, 25_557_032);
        // CIFAR ResNet-18 (kuangliu/pytorch-cifar): 11,173,962.
        let (n, net) = count(ModelKind::Resnet18Cifar, &o);
        assert_eq!(n, 11_173_962);
        let out = net.forward_t(&Tensor::zeros([2, 3, 32, 32], (Kind::Float, tch::Device::Cpu)), false);
        assert_eq!(out.size(), [2, 10]);
    }

    #[test]
    fn resnets_keep_tchs_torchvision_variable_names_and_shapes() {
        for kind in [ModelKind::Resnet18, ModelKind::Resnet50] {
            let ours = nn::VarStore::new(tch::Device::Cpu);
            let _net = build(kind, &ours.root(), &ModelOptions::default());
            let theirs = nn::VarStore::new(tch::Device::Cpu);
            if kind == ModelKind::Resnet18 {
                let _ = tch::vision::resnet::resnet18(&theirs.root(), 1000);
            } else {
                let _ = tch::vision::resnet::resnet50(&theirs.root(), 1000);
            }
            let shapes = |vs: &nn::VarStore| -> Vec<(String, Vec<i64>)> {
                let mut v: Vec<_> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
                v.sort();
                v
            };
            assert_eq!(shapes(&ours), shapes(&theirs), "{kind:?}");
        }
    }

    #[test]
    fn every_model_has_stages_and_cuts_do_not_change_the_result() {
        let o = ModelOptions {
            seq_len: 8,
            vocab: 50,
            dropout: false,
        };
        for kind in [ModelKind::MnistCnn, ModelKind::Resnet18Cifar, ModelKind::TransformerSmall] {
            let _seeded = crate::torch_seed::seed(3);
            let vs = nn::VarStore::new(tch::Device::Cpu);
            let net = build(kind, &vs.root(), &o);
            let x = match spec(kind, &o).input {
                Input::Image([c, h, w]) => Tensor::randn([2, c, h, w], (Kind::Float, tch::Device::Cpu)),
                Input::Tokens { seq_len, vocab } => Tensor::randint(vocab, [2, seq_len], (Kind::Int64, tch::Device::Cpu)),
            };
            let mut cuts = 0;
            let cut_out = net.forward_cut(&x, false, &mut |t| {
                cuts += 1;
                t.detach().set_requires_grad(true)
            });
            let plain = net.forward_t(&x, false);
            assert!(cuts >= 3, "{kind:?}: {cuts} cuts");
            assert_eq!(f64::try_from((cut_out - plain).abs().max()).unwrap(), 0.0, "{kind:?}");
        }
    }

    #[test]
    fn transformers_have_the_seed_shapes() {
        let o = ModelOptions {
            seq_len: 16,
            vocab: 1000,
            dropout: false,
        };
        // Per layer: qkv d·3d+3d, out d²+d, ff 2·d·f+f+d, two LayerNorms 4d.
        let per_layer = |d: i64, f: i64| 3 * d * d + 3 * d + d * d + d + 2 * d * f + f + d + 4 * d;
        let small = 1000 * 128 + 2 * per_layer(128, 512) + 128 * 4 + 4;
        let medium = 1000 * 256 + 4 * per_layer(256, 1024) + 256 * 4 + 4;
        let (n, net) = count(ModelKind::TransformerSmall, &o);
        assert_eq!(n, small);
        assert_eq!(count(ModelKind::TransformerMedium, &o).0, medium);
        let tokens = Tensor::from_slice(&[5i64, 6, 7, 0, 0, 0, 9, 9, 9, 9, 9, 9]).view([2, 6]);
        let out = net.forward_t(&tokens, false);
        assert_eq!(out.size(), [2, 4]);
        // Log-probabilities: each row sums to 1 after exp; padding does not change a row's result.
        let probs = out.exp().sum_dim_intlist([1i64].as_slice(), false, Kind::Float);
        assert!((probs - 1.0).abs().max().double_value(&[]) < 1e-5);
        let longer = Tensor::from_slice(&[5i64, 6, 7, 0, 0, 0, 0, 0]).view([1, 8]);
        let a = net.forward_t(&tokens.narrow(0, 0, 1).narrow(1, 0, 3), false);
        let b = net.forward_t(&longer.narrow(1, 0, 3), false);
        assert!((a - b).abs().max().double_value(&[]) < 1e-6);
    }
}
