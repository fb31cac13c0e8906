//! The misconfigurations a run is accepted with but warned of: fp16 autocast on a CPU,
//! too few measured steps, GPUs of a node left idle or shared, and a rank bound to
//! fewer CPUs than Slurm allocated it. Each becomes a [`RunWarning`] that rank 0 prints
//! once and the manifest records.

use super::config::TrainConfig;
use super::placement::Placement;
use super::state::Schedule;
use crate::data::DatasetKind;
use crate::record::AmpMode;
use crate::record::{RunWarning, WarningCode};
use crate::world::{gather_strings, Group};
use tch::Device;

/// Every rank's warnings, on rank 0 (each code once, the first rank's message, with the
/// ranks that share it); empty on the other ranks. A collective: every rank calls it.
pub(super) fn run_warnings(g: &Group, cfg: &TrainConfig, place: &Placement, schedule: &Schedule) -> Vec<RunWarning> {
    let facts = RankFacts {
        device: place.device,
        local_ranks: g.local_size,
        launcher_pus: place.launcher_pus,
        total_steps: schedule.total_steps,
        env: &|k| std::env::var(k).ok(),
        cuda_devices: &|| tch::Cuda::device_count().max(0) as usize,
    };
    let mine = rank_warnings(cfg, &facts);
    let text = serde_json::to_string(&mine).unwrap_or_else(|_| "[]".into());
    let Some(all) = gather_strings(g, &text) else {
        return Vec::new();
    };
    let per_rank: Vec<Vec<RunWarning>> = all.iter().map(|t| serde_json::from_str(t).unwrap_or_default()).collect();
    merge(&per_rank)
}

/// What one rank's warnings are decided from, as its caller reads them (the MPI group,
/// the placement, the environment, the CUDA runtime), so that the decisions and which
/// fact feeds which are tested with made-up facts on a machine without a GPU.
pub(super) struct RankFacts<'a> {
    /// The device this rank trains on.
    pub device: Device,
    /// Ranks on this rank's node.
    pub local_ranks: usize,
    /// CPUs the launcher gave this rank, before ddpbench binds it.
    pub launcher_pus: usize,
    /// Steps this run takes, warm-up included.
    pub total_steps: usize,
    /// An environment variable's value, if set.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// CUDA devices this process sees: asked only when the rank trains on CUDA.
    pub cuda_devices: &'a dyn Fn() -> usize,
}

