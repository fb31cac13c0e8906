//! `ddpbench train`: the timed data-parallel loop, one process per rank.
//!
//! Each step reads top to bottom like the sentence it measures:
//! load batch → forward → backward → all-reduce → optimizer step, each phase timed
//! the same way (libtorch's stream synchronised on GPU), the rest counted as `other_s`
//! so the phases add up to `step_s`. With `--overlap on`, backward runs in segments and
//! hands each finished bucket to the all-reduce as it goes; the all-reduce phase is
//! then only what is left to wait for (`comm_exposed_s`), and `comm_s` is all of it.
//!
//! Errors during set-up are agreed across ranks ([`agree`]) so every rank exits
//! non-zero with the same message; an error on one rank during training takes the
//! job down with MPI_Abort so no rank waits forever in a collective.

use crate::amp::AmpMode;
use crate::amp::{Autocast, LossScaler};
use crate::cli::TrainArgs;
use crate::comm::{self, mpi::MpiStaged, nccl::NcclReducer, BucketPlan, GradientReducer};
use crate::comm::{AllreduceChoice, OverlapMode};
use crate::data::{self, Dataset};
use crate::device::DeviceChoice;
use crate::model;
use crate::optim::LrScaling;
use crate::optim::{self, Optimizer};
use crate::record::{self, CommInfo, CsvLog, EpochRow, Manifest, RankInfo, StepRow};
use crate::topology::{self, World};
use anyhow::{anyhow, bail, Context, Result};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::topology::Communicator;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};
use tch::nn;
use tch::{Device, Kind, Tensor};
use tracing::{info, warn};

/// An error every rank knows about (agreed through MPI), reported once by rank 0.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AgreedError {
    /// The lowest rank that hit it.
    pub rank: usize,
    pub message: String,
}

/// Checks arguments that need no MPI, so bad input fails before any rendezvous.
pub fn validate(args: &TrainArgs) -> Result<()> {
    let fail = |flag: &str, why: &str| Err(anyhow!("{flag}: {why}"));
    if args.batch_size == 0 {
        return fail("--batch-size 0", "must be at least 1 sample per rank");
    }
    if args.epochs == 0 {
        return fail("--epochs 0", "must be at least 1 (use --max-steps to stop earlier)");
    }
    if args.max_steps == Some(0) {
        return fail("--max-steps 0", "must be at least 1");
    }
    if args.threads == Some(0) {
        return fail("--threads 0", "must be at least 1 (leave it out to follow the core binding)");
    }
    if !(args.bucket_mb > 0.0 && args.bucket_mb.is_finite()) {
        return fail(&format!("--bucket-mb {}", args.bucket_mb), "must be a positive number of MiB");
    }
    if let Some(lr) = args.lr {
        if !(lr > 0.0 && lr.is_finite()) {
            return fail(&format!("--lr {lr}"), "must be positive");
        }
    }
    if args.grad_accum == 0 {
        return fail("--grad-accum 0", "must be at least 1 micro-batch per step");
    }
    if !(args.warmup_epochs >= 0.0 && args.warmup_epochs.is_finite()) {
        return fail(&format!("--warmup-epochs {}", args.warmup_epochs), "must be 0 or more");
    }
    if args.seq_len == 0 {
        return fail("--seq-len 0", "must be at least 1 token");
    }
    if args.vocab_size < 3 {
        return fail(
            &format!("--vocab-size {}", args.vocab_size),
            "must be at least 3 (padding, unknown and one word)",
        );
    }
    if args.synthetic_samples == 0 {
        return fail("--synthetic-samples 0", "must be at least 1");
    }
    Ok(())
}

/// Entry point of `ddpbench train`.
pub fn main(args: TrainArgs) -> Result<()> {
    validate(&args)?;
    let world = World::init()?;
    init_logging(world.rank);
    install_abort_on_panic();
    let _span = tracing::info_span!("rank", r = world.rank).entered();
    match run(&world, &args) {
        Ok(()) => Ok(()),
        Err(err) => match err.downcast_ref::<AgreedError>() {
            Some(agreed) => {
                let rank = world.rank;
                let origin = agreed.rank;
                drop(world); // MPI_Finalize: every rank reached this point.
                if rank == 0 {
                    Err(err.context(format!("rank {origin} reported")))
                } else {
                    std::process::exit(1)
                }
            }
            None => {
                eprintln!("Error on rank {} ({}): {err:#}. Aborting the job.", world.rank, world.host);
                world.world.abort(1)
            }
        },
    }
}

fn init_logging(rank: usize) {
    use tracing_subscriber::EnvFilter;
    let default = if rank == 0 { "info" } else { "warn" };
    let filter = EnvFilter::try_from_env("DDPBENCH_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// A panic on one rank must not leave the others blocked in a collective.
fn install_abort_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        // SAFETY: MPI is initialised (the hook is installed after World::init).
        unsafe {
            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 2);
        }
    }));
}

/// Turns a per-rank result into one every rank agrees on: if any rank failed,
/// all ranks return the lowest failing rank's message as an [`AgreedError`].
pub fn agree<T>(w: &World, result: Result<T>) -> Result<T> {
    let mine: i32 = if result.is_err() { w.rank as i32 } else { i32::MAX };
    let mut first = 0i32;
    w.world.all_reduce_into(&mine, &mut first, SystemOperation::min());
    if first == i32::MAX {
        return result;
    }
    let mut text = match &result {
        Err(e) if w.rank as i32 == first => format!("{e:#}").into_bytes(),
        _ => Vec::new(),
    };
    let root = w.world.process_at_rank(first);
    let mut len = text.len() as u64;
    root.broadcast_into(&mut len);
    text.resize(len as usize, 0);
    root.broadcast_into(&mut text[..]);
    Err(AgreedError {
        rank: first as usize,
        message: String::from_utf8_lossy(&text).into_owned(),
    }
    .into())
}

