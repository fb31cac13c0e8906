//! libtorch's global random generator, seeded and drawn from under one lock, so that two
//! threads of one process (unit tests run in parallel) never interleave a seed and the
//! draws that follow it.

use std::sync::{Mutex, MutexGuard};

static GLOBAL: Mutex<()> = Mutex::new(());

/// Seeds libtorch's global generator with `seed` and keeps it to the caller until the
/// guard is dropped. Not reentrant: a thread holding a guard must not ask for another.
pub(crate) fn seed(seed: i64) -> MutexGuard<'static, ()> {
    // A thread that panicked while holding it left no state behind but the generator's,
    // which the seed below resets.
    let guard = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed);
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    #[test]
    fn draws_after_a_seed_repeat_while_other_threads_seed_and_draw() {
        let draw = |s: i64| {
            let _g = seed(s);
            Tensor::randn([64], (Kind::Float, Device::Cpu))
        };
        let reference = draw(5);
        let noise = std::thread::spawn(move || {
            for k in 0..200 {
                let _ = draw(k);
            }
        });
        for _ in 0..200 {
            assert!(draw(5).equal(&reference));
        }
        noise.join().unwrap();
    }
}
