//! A network saved from PyTorch as TorchScript (`torch.jit.script(net).save("net.pt")`):
//! its parameters and buffers registered in the run's `VarStore` (so they become the
//! gradient buckets and are broadcast from rank 0 like a built-in network's), trained
//! through the module's own forward. The module is a black box: it cannot be cut into
//! stages, so backward never overlaps the all-reduce ([`UNCUT_NOTE`]).
//!
//! libtorch is reached through `script_shim.cpp`, since tch 0.24 lists a module's
//! parameters but not its buffers, and its forward fails alike for every non-tensor.

use super::choice::LossKind;
use super::{Input, Net};
use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::Read;
use std::path::Path;
use std::ptr::NonNull;
use tch::{nn, Device, Kind, Tensor};

/// What the run's notes and manifest say when `--overlap` asked for overlap.
pub(crate) const UNCUT_NOTE: &str = "overlap off: a TorchScript module is one black box that backward cannot be cut \
    into stages, so every bucket is all-reduced after backward";

/// Largest TorchScript file loaded (libtorch reads it whole into memory).
pub(crate) const MAX_FILE_BYTES: u64 = 16 << 30;

type NamedFn = extern "C" fn(data: *mut c_void, name: *const c_char, tensor: *mut c_void);

extern "C" {
    fn ddpbench_script_free_text(text: *mut c_char);
    fn ddpbench_script_load(path: *const c_char, device: c_int, err: *mut *mut c_char) -> *mut c_void;
    fn ddpbench_script_free(module: *mut c_void);
    fn ddpbench_script_set_train(module: *mut c_void, on: c_int, err: *mut *mut c_char) -> c_int;
    fn ddpbench_script_named(module: *mut c_void, buffers: c_int, data: *mut c_void, f: NamedFn, err: *mut *mut c_char) -> c_int;
    fn ddpbench_script_forward(
        module: *mut c_void,
        inputs: *const *mut c_void,
        n: c_int,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn ddpbench_script_save(module: *mut c_void, path: *const c_char, err: *mut *mut c_char) -> c_int;
}

/// The text of a shim error (freed here), or "" when there is none.
fn take_text(err: *mut c_char) -> String {
    if err.is_null() {
        return String::new();
    }
    // SAFETY: the shim returns a NUL-terminated malloc'd copy, freed once, here.
    let text = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { ddpbench_script_free_text(err) };
    text
}

/// What a libtorch error says, without its C++ backtrace: for an error inside the
/// TorchScript interpreter its last line (the operation's own message), else the text
/// before libtorch's "Exception raised from" trailer; at most 500 characters.
pub(crate) fn cause(text: &str) -> String {
    let text = text.split("\nException raised from").next().unwrap_or(text).trim();
    let line = if text.contains("TorchScript interpreter") || text.contains("Traceback of TorchScript") {
        text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(text).trim()
    } else {
        text
    };
    let one: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
    match one.char_indices().nth(500) {
        Some((at, _)) => format!("{}...", &one[..at]),
        None => one,
    }
}

/// A loaded TorchScript module (owned; freed on drop).
struct Module(NonNull<c_void>);

extern "C" fn push_named(data: *mut c_void, name: *const c_char, tensor: *mut c_void) {
    // SAFETY: `data` is the Vec passed by `named`; `tensor` a new at::Tensor we now own.
    let list = unsafe { &mut *(data as *mut Vec<(String, Tensor)>) };
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    list.push((name, unsafe { Tensor::from_ptr(tensor as *mut torch_sys::C_tensor) }));
}

impl Module {
    fn load(path: &Path, device: Device) -> Result<Module, String> {
        let index = match device {
            Device::Cpu => -1,
            Device::Cuda(i) => i as c_int,
            other => return Err(format!("TorchScript files run on CPU or CUDA, not {other:?}")),
        };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "the path holds a NUL byte".to_string())?;
        let mut err = std::ptr::null_mut();
        // SAFETY: a valid C string and out-pointer; the shim catches every exception.
        let m = unsafe { ddpbench_script_load(c_path.as_ptr(), index, &mut err) };
        NonNull::new(m).map(Module).ok_or_else(|| cause(&take_text(err)))
    }

    /// Parameters (or buffers) with their dotted names, in the module's order.
    fn named(&self, buffers: bool) -> Result<Vec<(String, Tensor)>, String> {
        let mut list: Vec<(String, Tensor)> = Vec::new();
        let mut err = std::ptr::null_mut();
        // SAFETY: `push_named` casts `data` back to this Vec, which outlives the call.
        let rc = unsafe {
            ddpbench_script_named(
                self.0.as_ptr(),
                c_int::from(buffers),
                &mut list as *mut _ as *mut c_void,
                push_named,
                &mut err,
            )
        };
        if rc == 0 {
            Ok(list)
        } else {
            Err(cause(&take_text(err)))
        }
    }

    fn set_train(&self, on: bool) -> Result<(), String> {
        let mut err = std::ptr::null_mut();
        // SAFETY: a live module; the shim catches every exception.
        match unsafe { ddpbench_script_set_train(self.0.as_ptr(), c_int::from(on), &mut err) } {
            0 => Ok(()),
            _ => Err(cause(&take_text(err))),
        }
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor, Forward> {
        let ptrs: Vec<*mut c_void> = inputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the inputs are live at::Tensor pointers; the shim only reads them.
        let rc = unsafe { ddpbench_script_forward(self.0.as_ptr(), ptrs.as_ptr(), ptrs.len() as c_int, &mut out, &mut err) };
        match rc {
            // SAFETY: on 0 the shim handed over a new at::Tensor.
            0 => Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) }),
            2 => Err(Forward::NotATensor(take_text(err))),
            _ => Err(Forward::Failed(cause(&take_text(err)))),
        }
    }

    fn save(&self, path: &Path) -> Result<(), String> {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| "the path holds a NUL byte".to_string())?;
        let mut err = std::ptr::null_mut();
        // SAFETY: a live module and a valid C string.
        match unsafe { ddpbench_script_save(self.0.as_ptr(), c_path.as_ptr(), &mut err) } {
            0 => Ok(()),
            _ => Err(cause(&take_text(err))),
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module was made by ddpbench_script_load and is freed once.
        unsafe { ddpbench_script_free(self.0.as_ptr()) }
    }
}

