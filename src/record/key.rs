//! The comparison key: everything that changes the work of a step except the rank
//! count, the batch and the node types (each a dimension of a point of its own). Runs
//! with the same key, node types, ranks and batch are repeats of one point, and a point
//! is compared only with a 1-rank point of the same key: never with a substitute.
//!
//! The key records what ran, not what was typed: the device found, the threads each
//! rank bound, the backend `--allreduce auto` chose, the overlap in effect. `train`
//! computes it once and writes it into `manifest.json` as `comparison_key`; `reduce`
//! reads it there and derives it from the other fields of manifests written before it
//! existed ([`ComparisonKey::derive`]). Beside `TrainConfig`, `IN_KEY` and `NOT_IN_KEY`
//! say for every `train` flag whether it is a field here or why it does not change the
//! step, and a test fails on a flag in neither list.
//!
//! Fields added later (the memory format, the phase-timing mode, a model file's SHA-256,
//! never its path) take `#[serde(default)]` with what older runs ran with (contiguous
//! memory, ...) and are left out of [`ComparisonKey::describe`] at that value, as
//! `phase_sync`, `dropout`, `momentum` and `weight_decay` are: an older manifest then keeps
//! its key, and its text in `scaling.csv`.
//!
//! The enums of the key's settings are defined in [`super::settings`].

use super::settings::{
    AmpMode, Backend, DeviceKind, GradDtype, InputDtype, LossKind, MallocMode, MemoryFormat, NoiseScaleMode, OptimizerKind, Overlap,
    PhaseSync, Twin,
};
use super::{Manifest, RankInfo};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// A real number compared by its bits, so that a key holding one is `Eq`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Real(pub f64);

