//! The manifest a run starts with (status "running"): configuration, versions,
//! every rank's placement, the model, the communication set-up and the schedule.

use super::communication::Communication;
use super::config::TrainConfig;
use super::placement::Placement;
use super::run_folder::RunFolder;
use super::trainer::{gathered_rank_infos, ModelState, Schedule};
use crate::data::Dataset;
use crate::record::{self, Manifest};
use crate::world::Group;
use anyhow::Result;
use std::path::Path;
use std::time::SystemTime;

/// The manifest as written before the first step (rank 0 holds every rank's placement).
#[allow(clippy::too_many_arguments)]
pub fn initial(
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
        model: serde_json::to_value(cfg.workload.model)?.as_str().unwrap_or("").into(),
        dataset: dataset.name.clone(),
        dataset_source: dataset.source.clone(),
        parameters,
        gradient_bytes: (parameters * 4) as u64,
        comm_backend: comm.reducer.backend().into(),
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
        ranks: gathered_rank_infos(g, place, cfg)?,
        host_malloc: None,
        clock: None,
    })
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