/// Why a forward pass gave no tensor.
enum Forward {
    /// The module raised an error (its cause).
    Failed(String),
    /// It returned another type (its name, e.g. `(Tensor, Tensor)`).
    NotATensor(String),
}

pub(crate) use crate::record::ScriptFile;

impl ScriptFile {
    /// Reads `path` once for its size and hash; Err says what is wrong with it.
    pub(crate) fn read(path: &Path) -> Result<ScriptFile> {
        let meta = std::fs::metadata(path).with_context(|| format!("--model {}: cannot read the file", path.display()))?;
        if !meta.is_file() {
            bail!("--model {}: not a file (a TorchScript file saved from PyTorch)", path.display());
        }
        if meta.len() > MAX_FILE_BYTES {
            bail!(
                "--model {}: {} bytes, more than the {} GiB ddpbench loads",
                path.display(),
                meta.len(),
                MAX_FILE_BYTES >> 30
            );
        }
        let mut f = std::fs::File::open(path).with_context(|| format!("--model {}: cannot open the file", path.display()))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("--model {}: cannot read the file", path.display()))?;
            if n == 0 {
                break;
            }
            bytes += n as u64;
            hash.update(&buf[..n]);
        }
        let sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(ScriptFile {
            path: path.to_path_buf(),
            bytes,
            sha256,
        })
    }
}

