//! Traces: what every rank did, step by step, in the Chrome trace-event format that
//! Perfetto, `chrome://tracing` and Holistic Trace Analysis read. `train --trace` writes
//! one file per rank ([`writer`]); `ddpbench trace RUN_DIR` (and `reduce` on a traced
//! run) merges them on one clock into `timeline.json` (`crate::reduce::timeline`, next
//! to the clock offsets it corrects by).

pub(crate) mod event;
pub(crate) mod files;
pub(crate) mod window;
#[cfg(feature = "train")]
pub(crate) mod writer;

pub use event::viewer_times;
pub(crate) use window::StepWindow;
#[cfg(feature = "train")]
pub(crate) use writer::{RankIdentity, RankTrace, TracedStep};