/// Rank 0's string, on every rank.
fn broadcast_string(w: &World, s: &str) -> String {
    let root = w.world.process_at_rank(0);
    let mut bytes = if w.rank == 0 { s.as_bytes().to_vec() } else { Vec::new() };
    let mut len = bytes.len() as u64;
    root.broadcast_into(&mut len);
    bytes.resize(len as usize, 0);
    root.broadcast_into(&mut bytes[..]);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every rank's string, on rank 0 (None elsewhere).
fn gather_strings(w: &World, s: &str) -> Option<Vec<String>> {
    let mut width = 0u64;
    w.world.all_reduce_into(&(s.len() as u64), &mut width, SystemOperation::max());
    let mut mine = s.as_bytes().to_vec();
    mine.resize(width as usize, 0);
    let root = w.world.process_at_rank(0);
    if w.rank == 0 {
        let mut all = vec![0u8; width as usize * w.size];
        root.gather_into_root(&mine[..], &mut all[..]);
        Some(
            all.chunks(width.max(1) as usize)
                .take(w.size)
                .map(|c| String::from_utf8_lossy(c).trim_end_matches('\0').to_string())
                .collect(),
        )
    } else {
        root.gather_into(&mine[..]);
        None
    }
}

/// Rank 0 picks and prepares the run folder; every rank learns its path.
fn prepare_out_dir(w: &World, args: &TrainArgs, started: SystemTime) -> Result<(PathBuf, String)> {
    let prepared: Result<PathBuf> = if w.rank == 0 {
        (|| {
            let dir = match &args.out {
                Some(d) => d.clone(),
                None => {
                    let id = format!(
                        "{}-{}-n{}-{}",
                        serde_json::to_value(args.model)?.as_str().unwrap_or("model"),
                        serde_json::to_value(args.dataset)?.as_str().unwrap_or("data"),
                        w.size,
                        record::compact_utc(started)
                    );
                    PathBuf::from("results").join(id)
                }
            };
            if dir.join("manifest.json").exists() {
                bail!(
                    "{} already holds a run (manifest.json). Choose another --out or move that run away",
                    dir.display()
                );
            }
            std::fs::create_dir_all(&dir).with_context(|| {
                format!(
                    "cannot create output folder {} (check permissions or choose another --out)",
                    dir.display()
                )
            })?;
            let probe = dir.join(".write-test");
            std::fs::write(&probe, b"ok")
                .with_context(|| format!("output folder {} is not writable (choose another --out)", dir.display()))?;
            let _ = std::fs::remove_file(probe);
            Ok(dir)
        })()
    } else {
        Ok(PathBuf::new())
    };
    let dir = agree(w, prepared)?;
    let dir = PathBuf::from(broadcast_string(w, &dir.to_string_lossy()));
    let run_id = dir.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok((dir, run_id))
}

/// True when this node has an NVIDIA driver, i.e. a GPU may be usable.
fn nvidia_driver_present() -> bool {
    Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidiactl").exists()
}

/// Loads libtorch's CUDA backend. The binary does not link it, so that CPU runs,
/// `reduce` and `topo` start fast; its static initialisers register CUDA with libtorch.
pub fn load_cuda_backend() -> Result<()> {
    let dir = option_env!("DDPBENCH_LIBTORCH_LIB").unwrap_or("");
    let candidates = [format!("{dir}/libtorch_cuda.so"), "libtorch_cuda.so".to_string()];
    let mut errors = Vec::new();
    for lib in candidates.iter().filter(|c| !c.starts_with('/') || Path::new(c).exists()) {
        let name = std::ffi::CString::new(lib.as_str())?;
        // SAFETY: dlopen with a valid C string; the handle is kept for the process' life.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !handle.is_null() {
            return Ok(());
        }
        // SAFETY: dlerror returns a C string owned by libc, valid until the next dl call.
        let err = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        errors.push(format!("{lib}: {}", err.to_string_lossy()));
    }
    bail!(
        "libtorch's CUDA backend could not be loaded ({}). Is this a CUDA build of libtorch?",
        errors.join("; ")
    )
}

fn resolve_device(choice: DeviceChoice, local_rank: usize) -> Result<Device> {
    let gpus = match choice {
        DeviceChoice::Cpu => 0,
        DeviceChoice::Auto if !nvidia_driver_present() => 0,
        DeviceChoice::Auto => match load_cuda_backend() {
            Ok(()) => tch::Cuda::device_count(),
            Err(e) => {
                warn!("{e:#}; training on CPU");
                0
            }
        },
        DeviceChoice::Cuda => {
            load_cuda_backend()?;
            tch::Cuda::device_count()
        }
    };
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto if gpus == 0 => Ok(Device::Cpu),
        DeviceChoice::Cuda if gpus == 0 => bail!(
            "--device cuda: libtorch sees no GPU (CUDA_VISIBLE_DEVICES={:?}). Use --device cpu or check the node's driver",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
        ),
        _ => Ok(Device::Cuda(local_rank % gpus as usize)),
    }
}

/// Waits for the device work queued so far by libtorch, so a phase's wall time covers
/// its kernels. On CUDA this synchronises libtorch's stream only, not NCCL's (so an
/// overlapped all-reduce keeps running); that costs the CPU/GPU pipelining across
/// phase boundaries, a few kernel launches' worth per phase.
fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        if crate::cuda::sync_torch_stream().is_err() {
            tch::Cuda::synchronize(i as i64);
        }
    }
}