/// A TorchScript network trained in place: its tensors are the ones in the `VarStore`.
pub struct ScriptNet {
    module: Module,
    file: ScriptFile,
    loss: LossKind,
    /// The width of the logits the labels need (`--num-classes`).
    classes: i64,
    /// The mode the module is in (None until first set).
    training: Cell<Option<bool>>,
}

impl std::fmt::Debug for ScriptNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScriptNet({})", self.file.path.display())
    }
}

/// Registers `tensor` under its dotted `name` below `p` (`layer1.0.conv1.weight`, as
/// built-in networks name theirs), so that ordering by name is the same on every rank.
fn register(p: &nn::Path, name: &str, tensor: Tensor, trainable: bool) {
    let mut parts: Vec<&str> = name.split('.').collect();
    let last = parts.pop().unwrap_or(name);
    let at = parts.into_iter().fold(p.clone(), |at, part| at.sub(part));
    let _ = at.add(last, tensor, trainable);
}

impl ScriptNet {
    /// Loads `file` onto `p`'s device and registers its parameters (trainable when the
    /// module's are) and buffers below `p`.
    pub(crate) fn load(file: ScriptFile, p: &nn::Path, loss: LossKind, classes: i64) -> Result<ScriptNet> {
        let shown = file.path.display().to_string();
        let module = Module::load(&file.path, p.device())
            .map_err(|e| anyhow!("--model {shown} is not a TorchScript file libtorch can load ({e}); save one with torch.jit.script(net).save(path) or torch.jit.trace"))?;
        let params = module
            .named(false)
            .map_err(|e| anyhow!("--model {shown}: cannot list its parameters: {e}"))?;
        if !params.iter().any(|(_, t)| t.requires_grad()) {
            bail!("--model {shown} has no trainable parameter: nothing to train");
        }
        let buffers = module
            .named(true)
            .map_err(|e| anyhow!("--model {shown}: cannot list its buffers: {e}"))?;
        for (name, t) in params {
            let trainable = t.requires_grad();
            register(p, &name, t, trainable);
        }
        for (name, t) in buffers {
            register(p, &name, t, false);
        }
        let net = ScriptNet {
            module,
            file,
            loss,
            classes,
            training: Cell::new(None),
        };
        net.mode(true)?;
        Ok(net)
    }

    pub(crate) fn file(&self) -> &ScriptFile {
        &self.file
    }

    /// Puts the module in training or evaluation mode (once per change).
    fn mode(&self, train: bool) -> Result<()> {
        if self.training.get() != Some(train) {
            self.module
                .set_train(train)
                .map_err(|e| anyhow!("--model {}: cannot switch train/eval mode: {e}", self.file.path.display()))?;
            self.training.set(Some(train));
        }
        Ok(())
    }

    fn call(&self, inputs: &[&Tensor], train: bool) -> Result<Tensor> {
        self.mode(train)?;
        let shapes: Vec<String> = inputs.iter().map(|t| format!("{:?}", t.size())).collect();
        self.module.forward(inputs).map_err(|e| match e {
            Forward::Failed(cause) => anyhow!(
                "--model {} rejects an input of shape {}: {cause}",
                self.file.path.display(),
                shapes.join(" with target ")
            ),
            Forward::NotATensor(ty) => anyhow!(
                "--model {} returns {ty}, not one tensor: ddpbench needs the class logits as one tensor \
                 [batch, classes] (or, with --loss none, one scalar loss); return only that from forward",
                self.file.path.display()
            ),
        })
    }

