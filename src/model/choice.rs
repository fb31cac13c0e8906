//! What `--model` and the flags that shape a TorchScript model's data say: a built-in
//! network or a file ([`ModelChoice`]), the sample shape (`--input-shape`,
//! `--input-dtype`), and the loss (`--loss`).

use super::{Input, ModelKind};
use clap::ValueEnum;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::PathBuf;
use std::str::FromStr;

/// The network `--model` names: a built-in one, or a TorchScript file saved from PyTorch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    Builtin(ModelKind),
    File(PathBuf),
}

impl Default for ModelChoice {
    fn default() -> Self {
        ModelChoice::Builtin(ModelKind::MnistCnn)
    }
}

/// The built-in networks' names, for messages.
pub(crate) fn builtin_names() -> String {
    ModelKind::value_variants()
        .iter()
        .filter_map(|k| k.to_possible_value().map(|v| v.get_name().to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl ModelChoice {
    /// A built-in name, else a file: what a manifest's config holds is read back as
    /// what it was, whether or not the file is still there.
    fn lenient(s: &str) -> ModelChoice {
        match ModelKind::from_str(s, false) {
            Ok(k) => ModelChoice::Builtin(k),
            Err(_) => ModelChoice::File(PathBuf::from(s)),
        }
    }

    /// The name reports show: the built-in's, or the file's name without its folder
    /// (a run is compared by the file's SHA-256, never by where it lay).
    pub(crate) fn name(&self) -> String {
        match self {
            ModelChoice::Builtin(k) => k.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default(),
            ModelChoice::File(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.to_string_lossy().into_owned()),
        }
    }

    /// A built-in convolution network (a file's layers are not known in advance: its
    /// layout is contiguous unless `--memory-format` says otherwise).
    pub(crate) fn is_convolutional(&self) -> bool {
        matches!(self, ModelChoice::Builtin(k) if k.is_convolutional())
    }
}

impl std::fmt::Display for ModelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelChoice::Builtin(_) => f.write_str(&self.name()),
            ModelChoice::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl FromStr for ModelChoice {
    type Err = String;

    /// A built-in name; else a path that ends in `.pt` or names a file.
    fn from_str(s: &str) -> Result<ModelChoice, String> {
        match ModelChoice::lenient(s) {
            ModelChoice::File(p) if !(s.ends_with(".pt") || p.is_file()) => Err(format!(
                "{s:?} is neither a built-in network ({}) nor a TorchScript file (a path ending in .pt, or a file \
                 that exists): see `ddpbench models`",
                builtin_names()
            )),
            choice => Ok(choice),
        }
    }
}

impl Serialize for ModelChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ModelChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ModelChoice, D::Error> {
        Ok(ModelChoice::lenient(&String::deserialize(d)?))
    }
}

/// The input's element type and the loss are settings of the comparison key, defined
/// with it so that `record` needs no `model`.
pub use crate::record::settings::{InputDtype, LossKind};

/// Largest extent of one dimension of `--input-shape`.
pub(crate) const MAX_DIM: i64 = 1 << 20;
/// Largest sample `--input-shape` may describe: 256 MiB, the pool synthetic data holds.
pub(crate) const MAX_SAMPLE_BYTES: i64 = 256 << 20;

/// One sample's shape, without the batch dimension (`3x224x224`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputShape(pub Vec<i64>);

impl FromStr for InputShape {
    type Err = String;

    fn from_str(s: &str) -> Result<InputShape, String> {
        let dims: Result<Vec<i64>, _> = s.split(['x', 'X', '×']).map(|d| d.trim().parse::<i64>()).collect();
        match dims {
            Ok(d) if !d.is_empty() && d.len() <= 4 && d.iter().all(|&n| (1..=MAX_DIM).contains(&n)) => Ok(InputShape(d)),
            _ => Err(format!(
                "{s:?}: a sample's shape without the batch, 1 to 4 whole numbers from 1 to {MAX_DIM} joined by 'x' \
                 (3x224x224 for images, 128 for 128 tokens)"
            )),
        }
    }
}

impl std::fmt::Display for InputShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = self.0.iter().map(i64::to_string).collect();
        f.write_str(&dims.join("x"))
    }
}

