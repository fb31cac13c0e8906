//! ddpbench: how well does data-parallel training scale on this machine, and where
//! does the time go?
//!
//! One module per concept: [`world`] (the MPI world, communicators, agreeing on errors),
//! [`topology`] (the node's hardware, node type, hwloc binding, GPU locality),
//! [`device`] (CPU or CUDA, and the GPU libraries opened at run time),
//! [`telemetry`] (NVML sampling), [`comm`] (gradient buckets, all-reduce backends,
//! overlap with backward), [`data`] (data sets by format, sharding, loading),
//! [`model`] (networks), [`optim`] and [`amp`] (optimizers, mixed precision),
//! [`train`] (the configuration and the timed loop), [`record`] (the files a run
//! writes: CSV rows, the phase glossary, the manifest), [`reduce`] (from run folders to
//! tables, report and plots), [`stats`] and [`plot`], and [`cli`] (the command line).

pub mod amp;
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
pub mod telemetry;
pub mod topology;
pub mod train;
pub mod world;

/// Seconds, as every duration in ddpbench's output is measured.
pub type Seconds = f64;
