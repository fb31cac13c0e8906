//! A peer trainer's points beside ddpbench's (`peer = "pytorch-ddp"` in a study): the
//! same workload trained by PyTorch's DistributedDataParallel, one Python process per
//! rank of the point, launched by those ranks themselves. Its per-step timings become a
//! run folder `reduce` reads like any other, whose comparison key names the peer, so
//! its runs are never pooled with ddpbench's nor taken as their reference.
//!
//! The script trains through the recorder of `python/ddpbench_record` (its hooks time
//! each phase and each bucket's all-reduce, with its bytes), told that the study holds
//! the folder: rank 0 of the point locks the run folder and writes `manifest.json`
//! (backend `gloo` on CPU, `nccl` on GPUs; `comparison_key.peer`), the recorder writes
//! `rank-NNNNN.csv` in ddpbench's columns, `rank-NNNNN.end.json` and `clock.csv`.
//! `peer/` holds the script that ran, the recorder package it imported, `peer.json`
//! (what the script found: torch version, backend, device, parameter and gradient
//! bytes) and each process's log.

use crate::data::DatasetKind;
use crate::record::key::{self, ComparisonKey, Real};
use crate::record::lock::FolderLock;
use crate::record::OptimizerKind;
use crate::record::{self, Backend, DeviceKind, EndRecord, Manifest, Overlap, RankInfo, RunStatus, Twin};
use crate::train::config::TrainConfig;
use crate::world::{agree, all_strings, broadcast_string, Group};
use anyhow::{bail, ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

/// The PyTorch DDP twin of `mnist-cnn` (`benchmarks/pytorch_ddp_mnist.py`), kept in the
/// binary so that a study runs the script it was built with and copies it into each run.
pub(crate) const PYTORCH_DDP_SCRIPT: &str = include_str!("../../benchmarks/pytorch_ddp_mnist.py");

/// The script's name in a run's `peer/` folder.
const SCRIPT_FILE: &str = "pytorch_ddp_mnist.py";

/// The recorder package the script imports (`python/ddpbench_record`), kept in the
/// binary and written beside the script into each run's `peer/ddpbench_record/`, so a
/// study finds it wherever it runs and each run keeps the recorder that timed it.
const RECORDER_FILES: [(&str, &str); 8] = [
    ("__init__.py", include_str!("../../python/ddpbench_record/__init__.py")),
    ("clock.py", include_str!("../../python/ddpbench_record/clock.py")),
    ("columns.py", include_str!("../../python/ddpbench_record/columns.py")),
    ("files.py", include_str!("../../python/ddpbench_record/files.py")),
    ("lock.py", include_str!("../../python/ddpbench_record/lock.py")),
    ("recorder.py", include_str!("../../python/ddpbench_record/recorder.py")),
    ("run.py", include_str!("../../python/ddpbench_record/run.py")),
    ("step.py", include_str!("../../python/ddpbench_record/step.py")),
];

/// The recorder package's folder name (its import name) in a run's `peer/` folder.
const RECORDER_PACKAGE: &str = "ddpbench_record";

/// The models the peer has a twin of.
const TWINS: [&str; 1] = ["mnist-cnn"];

/// The Python that runs the peer: `DDPBENCH_PYTHON` (set by job-scripts/setup.sh), else
/// `python3` on the PATH.
pub(crate) fn python() -> PathBuf {
    std::env::var_os("DDPBENCH_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// PyTorch's version as the peer's Python imports it; Err says how to get one.
pub(crate) fn torch_version(peer: Twin) -> Result<String> {
    let py = python();
    let out = std::process::Command::new(&py)
        .args(["-c", "import torch, torch.distributed; print(torch.__version__)"])
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => bail!(
            "study key `peer = \"{}\"`: {} cannot import torch ({}): run job-scripts/setup.sh (it installs PyTorch \
             into a venv and exports DDPBENCH_PYTHON), point DDPBENCH_PYTHON at a Python with torch, or drop `peer`",
            peer.name(),
            py.display(),
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("no message").trim()
        ),
        Err(e) => bail!(
            "study key `peer = \"{}\"`: cannot run {} ({e}): set DDPBENCH_PYTHON to a Python with torch \
             (job-scripts/setup.sh makes one), or drop `peer`",
            peer.name(),
            py.display()
        ),
    }
}

/// Err when `peer` cannot train the point `cfg` describes: what differs, and what to change.
pub(crate) fn check_point(peer: Twin, cfg: &TrainConfig) -> Result<()> {
    let model = cfg.workload.model.name();
    let what = format!("study key `peer = \"{}\"`", peer.name());
    ensure!(
        TWINS.contains(&model.as_str()),
        "{what}: the model `{model}` has no PyTorch twin (the peer script trains {} only): study {} or drop `peer`",
        TWINS.join(", "),
        TWINS.join(", ")
    );
    ensure!(
        matches!(cfg.workload.dataset, DatasetKind::Synthetic | DatasetKind::FashionMnist),
        "{what}: the peer reads synthetic data or Fashion-MNIST only, not {:?}: use one of them or drop `peer`",
        cfg.workload.dataset
    );
    let unlike: Vec<&str> = [
        (cfg.optim.optimizer != OptimizerKind::Sgd, "optimizer other than sgd"),
        (cfg.schedule.grad_accum != 1, "grad_accum above 1"),
        (cfg.optim.amp != crate::record::AmpMode::Off, "amp"),
        (cfg.comm.grad_dtype != record::GradDtype::Fp32, "grad_dtype other than fp32"),
        (
            cfg.schedule.max_steps.is_none(),
            "no max_steps (the peer runs a bounded number of steps)",
        ),
    ]
    .into_iter()
    .filter_map(|(differs, what)| differs.then_some(what))
    .collect();
    ensure!(
        unlike.is_empty(),
        "{what}: the peer script cannot run this point as ddpbench does ({}): change those settings or drop `peer`",
        unlike.join(", ")
    );
    Ok(())
}

/// What the peer's rank 0 wrote about itself (`peer/peer.json`).
#[derive(serde::Deserialize)]
struct PeerInfo {
    torch_version: String,
    backend: String,
    device: String,
    parameters: usize,
    /// Bytes of the gradients DDP all-reduces, as the recorder counted them.
    gradient_bytes: u64,
    /// Bytes of each bucket of the last step, in the order DDP handed them over.
    bucket_bytes: Vec<u64>,
}

/// The peer's `peer.json` in `peer_dir`, read only as a regular file within
/// [`crate::bounds::PEER_INFO`]; Err names the file and what is wrong with it.
fn read_info(peer_dir: &Path) -> std::result::Result<PeerInfo, String> {
    let path = peer_dir.join("peer.json");
    let text =
        crate::files::read_regular_no_follow_to_string(&path, crate::bounds::PEER_INFO).map_err(|e| crate::files::read_error(&path, &e))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not the peer script's peer.json: {e}", path.display()))
}

/// Trains the point `cfg` with `peer` on the ranks of `pg` into the run folder `dir`.
/// Err is agreed: every rank of the point returns the same one.
pub(crate) fn run(pg: &Group, peer: Twin, cfg: &TrainConfig, dir: &Path) -> Result<()> {
    let started = SystemTime::now();
    let clock = Instant::now();
    let run_id = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let peer_dir = dir.join("peer");
    // Rank 0 holds the run folder's lock until the run ends (dropped on return), as
    // ddpbench's own runs do; the recorder is told the folder is held and takes none.
    let prepared = if pg.rank == 0 {
        prepare(dir, &peer_dir).map(|(r, l)| (r, Some(l)))
    } else {
        Ok((String::new(), None))
    };
    let (rendezvous, _lock) = agree(pg, prepared)?;
    let rendezvous = broadcast_string(pg, &rendezvous);
    let local_rank = {
        let hosts = all_strings(pg, &pg.host);
        hosts[..pg.rank].iter().filter(|h| **h == pg.host).count()
    };
    let node_type = cfg.placement.node_type.clone().unwrap_or_else(|| {
        let cores = hwloc2::Topology::new()
            .map(|t| crate::topology::discover_cores(&t))
            .unwrap_or_default();
        crate::topology::NodeInfo::detect(&cores).node_type()
    });
    let threads = cfg.placement.threads.unwrap_or(1);
    let me = RankInfo {
        rank: pg.rank,
        local_rank,
        host: pg.host.clone(),
        node_type: node_type.clone(),
        threads,
        binding: "none (the peer's processes are not bound)".into(),
        ..RankInfo::default()
    };
    let ranks: Vec<RankInfo> = all_strings(pg, &serde_json::to_string(&me)?)
        .iter()
        .map(|s| serde_json::from_str(s))
        .collect::<Result<_, _>>()?;
    let mut manifest = manifest(pg, peer, cfg, &run_id, started, ranks);
    if pg.rank == 0 {
        agree(pg, manifest.write(dir))?;
    } else {
        agree(pg, Ok(()))?;
    }
    let trained = launch(pg, cfg, dir, &rendezvous, local_rank, &node_type).and_then(|()| recorded(dir, pg.rank));
    let trained = agree(pg, trained);
    if pg.rank == 0 {
        let finished = trained.as_ref().map_err(|e| format!("{e:#}")).and_then(|()| {
            let info = read_info(peer_dir.as_path())?;
            fill_from(&mut manifest, &info);
            Ok(())
        });
        manifest.wall_s = Some(clock.elapsed().as_secs_f64());
        manifest.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
        match &finished {
            Ok(()) => manifest.status = RunStatus::Completed.as_str().into(),
            Err(e) => {
                manifest.status = RunStatus::Failed.as_str().into();
                manifest.error = Some(e.clone());
            }
        }
        let written = manifest.write(dir);
        trained?;
        written?;
        finished.map_err(|e| anyhow::anyhow!(e))
    } else {
        trained
    }
}

/// Rank 0: the run folder locked, the peer folder with the script and the recorder
/// package in it, and the rendezvous (`host:port`, a port free on this host now).
fn prepare(dir: &Path, peer_dir: &Path) -> Result<(String, FolderLock)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let lock = FolderLock::take(dir, "run folder", false)?;
    let package = peer_dir.join(RECORDER_PACKAGE);
    std::fs::create_dir_all(&package).with_context(|| format!("cannot create {}", package.display()))?;
    record::write_atomic(&peer_dir.join(SCRIPT_FILE), PYTORCH_DDP_SCRIPT)?;
    for (name, text) in RECORDER_FILES {
        record::write_atomic(&package.join(name), text)?;
    }
    let port = std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .context("cannot find a free TCP port for the peer's rendezvous")?
        .port();
    let host = hostname();
    Ok((format!("{host}:{port}"), lock))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Runs this rank's peer process, which records into the run folder `dir`, and waits for it.
fn launch(pg: &Group, cfg: &TrainConfig, dir: &Path, rendezvous: &str, local_rank: usize, node_type: &str) -> Result<()> {
    let (addr, port) = rendezvous.rsplit_once(':').context("no rendezvous address")?;
    let peer_dir = dir.join("peer");
    let threads = cfg.placement.threads.unwrap_or(1);
    let log = peer_dir.join(format!("rank-{:05}.log", pg.rank));
    let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = std::process::Command::new(python());
    cmd.arg(peer_dir.join(SCRIPT_FILE))
        .args(["--batch-size", &cfg.schedule.batch_size.to_string()])
        .args(["--max-steps", &cfg.schedule.max_steps.unwrap_or(0).to_string()])
        .args(["--lr", &cfg.learning_rate().to_string()])
        .args(["--momentum", &cfg.optim.momentum.to_string()])
        .args(["--weight-decay", &cfg.optim.weight_decay.to_string()])
        .args(["--bucket-mb", &cfg.comm.bucket_mb.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--seed", &cfg.schedule.seed.to_string()])
        .args(["--warmup-steps", &cfg.schedule.warmup_steps.to_string()])
        .args(["--node-type", node_type])
        .arg("--caller-holds-folder")
        .arg("--peer-json")
        .arg(peer_dir.join("peer.json"))
        .arg("--out")
        .arg(dir);
    match cfg.workload.dataset {
        DatasetKind::Synthetic => {
            cmd.arg("--synthetic");
        }
        _ => {
            if let Some(d) = &cfg.workload.data_dir {
                cmd.arg("--data-dir").arg(d);
            }
        }
    }
    if cfg.workload.no_dropout {
        cmd.arg("--no-dropout");
    }
    if cfg.placement.device == crate::device::DeviceChoice::Cpu {
        cmd.env("CUDA_VISIBLE_DEVICES", "");
    }
    // The package beside the script comes first, ahead of any installed copy (Python puts
    // the script's folder first on its path too, unless PYTHONSAFEPATH is set).
    let mut path = std::ffi::OsString::from(&peer_dir);
    if let Some(p) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(p);
    }
    cmd.env("PYTHONPATH", path)
        .env("RANK", pg.rank.to_string())
        .env("WORLD_SIZE", pg.size.to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("MASTER_ADDR", addr)
        .env("MASTER_PORT", port)
        .env("OMP_NUM_THREADS", threads.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {} for the peer", python().display()))?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        bail!(
            "the peer's rank {} exited with {status}: {last} (all of it in {})",
            pg.rank,
            log.display()
        );
    }
    Ok(())
}

/// The manifest of a peer run as it starts (status running); rank 0's copy is written.
fn manifest(pg: &Group, peer: Twin, cfg: &TrainConfig, run_id: &str, started: SystemTime, ranks: Vec<RankInfo>) -> Manifest {
    // What the peer's Python finds is filled in when it ends ([`fill_from`]).
    let cpu = cfg.placement.device == crate::device::DeviceChoice::Cpu || !tch::Cuda::is_available();
    let backend = if cpu { Backend::Gloo } else { Backend::Nccl };
    let key = ComparisonKey {
        model: cfg.workload.model.name(),
        dataset: dataset_name(cfg),
        device: if cpu { DeviceKind::Cpu } else { DeviceKind::Cuda },
        threads_per_rank: key::threads_of(&ranks),
        optimizer: Some(cfg.optim.optimizer),
        grad_accum: Some(1),
        bucket_mb: Some(Real(cfg.comm.bucket_mb)),
        // DDP all-reduces each bucket as backward finishes it, on gloo's or NCCL's own thread.
        overlap: Overlap::On,
        grad_dtype: Some(record::GradDtype::Fp32),
        amp: Some(crate::record::AmpMode::Off),
        backend,
        workers: Some(0),
        seq_len: Some(cfg.workload.seq_len),
        vocab_size: Some(cfg.workload.vocab_size),
        malloc: Some(record::MallocMode::Default),
        deterministic: Some(cfg.schedule.deterministic),
        phase_sync: record::PhaseSync::On,
        // The peer takes no gradient norms, whatever the study's flags say.
        noise_scale: record::NoiseScaleMode::Off,
        memory_format: record::MemoryFormat::Contiguous,
        dropout: !cfg.workload.no_dropout,
        momentum: Real(cfg.optim.momentum),
        weight_decay: Real(cfg.optim.weight_decay),
        input_shape: None,
        loss: cfg.workload.loss,
        model_sha256: None,
        env: key::env_of(&ranks),
        peer: Some(peer),
        ddp_options: Vec::new(),
    }
    .applicable();
    let mut config = serde_json::to_value(cfg).unwrap_or_default();
    config["peer"] = serde_json::json!(peer.name());
    config["noise_scale"] = serde_json::json!(record::NoiseScaleMode::Off);
    Manifest {
        schema_version: record::SCHEMA_VERSION,
        warnings: Vec::new(),
        target: None,
        study_run: cfg.study_run.clone(),
        run_id: run_id.into(),
        status: RunStatus::Running.as_str().into(),
        error: None,
        ddpbench_version: env!("CARGO_PKG_VERSION").into(),
        libtorch_version: String::new(),
        mpi_library: String::new(),
        command_line: vec![python().to_string_lossy().into_owned(), SCRIPT_FILE.into()],
        config,
        model: key.model.clone(),
        dataset: key.dataset.clone(),
        dataset_source: String::new(),
        parameters: 0,
        gradient_bytes: 0,
        comm_backend: backend,
        comm: record::CommInfo {
            overlap: true,
            backward_stages: 1,
            grad_dtype: "fp32".into(),
            amp: "off".into(),
            note: Some(format!(
                "{}, timed by ddpbench_record: comm_s is the time any bucket's all-reduce was in flight, from its \
                 hand-over to DDP's communication hook to its end; backward_s ends at the last bucket's hand-over, \
                 comm_exposed_s runs from there to the end of backward",
                peer.title()
            )),
            ..record::CommInfo::default()
        },
        buckets: 0,
        world_size: pg.size,
        nodes: pg.nodes,
        batch_size_per_rank: cfg.schedule.batch_size,
        global_batch_size: cfg.schedule.batch_size * pg.size,
        steps_per_epoch: steps_per_epoch(cfg, pg.size),
        start_utc: record::rfc3339_utc(started),
        end_utc: None,
        wall_s: None,
        final_param_l2: None,
        final_val_accuracy: None,
        allreduce_probe: None,
        allreduce_probe_warm: None,
        ranks,
        host_malloc: None,
        clock: None,
        comparison_key: Some(key),
        model_file: None,
        log_lines_dropped: 0,
    }
}

/// The data set's name as ddpbench's runs record it.
fn dataset_name(cfg: &TrainConfig) -> String {
    match cfg.workload.dataset {
        DatasetKind::Synthetic => "synthetic".into(),
        _ => "fashion-mnist".into(),
    }
}

/// Steps per epoch of the peer: 60,000 samples (both data sources it reads) sharded over
/// the ranks by DistributedSampler, in batches of the per-rank batch.
fn steps_per_epoch(cfg: &TrainConfig, world: usize) -> usize {
    60_000usize.div_ceil(world).div_ceil(cfg.schedule.batch_size.max(1))
}

/// What the peer said about itself, into the manifest.
fn fill_from(m: &mut Manifest, info: &PeerInfo) {
    m.libtorch_version = info.torch_version.clone();
    m.parameters = info.parameters;
    m.gradient_bytes = info.gradient_bytes;
    m.buckets = info.bucket_bytes.len();
    m.comm.bucket_bytes = info.bucket_bytes.clone();
    let backend = match info.backend.as_str() {
        "nccl" => Backend::Nccl,
        _ => Backend::Gloo,
    };
    m.comm_backend = backend;
    let cuda = info.device.starts_with("cuda");
    for r in &mut m.ranks {
        r.device = if cuda { format!("Cuda({})", r.local_rank) } else { "Cpu".into() };
    }
    if let Some(k) = m.comparison_key.as_mut() {
        k.backend = backend;
        k.device = if cuda { DeviceKind::Cuda } else { DeviceKind::Cpu };
    }
}

/// Ok when the recorder recorded this rank's part of the run as completed, with a step.
fn recorded(dir: &Path, rank: usize) -> Result<()> {
    let end = EndRecord::read(dir, rank).context("the peer's recorder left no end record")?;
    ensure!(
        end.status == RunStatus::Completed && end.steps > 0,
        "the peer's rank {rank} recorded its end as {} after {} step(s){}",
        end.status.as_str(),
        end.steps,
        end.error.map(|e| format!(": {e}")).unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::testing::{mkfifo, returns_promptly};

    #[test]
    fn a_fifo_for_peer_json_is_named_at_once_never_waited_on() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        mkfifo(&dir.join("peer.json"));
        let e = returns_promptly(move || read_info(&dir).map(drop)).unwrap_err();
        assert!(e.contains("peer.json is a FIFO (named pipe)"), "{e}");
        std::fs::remove_file(d.path().join("peer.json")).unwrap();
        let info = r#"{"torch_version": "2.11.0", "backend": "gloo", "device": "cpu", "parameters": 7,
            "gradient_bytes": 28, "bucket_bytes": [28]}"#;
        std::fs::write(d.path().join("peer.json"), info).unwrap();
        assert_eq!(read_info(d.path()).unwrap().parameters, 7);
    }

    #[test]
    fn the_embedded_recorder_is_every_python_file_of_its_package() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python").join(RECORDER_PACKAGE);
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .collect();
        on_disk.sort();
        let embedded: Vec<&str> = RECORDER_FILES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            embedded,
            on_disk,
            "RECORDER_FILES in src/study/peer.rs must list every .py file of {}",
            dir.display()
        );
        for (name, text) in RECORDER_FILES {
            assert_eq!(text, std::fs::read_to_string(dir.join(name)).unwrap(), "{name}");
        }
    }
}
