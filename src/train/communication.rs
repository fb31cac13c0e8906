//! The gradient all-reduce a run uses: the backend (the same on every rank), the
//! buckets in the order backward makes them ready, whether backward overlaps the
//! all-reduce, and the raw all-reduce probe of the same buckets.

use super::config::TrainConfig;
use super::placement::{CommCore, Placement};
use crate::allreduce::probe::{probe_allreduce, CACHE_FLUSH_BYTES};
use crate::comm::nccl::NcclReducer;
use crate::comm::none::NoReduce;
use crate::comm::overlap::{self, LaunchPlan};
use crate::comm::transport::nccl::{prepare, shared_gpu};
use crate::comm::{mpi::MpiStaged, AllreduceChoice, BucketPlan, GradientReducer, OverlapMode, ReduceDtype};
use crate::device::cuda;
use crate::model::{ModelSpec, Net};
use crate::record::{AllreduceProbe, Backend, CommInfo};
use crate::world::{agree, Group};
use anyhow::{anyhow, Result};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use tch::{Device, Tensor};

/// The all-reduce side of a run, ready for its first step.
pub(super) struct Communication {
    pub backend: Backend,
    pub reducer: Box<dyn GradientReducer>,
    /// Where backward is cut and buckets leave; None without overlap.
    pub launch: Option<LaunchPlan>,
    /// What ran, for the manifest.
    pub info: CommInfo,
    pub buckets: usize,
    /// What differs from what was asked, and why.
    pub notes: Vec<String>,
    pub probe: Option<AllreduceProbe>,
    pub probe_warm: Option<AllreduceProbe>,
}