impl PartialEq for Real {
    fn eq(&self, other: &Real) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Real {}

/// `--momentum`'s default.
const DEFAULT_MOMENTUM: f64 = 0.9;

fn default_momentum() -> Real {
    Real(DEFAULT_MOMENTUM)
}

fn is_default_momentum(m: &Real) -> bool {
    *m == default_momentum()
}

fn is_zero(r: &Real) -> bool {
    r.0 == 0.0
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Everything that changes the work of a step, except the rank count, the batch and the
/// node types. `None`: a manifest from before the setting was recorded (such runs are
/// compared only with each other).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComparisonKey {
    /// The network, by the name `--model` gives it.
    pub model: String,
    /// The data set, by the name the run found it under.
    pub dataset: String,
    pub device: DeviceKind,
    /// Intra-op threads each rank bound: every value the ranks had, ascending.
    #[serde(rename = "threads")]
    pub threads_per_rank: Vec<usize>,
    pub optimizer: Option<OptimizerKind>,
    pub grad_accum: Option<usize>,
    pub bucket_mb: Option<Real>,
    pub overlap: Overlap,
    /// Gradients' dtype on the wire.
    pub grad_dtype: Option<GradDtype>,
    pub amp: Option<AmpMode>,
    pub backend: Backend,
    /// Threads preparing batches (after the default was resolved).
    pub workers: Option<usize>,
    pub seq_len: Option<usize>,
    pub vocab_size: Option<usize>,
    pub malloc: Option<MallocMode>,
    pub deterministic: Option<bool>,
    /// How phases were timed (absent: on, the device waited for at every boundary).
    #[serde(default, skip_serializing_if = "PhaseSync::is_on")]
    pub phase_sync: PhaseSync,
    /// Which steps took the gradient noise scale's norms, as `--noise-scale` asked
    /// (absent: off, or a run that recorded its key before this field, whose config
    /// says what it asked: [`Self::of`] reads it there). A 1-rank run without
    /// micro-batches takes no norms but keeps the flag, so that it stays the reference
    /// of the N-rank runs that asked for the same.
    #[serde(default, skip_serializing_if = "NoiseScaleMode::is_off")]
    pub noise_scale: NoiseScaleMode,
    /// The batch's and convolution weights' layout (absent: contiguous).
    #[serde(default, skip_serializing_if = "MemoryFormat::is_contiguous")]
    pub memory_format: MemoryFormat,
    /// False with `--no-dropout` (absent: true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub dropout: bool,
    /// 0 skips SGD's momentum buffer (absent: 0.9, the default).
    #[serde(default = "default_momentum", skip_serializing_if = "is_default_momentum")]
    pub momentum: Real,
    /// Above 0 adds the decay term to every update (absent: 0).
    #[serde(default = "zero", skip_serializing_if = "is_zero")]
    pub weight_decay: Real,
    /// A TorchScript model's sample shape ([`input_text`]; absent: a built-in network's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_shape: Option<String>,
    /// `none`: the TorchScript model computes its own loss (absent: log-softmax and NLL).
    #[serde(default, skip_serializing_if = "LossKind::is_nll")]
    pub loss: LossKind,
    /// The SHA-256 of a TorchScript model's file (absent: a built-in network): two files
    /// are never one workload, and one file is the same wherever it lies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_sha256: Option<String>,
    /// Environment variables that change what a run does (the test hooks, glibc's malloc
    /// settings), as `NAME=value`, every value any rank saw, ascending (absent: none set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// The trainer, when it is not ddpbench (absent: ddpbench).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Twin>,
    /// A DDP script's options that change its step besides `bucket_mb`, as `name=value`
    /// (`static_graph=true`, ...), in the recorder's order (absent: none, every run of
    /// ddpbench's own trainer and of the study's twin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ddp_options: Vec<String>,
}

/// The built-in networks that take token ids (`--seq-len` and `--vocab-size` shape them),
/// by the name the key records; `model`'s tests hold this list to the networks' inputs.
pub(crate) const TOKEN_MODELS: &[&str] = &["transformer-small", "transformer-medium"];

/// A TorchScript model's `--input-shape` as the key holds it, with its dtype when that
/// is not float32 (`3x224x224`, `int64 128`).
pub(crate) fn input_text(shape: &str, dtype: InputDtype) -> String {
    match dtype {
        InputDtype::Float32 => shape.to_string(),
        InputDtype::Int64 => format!("int64 {shape}"),
    }
}

/// The longest model or data set name a DDP script's run may give (`ddpbench_record`'s
/// `MAX_NAME`).
const MAX_SCRIPT_NAME: usize = 64;

/// Err naming the key's field when a DDP script's run names its model or data set with
/// anything but 1 to [`MAX_SCRIPT_NAME`] letters, digits, `-`, `_`, `.` or `+` (what the
/// recorder accepts), or holds a DDP option that is not `name=value` of those.
fn script_names(k: &ComparisonKey) -> Result<(), String> {
    let word = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b));
    for (field, name) in [("model", &k.model), ("dataset", &k.dataset)] {
        if name.is_empty() || name.len() > MAX_SCRIPT_NAME || !word(name) {
            return Err(format!(
                "comparison_key.{field} is {}: a DDP script's {field} name is 1 to {MAX_SCRIPT_NAME} letters, digits, \
                 '-', '_', '.' or '+'",
                shorten(&serde_json::json!(name))
            ));
        }
    }
    match k.ddp_options.iter().find(|o| {
        !o.split_once('=')
            .is_some_and(|(n, v)| word(n) && word(v) && o.len() <= MAX_SCRIPT_NAME)
    }) {
        Some(o) => Err(format!(
            "comparison_key.ddp_options holds {}: not a DDP option as name=value",
            shorten(&serde_json::json!(o))
        )),
        None => Ok(()),
    }
}

/// Whether `s` is a SHA-256 as the key writes it: 64 lowercase hexadecimal digits.
fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `s` is an input shape as [`input_text`] writes it (at most 64 characters).
fn is_input_text(s: &str) -> bool {
    let dims = s.strip_prefix("int64 ").unwrap_or(s);
    s.len() <= 64 && !dims.is_empty() && dims.split('x').all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

fn zero() -> Real {
    Real(0.0)
}

/// A setting as `describe` prints it: a string bare, a number or flag as JSON writes it
/// (`25.0`, `false`); None when it is not recorded.
fn text<T: Serialize>(v: &T) -> Option<String> {
    match serde_json::to_value(v).ok()? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s),
        other => Some(other.to_string()),
    }
}

