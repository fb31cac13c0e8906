//! Writes a synthetic run folder (manifest + rank files) for benchmarking the reducer:
//!   cargo run --release --example gen_run -- DIR RANKS STEPS
//! Step times vary per rank and step (deterministic), and two node types alternate.
use ddpbench::record::{CsvLog, Manifest, RankInfo, StepRow};
use std::path::PathBuf;

/// Seconds between the starts of two steps: above the longest step drawn (about 0.056 s).
const STEP_EVERY_S: f64 = 0.1;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: gen_run DIR RANKS STEPS");
    let dir = PathBuf::from(&args[1]);
    let ranks: usize = args[2].parse()?;
    let steps: usize = args[3].parse()?;
    std::fs::create_dir_all(&dir)?;
    let types = ["V100 node", "A40 node"];
    let manifest = Manifest {
        schema_version: ddpbench::record::SCHEMA_VERSION,
        run_id: dir.file_name().unwrap().to_string_lossy().into(),
        status: "completed".into(),
        error: None,
        ddpbench_version: env!("CARGO_PKG_VERSION").into(),
        libtorch_version: "2.11.0".into(),
        mpi_library: "generated".into(),
        command_line: args.clone(),
        config: serde_json::Value::Null,
        model: "mnist-cnn".into(),
        dataset: "synthetic".into(),
        dataset_source: String::new(),
        warnings: Vec::new(),
        target: None,
        study_run: None,
        parameters: 1_199_882,
        gradient_bytes: 4_799_528,
        comm_backend: ddpbench::record::Backend::Mpi,
        comm: Default::default(),
        buckets: 1,
        world_size: ranks,
        nodes: ranks.div_ceil(4),
        batch_size_per_rank: 64,
        global_batch_size: 64 * ranks,
        steps_per_epoch: steps,
        start_utc: "2026-01-01T00:00:00.000000Z".into(),
        end_utc: None,
        // The rows' steps start every STEP_EVERY_S: the run ends after the last.
        wall_s: Some(steps as f64 * STEP_EVERY_S + 1.0),
        final_param_l2: Some(1.0),
        final_val_accuracy: None,
        allreduce_probe: None,
        allreduce_probe_warm: None,
        host_malloc: None,
        clock: None,
        // Derived by reduce from the fields above, as for a manifest written before the key.
        comparison_key: None,
        model_file: None,
        log_lines_dropped: 0,
        ranks: (0..ranks)
            .map(|r| RankInfo {
                rank: r,
                local_rank: r % 4,
                host: format!("gn{:02}", r / 4),
                node_type: types[(r / 4) % 2].into(),
                device: "Cuda(0)".into(),
                binding: "auto".into(),
                threads: 8,
                cpu_model: "x".into(),
                gpus: vec![],
                gpu_bus_id: None,
                binding_note: None,
                comm_thread: None,
                launcher_env: vec![],
                ..Default::default()
            })
            .collect(),
    };
    manifest.write(&dir)?;
    let run_id = manifest.run_id.clone();
    let mut seed = 0x1234_5678_u64;
    for r in 0..ranks {
        let mut log = CsvLog::<StepRow>::create(&dir.join(ddpbench::record::rank_file_name(r)))?;
        let node_type = types[(r / 4) % 2].to_string();
        let slow = if (r / 4) % 2 == 1 { 1.3 } else { 1.0 };
        for k in 0..steps {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let jitter = 1.0 + ((seed >> 33) as f64 / (1u64 << 31) as f64) * 0.2;
            let (data, fwd, bwd, comm, opt) = (0.001 * jitter, 0.01 * slow * jitter, 0.02 * slow * jitter, 0.004 * jitter, 0.002);
            let step = data + fwd + bwd + comm + opt + 0.0001;
            let t = k as f64 * STEP_EVERY_S;
            log.write(&StepRow {
                run_id: run_id.clone(),
                rank: r,
                node_type: node_type.clone(),
                epoch: 0,
                step: k,
                global_step: k,
                warmup: u8::from(k < 5),
                time_utc: "2026-01-01T00:00:00.000000Z".into(),
                step_start_at_s: t,
                samples: 64,
                phases: ddpbench::record::PhaseArray([data, 0.0, fwd, bwd, comm, opt, 0.0001]),
                comm_s: comm,
                comm_stage_d2h_s: 0.0,
                comm_stage_h2d_s: 0.0,
                step_s: step,
                comm_hidden_s: 0.0,
                comm_start_at_s: t + data + fwd + bwd,
                comm_last_start_at_s: t + data + fwd + bwd,
                loss: 1.0,
                bytes: 4_799_528,
                loss_scale: None,
                step_skipped: 0,
                noise: None,
            })?;
        }
        log.flush()?;
    }
    Ok(())
}
