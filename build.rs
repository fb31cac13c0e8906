//! Give the binary an rpath to libtorch so ranks launched by mpirun/srun find it
//! without LD_LIBRARY_PATH, and tell the code where libtorch lives so it can load
//! libtorch_cuda at run time (only when a GPU may be used: CPU ranks, `reduce` and
//! `topo` then skip CUDA's ~0.7 s and ~400 MB start-up cost).
//!
//! Also compiles the small C shim over libjpeg(-turbo) that decodes image regions
//! (src/data/jpeg_shim.c) and links the system libjpeg, and the C++ shim over
//! TorchScript modules (src/model/script_shim.cpp: buffers, typed forward) against
//! libtorch's headers, with the flags torch-sys builds its own C++ with. All of it only
//! with the `train` feature.
fn main() {
    // The analysis alone (`--no-default-features --features report`) decodes no image and
    // links no libtorch: neither shim, no rpath.
    if std::env::var_os("CARGO_FEATURE_TRAIN").is_none() {
        return;
    }
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
        script_shim(std::path::Path::new(&dir));
    }
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
}

/// The TorchScript shim, against the headers beside libtorch's `lib` folder.
fn script_shim(lib: &std::path::Path) {
    let root = lib.parent().unwrap_or(lib);
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    cc::Build::new()
        .cpp(true)
        .file("src/model/script_shim.cpp")
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2)
        .warnings(false)
        .compile("ddpbench_script_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=torch_cpu");
    println!("cargo:rustc-link-lib=c10");
    println!("cargo:rerun-if-changed=src/model/script_shim.cpp");
}
