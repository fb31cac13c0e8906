//! `ddpbench study`: a whole scaling study in one launch. The job is started with the
//! most ranks any point needs; each point (one configuration at one rank count) runs on
//! a sub-communicator of the world holding exactly its ranks, in its own run folder
//! (the folder `train` writes), while the other ranks wait without spinning; at the end
//! rank 0 reduces every point into one report.
//!
//! The study folder holds `study.toml` (the resolved study: every key explicit),
//! `study.json` (its hash and points), `points.csv` (one row per point run: its ranks,
//! hosts, outcome and the idle ranks' CPU use), `runs/<point>-rep<N>/` and `report/`.
//! Running the same command again skips finished points, retries failed ones only with
//! `--retry-failed`, and refuses a study whose resolved file changed.
//!
//! Its files, by concern: [`args`] (the flags and the study they make), [`spec`] (the
//! study file's keys), [`layout`] (the job's nodes), [`plan`] (points, ranks, schedule)
//! with [`lr_grid`] (learning rates paired with batches), [`runner`] (the job: each point on its ranks, the others idle),
//! [`point`] (one point run), [`folder`] (the study folder, new or resumed), [`book`]
//! (`points.csv` and the state as the study goes), [`broadcast`] and [`idle`] (the
//! study's own collectives and the idle ranks' CPU meter), [`print`](mod@print) (the plan, the dry
//! run's estimate), [`finish`] and `report` (rank 0's report at the end).

mod args;
mod book;
mod broadcast;
mod estimate;
mod finish;
mod folder;
mod idle;
mod layout;
mod lr_grid;
pub(crate) mod peer;
pub(crate) mod plan;
mod point;
mod print;
mod report;
mod runner;
mod spec;
mod state;

pub(crate) use args::StudyArgs;
pub use runner::main;
