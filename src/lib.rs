//! ddpbench: how well does data-parallel training scale on this machine, and where
//! does the time go?
//!
//! One module per concept: [`world`] (the MPI world, communicators, agreeing on errors),
//! [`job`] (what every MPI command shares: MPI start, logging, panics, stop signals,
//! the watchdog, how a job ends), [`topology`] (the node's hardware, node type, hwloc
//! binding, GPU locality), [`device`] (CPU or CUDA, and the GPU libraries opened at run
//! time), [`telemetry`] (NVML sampling), [`comm`] (gradient buckets, all-reduce
//! backends, overlap with backward), [`allreduce`] (the all-reduce sweep), [`link`] (the fitted
//! link model and its file), [`data`] (data sets by format, sharding, loading), [`model`]
//! (networks), [`optim`] and [`amp`] (optimizers, mixed precision), [`noise_scale`]
//! (the gradient noise scale's estimators, a leaf), [`train`] (the
//! configuration and the timed loop), [`bounds`] (what a value read back from a file may
//! be), [`study`] (a whole scaling study on sub-communicators of one job), [`record`]
//! (the files a run writes: CSV rows, the phase glossary, the manifest), [`reduce`]
//! (from run folders to tables, report and plots), [`compare`] (two reports side by side), [`bandwidth`] (algbw and busbw, a
//! leaf every layer uses), [`files`] (regular files only, exclusive creation: a leaf),
//! [`cleanup`] (what a process removes on every way out: scratch folders, folder locks),
//! [`stderr`] (stderr through a queue that never blocks its callers: a leaf),
//! [`stats`] and [`plot`], and [`cli`] (the command line's root:
//! one subcommand each, whose arguments live with the command).

pub mod allreduce;
pub mod amp;
pub mod bandwidth;
pub mod bounds;
pub mod cleanup;
pub mod cli;
pub mod comm;
pub mod compare;
pub mod data;
pub mod device;
pub mod diagnose;
pub mod files;
pub mod flight;
pub mod job;
pub mod link;
pub mod model;
pub mod noise_scale;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod record;
pub mod reduce;
pub mod stats;
pub mod stderr;
pub mod study;
pub mod telemetry;
pub mod topology;
pub mod trace;
pub mod train;
pub mod world;

/// Seconds, as every duration in ddpbench's output is measured.
pub type Seconds = f64;
