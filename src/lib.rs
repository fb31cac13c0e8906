//! ddpbench: how well does data-parallel training scale on this machine, and where
//! does the time go?
//!
//! One module per concept: [`world`] (the MPI world, communicators, agreeing on errors),
//! [`topology`] (the node's hardware, node type, hwloc binding, GPU locality),
//! [`device`] (CPU or CUDA, and the GPU libraries opened at run time),
//! [`telemetry`] (NVML sampling), [`comm`] (gradient buckets, all-reduce backends,
//! overlap with backward), [`allreduce`] (the all-reduce sweep and the fitted
//! interconnect model), [`data`] (data sets by format, sharding, loading),
//! [`model`] (networks), [`optim`] and [`amp`] (optimizers, mixed precision),
//! [`train`] (the configuration and the timed loop), [`bounds`] (what a value read back
//! from a file may be), [`study`] (a whole scaling study
//! on sub-communicators of one job), [`record`] (the files a run
//! writes: CSV rows, the phase glossary, the manifest), [`reduce`] (from run folders to
//! tables, report and plots), [`bandwidth`] (algbw and busbw, a leaf every layer uses),
//! [`stats`] and [`plot`], and [`cli`] (the command line).

pub mod allreduce;
pub mod amp;
pub mod bandwidth;
pub mod bounds;
pub mod cli;
pub mod comm;
pub mod data;
pub mod device;
pub mod diagnose;
pub mod flight;
pub mod model;
pub mod optim;
pub mod plot;
pub mod record;
pub mod reduce;
pub mod stats;
pub mod study;
pub mod telemetry;
pub mod topology;
pub mod train;
pub mod world;

/// A panic's message in one line for a user: libtorch's error without its C++ trace, an
/// allocation failure with what to lower, and where in ddpbench it happened.
pub fn panic_message(info: &std::panic::PanicHookInfo) -> String {
    let payload = info
        .payload()
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| info.payload().downcast_ref::<&str>().copied())
        .unwrap_or("unknown error");
    let first = payload
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Exception raised from"))
        .unwrap_or(payload)
        .trim_start_matches("called `Result::unwrap()` on an `Err` value: ")
        .to_string();
    let lower = first.to_lowercase();
    let hint = if lower.contains("out of memory") || lower.contains("can't allocate memory") || lower.contains("cannot allocate memory") {
        ": memory ran out; lower --batch-size (or --workers, --synthetic-samples), or use fewer ranks per node"
    } else {
        ""
    };
    let place = info
        .location()
        .map(|l| format!(" (in ddpbench at {}:{})", l.file(), l.line()))
        .unwrap_or_default();
    format!("{first}{hint}{place}")
}

/// Seconds, as every duration in ddpbench's output is measured.
pub type Seconds = f64;
