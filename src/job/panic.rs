//! Panics in a job: one line for a user, then the job aborted ([`abort_job`]).

use super::abort::abort_job;

/// A panic on one rank (libtorch reports most of its errors, out of memory among them,
/// as one) must not leave the others blocked in a collective: the rank says what went
/// wrong in one line and aborts the job.
pub(super) fn abort_on_panic(rank: usize, host: &str) {
    let host = host.to_string();
    std::panic::set_hook(Box::new(move |info| {
        crate::stderr::say(&format!(
            "Error on rank {rank} ({host}): {}. Aborting the job.",
            panic_message(info)
        ));
        abort_job(2)
    }));
}

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