impl ComparisonKey {
    /// The key in one line, as `scaling.csv` and `projection.csv` print it (model and
    /// data set have columns of their own); a setting that is not recorded, or at the
    /// value older runs had before it was a field, is left out.
    pub(crate) fn describe(&self) -> String {
        let threads: Vec<String> = self.threads_per_rank.iter().map(usize::to_string).collect();
        let settings = [
            ("optimizer", text(&self.optimizer)),
            ("grad_accum", text(&self.grad_accum)),
            ("bucket_mb", text(&self.bucket_mb)),
            ("overlap", text(&self.overlap)),
            ("grad_dtype", text(&self.grad_dtype)),
            ("amp", text(&self.amp)),
            ("backend", text(&self.backend)),
            ("workers", text(&self.workers)),
            ("seq_len", text(&self.seq_len)),
            ("vocab_size", text(&self.vocab_size)),
            ("malloc", text(&self.malloc)),
            ("deterministic", text(&self.deterministic)),
            ("phase_sync", (!self.phase_sync.is_on()).then(|| text(&self.phase_sync)).flatten()),
            ("noise_scale", (!self.noise_scale.is_off()).then(|| self.noise_scale.to_string())),
            (
                "memory_format",
                (!self.memory_format.is_contiguous()).then(|| text(&self.memory_format)).flatten(),
            ),
            ("dropout", (!self.dropout).then(|| "false".to_string())),
            (
                "momentum",
                (!is_default_momentum(&self.momentum)).then(|| text(&self.momentum)).flatten(),
            ),
            (
                "weight_decay",
                (!is_zero(&self.weight_decay)).then(|| text(&self.weight_decay)).flatten(),
            ),
            ("input_shape", self.input_shape.clone()),
            ("loss", (!self.loss.is_nll()).then(|| text(&self.loss)).flatten()),
            ("model_sha256", self.model_sha256.clone()),
            ("peer", self.peer.map(|p| p.name().to_string())),
            ("ddp_options", (!self.ddp_options.is_empty()).then(|| self.ddp_options.join(","))),
            ("env", (!self.env.is_empty()).then(|| self.env.join(","))),
        ];
        let mut out = format!("{} threads={}", text(&self.device).unwrap_or_default(), threads.join("/"));
        for (name, value) in settings {
            if let Some(v) = value {
                out.push_str(&format!(" {name}={v}"));
            }
        }
        out
    }

    /// The run's key: the one its manifest records, else derived from the manifest's other
    /// fields. Err names the key that holds what no run has.
    pub(crate) fn of(m: &Manifest) -> Result<ComparisonKey, String> {
        match &m.comparison_key {
            Some(k) if k.threads_per_rank.len() > m.ranks.len().max(1) => Err(format!(
                "comparison_key.threads lists {} values for {} ranks",
                k.threads_per_rank.len(),
                m.ranks.len()
            )),
            Some(k) if k.model_sha256.as_deref().is_some_and(|h| !is_sha256(h)) => Err(format!(
                "comparison_key.model_sha256 is {}: not a SHA-256 (64 hexadecimal digits)",
                shorten(&serde_json::json!(k.model_sha256))
            )),
            Some(k) if k.input_shape.as_deref().is_some_and(|s| !is_input_text(s)) => Err(format!(
                "comparison_key.input_shape is {}: not a sample shape (e.g. 3x224x224 or int64 128)",
                shorten(&serde_json::json!(k.input_shape))
            )),
            Some(k) => {
                if k.peer == Some(Twin::PytorchDdpScript) {
                    script_names(k)?;
                }
                let mut k = k.clone();
                if k.noise_scale.is_off() {
                    // Keys recorded before the field left it out whatever ran; the
                    // config records the flag as given, `off` included.
                    k.noise_scale = config(&m.config, "noise_scale")?.unwrap_or_default();
                }
                Ok(k.applicable())
            }
            None => ComparisonKey::derive(m),
        }
    }

    /// The key without the settings its model does not read: `seq_len` only for a
    /// built-in network that takes tokens, `vocab_size` for any model that takes tokens
    /// (a built-in transformer, or a TorchScript model with int64 input). Manifests that
    /// recorded them for every model read back as the same key as those that did not.
    pub(crate) fn applicable(mut self) -> ComparisonKey {
        let builtin_tokens = TOKEN_MODELS.contains(&self.model.as_str());
        let script_tokens = self.input_shape.as_deref().is_some_and(|s| s.starts_with("int64 "));
        if !builtin_tokens {
            self.seq_len = None;
        }
        if !(builtin_tokens || script_tokens) {
            self.vocab_size = None;
        }
        self
    }

