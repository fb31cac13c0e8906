//! `ddpbench allreduce`: an nccl-tests-style sweep of all-reduce sizes on every backend
//! the node supports, at every level of the allocation (within a node, across nodes with
//! one rank per node, the whole world), each sum checked, and the link model (α–β) fitted to
//! each level ([`crate::link::model`]), which `reduce` uses to project a workload to more nodes. Every
//! size runs through the transport training uses ([`crate::comm::transport`]), and
//! [`probe`] times a training run's own buckets the same way.
//!
//! One file per concern: [`args`] (flags and their checks), [`run`] (the sweep on every
//! rank), [`sweep`] (one size's timed loop), [`file`](mod@file) (the folder and what is written
//! there), [`fit`] (the link model from the rows), [`print`](mod@print) (what the terminal shows).

mod args;
mod file;
mod fit;
mod print;
pub(crate) mod probe;
mod run;
pub(crate) mod sweep;

pub(crate) use args::AllreduceArgs;
pub(crate) use file::Swept;
pub use run::main;
pub(crate) use run::run_on;