impl Serialize for InputShape {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for InputShape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<InputShape, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl InputShape {
    /// The model input this shape and dtype make: C×H×W images of f32, or a sequence of
    /// token ids below `vocab`. Err says which shapes ddpbench can feed.
    pub(crate) fn input(&self, dtype: InputDtype, vocab: i64) -> Result<Input, String> {
        match (dtype, self.0.as_slice()) {
            (InputDtype::Float32, &[c, h, w]) if c * h * w * 4 <= MAX_SAMPLE_BYTES => Ok(Input::Image([c, h, w])),
            (InputDtype::Float32, &[_, _, _]) => Err(format!(
                "--input-shape {self}: a sample of more than {} MiB",
                MAX_SAMPLE_BYTES >> 20
            )),
            (InputDtype::Float32, _) => Err(format!(
                "--input-shape {self} with --input-dtype float32: ddpbench feeds images, channels × height × width \
                 (three numbers, e.g. 3x224x224); for token ids use --input-dtype int64 with the sequence length"
            )),
            (InputDtype::Int64, &[seq_len]) => Ok(Input::Tokens { seq_len, vocab }),
            (InputDtype::Int64, _) => Err(format!(
                "--input-shape {self} with --input-dtype int64: token ids take one number, the sequence length (e.g. 128)"
            )),
        }
    }
}

/// An input as `--input-shape` and `--input-dtype` would write it (`3x224x224`, `int64 128`).
pub(crate) fn input_text(input: &Input) -> String {
    // The comparison key's spelling, so a model's input and a run's key read alike.
    match *input {
        Input::Image([c, h, w]) => crate::record::key::input_text(&format!("{c}x{h}x{w}"), InputDtype::Float32),
        Input::Tokens { seq_len, .. } => crate::record::key::input_text(&seq_len.to_string(), InputDtype::Int64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_and_files_parse_apart() {
        assert_eq!("resnet50".parse(), Ok(ModelChoice::Builtin(ModelKind::Resnet50)));
        assert_eq!("nets/my.pt".parse(), Ok(ModelChoice::File(PathBuf::from("nets/my.pt"))));
        let err = "resnet5".parse::<ModelChoice>().unwrap_err();
        assert!(err.contains("neither a built-in network") && err.contains("resnet50"), "{err}");
        let f = ModelChoice::File(PathBuf::from("/a/b/net.pt"));
        assert_eq!(f.name(), "net.pt");
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json, "/a/b/net.pt");
        assert_eq!(serde_json::from_value::<ModelChoice>(json).unwrap(), f);
        assert_eq!(serde_json::to_value(ModelChoice::default()).unwrap(), "mnist-cnn");
    }

    #[test]
    fn input_shapes_parse_within_bounds() {
        let s: InputShape = "3x224x224".parse().unwrap();
        assert_eq!(s.0, [3, 224, 224]);
        assert_eq!(s.input(InputDtype::Float32, 10), Ok(Input::Image([3, 224, 224])));
        assert_eq!(
            "128".parse::<InputShape>().unwrap().input(InputDtype::Int64, 500),
            Ok(Input::Tokens { seq_len: 128, vocab: 500 })
        );
        for bad in ["", "3x", "0x2x2", "-1", "1x2x3x4x5", "3x224x99999999"] {
            assert!(bad.parse::<InputShape>().is_err(), "{bad}");
        }
        assert!("16000".parse::<InputShape>().unwrap().input(InputDtype::Float32, 10).is_err());
        assert!("4096x4096x8".parse::<InputShape>().unwrap().input(InputDtype::Float32, 10).is_err());
        assert_eq!(input_text(&Input::Image([1, 28, 28])), "1x28x28");
    }
}
