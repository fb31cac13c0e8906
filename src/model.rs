//! The networks. Each model implements `nn::ModuleT` and returns log-probabilities;
//! its parameters are listed in one fixed order ([`ordered_parameters`]) because
//! `VarStore::variables()` is a HashMap whose order differs between processes.
//!
//! - `mnist-cnn`: PyTorch examples/mnist's CNN.
//! - `resnet18`, `resnet50`: torchvision's definitions (tch's port), 1000 classes.
//! - `resnet18-cifar`: 3×3 stem, stride 1, no max-pool, 10 classes.
//! - `transformer-small`/`-medium`: token embedding + sinusoidal positions, post-norm
//!   encoder layers, mean-pool, 4-class head.
//!
//! Or a TorchScript file saved from PyTorch ([`script`]), which returns class logits
//! (or its own loss), named by `--model path.pt` ([`ModelChoice`]).

pub(crate) mod choice;
pub(crate) mod script;

pub use choice::{InputDtype, InputShape, LossKind, ModelChoice};

use crate::record::MemoryFormat;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use tch::nn;
use tch::{Kind, Tensor};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// PyTorch examples/mnist CNN: 2 conv + 2 fc layers, 1,199,882 parameters.
    MnistCnn,
    /// torchvision ResNet-18, 224×224 inputs, 1000 classes.
    Resnet18,
    /// torchvision ResNet-50, 224×224 inputs, 1000 classes (25,557,032 parameters).
    Resnet50,
    /// ResNet-18 for CIFAR-10: 3×3 stem, no max-pool, 32×32 inputs, 10 classes.
    Resnet18Cifar,
    /// Transformer encoder classifier: d_model 128, 2 layers, 4 heads, feed-forward 512.
    TransformerSmall,
    /// Transformer encoder classifier: d_model 256, 4 layers, 8 heads, feed-forward 1024.
    TransformerMedium,
}

impl ModelKind {
    /// True for the networks that take images (convolutions): the ones `--memory-format
    /// channels-last` applies to.
    pub(crate) fn is_convolutional(self) -> bool {
        matches!(spec(self, &ModelOptions::default()).input, Input::Image(_))
    }
}

/// A network whose forward pass is cut into stages, so that backward can run stage by
/// stage and gradient buckets can leave while earlier stages are still in backward
/// (`--overlap on`). Every network returns log-probabilities.
pub trait Net: std::fmt::Debug {
    /// The forward pass; at each stage boundary the activation goes through `cut`, and
    /// what `cut` returns carries on. Stages are coarse (a block or layer each).
    fn forward_cut(&self, xs: &Tensor, train: bool, cut: &mut dyn FnMut(Tensor) -> Tensor) -> Tensor;

    /// The forward pass without cuts.
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.forward_cut(xs, train, &mut |t| t)
    }

    /// The TorchScript module this network is, if it is one: it cannot be cut into
    /// stages, returns logits (or its own loss), and its calls can fail.
    fn script(&self) -> Option<&script::ScriptNet> {
        None
    }
}

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
fn resnet18_cifar(p: &nn::Path, classes: i64) -> Stages {
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
fn resnet_torchvision(p: &nn::Path, classes: i64, bottleneck: bool, counts: [i64; 4]) -> Stages {
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

/// Token id of padding (0) and of words outside the vocabulary (1).
pub(crate) const PAD_TOKEN: i64 = 0;
pub(crate) const UNK_TOKEN: i64 = 1;

/// What a model takes as input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Images, channels × height × width, f32.
    Image([i64; 3]),
    /// Token ids (i64), padded or truncated to `seq_len`, ids below `vocab`.
    Tokens { seq_len: i64, vocab: i64 },
}

/// Static facts of a model.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    pub input: Input,
    pub classes: i64,
}

/// Sizes a model depends on (sequence length and vocabulary for transformers).
#[derive(Debug, Clone, Copy)]
pub struct ModelOptions {
    pub seq_len: i64,
    pub vocab: i64,
    pub dropout: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            seq_len: 128,
            vocab: 20_000,
            dropout: true,
        }
    }
}

pub(crate) fn spec(kind: ModelKind, o: &ModelOptions) -> ModelSpec {
    match kind {
        ModelKind::MnistCnn => ModelSpec {
            input: Input::Image([1, 28, 28]),
            classes: 10,
        },
        ModelKind::Resnet18 | ModelKind::Resnet50 => ModelSpec {
            input: Input::Image([3, 224, 224]),
            classes: 1000,
        },
        ModelKind::Resnet18Cifar => ModelSpec {
            input: Input::Image([3, 32, 32]),
            classes: 10,
        },
        ModelKind::TransformerSmall | ModelKind::TransformerMedium => ModelSpec {
            input: Input::Tokens {
                seq_len: o.seq_len,
                vocab: o.vocab,
            },
            classes: 4,
        },
    }
}

