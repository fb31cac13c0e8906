//! A user's own network as a TorchScript file (`--model net.pt`), written by the test
//! with the project's PyTorch venv: it trains at 2 ranks exactly as at 1 rank of twice
//! the batch, the MNIST CNN saved from PyTorch costs what the built-in one costs, its
//! buffers are the run's, bad files and shapes stop every rank with one message, and a
//! study compares it with a built-in network.

mod common;
use common::*;
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
/// The relative L2 distance under which 1 × 64 and 2 × 32 count as the same training:
/// 10 × the largest distance seen over seeds 1 to 3 and every CPU kernel setting
/// (BENCHMARKS.md, "Equality of training on other CPU kernels").
// Largest seen in the sweep: 4.5e-7 (22 x under); another seed 4.0e-2 away (3,600 x beyond).
const EQUALITY_BOUND: f64 = 1e-5;

/// The modules the tests train. `mnist` has the layer shapes (and names) of the built-in
/// `mnist-cnn`, without dropout; `bn` has a BatchNorm (buffers); `pair` returns a tuple;
/// `own_loss` takes token ids and the target and returns its own loss.
const MODULES: &str = r#"
import sys, torch, torch.nn as nn, torch.nn.functional as F
class Mnist(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))
class Bn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 13 * 13, 10)
    def forward(self, x):
        return self.fc(torch.flatten(F.relu(self.bn(self.conv(x))), 1))
class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)
    def forward(self, x):
        y = self.fc(torch.flatten(x, 1))
        return y, y
class OwnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 4)
    def forward(self, x, target):
        return F.cross_entropy(self.head(self.embed(x).mean(1)), target)
torch.manual_seed(0)
out = sys.argv[1]
for name, net in [("mnist", Mnist()), ("bn", Bn()), ("pair", Pair()), ("own_loss", OwnLoss())]:
    torch.jit.script(net).save(f"{out}/{name}.pt")
"#;