    /// The key of a manifest written before `comparison_key` existed, from `config` (the
    /// flags as given), `comm` (what communication ran) and `ranks`, with only the fields
    /// its model reads ([`Self::applicable`]).
    pub fn derive(m: &Manifest) -> Result<ComparisonKey, String> {
        let c = &m.config;
        let no_dropout: Option<bool> = config(c, "no_dropout")?;
        Ok(ComparisonKey {
            model: m.model.clone(),
            dataset: m.dataset.clone(),
            device: DeviceKind::of_ranks(&m.ranks),
            threads_per_rank: threads_of(&m.ranks),
            optimizer: config(c, "optimizer")?,
            grad_accum: config(c, "grad_accum")?,
            bucket_mb: config(c, "bucket_mb")?,
            overlap: Overlap::in_effect(m.comm.overlap, m.comm.overlap_shares_core),
            grad_dtype: named(&m.comm.grad_dtype, "comm.grad_dtype")?,
            amp: named(&m.comm.amp, "comm.amp")?,
            backend: m.comm_backend,
            workers: config(c, "workers")?,
            seq_len: config(c, "seq_len")?,
            vocab_size: config(c, "vocab_size")?,
            malloc: config(c, "malloc")?,
            deterministic: config(c, "deterministic")?,
            phase_sync: config(c, "phase_sync")?.unwrap_or_default(),
            noise_scale: config(c, "noise_scale")?.unwrap_or_default(),
            memory_format: config(c, "memory_format")?.unwrap_or_default(),
            dropout: !no_dropout.unwrap_or(false),
            momentum: config(c, "momentum")?.unwrap_or_else(default_momentum),
            weight_decay: config(c, "weight_decay")?.unwrap_or_else(zero),
            input_shape: config::<String>(c, "input_shape")?
                .map(|shape| config(c, "input_dtype").map(|d| input_text(&shape, d.unwrap_or_default())))
                .transpose()?,
            loss: config(c, "loss")?.unwrap_or_default(),
            model_sha256: match &m.model_file {
                Some(f) if !is_sha256(&f.sha256) => {
                    return Err(format!(
                        "model_file.sha256 is {}: not a SHA-256",
                        shorten(&serde_json::json!(f.sha256))
                    ))
                }
                f => f.as_ref().map(|f| f.sha256.clone()),
            },
            peer: None,
            ddp_options: Vec::new(),
            env: env_of(&m.ranks),
        }
        .applicable())
    }
}

/// The run-changing environment every rank recorded (`RankInfo::run_env`), every
/// `NAME=value` once, ascending.
pub(crate) fn env_of(ranks: &[RankInfo]) -> Vec<String> {
    let mut e: Vec<String> = ranks.iter().flat_map(|r| r.run_env.iter().cloned()).collect();
    e.sort_unstable();
    e.dedup();
    e
}

/// One `train` flag that makes a run of a key ([`ComparisonKey::flags`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyFlag {
    /// `--flag value`.
    Value(&'static str, String),
    /// A switch: given (true) or left out (false).
    Switch(&'static str, bool),
}

impl KeyFlag {
    #[cfg(test)]
    pub(crate) fn flag(&self) -> &'static str {
        match self {
            KeyFlag::Value(f, _) | KeyFlag::Switch(f, _) => f,
        }
    }
}