/// Copies rank 0's values of `vars` to every rank: parameters at the start (as DDP does at
/// construction), BatchNorm statistics before validation.
fn broadcast_from_rank0(w: &World, params: &[(String, Tensor)]) {
    let root = w.world.process_at_rank(0);
    for (_, p) in params {
        let n = p.numel();
        let mut buf = vec![0f32; n];
        if w.rank == 0 {
            p.to_device(Device::Cpu).to_kind(Kind::Float).copy_data(&mut buf, n);
        }
        root.broadcast_into(&mut buf[..]);
        let src = Tensor::from_slice(&buf).view(p.size().as_slice()).to_device(p.device());
        tch::no_grad(|| {
            let mut p = p.shallow_clone();
            p.copy_(&src);
        });
    }
}

/// (L2 norm, plain sum) of all parameters, in f64.
fn param_checksum(params: &[(String, Tensor)]) -> [f64; 2] {
    tch::no_grad(|| {
        let mut sq = 0.0;
        let mut sum = 0.0;
        for (_, p) in params {
            let d = p.to_kind(Kind::Double);
            sq += d.square().sum(Kind::Double).double_value(&[]);
            sum += d.sum(Kind::Double).double_value(&[]);
        }
        [sq.sqrt(), sum]
    })
}

/// Every rank must hold the same parameters; a difference names the ranks.
fn check_in_sync(w: &World, params: &[(String, Tensor)], epoch: usize) -> Result<f64> {
    let mine = param_checksum(params);
    let mut all = vec![0f64; 2 * w.size];
    w.world.all_gather_into(&mine[..], &mut all[..]);
    let reference = [all[0], all[1]];
    let diverged: Vec<String> = all
        .chunks(2)
        .enumerate()
        .filter(|(_, c)| (0..2).any(|k| (c[k] - reference[k]).abs() > 1e-9 * reference[k].abs().max(1.0)))
        .map(|(r, c)| format!("rank {r} (l2 {:.12}, sum {:.12})", c[0], c[1]))
        .collect();
    if !diverged.is_empty() {
        return Err(AgreedError {
            rank: w.rank,
            message: format!(
                "parameters diverged after epoch {epoch}: rank 0 has l2 {:.12}, sum {:.12}; {}. \
                 Gradients were not averaged identically on every rank",
                reference[0],
                reference[1],
                diverged.join("; ")
            ),
        }
        .into());
    }
    Ok(reference[0])
}

/// Loss and accuracy on the test split, each rank taking every size-th sample.
fn validate_epoch(w: &World, net: &dyn model::Net, data: &Dataset, device: Device, limit: Option<usize>) -> Result<(f64, f64, usize)> {
    let n = data.test.len().min(limit.unwrap_or(usize::MAX));
    let mine: Vec<i64> = (w.rank..n).step_by(w.size).map(|i| i as i64).collect();
    let (mut loss_sum, mut correct) = (0.0f64, 0.0f64);
    tch::no_grad(|| -> Result<()> {
        for chunk in mine.chunks(if data.test.files.is_some() { 64 } else { 1000 }) {
            let (x, y) = data.test.batch(&Tensor::from_slice(chunk), device)?;
            let out = net.forward_t(&x, false);
            loss_sum += out.nll_loss(&y).double_value(&[]) * chunk.len() as f64;
            correct += out.argmax(-1, false).eq_tensor(&y).sum(Kind::Int64).int64_value(&[]) as f64;
        }
        Ok(())
    })?;
    let mine = [loss_sum, correct, mine.len() as f64];
    let mut total = [0f64; 3];
    w.world.all_reduce_into(&mine[..], &mut total[..], SystemOperation::sum());
    if total[2] == 0.0 {
        return Ok((f64::NAN, f64::NAN, 0));
    }
    Ok((total[0] / total[2], total[1] / total[2], total[2] as usize))
}

fn run(w: &World, args: &TrainArgs) -> Result<()> {
    let started = SystemTime::now();
    let (out_dir, run_id) = prepare_out_dir(w, args, started)?;
    let result = run_in(w, args, started, &out_dir, &run_id);
    if result.is_err() && w.rank == 0 && !out_dir.join("manifest.json").exists() {
        // Set-up failed before the run began: leave no empty run folder behind.
        let _ = std::fs::remove_dir(&out_dir);
    }
    result
}