/// Writes the modules of [`MODULES`] into a new folder.
fn modules() -> tempfile::TempDir {
    let d = tmp();
    let script = d.path().join("make.py");
    std::fs::write(&script, MODULES).unwrap();
    let out = std::process::Command::new(python()).arg(&script).arg(d.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    d
}

fn sha256(path: &Path) -> String {
    sha2::Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The trained parameters of a run's model.pt, sorted by name.
fn saved_params(run: &Path) -> Vec<(String, tch::Tensor)> {
    let m = tch::CModule::load(run.join("model.pt")).unwrap();
    let mut p = m.named_parameters().unwrap();
    p.sort_by(|a, b| a.0.cmp(&b.0));
    p
}

fn relative_difference(a: &[(String, tch::Tensor)], b: &[(String, tch::Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut diff, mut norm) = (0.0, 0.0);
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        diff += (ta - tb).square().sum(tch::Kind::Double).double_value(&[]);
        norm += ta.square().sum(tch::Kind::Double).double_value(&[]);
    }
    (diff / norm).sqrt()
}

const MNIST_SHAPE: [&str; 6] = ["--input-shape", "1x28x28", "--num-classes", "10", "--dataset", "synthetic"];

#[test]
fn a_torchscript_cnn_at_2_ranks_of_32_trains_as_1_rank_of_64() {
    let m = modules();
    let file = path_str(&m.path().join("mnist.pt"));
    let run = |ranks: usize, batch: &str, seed: &str, name: &str| {
        let out = path_str(&m.path().join(name));
        let mut args = vec!["--model", &file];
        args.extend(MNIST_SHAPE);
        args.extend([
            "--synthetic-samples",
            "1280",
            "--max-steps",
            "20",
            "--deterministic",
            "--optimizer",
            "sgd",
            "--lr",
            "0.01",
            "--val-samples",
            "0",
            "--save-model",
            "--probe-iters",
            "0",
            "--batch-size",
            batch,
            "--seed",
            seed,
            "--out",
            &out,
        ]);
        train(ranks, &args, LIMIT).assert_ok();
        PathBuf::from(out)
    };
    let seed = equality_seed(3);
    let one = run(1, "64", &seed.to_string(), "one");
    let two = run(2, "32", &seed.to_string(), "two");
    let other = run(2, "32", &other_seed(seed).to_string(), "other");
    let d = relative_difference(&saved_params(&one), &saved_params(&two));
    // The far side: another shuffle of the same file's weights.
    let d_other = relative_difference(&saved_params(&one), &saved_params(&other));
    assert_equal_training("torchscript-1x64-2x32", seed, d, d_other, EQUALITY_BOUND);
    // Training moved the weights: the file's own are far from the trained ones.
    let start = {
        let m = tch::CModule::load(&file).unwrap();
        let mut p = m.named_parameters().unwrap();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        p
    };
    assert!(relative_difference(&start, &saved_params(&two)) > 1e-4);
    // The manifest records the file; the key holds its hash and shape, not its path.
    let manifest = json(&two.join("manifest.json"));
    let hash = sha256(Path::new(&file));
    assert_eq!(manifest["model"], "mnist.pt");
    assert_eq!(manifest["model_file"]["sha256"], hash.as_str());
    assert_eq!(manifest["model_file"]["path"], file.as_str());
    assert_eq!(
        manifest["model_file"]["bytes"].as_u64(),
        Some(std::fs::metadata(&file).unwrap().len())
    );
    let key = &manifest["comparison_key"];
    assert_eq!(key["model_sha256"], hash.as_str());
    assert_eq!(key["input_shape"], "1x28x28");
    assert!(!key.to_string().contains(&file), "{key}");
}

#[test]
fn the_mnist_cnn_saved_from_pytorch_costs_what_the_builtin_one_costs() {
    let m = modules();
    let file = path_str(&m.path().join("mnist.pt"));
    let listed = ddpbench(&["models", "--file", &file]);
    listed.assert_ok();
    let line = listed
        .stdout
        .lines()
        .find(|l| l.starts_with("mnist.pt"))
        .expect("a line for the file");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[1..3], ["1199882", "4799528"], "{line}");
    assert_eq!(cells[4], sha256(Path::new(&file)));
    let run = |model: &str, name: &str| {
        let out = m.path().join(name);
        let o = path_str(&out);
        let mut args = vec!["--model", model];
        args.extend(MNIST_SHAPE);
        args.extend([
            "--synthetic-samples",
            "256",
            "--batch-size",
            "32",
            "--max-steps",
            "3",
            "--val-samples",
            "16",
            "--probe-iters",
            "0",
            "--overlap",
            "force",
            "--out",
            &o,
        ]);
        train(2, &args, LIMIT).assert_ok();
        out
    };
    let builtin = run("mnist-cnn", "builtin");
    let script = run(&file, "script");
    let (a, b) = (json(&builtin.join("manifest.json")), json(&script.join("manifest.json")));
    for field in ["parameters", "gradient_bytes", "buckets"] {
        assert_eq!(a[field], b[field], "{field}");
    }
    assert_eq!(b["parameters"], 1_199_882);
    let bucket_bytes = |m: &serde_json::Value| {
        let mut v: Vec<u64> = m["comm"]["bucket_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(bucket_bytes(&a), bucket_bytes(&b));
    for r in 0..2 {
        let bytes = |run: &Path| {
            let (h, rows) = read_csv(&run.join(format!("rank-{r:05}.csv")));
            col(&h, &rows, "bytes")
        };
        let (x, y) = (bytes(&builtin), bytes(&script));
        assert_eq!(x.len(), 3);
        assert_eq!(x, y, "bytes per step, rank {r}");
    }
    // The module cannot be cut: overlap is off, said once, and recorded.
    assert_eq!(b["comm"]["overlap"], false);
    assert_eq!(b["comparison_key"]["overlap"], "off");
    let note = b["comm"]["note"].as_str().unwrap_or("");
    assert!(note.contains("black box"), "{note}");
    let log = std::fs::read_to_string(script.join("manifest.json")).unwrap();
    assert_eq!(log.matches("black box").count(), 1);
    assert_ne!(a["comparison_key"], b["comparison_key"]);
}

#[test]
fn a_modules_buffers_are_the_runs_and_reach_the_saved_file() {
    let m = modules();
    let file = m.path().join("bn.pt");
    let spec = ddpbench::model::ModelSpec {
        input: ddpbench::model::Input::Image([1, 28, 28]),
        classes: 10,
    };
    let choice = ddpbench::model::ModelChoice::File(file.clone());
    let load = || {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let o = ddpbench::model::ModelOptions::default();
        let net = ddpbench::model::build_choice(&choice, &vs.root(), &o, &spec, ddpbench::model::LossKind::Nll).unwrap();
        (vs, net)
    };
    let (vs, net) = load();
    let buffers = ddpbench::model::ordered_buffers(&vs);
    let names: Vec<&str> = buffers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]);
    let params: Vec<String> = ddpbench::model::ordered_parameters(&vs).into_iter().map(|(n, _)| n).collect();
    assert_eq!(params, ["bn.bias", "bn.weight", "conv.bias", "conv.weight", "fc.bias", "fc.weight"]);
    // What a broadcast writes into the store's tensors is the module's: the saved file has it.
    tch::no_grad(|| {
        let _ = buffers[1].1.shallow_clone().fill_(7.0);
    });
    let saved = m.path().join("saved.pt");
    net.script().unwrap().save(&saved).unwrap();
    let again = ddpbench::model::ModelChoice::File(saved);
    let vs2 = tch::nn::VarStore::new(tch::Device::Cpu);
    let o = ddpbench::model::ModelOptions::default();
    let _net2 = ddpbench::model::build_choice(&again, &vs2.root(), &o, &spec, ddpbench::model::LossKind::Nll).unwrap();
    let mean = &ddpbench::model::ordered_buffers(&vs2)[1].1;
    assert_eq!(mean.size(), [8]);
    assert_eq!(mean.min().double_value(&[]), 7.0);
    assert_eq!(mean.max().double_value(&[]), 7.0);

    // At 2 ranks with BatchNorm, training and validation complete.
    let out = m.path().join("run");
    let f = path_str(&file);
    let o = path_str(&out);
    let mut args = vec!["--model", f.as_str()];
    args.extend(MNIST_SHAPE);
    args.extend([
        "--synthetic-samples",
        "96",
        "--batch-size",
        "16",
        "--max-steps",
        "3",
        "--val-samples",
        "16",
        "--probe-iters",
        "0",
        "--out",
        &o,
    ]);
    train(2, &args, LIMIT).assert_ok();
    let (h, rows) = read_csv(&out.join("epochs.csv"));
    assert!(col(&h, &rows, "val_accuracy")[0].is_finite());
}

#[test]
fn a_module_with_its_own_loss_trains_on_token_ids() {
    let m = modules();
    let out = m.path().join("run");
    let (f, o) = (path_str(&m.path().join("own_loss.pt")), path_str(&out));
    let job = train(
        2,
        &[
            "--model",
            &f,
            "--loss",
            "none",
            "--input-dtype",
            "int64",
            "--input-shape",
            "12",
            "--vocab-size",
            "100",
            "--num-classes",
            "4",
            "--dataset",
            "synthetic",
            "--synthetic-samples",
            "64",
            "--batch-size",
            "8",
            "--max-steps",
            "3",
            "--val-samples",
            "8",
            "--probe-iters",
            "0",
            "--out",
            &o,
        ],
        LIMIT,
    );
    job.assert_ok();
    let (h, rows) = read_csv(&out.join("rank-00000.csv"));
    let loss = col(&h, &rows, "loss");
    // Cross-entropy of 4 classes starts near ln 4.
    assert!(loss.iter().all(|l| (0.5..3.0).contains(l)), "{loss:?}");
    let manifest = json(&out.join("manifest.json"));
    assert_eq!(manifest["comparison_key"]["loss"], "none");
    assert_eq!(manifest["comparison_key"]["input_shape"], "int64 12");
    // Its own loss gives no predictions: no accuracy.
    assert!(manifest["final_val_accuracy"].is_null(), "{manifest}");
}

/// Every rank printed `rank-exit <r> <non-zero>`, the message appeared once, no panic.
fn fails_everywhere(args: &[&str], message: &str) {
    let job = train_reporting_exits(2, args, &[], Duration::from_secs(120));
    let all = job.all();
    assert!(!job.timed_out, "hung:\n{all}");
    assert_eq!(all.matches(message).count(), 1, "expected {message:?} once in:\n{all}");
    for bad in ["panicked", "RUST_BACKTRACE", "ddpbench bug", "Exception raised from", "frame #"] {
        assert!(!all.contains(bad), "{bad:?} reached the user:\n{all}");
    }
    for r in 0..2 {
        let line = all
            .lines()
            .find(|l| l.starts_with(&format!("rank-exit {r} ")))
            .unwrap_or_else(|| panic!("rank {r} reported no exit status:\n{all}"));
        assert_ne!(line, format!("rank-exit {r} 0"), "{all}");
    }
}

#[test]
fn bad_files_and_shapes_stop_every_rank_with_one_message() {
    let m = modules();
    let d = m.path();
    let not_script = d.join("notes.pt");
    std::fs::write(&not_script, "not a TorchScript file\n").unwrap();
    let run = |model: &Path, shape: &str, classes: &str, message: &str| {
        let out = path_str(&d.join(format!("run-{}", message.len())));
        let f = path_str(model);
        fails_everywhere(
            &[
                "--model",
                &f,
                "--input-shape",
                shape,
                "--num-classes",
                classes,
                "--dataset",
                "synthetic",
                "--synthetic-samples",
                "64",
                "--batch-size",
                "16",
                "--max-steps",
                "2",
                "--probe-iters",
                "0",
                "--out",
                &out,
            ],
            message,
        );
    };
    run(&not_script, "1x28x28", "10", "is not a TorchScript file libtorch can load");
    // Logits of 10 classes where the labels need 7.
    run(&d.join("mnist.pt"), "1x28x28", "7", "the labels need logits [16, 7]");
    // Three channels into a one-channel convolution.
    run(&d.join("mnist.pt"), "3x28x28", "10", "rejects an input of shape [16, 3, 28, 28]");
    run(&d.join("pair.pt"), "1x28x28", "10", "not one tensor");
    // The flags a file needs are asked for before anything starts.
    let f = path_str(&d.join("mnist.pt"));
    fails_everywhere(&["--model", &f, "--num-classes", "10"], "needs --input-shape");
    fails_everywhere(
        &["--model", "mnist-cnn", "--input-shape", "3x32x32"],
        "--model mnist-cnn takes 1x28x28",
    );
}

#[test]
fn a_study_compares_a_builtin_network_with_a_torchscript_file() {
    let m = modules();
    let file = m.path().join("study.toml");
    let net = path_str(&m.path().join("mnist.pt"));
    std::fs::write(
        &file,
        format!(
            "name = \"own\"\nmodels = [\"mnist-cnn\", \"{net}\"]\ndatasets = [\"synthetic\"]\nbatch_sizes = [32]\n\
             ranks = [1, 2]\nmax_steps = 6\nwarmup_steps = 1\nsynthetic_samples = 512\ninput_shape = \"1x28x28\"\n\
             num_classes = 10\nval_samples = 0\nprobe_iters = 0\n"
        ),
    )
    .unwrap();
    let out = m.path().join("study");
    let mut cmd = mpirun_cmd(2);
    cmd.arg(BIN).arg("study").arg(&file).arg("--out").arg(&out);
    let job = run_with_limit(cmd, LIMIT);
    job.assert_ok();
    let (h, rows) = read_csv(&out.join("points.csv"));
    let status = h.iter().position(|c| c == "status").unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|r| r[status] == "completed"), "{rows:?}");
    let (h, scaling) = read_csv(&out.join("report/scaling.csv"));
    let model = h.iter().position(|c| c == "model").unwrap();
    let models: std::collections::BTreeSet<&str> = scaling.iter().map(|r| r[model].as_str()).collect();
    assert_eq!(models.into_iter().collect::<Vec<_>>(), ["mnist-cnn", "mnist.pt"], "{scaling:?}");
}