    /// Writes the module with its current (trained) weights as TorchScript.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.module
            .save(path)
            .map_err(|e| anyhow!("cannot save the trained module to {}: {e}", path.display()))
    }

    /// The module's output for `xs`, checked to be the logits the labels need:
    /// [batch, classes], real-valued.
    fn logits(&self, xs: &Tensor, train: bool) -> Result<Tensor> {
        let (batch, classes) = (xs.size()[0], self.classes);
        let out = self.call(&[xs], train)?;
        let size = out.size();
        if size != [batch, classes] || !out.is_floating_point() {
            bail!(
                "--model {} returns {:?} {size:?} for an input of shape {:?}; the labels need logits \
                 [{batch}, {classes}] (batch × --num-classes), real-valued",
                self.file.path.display(),
                out.kind(),
                xs.size()
            );
        }
        Ok(out)
    }

    /// The module's own loss of (`xs`, `ys`) with `--loss none`, checked to be one real scalar.
    fn own_loss(&self, xs: &Tensor, ys: &Tensor, train: bool) -> Result<Tensor> {
        let out = self.call(&[xs, ys], train)?;
        if out.numel() != 1 || !out.is_floating_point() {
            bail!(
                "--model {} with --loss none returns {:?} {:?}; it must return one real scalar, the loss of \
                 (input, target)",
                self.file.path.display(),
                out.kind(),
                out.size()
            );
        }
        Ok(out.sum(Kind::Float))
    }

    /// The mean loss of one batch: log-softmax and NLL of the module's logits, as the
    /// built-in classifiers end, or with `--loss none` the module's own.
    pub(crate) fn loss(&self, xs: &Tensor, ys: &Tensor, train: bool) -> Result<Tensor> {
        match self.loss {
            LossKind::Nll => Ok(self.logits(xs, train)?.log_softmax(-1, Kind::Float).nll_loss(ys)),
            LossKind::None => self.own_loss(xs, ys, train),
        }
    }

    /// The summed loss and the correct predictions of an evaluation batch (NaN correct
    /// with `--loss none`: the module gives no predictions).
    pub(crate) fn evaluate(&self, xs: &Tensor, ys: &Tensor) -> Result<(f64, f64)> {
        let n = xs.size()[0] as f64;
        match self.loss {
            LossKind::Nll => {
                let out = self.logits(xs, false)?;
                let loss = out.log_softmax(-1, Kind::Float).nll_loss(ys).double_value(&[]) * n;
                let correct = out.argmax(-1, false).eq_tensor(ys).sum(Kind::Int64).int64_value(&[]) as f64;
                Ok((loss, correct))
            }
            LossKind::None => Ok((self.own_loss(xs, ys, false)?.double_value(&[]) * n, f64::NAN)),
        }
    }
}

impl Net for ScriptNet {
    /// A TorchScript module has no stages: `cut` is never called.
    fn forward_cut(&self, xs: &Tensor, train: bool, _cut: &mut dyn FnMut(Tensor) -> Tensor) -> Tensor {
        // Only reached by a caller that ignores `script()`; the trainer always asks it first.
        match self.call(&[xs], train) {
            Ok(out) => out.log_softmax(-1, Kind::Float),
            Err(e) => panic!("{e:#}"),
        }
    }

    fn script(&self) -> Option<&ScriptNet> {
        Some(self)
    }
}

/// A first forward and backward of one batch of `batch` samples shaped as `spec` says,
/// before training (in evaluation mode, so BatchNorm statistics stay as loaded): the
/// module takes that input and returns what the loss needs, or one message says why
/// not. Leaves every parameter's gradient defined, as the built-in networks' stage
/// discovery does, for the buckets to take over.
pub(crate) fn check_first_forward(net: &ScriptNet, input: &Input, batch: i64, device: Device) -> Result<()> {
    let x = match *input {
        Input::Image([c, h, w]) => Tensor::zeros([batch, c, h, w], (Kind::Float, device)),
        Input::Tokens { seq_len, .. } => Tensor::full([batch, seq_len], super::UNK_TOKEN, (Kind::Int64, device)),
    };
    let y = Tensor::zeros([batch], (Kind::Int64, device));
    let loss = net.loss(&x, &y, false);
    let back = loss.and_then(|l| {
        if l.requires_grad() {
            l.backward();
            Ok(())
        } else {
            Err(anyhow!(
                "--model {}: its loss does not depend on any trainable parameter",
                net.file.path.display()
            ))
        }
    });
    net.mode(true)?;
    back
}