fn run_in(w: &World, args: &TrainArgs, started: SystemTime, out_dir: &Path, run_id: &str) -> Result<()> {
    let started_at = Instant::now();
    let (out_dir, run_id) = (out_dir.to_path_buf(), run_id.to_string());

    // Placement: the device first (its GPU decides the cores), then bind this rank to its
    // cores, then size libtorch's thread pool to them.
    let device = agree(w, resolve_device(args.device, w.local_rank))?;
    let mut hw = hwloc2::Topology::new().ok_or_else(|| anyhow!("hwloc could not read the topology"));
    let cores = hw.as_ref().map(topology::discover_cores).unwrap_or_default();
    let (gpu_bus_id, gpu_near) = match device {
        Device::Cuda(i) => gpu_places(i),
        _ => (None, Err(anyhow!("training on CPU"))),
    };
    let binding = match (&gpu_near, args.bind) {
        (Ok(near), topology::BindPolicy::Auto) => topology::plan_gpu_bindings(&cores, near, w.local_size).swap_remove(w.local_rank),
        _ => topology::plan_binding(&cores, args.bind, w.local_rank, w.local_size),
    };
    let binding_note = match (&device, &gpu_near) {
        (Device::Cuda(_), Err(e)) => Some(format!("not bound by GPU locality: {e:#}")),
        _ => binding.fallback.clone(),
    };
    if let Some(n) = binding_note.as_ref().filter(|_| w.local_rank == 0 && device != Device::Cpu) {
        warn!("{n}");
    }
    if let Ok(hw) = hw.as_mut() {
        if let Err(e) = topology::apply_binding(hw, &binding) {
            warn!("{e:#}; running unbound");
        }
    }
    if binding.shared {
        warn!(
            "{} local ranks share {} cores: timings will include contention{}",
            w.local_size,
            cores.len(),
            if binding.pus.is_empty() { " (ranks left unbound)" } else { "" }
        );
    }
    let threads = args.threads.unwrap_or(binding.threads);
    tch::set_num_threads(threads as i32);
    let node = topology::NodeInfo::detect(&cores);
    let node_type = args.node_type.clone().unwrap_or_else(|| node.node_type());
    if let Device::Cuda(_) = device {
        tch::Cuda::cudnn_set_benchmark(!args.deterministic);
    }

    // Data and model. The same seed on every rank, then rank 0's parameters win.
    let options = model::ModelOptions {
        seq_len: args.seq_len as i64,
        vocab: args.vocab_size as i64,
        dropout: !args.no_dropout,
    };
    let spec = model::spec(args.model, &options);
    let dataset = agree(w, data::load(args, &spec))?;
    tch::manual_seed(args.seed as i64);
    let vs = nn::VarStore::new(device);
    let net = model::build(args.model, &vs.root(), &options);
    let params = model::ordered_parameters(&vs);
    broadcast_from_rank0(w, &params);
    // Dropout masks differ per rank, as in a PyTorch job where each process draws its own.
    tch::manual_seed(args.seed as i64 + 1 + w.rank as i64);
    let param_tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    let mut opt = agree(
        w,
        Optimizer::new(
            args.optimizer,
            &vs,
            &param_tensors,
            args.learning_rate(),
            args.momentum,
            args.weight_decay,
        ),
    )?;
    let lr_scale = match args.lr_scaling {
        LrScaling::None => 1.0,
        LrScaling::Linear => (w.size * args.grad_accum) as f64,
    };

    // Communication: backend, overlap, buckets in the order backward makes them ready.
    let (use_nccl, backend_note) = choose_backend(w, args, device)?;
    // What differs from what was asked, and why: logged once and kept in the manifest.
    let mut notes: Vec<String> = backend_note.into_iter().collect();
    let threading_ok = matches!(w.threading, mpi::Threading::Serialized | mpi::Threading::Multiple);
    let mut overlap = args.overlap == OverlapMode::On && (use_nccl || threading_ok);
    if args.overlap == OverlapMode::On && !overlap {
        notes.push(format!(
            "overlap off: MPI granted thread level {:?}, and the all-reduce thread needs serialized or multiple",
            w.threading
        ));
    }
    let (stage_of, stages) = discover_stages(net.as_ref(), &spec, device, &param_tensors);
    let numels: Vec<usize> = params.iter().map(|(_, t)| t.numel()).collect();
    let mut order: Vec<usize> = (0..numels.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(stage_of[i]), std::cmp::Reverse(i)));
    let plan = BucketPlan::in_order(&numels, &order, 4, (args.bucket_mb * (1 << 20) as f64) as usize);
    // launch_after[k]: the buckets whose last gradient is made by stage k's backward.
    let mut launch_after: Vec<Vec<usize>> = vec![Vec::new(); stages];
    for (b, members) in plan.buckets.iter().enumerate() {
        launch_after[members.iter().map(|&p| stage_of[p]).min().unwrap_or(0)].push(b);
    }
    // Backward is cut only where a bucket becomes ready: every other cut would cost an
    // extra pass over an activation and hide nothing. Buckets ready only when backward
    // ends (stage 0) cannot overlap anything and go in `finish`.
    let cut_at: Vec<usize> = (1..stages).filter(|&k| !launch_after[k].is_empty()).collect();
    if overlap && cut_at.is_empty() {
        overlap = false;
        notes.push(if plan.buckets.len() == 1 {
            format!(
                "overlap off: all {:.1} MB of gradients fit one {} MiB bucket, ready only when backward ends; lower --bucket-mb to overlap",
                (numels.iter().sum::<usize>() * 4) as f64 / 1e6,
                args.bucket_mb
            )
        } else {
            "overlap off: every gradient bucket is ready only when backward ends (the first stage holds them all)".into()
        });
    }
    let probing = args.probe_iters > 0 && w.size > 1;
    let probe = probing.then(|| comm::probe_allreduce(&w.world, w.size, &plan, args.probe_iters, comm::CACHE_FLUSH_BYTES));
    let probe_warm = probing.then(|| comm::probe_allreduce(&w.world, w.size, &plan, args.probe_iters, 0));
    let buckets = plan.buckets.len();
    let mut reducer: Box<dyn GradientReducer> = match device {
        Device::Cuda(index) if use_nccl => {
            let mine = if w.rank == 0 {
                crate::cuda::nccl().and_then(|n| n.unique_id())
            } else {
                Ok(crate::cuda::NcclUniqueId { internal: [0; 128] })
            };
            let mut id = agree(w, mine)?;
            w.world.process_at_rank(0).broadcast_into(&mut id.internal[..]);
            // Not agreed: a rank whose ncclCommInitRank fails leaves the others waiting in it,
            // so its error aborts the job (MPI_Abort) rather than meeting them in a collective.
            Box::new(NcclReducer::join(w.rank, w.size, id, index, plan, args.grad_dtype)?)
        }
        _ => Box::new(agree(w, MpiStaged::new(&w.world, plan, args.grad_dtype, overlap))?),
    };
    // The discovery pass left every gradient defined: they become views of the buckets.
    agree(w, reducer.attach(&param_tensors))?;
    reducer.zero_grads();
    let autocast = agree(w, Autocast::new(args.amp, device))?;
    let mut scaler = (args.amp == AmpMode::Fp16).then(LossScaler::default);
    let overflow_at = if w.rank == 0 { fault_step("DDPBENCH_AMP_OVERFLOW") } else { None };
    // Gradients are summed by the all-reduce: pre-divide the loss so the sum is the mean.
    let loss_scale = 1.0 / (w.size * args.grad_accum) as f64;

    let samples_per_step = args.batch_size * args.grad_accum;
    let steps_per_epoch = match &dataset.stream {
        // Streams yield full batches only (equal ranges on every rank).
        Some(src) => {
            let (a, b) = crate::bigmnist::rank_range(&src.index, w.rank, w.size);
            ((b - a) as usize / args.batch_size / args.grad_accum).max(1)
        }
        None => {
            let per_rank = data::shard_indices(dataset.train.len(), w.size, w.rank, args.seed, 0, true).len();
            data::steps_per_epoch(per_rank, samples_per_step)
        }
    };
    let warmup_lr_steps = (args.warmup_epochs * steps_per_epoch as f64).round() as usize;
    let total_steps = (steps_per_epoch * args.epochs).min(args.max_steps.unwrap_or(usize::MAX));
    let epochs = total_steps.div_ceil(steps_per_epoch);

    // The manifest: written now (status "running") and again at the end.
    let info = RankInfo {
        rank: w.rank,
        local_rank: w.local_rank,
        host: w.host.clone(),
        node_type: node_type.clone(),
        device: format!("{device:?}"),
        binding: format!(
            "{}: {}",
            serde_json::to_value(args.bind)?.as_str().unwrap_or(""),
            if binding.pus.is_empty() {
                "unbound".into()
            } else {
                topology::compact_list(&binding.pus)
            }
        ),
        threads: tch::get_num_threads() as usize,
        cpu_model: node.cpu_model.clone(),
        gpus: node.gpus.clone(),
        gpu_bus_id: gpu_bus_id.clone(),
        binding_note: binding_note.clone(),
        launcher_env: topology::launcher_env(),
    };
    let infos = gather_strings(w, &serde_json::to_string(&info)?);
    let mut manifest = Manifest {
        schema_version: record::SCHEMA_VERSION,
        run_id: run_id.clone(),
        status: "running".into(),
        error: None,
        ddpbench_version: env!("CARGO_PKG_VERSION").into(),
        libtorch_version: libtorch_version(),
        mpi_library: mpi::environment::library_version().unwrap_or_default().trim().to_string(),
        command_line: std::env::args().collect(),
        config: {
            let mut c = serde_json::to_value(args)?;
            c["lr"] = serde_json::json!(args.learning_rate());
            c
        },
        model: serde_json::to_value(args.model)?.as_str().unwrap_or("").into(),
        dataset: dataset.name.clone(),
        dataset_source: dataset.source.clone(),
        parameters: numels.iter().sum(),
        gradient_bytes: (numels.iter().sum::<usize>() * 4) as u64,
        comm_backend: reducer.backend().into(),
        comm: CommInfo {
            overlap,
            backward_stages: if overlap { cut_at.len() + 1 } else { 1 },
            grad_dtype: serde_json::to_value(args.grad_dtype)?.as_str().unwrap_or("").into(),
            amp: serde_json::to_value(args.amp)?.as_str().unwrap_or("").into(),
            nccl_version: use_nccl.then(|| crate::cuda::nccl().map(|n| n.version()).unwrap_or_default()),
            mpi_threading: format!("{:?}", w.threading).to_lowercase(),
            note: (!notes.is_empty()).then(|| notes.join("; ")),
        },
        buckets,
        world_size: w.size,
        nodes: w.nodes,
        batch_size_per_rank: args.batch_size,
        global_batch_size: samples_per_step * w.size,
        steps_per_epoch,
        start_utc: record::rfc3339_utc(started),
        end_utc: None,
        wall_s: None,
        final_param_l2: None,
        final_val_accuracy: None,
        allreduce_probe: probe,
        allreduce_probe_warm: probe_warm,
        ranks: infos
            .unwrap_or_default()
            .iter()
            .map(|s| serde_json::from_str(s))
            .collect::<Result<_, _>>()?,
    };
    let wrote = if w.rank == 0 { manifest.write(&out_dir) } else { Ok(()) };
    agree(w, wrote)?;
    let mut steps_log = agree(w, CsvLog::<StepRow>::create(&out_dir.join(record::rank_file_name(w.rank))))?;
    let mut epochs_log = if w.rank == 0 {
        Some(agree(w, CsvLog::<EpochRow>::create(&out_dir.join("epochs.csv")))?)
    } else {
        agree(w, Ok(()))?;
        None
    };

    for n in &notes {
        info!("{n}");
    }
    info!(
        "all-reduce: {}, overlap {}, gradients as {:?} on the wire, amp {:?}",
        reducer.backend(),
        if overlap {
            format!("on ({} backward stages)", cut_at.len() + 1)
        } else {
            "off".into()
        },
        args.grad_dtype,
        args.amp
    );
    info!(
        "run {run_id}: {} ranks on {} node(s), {:?}, {} params in {} bucket(s), batch {}×{}, {} steps/epoch, {} epoch(s) → {}",
        w.size,
        w.nodes,
        device,
        manifest.parameters,
        buckets,
        args.batch_size,
        w.size,
        steps_per_epoch,
        epochs,
        out_dir.display()
    );
    if let Some(p) = &manifest.allreduce_probe {
        info!(
            "raw MPI_Allreduce of {} B: median {:.3} ms, busbw {:.2} GB/s with caches flushed ({:.2} GB/s warm)",
            p.bytes,
            p.median_s * 1e3,
            p.busbw_bytes_per_s / 1e9,
            manifest
                .allreduce_probe_warm
                .as_ref()
                .map(|w| w.busbw_bytes_per_s / 1e9)
                .unwrap_or(f64::NAN)
        );
    }

    // A common time origin: ranks leave the barrier together (to within its exit skew).
    w.world.barrier();
    let origin = Instant::now();
    let telemetry = match (&gpu_bus_id, args.telemetry_ms) {
        (Some(bus), ms) if ms > 0 => {
            let path = out_dir.join(record::gpu_file_name(w.rank));
            match crate::telemetry::NvmlGpu::open(bus)
                .and_then(|gpu| crate::telemetry::GpuSampler::start_with(gpu, w.rank, &path, std::time::Duration::from_millis(ms), origin))
            {
                Ok(s) => Some(s),
                Err(e) => {
                    if w.local_rank == 0 {
                        warn!("GPU telemetry off: {e:#}");
                    }
                    None
                }
            }
        }
        _ => None,
    };
    let fault = fault_injection(w.rank);
    let mut global_step = 0usize;
    let mut last_l2 = 0.0;
    let mut last_acc = None;
    for epoch in 0..epochs {
        let epoch_start = Instant::now();
        let (mut loss_sum, mut steps_done) = (0.0f64, 0usize);
        let steps_this_epoch = steps_per_epoch.min(total_steps - global_step);
        let mut loader = match &dataset.stream {
            Some(src) => data::Loader::stream(
                src,
                w.rank,
                w.size,
                args.batch_size,
                steps_this_epoch * args.grad_accum,
                2 * args.workers.max(2),
            ),
            None => {
                let indices = data::shard_indices(dataset.train.len(), w.size, w.rank, args.seed, epoch, true);
                let micro: Vec<Vec<i64>> = indices.chunks(args.batch_size).map(<[i64]>::to_vec).collect();
                data::Loader::new(
                    &dataset.train,
                    micro.into_iter().take(steps_this_epoch * args.grad_accum).collect(),
                    args.workers,
                )
            }
        };
        for step in 0..steps_this_epoch {
            if fault == Some(global_step) {
                bail!("fault injected by DDPBENCH_FAULT at step {global_step}");
            }
            opt.set_lr(optim::learning_rate(args.learning_rate(), lr_scale, global_step, warmup_lr_steps));
            let wall = SystemTime::now();
            let t0 = Instant::now();
            let (mut data_s, mut batch_copy_s, mut forward_s, mut backward_s) = (0.0, 0.0, 0.0, 0.0);
            let s = |a: Instant, b: Instant| (b - a).as_secs_f64();
            let mut samples = 0usize;
            let mut step_loss: Option<Tensor> = None;
            let mut micro_steps = 0usize;
            let mut first_launch: Option<Instant> = None;
            if overflow_at == Some(global_step) {
                // Test hook: an fp16 overflow on rank 0 (backward accumulates onto it), which
                // the all-reduce spreads to every rank.
                let _ = param_tensors[0].grad().fill_(f64::INFINITY);
            }
            let amp_scale = scaler.as_ref().map_or(1.0, |sc| sc.scale);
            // Micro-batches: gradients accumulate in the flat buckets; one all-reduce per step.
            while micro_steps < args.grad_accum {
                let ta = Instant::now();
                let Some(batch) = loader.next_batch() else { break };
                let (x, y) = batch?;
                let tcopy = Instant::now();
                let (x, y) = if device == Device::Cpu {
                    (x, y)
                } else {
                    (x.to_device(device), y.to_device(device))
                };
                sync(device);
                let tb = Instant::now();
                // Only the last micro-batch's backward hands buckets to the all-reduce.
                let staged = overlap && micro_steps + 1 == args.grad_accum;
                let mut cuts: Vec<(Tensor, Tensor)> = Vec::new();
                let mut boundary = 0usize;
                let mut forward = || {
                    if staged {
                        net.forward_cut(&x, true, &mut |h| {
                            boundary += 1;
                            if cut_at.contains(&boundary) {
                                cut(h, &mut cuts)
                            } else {
                                h
                            }
                        })
                    } else {
                        net.forward_t(&x, true)
                    }
                };
                let out = match &autocast {
                    Some(ac) => ac.run(forward),
                    None => forward(),
                };
                let loss = out.nll_loss(&y);
                sync(device);
                let tc = Instant::now();
                let factor = loss_scale * amp_scale;
                if factor != 1.0 {
                    (&loss * factor).backward();
                } else {
                    loss.backward();
                }
                if staged {
                    // Segment by segment from the last: the buckets a segment completed
                    // leave before the backward of the segment below it starts.
                    for j in (0..cuts.len()).rev() {
                        let upper = cut_at.get(j + 1).copied().unwrap_or(stages);
                        for &b in launch_after[cut_at[j]..upper].iter().flatten() {
                            first_launch.get_or_insert_with(Instant::now);
                            reducer.launch(b)?;
                        }
                        backward_through_cut(&cuts[j]);
                    }
                }
                sync(device);
                let td = Instant::now();
                data_s += s(ta, tcopy);
                batch_copy_s += s(tcopy, tb);
                forward_s += s(tb, tc);
                backward_s += s(tc, td);
                samples += y.size()[0] as usize;
                step_loss = Some(match step_loss {
                    None => loss.detach(),
                    Some(sum) => sum + loss.detach(),
                });
                micro_steps += 1;
            }
            let t3 = Instant::now();
            let comm = reducer.finish(&param_tensors)?;
            sync(device);
            let t4 = Instant::now();
            let step_taken = match scaler.as_mut() {
                None => true,
                Some(sc) => {
                    // One device read for all buckets, not one per bucket.
                    let found_inf = tch::no_grad(|| {
                        let finite = reducer
                            .reduced()
                            .iter()
                            .map(|b| b.isfinite().all())
                            .reduce(|a, b| a.logical_and(&b));
                        finite.is_some_and(|f| f.int64_value(&[]) == 0)
                    });
                    if !found_inf {
                        tch::no_grad(|| {
                            for b in reducer.reduced() {
                                let _ = b.shallow_clone().g_mul_scalar_(1.0 / sc.scale);
                            }
                        });
                    }
                    sc.update(found_inf)
                }
            };
            if step_taken {
                opt.step();
            }
            reducer.zero_grads();
            sync(device);
            let t5 = Instant::now();
            let loss_sum_step = step_loss.map(|l| l.double_value(&[])).unwrap_or(f64::NAN);
            let loss_value = loss_sum_step / micro_steps.max(1) as f64;
            let t6 = Instant::now();
            let (comm_exposed_s, optimizer_s) = (s(t3, t4), s(t4, t5));
            let step_s = s(t0, t6);
            steps_log.write(&StepRow {
                rank: w.rank,
                node_type: node_type.clone(),
                epoch,
                step,
                global_step,
                warmup: u8::from(global_step < args.warmup_steps),
                time_utc: record::rfc3339_utc(wall),
                elapsed_s: s(origin, t0),
                samples,
                data_s,
                batch_copy_s,
                forward_s,
                backward_s,
                comm_s: comm.comm_s,
                comm_exposed_s,
                comm_stage_d2h_s: comm.stage_d2h_s,
                comm_stage_h2d_s: comm.stage_h2d_s,
                optimizer_s,
                other_s: step_s - (data_s + batch_copy_s + forward_s + backward_s + comm_exposed_s + optimizer_s),
                step_s,
                comm_start_s: s(origin, first_launch.unwrap_or(t3)),
                loss: loss_value,
                bytes: comm.bytes,
                loss_scale: Some(amp_scale).filter(|_| scaler.is_some()),
                step_skipped: u8::from(!step_taken),
            })?;
            if !loss_value.is_finite() {
                bail!("loss became {loss_value} at epoch {epoch} step {step}: lower --lr");
            }
            loss_sum += loss_value;
            steps_done += 1;
            global_step += 1;
            if w.rank == 0 && args.log_every > 0 && global_step % args.log_every == 0 {
                info!(
                    "epoch {epoch} step {step}/{steps_per_epoch} loss {loss_value:.4} step {:.1} ms",
                    step_s * 1e3
                );
            }
        }
        steps_log.flush()?;
        let epoch_s_local = epoch_start.elapsed().as_secs_f64();
        let mut epoch_s = 0.0;
        w.world.all_reduce_into(&epoch_s_local, &mut epoch_s, SystemOperation::max());
        let mut train = [0f64; 2];
        w.world
            .all_reduce_into(&[loss_sum, steps_done as f64][..], &mut train[..], SystemOperation::sum());
        last_l2 = check_in_sync(w, &params, epoch)?;
        // As DDP's broadcast_buffers: every rank validates with rank 0's BatchNorm statistics.
        broadcast_from_rank0(w, &model::ordered_buffers(&vs));
        let val_start = Instant::now();
        let (val_loss, val_acc, val_n) = validate_epoch(w, net.as_ref(), &dataset, device, args.val_samples)?;
        last_acc = val_acc.is_finite().then_some(val_acc);
        if let Some(log) = epochs_log.as_mut() {
            log.write(&EpochRow {
                epoch,
                time_utc: record::rfc3339_utc(SystemTime::now()),
                steps: steps_done,
                epoch_s,
                train_loss: train[0] / train[1].max(1.0),
                val_loss,
                val_accuracy: val_acc,
                val_samples: val_n,
                val_s: val_start.elapsed().as_secs_f64(),
                param_l2: last_l2,
            })?;
            log.flush()?;
            info!(
                "epoch {epoch}: {steps_done} steps in {epoch_s:.2} s, train loss {:.4}, val loss {val_loss:.4}, val accuracy {:.2} %",
                train[0] / train[1].max(1.0),
                val_acc * 100.0
            );
        }
    }

    if let Some(t) = telemetry {
        match t.stop() {
            Ok(sum) => info!(
                "GPU telemetry: {} samples, mean utilisation {} %, peak memory {} MiB, mean power {} W",
                sum.samples,
                sum.mean_gpu_util_pct.map_or("?".into(), |v| format!("{v:.0}")),
                sum.max_mem_used_bytes.map_or("?".into(), |v| (v >> 20).to_string()),
                sum.mean_power_w.map_or("?".into(), |v| format!("{v:.0}"))
            ),
            Err(e) => warn!("GPU telemetry: {e:#}"),
        }
    }
    if w.rank == 0 {
        if args.save_model {
            vs.save(out_dir.join("model.safetensors"))
                .context("cannot save model.safetensors")?;
        }
        manifest.status = "completed".into();
        manifest.end_utc = Some(record::rfc3339_utc(SystemTime::now()));
        manifest.wall_s = Some(started_at.elapsed().as_secs_f64());
        manifest.final_param_l2 = Some(last_l2);
        manifest.final_val_accuracy = last_acc;
        manifest.write(&out_dir)?;
        info!("done: {} (reduce with: ddpbench reduce {})", out_dir.display(), out_dir.display());
    }
    w.world.barrier();
    Ok(())
}

