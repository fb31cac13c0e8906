//! Give the binary an rpath to libtorch so ranks launched by mpirun/srun find it
//! without LD_LIBRARY_PATH, and tell the code where libtorch lives so it can load
//! libtorch_cuda at run time (only when a GPU may be used: CPU ranks, `reduce` and
//! `topo` then skip CUDA's ~0.7 s and ~400 MB start-up cost).
fn main() {
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rustc-env=DDPBENCH_LIBTORCH_LIB={dir}");
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
}
