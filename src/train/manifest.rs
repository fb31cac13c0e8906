//! The manifest a run starts with (status "running"): configuration, versions,
//! every rank's placement, the model, the communication set-up, the schedule, and the
//! comparison key of what ran.

use super::communication::Communication;
use super::config::TrainConfig;
use super::placement::{gathered_rank_infos, Placement};
use super::run_folder::RunFolder;
use super::state::{ModelState, Schedule};
use crate::data::Dataset;
use crate::record::key::{self, ComparisonKey, Real};
use crate::record::{self, DeviceKind, Manifest, Overlap, RankInfo};
use crate::world::Group;
use anyhow::Result;
use std::path::Path;
use std::time::SystemTime;

/// The manifest as written before the first step (rank 0 holds every rank's placement).
#[allow(clippy::too_many_arguments)]
pub(super) fn initial(
    g: &Group,
    cfg: &TrainConfig,
    folder: &RunFolder,
    started: SystemTime,
    place: &Placement,
    dataset: &Dataset,
    model: &ModelState,
    comm: &Communication,
    schedule: &Schedule,
) -> Result<Manifest> {
    let parameters: usize = model.param_tensors.iter().map(|t| t.numel()).sum();
    let mut config = serde_json::to_value(cfg)?;
    config["lr"] = serde_json::json!(cfg.learning_rate());
    if dataset.stream.is_none() {
        // Which shuffle the seed chose the order of samples with: another order before it.
        config["sample_order"] = serde_json::json!(crate::data::SAMPLE_ORDER);
    }
    let model_name = cfg.workload.model.name();
    let ranks = gathered_rank_infos(g, place, cfg)?;
    let model_file = model.net.script().map(|s| s.file().clone());
    let mut comparison_key = comparison_key(cfg, &model_name, &dataset.name, &ranks, comm, place.device);
    if let Some(f) = &model_file {
        comparison_key.model_sha256 = Some(f.sha256.clone());
        comparison_key.input_shape = cfg
            .workload
            .input_shape
            .as_ref()
            .map(|s| key::input_text(&s.to_string(), cfg.workload.input_dtype));
    }
    let comparison_key = comparison_key.applicable();
    Ok(Manifest {
        schema_version: record::SCHEMA_VERSION,
        run_id: folder.run_id.clone(),
        status: "running".into(),
        error: None,
        ddpbench_version: env!("CARGO_PKG_VERSION").into(),
        libtorch_version: libtorch_version(),
        mpi_library: mpi::environment::library_version().unwrap_or_default().trim().to_string(),
        command_line: std::env::args().collect(),
        config,
        model: model_name,
        dataset: dataset.name.clone(),
        dataset_source: dataset.source.clone(),
        parameters,
        gradient_bytes: model
            .param_tensors
            .iter()
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum::<usize>() as u64,
        comm_backend: comm.backend,
        comm: comm.info.clone(),
        buckets: comm.buckets,
        world_size: g.size,
        nodes: g.nodes,
        batch_size_per_rank: cfg.schedule.batch_size,
        global_batch_size: cfg.samples_per_step() * g.size,
        steps_per_epoch: schedule.steps_per_epoch,
        start_utc: record::rfc3339_utc(started),
        end_utc: None,
        wall_s: None,
        final_param_l2: None,
        final_val_accuracy: None,
        allreduce_probe: comm.probe.clone(),
        allreduce_probe_warm: comm.probe_warm.clone(),
        ranks,
        host_malloc: None,
        clock: None,
        comparison_key: Some(comparison_key),
        model_file,
        log_lines_dropped: 0,
        warnings: Vec::new(),
        target: None,
        study_run: cfg.study_run.clone(),
    })
}

/// What the run is compared by: what ran (the device found, the threads bound, the
/// backend chosen, the overlap in effect) and the flags that change a step's work.
fn comparison_key(
    cfg: &TrainConfig,
    model: &str,
    dataset: &str,
    ranks: &[RankInfo],
    comm: &Communication,
    device: tch::Device,
) -> ComparisonKey {
    ComparisonKey {
        model: model.into(),
        dataset: dataset.into(),
        device: DeviceKind::of_ranks(ranks),
        threads_per_rank: key::threads_of(ranks),
        optimizer: Some(cfg.optim.optimizer),
        grad_accum: Some(cfg.schedule.grad_accum),
        bucket_mb: Some(Real(cfg.comm.bucket_mb)),
        overlap: Overlap::in_effect(comm.info.overlap, comm.info.overlap_shares_core),
        grad_dtype: Some(cfg.comm.grad_dtype),
        amp: Some(cfg.optim.amp),
        backend: comm.backend,
        workers: cfg.placement.workers,
        seq_len: Some(cfg.workload.seq_len),
        vocab_size: Some(cfg.workload.vocab_size),
        malloc: Some(cfg.placement.malloc),
        deterministic: Some(cfg.schedule.deterministic),
        phase_sync: cfg.phase_sync_on(device),
        noise_scale: cfg.comm.noise_scale,
        memory_format: cfg.memory_format_on(device),
        dropout: !cfg.workload.no_dropout,
        momentum: Real(cfg.optim.momentum),
        weight_decay: Real(cfg.optim.weight_decay),
        input_shape: None,
        loss: cfg.workload.loss,
        model_sha256: None,
        env: key::env_of(ranks),
        peer: None,
        ddp_options: Vec::new(),
    }
}

/// Version of the libtorch this binary runs on, from the library's build file.
fn libtorch_version() -> String {
    option_env!("DDPBENCH_LIBTORCH_LIB")
        .map(Path::new)
        .and_then(|lib| lib.parent())
        .and_then(|root| std::fs::read_to_string(root.join("version.py")).ok())
        .and_then(|v| {
            v.lines()
                .find_map(|l| l.strip_prefix("__version__ = ").map(|s| s.trim_matches(['\'', '"']).to_string()))
        })
        .unwrap_or_else(|| "unknown".into())
}