/// `VAR=STEP`: the global step at which a test hook fires.
fn fault_step(var: &str) -> Option<usize> {
    std::env::var(var).ok()?.parse().ok()
}

/// Cuts the graph at activation `h`: the next stage starts from a leaf copy of it, and
/// (h, leaf) is kept so backward can be carried across the cut ([`backward_through_cut`]).
fn cut(h: Tensor, cuts: &mut Vec<(Tensor, Tensor)>) -> Tensor {
    let leaf = h.detach().set_requires_grad(true);
    cuts.push((h, leaf.shallow_clone()));
    leaf
}

/// Backward through one stage: the gradient that arrived at the next stage's input
/// (a leaf cut from the graph) is sent into this stage's output. d(sum(out·g))/d(out)
/// is g exactly, so the gradients are those of one whole backward, bit for bit.
fn backward_through_cut((out, leaf): &(Tensor, Tensor)) {
    let g = leaf.grad();
    if g.defined() && out.requires_grad() {
        (out * g).sum(Kind::Float).backward();
    }
}

/// Runs one forward and a staged backward on a dummy batch in eval mode (BatchNorm
/// statistics and dropout untouched) and returns, per parameter, the stage whose
/// backward made its gradient (the loss's stage is the last), and the stage count.
/// Buckets are filled in that order, as PyTorch DDP rebuilds its buckets after the
/// first iteration. Leaves every gradient defined.
fn discover_stages(net: &dyn model::Net, spec: &model::ModelSpec, device: Device, params: &[Tensor]) -> (Vec<usize>, usize) {
    let x = match spec.input {
        model::Input::Image([c, h, w]) => Tensor::zeros([2, c, h, w], (Kind::Float, device)),
        model::Input::Tokens { seq_len, .. } => Tensor::full([2, seq_len], model::UNK_TOKEN, (Kind::Int64, device)),
    };
    let y = Tensor::zeros([2], (Kind::Int64, device));
    let mut cuts: Vec<(Tensor, Tensor)> = Vec::new();
    let out = net.forward_cut(&x, false, &mut |h| cut(h, &mut cuts));
    let mut stage = vec![usize::MAX; params.len()];
    let mut mark = |k: usize| {
        for (i, p) in params.iter().enumerate() {
            if stage[i] == usize::MAX && p.grad().defined() {
                stage[i] = k;
            }
        }
    };
    out.nll_loss(&y).backward();
    mark(cuts.len());
    for k in (0..cuts.len()).rev() {
        backward_through_cut(&cuts[k]);
        mark(k);
    }
    // A parameter no stage reached is reduced last (FlatGrads::attach then names it).
    let stages = cuts.len() + 1;
    (stage.into_iter().map(|s| if s == usize::MAX { 0 } else { s }).collect(), stages)
}

