//! Which conditions slow a 4.8 MB MPI_Allreduce down (BENCHMARKS.md, issue 2)?
//!   mpirun -n 2 --bind-to core target/release/examples/allreduce_patterns
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Communicator, SimpleCommunicator};
use std::cell::RefCell;

/// Median ms over iterations 10..60 of `op`. Each iteration runs `prepare`, a barrier,
/// then `late` (both untimed: a rank busy in `late` enters `op` after the others).
fn median_ms(w: &SimpleCommunicator, prepare: &dyn Fn(usize), late: &dyn Fn(), op: &dyn Fn(usize)) -> f64 {
    let mut t = Vec::new();
    for i in 0..60 {
        prepare(i);
        w.barrier();
        late();
        let t0 = mpi::time();
        op(i);
        if i >= 10 {
            t.push(mpi::time() - t0);
        }
    }
    t.sort_by(f64::total_cmp);
    t[t.len() / 2] * 1e3
}

fn main() {
    let universe = mpi::initialize().unwrap();
    let w = universe.world();
    let n = 1_199_882usize; // the MNIST CNN's gradient, 4.8 MB
    let a = RefCell::new(vec![1.0f32; n]);
    let b = RefCell::new(vec![0.0f32; n]);
    let r = RefCell::new(vec![0.0f32; n]);
    let junk = RefCell::new(vec![0u8; 64 << 20]);
    let sum = SystemOperation::sum();
    let reduce = |from: &RefCell<Vec<f32>>, to: &RefCell<Vec<f32>>| w.all_reduce_into(&from.borrow()[..], &mut to.borrow_mut()[..], sum);
    let none = |_: usize| {};
    let on_time = || {};

    let fixed = median_ms(&w, &none, &on_time, &|_| reduce(&a, &r));
    // Two buffer sets in turn, as training's double-buffered gradients.
    let alternating = median_ms(&w, &none, &on_time, &|i| if i % 2 == 0 { reduce(&a, &b) } else { reduce(&b, &a) });
    // Send buffer freshly written, as gradients after backward.
    let fresh = median_ms(
        &w,
        &|i| a.borrow_mut().iter_mut().enumerate().for_each(|(k, v)| *v = (k + i) as f32 * 1e-6),
        &on_time,
        &|_| reduce(&a, &r),
    );
    // Rank 1 arrives 20 ms late (busy); the median on it, the last to enter, is the transfer.
    let rank = w.rank();
    let delay = || {
        if rank == 1 {
            let t = mpi::time();
            while mpi::time() - t < 0.02 {}
        }
    };
    let skewed = median_ms(&w, &none, &delay, &|_| reduce(&a, &r));
    // 64 MB streamed through the caches first, as backward's activations do.
    let cold = median_ms(
        &w,
        &|i| {
            junk.borrow_mut()
                .iter_mut()
                .step_by(64)
                .enumerate()
                .for_each(|(k, v)| *v = (k + i) as u8)
        },
        &on_time,
        &|_| reduce(&a, &r),
    );
    if rank == 1 {
        println!("median ms: fixed {fixed:.3}  alternating {alternating:.3}  fresh-send {fresh:.3}  skewed(last rank) {skewed:.3}  cold-cache {cold:.3}");
    }
}
