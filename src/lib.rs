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
//! [`out_folder`] (the folder a report goes into: locked, staged, swapped in whole),
//! [`escape`] (data text for a terminal and for Markdown: a leaf),
//! [`stderr`] (stderr through a queue that never blocks its callers: a leaf),
//! [`stats`] and [`plot`], and [`cli`] (the command line's root:
//! one subcommand each, whose arguments live with the command).
//!
//! Features: `train` (the default) builds the trainer and everything that runs under MPI
//! or on libtorch; `report` (which `train` includes) the analysis: [`reduce`],
//! [`compare`], [`diagnose`], the [`trace`] merge and [`plot`]. The analysis and the
//! file formats it reads ([`record`], [`link`], [`trace`]'s files and events) use
//! neither libtorch nor MPI, so `--no-default-features --features report` builds a
//! binary that analyses run folders without either.

// Without the trainer, the writer side of the file formats (rows, manifests, traces
// written during a run) has no caller: it is dead in that build by design.
#![cfg_attr(not(feature = "train"), allow(dead_code))]
// `pub` only where a name leaves the crate (main.rs, tests, examples): everything else is
// `pub(crate)` or narrower. Checked in the full build, where every re-export exists.
#![cfg_attr(feature = "train", warn(unreachable_pub))]
// The documentation is built with private items (the test command's `cargo doc
// --document-private-items`), so a public item's doc may link to a private helper.
#![allow(rustdoc::private_intra_doc_links)]

#[cfg(not(feature = "report"))]
compile_error!("ddpbench needs the `report` feature, or `train` (the default), which includes it");

#[cfg(feature = "train")]
pub mod allreduce;
#[cfg(feature = "train")]
pub(crate) mod amp;
pub(crate) mod bandwidth;
pub(crate) mod bounds;
pub(crate) mod cleanup;
pub mod cli;
#[cfg(feature = "train")]
pub(crate) mod comm;
#[cfg(feature = "report")]
pub mod compare;
#[cfg(feature = "train")]
pub mod data;
#[cfg(feature = "train")]
pub(crate) mod device;
#[cfg(feature = "report")]
pub mod diagnose;
pub(crate) mod escape;
pub(crate) mod files;
pub(crate) mod flight;
#[cfg(feature = "train")]
pub mod job;
pub mod link;
#[cfg(feature = "train")]
pub mod model;
pub(crate) mod noise_scale;
#[cfg(feature = "train")]
pub(crate) mod optim;
#[cfg(feature = "report")]
pub(crate) mod out_folder;
#[cfg(feature = "report")]
pub mod plot;
#[cfg(feature = "train")]
pub(crate) mod progress;
pub mod record;
#[cfg(feature = "report")]
pub mod reduce;
pub(crate) mod stats;
pub mod stderr;
#[cfg(feature = "train")]
pub mod study;
#[cfg(feature = "train")]
pub(crate) mod telemetry;
#[cfg(feature = "train")]
pub mod topology;
#[cfg(feature = "train")]
pub(crate) mod torch_seed;
pub mod trace;
#[cfg(feature = "train")]
pub mod train;
#[cfg(feature = "train")]
pub mod world;

/// Seconds, as every duration in ddpbench's output is measured.
pub type Seconds = f64;