/// This rank's GPU's PCI bus id, and the hardware threads nearest each visible GPU in
/// CUDA's numbering (rank r takes GPU r % visible), from hwloc.
fn gpu_places(ordinal: usize) -> (Option<String>, Result<Vec<Vec<u32>>>) {
    let driver = match crate::cuda::driver() {
        Ok(d) => d,
        Err(e) => return (None, Err(e)),
    };
    let mine = driver.pci_bus_id(ordinal).ok();
    let near = (0..tch::Cuda::device_count().max(0) as usize)
        .map(|g| {
            let bus = topology::parse_pci_bus_id(&driver.pci_bus_id(g)?)?;
            Ok(topology::pci_locality(&bus)?.pus)
        })
        .collect::<Result<Vec<_>>>();
    (mine.map(|b| b.to_lowercase()), near)
}

/// Which all-reduce the run uses, the same on every rank, and a note when `auto` fell
/// back from NCCL.
fn choose_backend(w: &World, args: &TrainArgs, device: Device) -> Result<(bool, Option<String>)> {
    let local: Result<()> = match device {
        Device::Cuda(i) => comm::nccl::prepare(i).map(|_| ()),
        _ => Err(anyhow!("this rank trains on CPU and NCCL needs CUDA")),
    };
    match args.allreduce {
        AllreduceChoice::Mpi => Ok((false, None)),
        AllreduceChoice::Nccl => {
            let checked = local.map_err(|e| anyhow!("--allreduce nccl cannot work: {e:#}. Use --allreduce mpi (CPU-staged) or auto"));
            agree(w, checked)?;
            Ok((true, None))
        }
        AllreduceChoice::Auto => {
            let mine = i32::from(local.is_ok());
            let mut all = 0i32;
            w.world.all_reduce_into(&mine, &mut all, SystemOperation::min());
            if all == 1 {
                return Ok((true, None));
            }
            let why = match (&local, device) {
                (_, Device::Cpu) => "training on CPU".to_string(),
                (Err(e), _) => format!("NCCL cannot work on rank {} ({e:#})", w.rank),
                (Ok(()), _) => "NCCL cannot work on another rank".to_string(),
            };
            Ok((false, Some(format!("all-reduce: CPU-staged MPI ({why}; --allreduce auto)"))))
        }
    }
}

/// `DDPBENCH_FAULT=RANK:STEP` makes rank RANK fail at global step STEP: the tests
/// use it to prove a failing rank takes the job down instead of hanging it.
fn fault_injection(rank: usize) -> Option<usize> {
    let spec = std::env::var("DDPBENCH_FAULT").ok()?;
    let (r, s) = spec.split_once(':')?;
    (r.parse::<usize>().ok()? == rank).then(|| s.parse().ok()).flatten()
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
