//! `ddpbench models`: every built-in network's parameter count and gradient bytes, or
//! a TorchScript file's.

use super::tensors::{dtype_name, ordered_buffers, ordered_parameters};
use super::{build, script, spec, Input, LossKind, ModelChoice, ModelKind, ModelOptions};
use clap::{Args, ValueEnum};
use tch::nn;
use tch::{Kind, Tensor};

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
