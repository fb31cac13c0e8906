//! How the C allocator treats the memory a training step frees. libtorch allocates a
//! step's activations and gradients on the host with malloc and frees them at the end
//! of the step. glibc hands large blocks back to the kernel (munmap, or trimming the
//! heap's top), so the next step takes them again page by page: thousands of page
//! faults per step (about 7,000 for mnist-cnn at batch 64, measured with `perf stat`),
//! and under Open MPI each munmap also passes through its memory hooks. `tuned` keeps
//! freed memory in the process for reuse, as PyTorch's CUDA caching allocator does on
//! a GPU; the price is that resident memory stays at its peak.

/// glibc's largest mmap threshold on 64-bit: blocks up to this size come from the heap.
const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;

/// Defined with the comparison key, which records it.
pub(crate) use crate::record::MallocMode;

/// glibc's malloc settings from the environment, which win over `--malloc`.
pub(crate) const MALLOC_ENV: [&str; 3] = ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"];

/// Applies `mode` to glibc's malloc and says what the process runs with, for the
/// manifest. `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` in the environment
/// win: then nothing is changed.
pub(crate) fn apply(mode: MallocMode) -> String {
    let from_env: Vec<String> = MALLOC_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    if !from_env.is_empty() {
        return format!("glibc malloc as the environment sets it ({})", from_env.join(" "));
    }
    match mode {
        MallocMode::Default => "glibc malloc defaults".into(),
        MallocMode::Tuned => {
            // SAFETY: mallopt only sets allocator parameters; any value is accepted or refused (0).
            let ok = unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
            };
            if ok {
                "glibc malloc tuned: mmap threshold 32 MiB, no trimming (--malloc tuned)".into()
            } else {
                "glibc malloc defaults (mallopt refused --malloc tuned)".into()
            }
        }
    }
}