/// Builds `kind` under `p`. Every network returns log-probabilities.
pub(crate) fn build(kind: ModelKind, p: &nn::Path, o: &ModelOptions) -> Box<dyn Net> {
    let classes = spec(kind, o).classes;
    let p_drop = if o.dropout { 0.1 } else { 0.0 };
    match kind {
        ModelKind::MnistCnn => Box::new(MnistCnn::new(p, o.dropout)),
        ModelKind::Resnet18 => Box::new(resnet_torchvision(p, classes, false, [2, 2, 2, 2])),
        ModelKind::Resnet50 => Box::new(resnet_torchvision(p, classes, true, [3, 4, 6, 3])),
        ModelKind::Resnet18Cifar => Box::new(resnet18_cifar(p, classes)),
        ModelKind::TransformerSmall => Box::new(TransformerClassifier::new(
            p,
            TRANSFORMER_SMALL,
            o.vocab,
            o.seq_len,
            classes,
            p_drop,
        )),
        ModelKind::TransformerMedium => Box::new(TransformerClassifier::new(
            p,
            TRANSFORMER_MEDIUM,
            o.vocab,
            o.seq_len,
            classes,
            p_drop,
        )),
    }
}

/// `ddpbench models` options.
#[derive(Args, Debug, Clone)]
pub struct ModelsArgs {
    /// A TorchScript file saved from PyTorch: print its parameter count, gradient bytes,
    /// buffer values and SHA-256 instead of the built-in networks.
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// Sequence length assumed for transformer models.
    #[arg(long, default_value_t = 128)]
    pub seq_len: usize,
    /// Vocabulary size assumed for transformer models.
    #[arg(long, default_value_t = 20_000)]
    pub vocab_size: usize,
}

/// Entry point of `ddpbench models`.
pub fn main(args: ModelsArgs) -> anyhow::Result<()> {
    if let Some(file) = &args.file {
        return describe_file(file);
    }
    list(&ModelOptions {
        seq_len: args.seq_len as i64,
        vocab: args.vocab_size as i64,
        dropout: true,
    });
    Ok(())
}

/// The flags that describe a TorchScript model's data and loss (`--input-shape`,
/// `--input-dtype`, `--num-classes`, `--loss`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShapeFlags<'a> {
    pub input_shape: Option<&'a InputShape>,
    pub input_dtype: InputDtype,
    pub num_classes: Option<usize>,
    pub loss: LossKind,
}

/// Largest `--num-classes`.
pub(crate) const MAX_CLASSES: usize = 1_000_000;

/// What the model `choice` takes and predicts: a built-in network's own (the shape flags,
/// when given, must say the same), or a file's from the flags, which it then needs.
pub(crate) fn resolve_spec(choice: &ModelChoice, flags: &ShapeFlags, o: &ModelOptions) -> Result<ModelSpec, String> {
    let name = choice.name();
    if let Some(c) = flags.num_classes.filter(|c| !(1..=MAX_CLASSES).contains(c)) {
        return Err(format!("--num-classes {c}: must be 1 to {MAX_CLASSES} classes"));
    }
    let asked = flags.input_shape.map(|s| s.input(flags.input_dtype, o.vocab)).transpose()?;
    match choice {
        ModelChoice::Builtin(kind) => {
            let own = spec(*kind, o);
            if asked.is_some_and(|a| a != own.input) {
                return Err(format!(
                    "--model {name} takes {}; --input-shape and --input-dtype describe a TorchScript model's input: \
                     leave them out, or give that shape",
                    choice::input_text(&own.input)
                ));
            }
            if flags.num_classes.is_some_and(|c| c as i64 != own.classes) {
                return Err(format!("--model {name} predicts {} classes: leave --num-classes out", own.classes));
            }
            if !flags.loss.is_nll() {
                return Err(format!(
                    "--loss none is for a TorchScript model that computes its own loss; --model {name} is trained \
                     with log-softmax and NLL (leave --loss out)"
                ));
            }
            Ok(own)
        }
        ModelChoice::File(_) => {
            let input = asked.ok_or_else(|| {
                format!("--model {name} needs --input-shape: the shape of one sample its forward takes, without the batch (e.g. 3x224x224)")
            })?;
            let classes = flags
                .num_classes
                .ok_or_else(|| format!("--model {name} needs --num-classes: the width of the logits it returns (the labels' classes)"))?;
            Ok(ModelSpec {
                input,
                classes: classes as i64,
            })
        }
    }
}

