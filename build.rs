//! Give the binary an rpath to libtorch so ranks launched by mpirun/srun find it
//! without LD_LIBRARY_PATH, and tell the code where libtorch lives so it can load
//! libtorch_cuda at run time (only when a GPU may be used: CPU ranks, `reduce` and
//! `topo` then skip CUDA's ~0.7 s and ~400 MB start-up cost).
//!
//! Also compiles the small C shim over libjpeg(-turbo) that decodes image regions
//! (src/data/jpeg_shim.c) and links the system libjpeg.
fn main() {
    cc::Build::new()
        .file("src/data/jpeg_shim.c")
        .opt_level(2)
        .warnings(true)
        .compile("ddpbench_jpeg_shim");
    println!("cargo:rustc-link-lib=jpeg");
    println!("cargo:rerun-if-changed=src/data/jpeg_shim.c");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rustc-env=DDPBENCH_LIBTORCH_LIB={dir}");
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
}