impl ComparisonKey {
    /// The `train` flags that make a run of this key: each field as its flag with the
    /// value that ran (the pairs `train`'s `IN_KEY` lists), a setting not recorded left
    /// out. The model, the data set and a TorchScript model's input shape are not among
    /// them (a run names them by path, as it was given), nor the environment ([`Self::env`]).
    pub(crate) fn flags(&self) -> Vec<KeyFlag> {
        let value = |flag: &'static str, v: Option<String>| v.map(|v| KeyFlag::Value(flag, v));
        let threads = match self.threads_per_rank.as_slice() {
            [t] => Some(t.to_string()),
            _ => None,
        };
        [
            value("--device", text(&self.device)),
            value("--threads", threads),
            value("--optimizer", text(&self.optimizer)),
            value("--grad-accum", text(&self.grad_accum)),
            value("--bucket-mb", text(&self.bucket_mb)),
            value("--overlap", text(&self.overlap)),
            value("--grad-dtype", text(&self.grad_dtype)),
            value("--amp", text(&self.amp)),
            value("--allreduce", text(&self.backend)),
            value("--workers", text(&self.workers)),
            value("--seq-len", text(&self.seq_len)),
            value("--vocab-size", text(&self.vocab_size)),
            value("--malloc", text(&self.malloc)),
            self.deterministic.map(|d| KeyFlag::Switch("--deterministic", d)),
            value("--phase-sync", text(&self.phase_sync)),
            value("--noise-scale", Some(self.noise_scale.to_string())),
            value("--memory-format", text(&self.memory_format)),
            Some(KeyFlag::Switch("--no-dropout", !self.dropout)),
            value("--momentum", text(&self.momentum)),
            value("--weight-decay", text(&self.weight_decay)),
            value("--loss", text(&self.loss)),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The threads the ranks bound, every value once, ascending.
pub(crate) fn threads_of(ranks: &[RankInfo]) -> Vec<usize> {
    let mut t: Vec<usize> = ranks.iter().map(|r| r.threads).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// `config.<key>` as a `T`; None when absent or null. Err names the key and the value.
fn config<T: DeserializeOwned>(c: &serde_json::Value, key: &str) -> Result<Option<T>, String> {
    match c.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| format!("config.{key} is {}: not a value of --{} ({e})", shorten(v), key.replace('_', "-"))),
    }
}

/// A setting recorded as a name (`comm.grad_dtype`, `comm.amp`); None when empty.
fn named<T: DeserializeOwned>(name: &str, key: &str) -> Result<Option<T>, String> {
    if name.is_empty() {
        return Ok(None);
    }
    serde_json::from_value(serde_json::Value::String(name.into()))
        .map(Some)
        .map_err(|e| format!("{key} is {}: {e}", shorten(&serde_json::Value::String(name.into()))))
}

/// A value as JSON, at most 80 characters of it (a hostile one can be long).
fn shorten(v: &serde_json::Value) -> String {
    let t = v.to_string();
    match t.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &t[..at]),
        None => t,
    }
}

/// Runs are ordered by model, data set and the text of their key, as `scaling.csv` lists
/// their points; keys with the same text (there are none while `describe` shows every
/// field) by the rest of their fields.
impl Ord for ComparisonKey {
    fn cmp(&self, other: &ComparisonKey) -> Ordering {
        (&self.model, &self.dataset, self.describe())
            .cmp(&(&other.model, &other.dataset, other.describe()))
            .then_with(|| serde_json::to_string(self).ok().cmp(&serde_json::to_string(other).ok()))
    }
}