impl Communication {
    /// Chooses the backend, plans buckets from one discovery pass (which leaves every
    /// gradient defined), probes the interconnect and attaches the gradients to the
    /// buckets.
    pub(super) fn setup(
        g: &Group,
        cfg: &TrainConfig,
        place: &Placement,
        net: &dyn Net,
        spec: &ModelSpec,
        params: &[Tensor],
    ) -> Result<Communication> {
        let device = place.device;
        let (backend, backend_note) = choose_backend(g, cfg, device, place.gpu_bus_id.as_deref())?;
        let mut notes: Vec<String> = backend_note.into_iter().collect();
        let use_nccl = backend == Backend::Nccl;
        let (mut overlap, shares_core) = overlap_wanted(g, cfg, backend, place, &mut notes);
        let (stage_of, stages) = match net.script() {
            // One black box: one stage. Its first backward already ran (check_first_forward).
            Some(_) => {
                if overlap {
                    overlap = false;
                    notes.push(crate::model::script::UNCUT_NOTE.into());
                }
                (vec![0; params.len()], 1)
            }
            None => overlap::discover_stages(net, spec, device, params),
        };
        let numels: Vec<usize> = params.iter().map(Tensor::numel).collect();
        let dtypes = params
            .iter()
            .map(|p| ReduceDtype::of(p.kind()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| anyhow!("a parameter of a dtype the all-reduce cannot sum reached the buckets (internal error)"))?;
        let cap_bytes = (cfg.comm.bucket_mb * (1 << 20) as f64) as usize;
        let plan = BucketPlan::in_order(&numels, &dtypes, &overlap::ready_order(&stage_of), cap_bytes);
        let launch = LaunchPlan::new(&stage_of, stages, &plan);
        if overlap && !launch.can_overlap() {
            overlap = false;
            notes.push(launch.why_not(&plan, cfg.comm.bucket_mb));
        }
        let probing = cfg.comm.probe_iters > 0 && g.size > 1 && backend != Backend::None;
        let probe = |flush| probe_allreduce(&g.comm, g.size, &plan, cfg.comm.grad_dtype, cfg.comm.probe_iters, flush);
        let (probe, probe_warm) = if probing {
            (Some(agree(g, probe(CACHE_FLUSH_BYTES))?), Some(agree(g, probe(0))?))
        } else {
            (None, None)
        };
        let buckets = plan.buckets.len();
        let bucket_bytes = plan.wire_bytes(cfg.comm.grad_dtype);
        // Every rank must agree, since a rank without overlap cuts nothing.
        let mut all = 0i32;
        let f = crate::flight::enter("all-reduce", "overlap choice");
        g.comm.all_reduce_into(&i32::from(overlap), &mut all, SystemOperation::min());
        drop(f);
        if overlap && all == 0 {
            notes.push("overlap off: another rank cannot overlap".into());
        }
        overlap = all == 1;
        let thread_pus = match &place.comm_core {
            CommCore::Own(pus) => pus.clone(),
            _ => Vec::new(),
        };
        let mut reducer = make_reducer(g, cfg, device, backend, overlap.then_some(thread_pus), plan)?;
        agree(g, reducer.attach(params))?;
        reducer.zero_grads();
        let info = CommInfo {
            overlap,
            backward_stages: if overlap { launch.segments() } else { 1 },
            grad_dtype: serde_json::to_value(cfg.comm.grad_dtype)?.as_str().unwrap_or("").into(),
            amp: serde_json::to_value(cfg.optim.amp)?.as_str().unwrap_or("").into(),
            nccl_version: use_nccl.then(|| cuda::nccl().map(|n| n.version()).unwrap_or_default()),
            mpi_threading: format!("{:?}", g.threading).to_lowercase(),
            note: (!notes.is_empty()).then(|| notes.join("; ")),
            overlap_shares_core: overlap && shares_core,
            bucket_bytes,
            bucket_ready_fraction: Vec::new(),
        };
        Ok(Communication {
            backend,
            reducer,
            launch: overlap.then_some(launch),
            info,
            buckets,
            notes,
            probe,
            probe_warm,
        })
    }
}

/// Whether backward may overlap the all-reduce on this rank, and whether the
/// all-reduce thread would share backward's cores (`--overlap force` only).
fn overlap_wanted(g: &Group, cfg: &TrainConfig, backend: Backend, place: &Placement, notes: &mut Vec<String>) -> (bool, bool) {
    let mode = cfg.comm.overlap;
    if mode == OverlapMode::Off {
        return (false, false);
    }
    if backend == Backend::None {
        notes.push("no all-reduce (--allreduce none): every rank trains on its own gradients; the run measures the step without communication and is not a scaling run".into());
        return (false, false);
    }
    if backend == Backend::Nccl {
        return (true, false);
    }
    if !g.threads_may_call_mpi() {
        notes.push(format!(
            "overlap off: MPI granted thread level {:?}, and the all-reduce thread needs serialized or multiple",
            g.threading
        ));
        return (false, false);
    }
    match (&place.comm_core, mode) {
        (CommCore::Shared { cores, threads }, OverlapMode::On) => {
            notes.push(format!(
                "overlap off: the all-reduce thread would share this rank's {cores} core(s) with its {threads} compute thread(s) and hide nothing; \
                 {} or test the mechanism with --overlap force",
                free_core_advice(*cores, *threads)
            ));
            (false, false)
        }
        (CommCore::Shared { .. }, _) => {
            notes.push(
                "overlap forced onto the cores backward computes on: the all-reduce time-slices with backward, so none of it is hidden"
                    .into(),
            );
            (true, true)
        }
        _ => (true, false),
    }
}

/// How to give an all-reduce thread a core of its own, for a rank bound to `cores` cores
/// running `threads` compute threads on them: fewer threads where the rank has a core to
/// take from them, else more cores per rank.
fn free_core_advice(cores: usize, threads: usize) -> String {
    if cores > 1 {
        format!("leave a core free (--threads {})", cores - 1)
    } else {
        format!(
            "give each rank a second core (run fewer ranks per node: each is bound to 1 core and already runs {threads} compute thread(s))"
        )
    }
}

fn make_reducer(
    g: &Group,
    cfg: &TrainConfig,
    device: Device,
    backend: Backend,
    overlap: Option<Vec<u32>>,
    plan: BucketPlan,
) -> Result<Box<dyn GradientReducer>> {
    match (backend, device) {
        (Backend::None, _) => Ok(Box::new(NoReduce::new(plan))),
        (Backend::Nccl, Device::Cuda(index)) => {
            let reducer = NcclReducer::join(&g.comm, index, plan, cfg.comm.grad_dtype, |id| agree(g, id))?;
            Ok(Box::new(reducer))
        }
        _ => Ok(Box::new(agree(g, MpiStaged::new(&g.comm, plan, cfg.comm.grad_dtype, overlap))?)),
    }
}

/// Which all-reduce the run uses, the same on every rank, and a note when `auto` fell
/// back from NCCL.
fn choose_backend(g: &Group, cfg: &TrainConfig, device: Device, bus_id: Option<&str>) -> Result<(Backend, Option<String>)> {
    let shared = shared_gpu(g, device, bus_id);
    let local: Result<()> = match (device, shared) {
        (Device::Cuda(_), Some(why)) => Err(anyhow!("{why}")),
        (Device::Cuda(i), None) => prepare(i).map(|_| ()),
        _ => Err(anyhow!("this rank trains on CPU and NCCL needs CUDA")),
    };
    match cfg.comm.allreduce {
        AllreduceChoice::None => Ok((Backend::None, None)),
        AllreduceChoice::Mpi => Ok((Backend::Mpi, None)),
        AllreduceChoice::Nccl => {
            let checked = local.map_err(|e| anyhow!("--allreduce nccl cannot work: {e:#}. Use --allreduce mpi (CPU-staged) or auto"));
            agree(g, checked)?;
            Ok((Backend::Nccl, None))
        }
        AllreduceChoice::Auto => {
            let mine = i32::from(local.is_ok());
            let mut all = 0i32;
            let _f = crate::flight::enter("all-reduce", "backend choice");
            g.comm.all_reduce_into(&mine, &mut all, SystemOperation::min());
            if all == 1 {
                return Ok((Backend::Nccl, None));
            }
            let why = match (&local, device) {
                (_, Device::Cpu) => "training on CPU".to_string(),
                (Err(e), _) => format!("NCCL cannot work on rank {} ({e:#})", g.rank),
                (Ok(()), _) => "NCCL cannot work on another rank".to_string(),
            };
            Ok((Backend::Mpi, Some(format!("all-reduce: CPU-staged MPI ({why}; --allreduce auto)"))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The advice frees a core: never `--threads 1` to a rank that runs 1 thread on 1 core,
    /// never a thread count that still covers every core.
    #[test]
    fn the_advice_to_free_a_core_is_one_that_frees_it() {
        let one = free_core_advice(1, 1);
        assert!(!one.contains("--threads") && one.contains("fewer ranks per node"), "{one}");
        assert_eq!(free_core_advice(2, 2), "leave a core free (--threads 1)");
        assert_eq!(free_core_advice(2, 4), "leave a core free (--threads 1)");
        assert_eq!(free_core_advice(8, 8), "leave a core free (--threads 7)");
    }
}