/// One rank's warnings, from its configuration and facts.
pub(super) fn rank_warnings(cfg: &TrainConfig, facts: &RankFacts) -> Vec<RunWarning> {
    let s = &cfg.schedule;
    let visible_gpus = match facts.device {
        Device::Cuda(_) => (facts.cuda_devices)(),
        _ => 0,
    };
    [
        fp16_on_cpu(cfg.optim.amp, facts.device),
        too_few_measured_steps(facts.total_steps, s.warmup_steps, s.min_measured_steps),
        gpu_use(
            cfg.placement.node_slots.unwrap_or(facts.local_ranks),
            facts.local_ranks,
            visible_gpus,
        ),
        cores_against_allocation(facts.launcher_pus, facts.local_ranks, facts.env),
        target_on_random_labels(cfg),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One warning per code, the lowest rank's message, naming the ranks it came from
/// when not every rank gave it.
fn merge(per_rank: &[Vec<RunWarning>]) -> Vec<RunWarning> {
    let mut out: Vec<RunWarning> = Vec::new();
    for w in per_rank.iter().flatten() {
        if out.iter().all(|o| o.code != w.code) {
            let ranks: Vec<String> = per_rank
                .iter()
                .enumerate()
                .filter(|(_, ws)| ws.iter().any(|x| x.code == w.code))
                .map(|(r, _)| r.to_string())
                .collect();
            let mut w = w.clone();
            if ranks.len() < per_rank.len() {
                w.message = format!("rank(s) {}: {}", ranks.join(", "), w.message);
            }
            out.push(w);
        }
    }
    out
}

/// `--amp fp16` on a CPU: allowed (the fp16 path's only coverage on a machine without a
/// GPU), but float16 autocast there is emulated.
pub(crate) fn fp16_on_cpu(amp: AmpMode, device: Device) -> Option<RunWarning> {
    (amp == AmpMode::Fp16 && device == Device::Cpu).then(|| {
        RunWarning::new(
            WarningCode::Fp16OnCpu,
            "--amp fp16 on CPU: float16 autocast is emulated there and runs about 15× slower than --amp off \
             (3 ResNet-18 steps took 33 s instead of 2.3 s), so this run measures the emulation; use --amp bf16 \
             (the CPU's autocast type) or --device cuda",
        )
    })
}

/// `--target-accuracy` on `--dataset synthetic`, whose labels are drawn at random.
pub(crate) fn target_on_random_labels(cfg: &TrainConfig) -> Option<RunWarning> {
    let accuracy = cfg.schedule.target_accuracy?;
    (cfg.workload.dataset == DatasetKind::Synthetic).then(|| {
        RunWarning::new(
            WarningCode::TargetOnRandomLabels,
            format!(
                "--target-accuracy {accuracy} on --dataset synthetic: its labels are drawn at random, so the \
                 validation accuracy stays near chance and the samples to reach {accuracy} measure luck, not \
                 training; give a real data set (e.g. --dataset fashion-mnist) to measure time to an accuracy"
            ),
        )
    })
}

/// Fewer than `min` steps after the `warmup` ones out of `total`.
pub(crate) fn too_few_measured_steps(total: usize, warmup: usize, min: usize) -> Option<RunWarning> {
    let measured = total.saturating_sub(warmup);
    (measured < min).then(|| {
        RunWarning::new(
            WarningCode::TooFewMeasuredSteps,
            format!(
                "{measured} measured step(s) per rank ({total} in all, {warmup} of warm-up), fewer than \
                 --min-measured-steps {min}: too few to trust the throughput, and `reduce` claims no direction \
                 for this point; raise --epochs or --max-steps, or give more samples (--synthetic-samples)"
            ),
        )
    })
}

/// GPUs of a node left idle (fewer ranks planned on the node than GPUs visible), or one
/// GPU shared by ranks (more ranks on the node than GPUs visible). A point that uses
/// part of a node by plan (a study's `--node-slots` above its ranks on the node) is
/// not warned of idle GPUs: the study compares it with the points that fill the node.
pub(crate) fn gpu_use(planned_per_node: usize, local_ranks: usize, visible_gpus: usize) -> Option<RunWarning> {
    if visible_gpus == 0 {
        return None;
    }
    if local_ranks > visible_gpus {
        return Some(RunWarning::new(
            WarningCode::SharedGpu,
            format!(
                "{local_ranks} ranks on a node with {visible_gpus} GPU(s) visible: ranks share a GPU (rank r takes GPU \
                 r % {visible_gpus}) and time-slice it; launch one rank per GPU (srun --ntasks-per-node {visible_gpus} \
                 --gpus-per-task 1, or mpirun -n <{visible_gpus} per node>)"
            ),
        ));
    }
    (planned_per_node.max(local_ranks) < visible_gpus).then(|| {
        RunWarning::new(
            WarningCode::IdleGpus,
            format!(
                "{local_ranks} rank(s) on a node with {visible_gpus} GPUs visible: {} GPU(s) idle (Slurm starts one task \
                 per node unless told otherwise); launch one rank per GPU: srun --ntasks-per-node {visible_gpus} \
                 --gpus-per-task 1 ddpbench train ...",
                visible_gpus - local_ranks
            ),
        )
    })
}

/// A rank the launcher gave fewer CPUs (`launcher_pus`, its affinity before ddpbench
/// binds it) than Slurm allocated it: `SLURM_CPUS_PER_TASK`, else `SLURM_CPUS_ON_NODE`
/// shared among the node's `local_ranks`. Slurm 22.05 and later do not pass
/// `--cpus-per-task` from `sbatch` to `srun` (`SRUN_CPUS_PER_TASK` must be set), and
/// with task affinity each task then runs on one CPU.
pub(crate) fn cores_against_allocation(
    launcher_pus: usize,
    local_ranks: usize,
    env: impl Fn(&str) -> Option<String>,
) -> Option<RunWarning> {
    let number = |k: &str| env(k).and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0);
    let (allocated, from) = match number("SLURM_CPUS_PER_TASK") {
        Some(n) => (n, "SLURM_CPUS_PER_TASK".to_string()),
        None => {
            let on_node = number("SLURM_CPUS_ON_NODE")?;
            (
                on_node / local_ranks.max(1),
                format!("SLURM_CPUS_ON_NODE {on_node} over {local_ranks} rank(s)"),
            )
        }
    };
    (launcher_pus < allocated).then(|| {
        RunWarning::new(
            WarningCode::FewerCoresThanAllocated,
            format!(
                "bound to {launcher_pus} CPU(s) by the launcher, fewer than the {allocated} Slurm allocated per task \
                 ({from}): data workers and compute threads are starved; export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK \
                 before srun, or pass srun -c {allocated}"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn fp16_is_warned_of_on_cpu_only() {
        assert_eq!(fp16_on_cpu(AmpMode::Fp16, Device::Cpu).unwrap().code, WarningCode::Fp16OnCpu);
        assert!(fp16_on_cpu(AmpMode::Fp16, Device::Cuda(0)).is_none());
        assert!(fp16_on_cpu(AmpMode::Bf16, Device::Cpu).is_none());
        let w = fp16_on_cpu(AmpMode::Fp16, Device::Cpu).unwrap();
        assert!(
            w.message.contains("--amp bf16") && w.message.contains("--device cuda"),
            "{}",
            w.message
        );
        assert!(!w.invalidates_direction);
    }

    #[test]
    fn measured_steps_are_counted_after_warm_up() {
        let w = too_few_measured_steps(6, 5, 20).unwrap();
        assert!(w.message.starts_with("1 measured step(s)"), "{}", w.message);
        assert!(w.invalidates_direction);
        assert!(too_few_measured_steps(25, 5, 20).is_none());
        assert!(too_few_measured_steps(24, 5, 20).is_some());
        assert!(too_few_measured_steps(3, 5, 0).is_none(), "0 turns the check off");
    }

    /// The launch of `--help`'s old example (one task per node on 4 GPUs), two ranks on
    /// one GPU, a full node, and a study's 1-GPU point planned for a 4-rank node.
    #[test]
    fn idle_and_shared_gpus_are_warned_of_with_the_fix() {
        let idle = gpu_use(1, 1, 4).unwrap();
        assert_eq!((idle.code, idle.invalidates_direction), (WarningCode::IdleGpus, true));
        assert!(
            idle.message.contains("3 GPU(s) idle") && idle.message.contains("--ntasks-per-node 4"),
            "{}",
            idle.message
        );
        let shared = gpu_use(2, 2, 1).unwrap();
        assert_eq!(shared.code, WarningCode::SharedGpu);
        assert!(shared.message.contains("--gpus-per-task 1"), "{}", shared.message);
        assert!(gpu_use(4, 4, 4).is_none());
        assert!(gpu_use(4, 1, 4).is_none(), "a study's point on part of a node by plan");
        assert!(gpu_use(1, 1, 0).is_none(), "no GPU: nothing idle");
    }

    #[test]
    fn a_rank_bound_to_fewer_cpus_than_slurm_allocated_is_warned_of() {
        let w = cores_against_allocation(1, 2, env(&[("SLURM_CPUS_PER_TASK", "8")])).unwrap();
        assert_eq!(w.code, WarningCode::FewerCoresThanAllocated);
        assert!(
            w.message.contains("SRUN_CPUS_PER_TASK") && w.message.contains("-c 8"),
            "{}",
            w.message
        );
        assert!(cores_against_allocation(8, 2, env(&[("SLURM_CPUS_PER_TASK", "8")])).is_none());
        // Without --cpus-per-task: the node's CPUs shared among its ranks.
        assert!(cores_against_allocation(2, 4, env(&[("SLURM_CPUS_ON_NODE", "16")])).is_some());
        assert!(cores_against_allocation(4, 4, env(&[("SLURM_CPUS_ON_NODE", "16")])).is_none());
        assert!(cores_against_allocation(1, 1, env(&[])).is_none(), "not under Slurm");
    }

    /// A target accuracy on random labels is warned of, whatever the device; a target loss
    /// or a real data set is not.
    #[test]
    fn a_target_accuracy_on_random_labels_is_warned_of() {
        let random = config(&["--dataset", "synthetic", "--target-accuracy", "0.9"]);
        assert_eq!(codes(&random, Device::Cpu, 2, 0), [WarningCode::TargetOnRandomLabels]);
        let w = target_on_random_labels(&random).unwrap();
        assert!(
            w.message.contains("--dataset fashion-mnist") && !w.invalidates_direction,
            "{}",
            w.message
        );
        assert!(target_on_random_labels(&config(&["--dataset", "synthetic", "--target-loss", "0.5"])).is_none());
        assert!(target_on_random_labels(&config(&["--target-accuracy", "0.9"])).is_none());
    }

    /// A target accuracy whose first validation lies beyond the run's last step is
    /// refused, with the largest `--val-every` that would check it; without a target the
    /// same schedule is taken.
    #[test]
    fn a_target_accuracy_never_validated_is_refused() {
        use super::super::target::validate_every_steps;
        let schedule = |steps_per_epoch, total_steps| Schedule {
            steps_per_epoch,
            total_steps,
            epochs: total_steps.div_ceil(steps_per_epoch),
            warmup_lr_steps: 0,
            lr_scale: 1.0,
        };
        let every = config(&["--target-accuracy", "0.8", "--val-every", "30"]);
        assert_eq!(validate_every_steps(&every, &schedule(100, 30)).unwrap(), 30);
        let e = validate_every_steps(&every, &schedule(100, 29)).unwrap_err().to_string();
        assert!(e.contains("--val-every 30") && e.contains("give --val-every 29 or less"), "{e}");
        // Without --val-every: a tenth of an epoch's steps, checked the same way.
        let tenth = config(&["--target-accuracy", "0.8"]);
        assert_eq!(validate_every_steps(&tenth, &schedule(1875, 500)).unwrap(), 187);
        let e = validate_every_steps(&tenth, &schedule(1875, 100)).unwrap_err().to_string();
        assert!(e.contains("a tenth of an epoch's 1875 steps"), "{e}");
        assert_eq!(validate_every_steps(&config(&[]), &schedule(1875, 100)).unwrap(), 187);
    }

    /// `ddpbench train`'s flags, parsed as the command line is.
    fn config(flags: &[&str]) -> TrainConfig {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            cfg: TrainConfig,
        }
        <Line as clap::Parser>::try_parse_from(std::iter::once("train").chain(flags.iter().copied()))
            .unwrap()
            .cfg
    }

    /// The codes a rank of `facts` warns of; the CUDA count is `gpus`, and asking it on a
    /// CPU rank fails the test.
    fn codes(cfg: &TrainConfig, device: Device, local_ranks: usize, gpus: usize) -> Vec<WarningCode> {
        let cuda_devices = move || {
            assert!(device != Device::Cpu, "the CUDA runtime is asked on a CPU rank");
            gpus
        };
        let facts = RankFacts {
            device,
            local_ranks,
            launcher_pus: 64,
            total_steps: 1000,
            env: &|_| None,
            cuda_devices: &cuda_devices,
        };
        rank_warnings(cfg, &facts).iter().map(|w| w.code).collect()
    }

    /// The call site's wiring, with made-up facts: the device count reaches the GPU
    /// decision only on a CUDA rank, the node's ranks are the plan unless a study set
    /// `--node-slots`, and the other facts reach their own decisions.
    #[test]
    fn a_ranks_facts_reach_the_gpu_decision() {
        let train = config(&[]);
        // `srun -N 2 --gpus-per-node 4 ddpbench train`: one task per node, 3 GPUs idle.
        assert_eq!(codes(&train, Device::Cuda(0), 1, 4), [WarningCode::IdleGpus]);
        assert_eq!(codes(&train, Device::Cuda(0), 4, 4), []);
        assert_eq!(codes(&train, Device::Cuda(1), 2, 1), [WarningCode::SharedGpu]);
        assert_eq!(codes(&train, Device::Cpu, 1, 4), [], "a CPU rank leaves no GPU idle");
        // A study's 1-GPU point planned for a node of 4 ranks uses part of it by plan;
        // a plan of 2 ranks on that node leaves GPUs idle still.
        assert_eq!(codes(&config(&["--node-slots", "4"]), Device::Cuda(0), 1, 4), []);
        assert_eq!(
            codes(&config(&["--node-slots", "2"]), Device::Cuda(0), 1, 4),
            [WarningCode::IdleGpus]
        );
        // The other facts: steps, the environment and the launcher's CPUs.
        let few = RankFacts {
            device: Device::Cpu,
            local_ranks: 2,
            launcher_pus: 1,
            total_steps: 6,
            env: &|k| (k == "SLURM_CPUS_PER_TASK").then(|| "8".to_string()),
            cuda_devices: &|| panic!("the CUDA runtime is asked on a CPU rank"),
        };
        let got: Vec<WarningCode> = rank_warnings(&config(&["--amp", "fp16", "--warmup-steps", "5"]), &few)
            .iter()
            .map(|w| w.code)
            .collect();
        assert_eq!(
            got,
            [
                WarningCode::Fp16OnCpu,
                WarningCode::TooFewMeasuredSteps,
                WarningCode::FewerCoresThanAllocated
            ]
        );
    }

    #[test]
    fn each_code_is_kept_once_naming_the_ranks_that_gave_it() {
        let starved = |r: usize| RunWarning::new(WarningCode::FewerCoresThanAllocated, format!("rank {r} starved"));
        let few = too_few_measured_steps(1, 0, 20).unwrap();
        let merged = merge(&[vec![few.clone()], vec![few.clone(), starved(1)]]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0], few, "every rank gave it: its message as it was");
        assert_eq!(merged[1].message, "rank(s) 1: rank 1 starved");
    }
}