/// Builds (or loads) the network `choice` names under `p`.
/// `spec` and `loss` are a file's ([`resolve_spec`], `--loss`).
pub fn build_choice(
    choice: &ModelChoice,
    p: &nn::Path,
    o: &ModelOptions,
    spec: &ModelSpec,
    loss: LossKind,
) -> anyhow::Result<Box<dyn Net>> {
    match choice {
        ModelChoice::Builtin(kind) => Ok(build(*kind, p, o)),
        ModelChoice::File(path) => {
            let file = script::ScriptFile::read(path)?;
            Ok(Box::new(script::ScriptNet::load(file, p, loss, spec.classes)?))
        }
    }
}

/// `ddpbench models --file net.pt`: the file's parameter count and gradient bytes (each
/// parameter's gradient takes its parameter's dtype), then one line per dtype.
pub(crate) fn describe_file(path: &std::path::Path) -> anyhow::Result<()> {
    let file = script::ScriptFile::read(path)?;
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _net = script::ScriptNet::load(file.clone(), &vs.root(), LossKind::Nll, 1)?;
    let params = ordered_parameters(&vs);
    let buffers: i64 = ordered_buffers(&vs).iter().map(|(_, t)| t.numel() as i64).sum();
    let by_dtype = gradient_bytes_by_dtype(&params);
    let (n, bytes) = by_dtype.iter().fold((0, 0), |(n, b), (_, (pn, pb))| (n + pn, b + pb));
    println!(
        "{:<20} {:>14} {:>16} {:>14}  sha256",
        "file", "parameters", "gradient bytes", "buffer values"
    );
    println!(
        "{:<20} {:>14} {:>16} {:>14}  {}",
        ModelChoice::File(path.to_path_buf()).name(),
        n,
        bytes,
        buffers,
        file.sha256
    );
    for (dtype, (n, bytes)) in by_dtype {
        println!("  {dtype:<18} {n:>14} {bytes:>16}");
    }
    Ok(())
}

/// Per dtype of `params` (by name, in the order first met): its parameters' elements
/// and their gradients' bytes (a gradient has its parameter's dtype).
pub(crate) fn gradient_bytes_by_dtype(params: &[(String, Tensor)]) -> Vec<(&'static str, (usize, usize))> {
    let mut out: Vec<(&'static str, (usize, usize))> = Vec::new();
    for (_, t) in params {
        // A dtype the bindings do not know: named as such, its bytes as libtorch views them.
        let (name, elem) = match t.f_kind() {
            Ok(k) => (dtype_name(k), k.elt_size_in_bytes()),
            Err(_) => {
                let bytes = t.reshape([-1]).f_view_dtype(Kind::Uint8).map_or(0, |b| b.numel());
                ("unknown dtype", bytes / t.numel().max(1))
            }
        };
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, (n, b))) => {
                *n += t.numel();
                *b += t.numel() * elem;
            }
            None => out.push((name, (t.numel(), t.numel() * elem))),
        }
    }
    out
}

/// A built-in model's gradient bytes at fp32 (its parameters × 4), as `ddpbench models`
/// prints them.
pub(crate) fn gradient_bytes_of(kind: ModelKind) -> u64 {
    4 * parameter_count(kind, &ModelOptions::default())
}

/// A built-in model's parameter count, from the network built on CPU.
fn parameter_count(kind: ModelKind, o: &ModelOptions) -> u64 {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _net = build(kind, &vs.root(), o);
    ordered_parameters(&vs).iter().map(|(_, t)| t.numel() as u64).sum()
}

/// `ddpbench models`: every model with its parameter count and gradient bytes.
pub(crate) fn list(o: &ModelOptions) {
    println!(
        "{:<20} {:>14} {:>16}  {:<18} classes",
        "model", "parameters", "gradient bytes", "input"
    );
    for kind in ModelKind::value_variants() {
        let n = parameter_count(*kind, o);
        let s = spec(*kind, o);
        let input = match s.input {
            Input::Image([c, h, w]) => format!("{c}×{h}×{w} image"),
            Input::Tokens { seq_len, vocab } => format!("{seq_len} tokens of {vocab}"),
        };
        let name = kind.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
        println!("{:<20} {:>14} {:>16}  {:<18} {}", name, n, 4 * n, input, s.classes);
    }
}

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

    /// The comparison key keeps `--seq-len` and `--vocab-size` for the built-ins its list
    /// names: exactly the networks that take token ids.
    #[test]
    fn the_key_names_every_network_that_takes_tokens() {
        for &k in ModelKind::value_variants() {
            let name = k.to_possible_value().unwrap().get_name().to_string();
            let tokens = matches!(spec(k, &ModelOptions::default()).input, Input::Tokens { .. });
            assert_eq!(crate::record::key::TOKEN_MODELS.contains(&name.as_str()), tokens, "{name}");
        }
    }

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
