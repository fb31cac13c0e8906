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
mod command;
mod nets;
pub(crate) mod script;
mod tensors;

pub use choice::{InputDtype, InputShape, LossKind, ModelChoice};
pub(crate) use command::gradient_bytes_of;
pub use command::{main, ModelsArgs};
pub(crate) use tensors::{dtype_name, in_format, save, set_memory_format};
pub use tensors::{ordered_buffers, ordered_parameters};

use clap::ValueEnum;
use nets::{resnet18_cifar, resnet_torchvision, MnistCnn, TransformerClassifier, TRANSFORMER_MEDIUM, TRANSFORMER_SMALL};
use serde::{Deserialize, Serialize};
use tch::nn;
use tch::Tensor;

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
}
