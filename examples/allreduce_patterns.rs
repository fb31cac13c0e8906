//! Which conditions slow a 4.8 MB MPI_Allreduce down?  mpirun -n 2 allreduce_patterns
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::Communicator;

fn main() {
    let universe = mpi::initialize().unwrap();
    let w = universe.world();
    let n = 1_199_882usize;
    let mut a = vec![1.0f32; n];
    let mut b = vec![0.0f32; n];
    let mut r = vec![0.0f32; n];
    let time = |f: &mut dyn FnMut(usize)| -> f64 {
        let mut t = Vec::new();
        for i in 0..60 {
            w.barrier();
            let t0 = mpi::time();
            f(i);
            let dt = mpi::time() - t0;
            if i >= 10 {
                t.push(dt)
            }
        }
        t.sort_by(f64::total_cmp);
        t[t.len() / 2] * 1e3
    };
    let fixed = time(&mut |_| w.all_reduce_into(&a[..], &mut r[..], SystemOperation::sum()));
    let alternating = time(&mut |i| {
        if i % 2 == 0 {
            w.all_reduce_into(&a[..], &mut b[..], SystemOperation::sum())
        } else {
            w.all_reduce_into(&b[..], &mut a[..], SystemOperation::sum())
        }
    });
    let mut fresh = 0.0;
    {
        let mut ts = Vec::new();
        for i in 0..60 {
            for (k, v) in a.iter_mut().enumerate() {
                *v = (k + i) as f32 * 1e-6;
            }
            w.barrier();
            let t0 = mpi::time();
            w.all_reduce_into(&a[..], &mut r[..], SystemOperation::sum());
            if i >= 10 {
                ts.push(mpi::time() - t0)
            }
        }
        ts.sort_by(f64::total_cmp);
        fresh += ts[ts.len() / 2] * 1e3;
    }
    // Skewed entry: rank 1 arrives 20 ms late (busy), rank 0 waits inside the all-reduce;
    // time measured on rank 1 (the last to enter), as the reducer's transfer time.
    let mut ts = Vec::new();
    for i in 0..40 {
        w.barrier();
        if w.rank() == 1 {
            let t = mpi::time();
            while mpi::time() - t < 0.02 {}
        }
        let t0 = mpi::time();
        w.all_reduce_into(&a[..], &mut r[..], SystemOperation::sum());
        if i >= 5 {
            ts.push(mpi::time() - t0)
        }
    }
    ts.sort_by(f64::total_cmp);
    let skewed = ts[ts.len() / 2] * 1e3;
    // Cold caches: stream 64 MB through the cache before each all-reduce, as backward does.
    let mut junk = vec![0u8; 64 << 20];
    let mut ts = Vec::new();
    for i in 0..40 {
        for (k, v) in junk.iter_mut().enumerate().step_by(64) {
            *v = (k + i) as u8;
        }
        w.barrier();
        let t0 = mpi::time();
        w.all_reduce_into(&a[..], &mut r[..], SystemOperation::sum());
        if i >= 5 {
            ts.push(mpi::time() - t0)
        }
    }
    ts.sort_by(f64::total_cmp);
    let cold = ts[ts.len() / 2] * 1e3;
    if w.rank() == 1 {
        println!("median ms: fixed {fixed:.3}  alternating {alternating:.3}  fresh-send {fresh:.3}  skewed(last rank) {skewed:.3}  cold-cache {cold:.3}");
    }
    let _ = b[0];
}
