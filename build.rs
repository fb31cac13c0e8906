//! Give the binary an rpath to libtorch so ranks launched by mpirun/srun find it
//! without LD_LIBRARY_PATH, and link libtorch (not only libtorch_cpu) so CUDA is
//! available when the libtorch in use has it.
fn main() {
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rustc-env=DDPBENCH_LIBTORCH_LIB={dir}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
}
