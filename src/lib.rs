//! ddpbench: how well does data-parallel training scale on this machine, and where
//! does the time go?
//!
//! One module per concept: [`topology`] (MPI world, hwloc binding, GPU locality, node type),
//! [`telemetry`] (GPU inventory and NVML sampling),
//! [`comm`] (gradient all-reduce backends), [`data`] (data sets and sharding),
//! [`model`] (networks), [`train`] (the timed loop), [`record`] (CSV rows and the
//! run manifest), [`reduce`] (aggregation of run folders), [`stats`] (medians and
//! percentiles), [`cli`] (the command line, which is also the recorded configuration).

pub mod amp;
pub mod bigmnist;
pub mod cli;
pub mod comm;
pub mod cuda;
pub mod data;
pub mod device;
pub mod model;
pub mod optim;
pub mod plot;
pub mod record;
pub mod reduce;
pub mod stats;
pub mod telemetry;
pub mod topology;
pub mod train;

/// Seconds, as every duration in ddpbench's output is measured.
pub type Seconds = f64;