impl PartialOrd for ComparisonKey {
    fn partial_cmp(&self, other: &ComparisonKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A key with every field away from its default.
    pub(crate) fn unusual() -> ComparisonKey {
        ComparisonKey {
            model: "transformer-small".into(),
            dataset: "cifar10".into(),
            device: DeviceKind::Cuda,
            threads_per_rank: vec![2, 4],
            optimizer: Some(OptimizerKind::Lars),
            grad_accum: Some(2),
            bucket_mb: Some(Real(1.5)),
            overlap: Overlap::Force,
            grad_dtype: Some(GradDtype::Bf16),
            amp: Some(AmpMode::Fp16),
            backend: Backend::Nccl,
            workers: Some(3),
            seq_len: Some(64),
            vocab_size: Some(1000),
            malloc: Some(MallocMode::Default),
            deterministic: Some(true),
            phase_sync: PhaseSync::Events,
            noise_scale: NoiseScaleMode::Every(3),
            memory_format: MemoryFormat::ChannelsLast,
            dropout: false,
            momentum: Real(0.0),
            weight_decay: Real(1e-4),
            input_shape: Some("int64 128".into()),
            loss: LossKind::None,
            model_sha256: Some("ab".repeat(32)),
            env: vec!["DDPBENCH_SLOW_FORWARD=1:30".into()],
            peer: Some(Twin::PytorchDdp),
            ddp_options: vec!["static_graph=true".into()],
        }
    }

    /// A field added to the key shows in its text, so that runs it tells apart are told
    /// apart in scaling.csv too, and ordered as their text.
    #[test]
    fn describe_shows_every_field() {
        let k = unusual();
        let d = k.describe();
        assert!(d.starts_with("cuda threads=2/4 "), "{d}");
        let json = serde_json::to_value(&k).unwrap();
        let fields = json.as_object().unwrap();
        for name in fields
            .keys()
            .filter(|n| !["model", "dataset", "device", "threads"].contains(&n.as_str()))
        {
            assert!(d.contains(&format!(" {name}=")), "{name} is not in {d:?}");
        }
        assert_eq!(serde_json::from_value::<ComparisonKey>(json).unwrap(), k, "the key reads back");
    }

    #[test]
    fn force_and_off_are_different_keys() {
        assert_eq!(Overlap::in_effect(true, true), Overlap::Force);
        assert_eq!(Overlap::in_effect(true, false), Overlap::On);
        assert_eq!(Overlap::in_effect(false, true), Overlap::Off);
        let mut a = unusual();
        a.overlap = Overlap::Off;
        let b = unusual();
        assert_ne!(a, b);
        assert_ne!(a.cmp(&b), Ordering::Equal);
        assert!(a.describe().contains("overlap=off") && b.describe().contains("overlap=force"));
    }

    /// One name per backend: what schema 3 wrote (`mpi-cpu-staged`, the sweep's `staged`)
    /// reads as `mpi`, and only `mpi` is written.
    #[test]
    fn the_mpi_backend_has_one_name_and_old_names_read_as_it() {
        let m = manifest_with(unusual());
        assert_eq!(m.comm_backend, Backend::Mpi);
        assert_eq!(serde_json::to_value(&m).unwrap()["comm_backend"], "mpi");
        for old in ["mpi-cpu-staged", "staged", "mpi"] {
            assert_eq!(Backend::from_name(old), Ok(Backend::Mpi), "{old}");
        }
        let mut k = unusual();
        k.backend = Backend::from_name("mpi-cpu-staged").unwrap();
        assert!(k.describe().contains("backend=mpi "), "{}", k.describe());
        assert!(Backend::from_name("gloo").unwrap_err().contains("mpi, nccl or none"));
    }

    fn manifest_with(key: ComparisonKey) -> Manifest {
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "run_id": "r", "status": "completed", "ddpbench_version": "0", "libtorch_version": "0",
            "mpi_library": "", "command_line": [], "config": {}, "model": "net.pt", "dataset": "synthetic",
            "dataset_source": "", "parameters": 1, "gradient_bytes": 4, "comm_backend": "mpi-cpu-staged",
            "buckets": 1, "world_size": 2, "nodes": 1, "batch_size_per_rank": 1, "global_batch_size": 2,
            "steps_per_epoch": 1, "start_utc": "", "ranks": []
        }))
        .unwrap();
        m.comparison_key = Some(key);
        m
    }

    /// Two files are two workloads; a hash or shape no run writes is refused by name.
    #[test]
    fn a_model_files_hash_tells_files_apart_and_is_checked() {
        let mut k = unusual();
        k.threads_per_rank = vec![1];
        assert_eq!(ComparisonKey::of(&manifest_with(k.clone())), Ok(k.clone()));
        let mut other = k.clone();
        other.model_sha256 = Some("cd".repeat(32));
        assert_ne!(k, other);
        assert_ne!(k.describe(), other.describe());
        for (sha, shape, named) in [
            (Some("../../etc/passwd".to_string()), None, "comparison_key.model_sha256"),
            (Some("AB".repeat(32)), None, "comparison_key.model_sha256"),
            (None, Some("3x224x224; rm -rf".to_string()), "comparison_key.input_shape"),
            (None, Some("x".repeat(100)), "comparison_key.input_shape"),
        ] {
            let mut bad = k.clone();
            (bad.model_sha256, bad.input_shape) = (sha, shape);
            let err = ComparisonKey::of(&manifest_with(bad)).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
        let mut derived = manifest_with(k);
        derived.comparison_key = None;
        derived.model_file = Some(crate::record::ScriptFile {
            path: "net.pt".into(),
            bytes: 1,
            sha256: "not a hash".into(),
        });
        assert!(ComparisonKey::of(&derived).unwrap_err().contains("model_file.sha256"));
        derived.model_file.as_mut().unwrap().sha256 = "ef".repeat(32);
        assert_eq!(ComparisonKey::of(&derived).unwrap().model_sha256, Some("ef".repeat(32)));
    }

    /// Settings at the value runs had before they were fields are left out of the JSON
    /// and the text, and read back as that value.
    #[test]
    fn later_fields_default_to_what_older_runs_ran_with() {
        let mut k = unusual();
        (k.phase_sync, k.dropout, k.momentum, k.weight_decay) = (PhaseSync::On, true, Real(0.9), Real(0.0));
        k.noise_scale = NoiseScaleMode::Off;
        k.memory_format = MemoryFormat::Contiguous;
        (k.input_shape, k.loss, k.model_sha256, k.env, k.peer) = (None, LossKind::Nll, None, Vec::new(), None);
        k.ddp_options = Vec::new();
        let json = serde_json::to_value(&k).unwrap();
        for absent in [
            "phase_sync",
            "noise_scale",
            "memory_format",
            "dropout",
            "momentum",
            "weight_decay",
            "input_shape",
            "loss",
            "model_sha256",
            "env",
            "peer",
            "ddp_options",
        ] {
            assert!(json.get(absent).is_none(), "{absent} in {json}");
            assert!(!k.describe().contains(absent), "{}", k.describe());
        }
        assert_eq!(serde_json::from_value::<ComparisonKey>(json).unwrap(), k);
    }

    /// Runs that asked for different gradient norms are different keys, and a key
    /// recorded before it held the flag reads the flag from the run's config (what the
    /// run asked, `off` included), so those runs keep pooling with new ones.
    #[test]
    fn the_noise_scale_asked_for_is_part_of_the_key() {
        let mut on = unusual();
        on.threads_per_rank = vec![1];
        let mut off = on.clone();
        off.noise_scale = NoiseScaleMode::Off;
        assert_ne!(on, off);
        assert!(on.describe().contains(" noise_scale=every:3 "), "{}", on.describe());
        assert!(!off.describe().contains("noise_scale"), "{}", off.describe());
        assert!(on.flags().contains(&KeyFlag::Value("--noise-scale", "every:3".into())));
        assert!(off.flags().contains(&KeyFlag::Value("--noise-scale", "off".into())));
        for (asked, reads) in [
            (Some("every:10"), NoiseScaleMode::Every(10)),
            (Some("on"), NoiseScaleMode::Every(1)),
            (Some("off"), NoiseScaleMode::Off),
            (None, NoiseScaleMode::Off),
        ] {
            let mut m = manifest_with(off.clone());
            m.config = match asked {
                Some(a) => serde_json::json!({ "noise_scale": a }),
                None => serde_json::json!({}),
            };
            assert_eq!(ComparisonKey::of(&m).unwrap().noise_scale, reads, "recorded key, config {asked:?}");
            m.comparison_key = None;
            assert_eq!(ComparisonKey::derive(&m).unwrap().noise_scale, reads, "derived, config {asked:?}");
        }
        let mut m = manifest_with(off);
        m.config = serde_json::json!({ "noise_scale": "every:0" });
        assert!(ComparisonKey::of(&m).unwrap_err().contains("config.noise_scale"));
    }

    /// The transformer fields belong to models that take tokens: a ResNet's or a
    /// CNN's key has neither, whether its manifest recorded them (every run before) or
    /// not, so old and new runs of one workload have one key.
    #[test]
    fn a_key_holds_only_the_fields_its_model_reads() {
        let mut old = unusual();
        (old.model, old.input_shape, old.model_sha256) = ("resnet18".into(), None, None);
        old.threads_per_rank = vec![1];
        let m = manifest_with(old.clone());
        let read = ComparisonKey::of(&m).unwrap();
        assert_eq!((read.seq_len, read.vocab_size), (None, None));
        assert!(!read.describe().contains("seq_len") && !read.describe().contains("vocab_size"));
        let mut new = old.clone();
        (new.seq_len, new.vocab_size) = (None, None);
        assert_eq!(ComparisonKey::of(&manifest_with(new)).unwrap(), read);
        // Derived from an old manifest's config (no key recorded): the same.
        let mut derived = manifest_with(old.clone());
        derived.comparison_key = None;
        derived.model = "mnist-cnn".into();
        derived.config = serde_json::json!({"seq_len": 128, "vocab_size": 20000});
        let k = ComparisonKey::of(&derived).unwrap();
        assert_eq!((k.seq_len, k.vocab_size), (None, None));
        // A transformer keeps both; a TorchScript model of token ids keeps the vocabulary.
        let mut t = unusual();
        t.threads_per_rank = vec![1];
        let t = ComparisonKey::of(&manifest_with(t)).unwrap();
        assert_eq!((t.seq_len, t.vocab_size), (Some(64), Some(1000)));
        let mut script = unusual();
        script.threads_per_rank = vec![1];
        script.model = "net.pt".into();
        let s = ComparisonKey::of(&manifest_with(script.clone())).unwrap();
        assert_eq!((s.seq_len, s.vocab_size), (None, Some(1000)));
        script.input_shape = Some("3x32x32".into());
        let s = ComparisonKey::of(&manifest_with(script)).unwrap();
        assert_eq!((s.seq_len, s.vocab_size), (None, None));
    }

    /// A DDP script's run (`python/ddpbench_record`) names its trainer and its own model
    /// and data set: never ddpbench's run nor the twin's, its DDP options tell its runs
    /// apart, and a name that is no word is refused by the field that holds it.
    #[test]
    fn a_ddp_scripts_key_holds_its_own_names_and_refuses_others() {
        let mut k = unusual();
        k.threads_per_rank = vec![1];
        (k.model, k.dataset, k.peer) = ("my-vit_2.b+".into(), "fashion-mnist".into(), Some(Twin::PytorchDdpScript));
        let json = serde_json::to_value(&k).unwrap();
        assert_eq!(json["peer"], "pytorch-ddp-script");
        assert_eq!(ComparisonKey::of(&manifest_with(k.clone())), Ok(k.clone().applicable()));
        for other in [Some(Twin::PytorchDdp), None] {
            let mut o = k.clone();
            o.peer = other;
            assert_ne!(o, k);
        }
        let mut static_off = k.clone();
        static_off.ddp_options = vec!["static_graph=false".into()];
        assert_ne!(static_off, k);
        assert!(
            k.describe().contains(" peer=pytorch-ddp-script ddp_options=static_graph=true"),
            "{}",
            k.describe()
        );
        for (model, dataset, option, field) in [
            ("my vit", "d", "a=b", "comparison_key.model"),
            ("", "d", "a=b", "comparison_key.model"),
            ("m", "<script>", "a=b", "comparison_key.dataset"),
            ("m", &"x".repeat(65), "a=b", "comparison_key.dataset"),
            ("m", "d", "static_graph", "comparison_key.ddp_options"),
        ] {
            let mut bad = k.clone();
            (bad.model, bad.dataset, bad.ddp_options) = (model.into(), dataset.into(), vec![option.into()]);
            let err = ComparisonKey::of(&manifest_with(bad)).unwrap_err();
            assert!(err.contains(field), "{model:?} {dataset:?} {option:?}: {err}");
        }
    }

    /// A run-changing environment variable tells runs apart: a slowed rank is no repeat.
    #[test]
    fn the_environment_a_run_had_is_part_of_its_key() {
        let mut plain = unusual();
        plain.env.clear();
        let slowed = unusual();
        assert_ne!(plain, slowed);
        assert!(
            slowed.describe().ends_with(" env=DDPBENCH_SLOW_FORWARD=1:30"),
            "{}",
            slowed.describe()
        );
        // Derived for a manifest without a key: from what its ranks recorded.
        let mut m = manifest_with(plain);
        m.comparison_key = None;
        m.ranks = vec![
            RankInfo {
                run_env: vec!["DDPBENCH_SLOW_FORWARD=1:30".into()],
                ..Default::default()
            },
            RankInfo {
                rank: 1,
                run_env: vec!["DDPBENCH_SLOW_FORWARD=1:30".into()],
                ..Default::default()
            },
        ];
        assert_eq!(
            ComparisonKey::derive(&m).unwrap().env,
            vec!["DDPBENCH_SLOW_FORWARD=1:30".to_string()]
        );
    }
}
