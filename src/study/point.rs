//! One point run on the ranks of its sub-communicator: by ddpbench's trainer, or by
//! its peer.

use super::{
    peer,
    plan::{self, Point},
};
use crate::job::watchdog::Watchdog;
use crate::record::StudyRun;
use crate::train;
use crate::world::{agree, Group};
use anyhow::Result;
use std::path::Path;

/// Runs one point on the ranks of `pg`, into `dir`; `study_run` (which repeat of the
/// point it is) goes into its manifest.
pub(super) fn run_point(pg: &Group, point: &Point, study_run: Option<StudyRun>, dir: &Path, watchdog: &Watchdog) -> Result<()> {
    let mut argv = point.args.clone();
    argv.push("--out".into());
    argv.push(dir.to_string_lossy().into_owned());
    let mut cfg = agree(pg, plan::parse_train(&argv))?;
    cfg.study_run = study_run;
    if let Some(p) = point.peer {
        return peer::run(pg, p, &cfg, dir);
    }
    let malloc = train::host_memory::apply(cfg.placement.malloc);
    train::train(pg, &cfg, &malloc, watchdog)
}
