# Sourced by the GPU scripts: the environment a device machine needs to run the
# binaries that `benchmarks/gpu_validate.sh prepare` packed into .gpu/.

# Exports the library path (the packed libraries, the wheel's libtorch and NCCL), the
# packed Open MPI's prefix and PATH, and lets mpirun run as root. Run in the
# repository root.
gpu_device_env() {
    local torch_lib
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    # The wheel ships libnccl.so.2; the loader (cudarc) opens libnccl.so.
    mkdir -p .gpu/nccl && ln -sfn "$torch_lib/../../nvidia/nccl/lib/libnccl.so.2" .gpu/nccl/libnccl.so
    export LD_LIBRARY_PATH="$PWD/.gpu/nccl:$PWD/.gpu/lib:$torch_lib:${LD_LIBRARY_PATH:-}"
    export OPAL_PREFIX="$PWD/.gpu/ompi" PATH="$PWD/.gpu/ompi/bin:$PATH"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}
