//! The CPU a rank uses while it waits for a point it is not part of (`points.csv`'s
//! `idle_cpu_s_per_s`).

use std::time::Instant;

/// CPU time this process uses while it waits.
pub(super) struct IdleMeter {
    wall: Instant,
    cpu_s: f64,
}

fn process_cpu_s() -> f64 {
    // SAFETY: getrusage fills a zeroed struct for this process.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
        t(u.ru_utime) + t(u.ru_stime)
    }
}

impl IdleMeter {
    pub(super) fn start() -> IdleMeter {
        IdleMeter {
            wall: Instant::now(),
            cpu_s: process_cpu_s(),
        }
    }

    /// CPU seconds per second of waiting since `start`.
    pub(super) fn cpu_s_per_s(self) -> f64 {
        let wall = self.wall.elapsed().as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        (process_cpu_s() - self.cpu_s).max(0.0) / wall
    }
}
