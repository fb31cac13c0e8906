#!/usr/bin/env bash
# GPU proof of ddpbench's CUDA path: NCCL, the CPU-staged all-reduce on device tensors,
# AMP, GPU binding and telemetry. Two halves, because the GPU machine has PyTorch but
# no Rust, no Open MPI and no network:
#
#   benchmarks/gpu_validate.sh prepare    # here: build, gather the stripped binary and
#                                         # Open MPI (binaries, libraries, plugins, help
#                                         # files) into .gpu/ (git-ignored), < 30 MB
#   benchmarks/gpu_validate.sh device     # there, from the repo root, with .gpu carried
#
# With this workplace's device tool: run(command="benchmarks/gpu_validate.sh device",
# carry=[".gpu"]); results land in $OUT (else results/gpu-validate-<time>).
# The binary links libtorch 2.11.0 (cu130 wheel) and runs against the device's own
# PyTorch 2.11.0+cu130, found through python3.
#
# Runs (synthetic data, so nothing else needs carrying), then `ddpbench reduce`:
#   mnist-cnn  1 rank  NCCL           fp32, bf16      (NCCL single-rank overhead)
#   mnist-cnn  2 ranks CPU-staged MPI fp32, overlap on and off (two ranks share the GPU)
#   resnet50   1 rank  NCCL           fp32, fp16 AMP  (vs PyTorch eager, same batch)
#   resnet50   2 ranks CPU-staged MPI fp16 AMP        (staged bandwidth vs copy bandwidth)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

prepare() {
    # shellcheck disable=SC1091
    source job-scripts/setup.sh
    cargo build --release
    rm -rf .gpu && mkdir -p .gpu/lib .gpu/ompi/bin
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    strip -o .gpu/ddpbench target/release/ddpbench
    # Open MPI relocated under OPAL_PREFIX=.gpu/ompi, in Debian's layout.
    local mpilib=/usr/lib/x86_64-linux-gnu/openmpi
    mkdir -p .gpu/ompi/lib/x86_64-linux-gnu .gpu/ompi/share
    cp -a "$mpilib" .gpu/ompi/lib/x86_64-linux-gnu/
    cp -a /usr/share/openmpi .gpu/ompi/share/
    cp -L "$(readlink -f /usr/bin/mpirun)" .gpu/ompi/bin/orterun
    ln -sf orterun .gpu/ompi/bin/mpirun
    cp -L /usr/bin/orted .gpu/ompi/bin/
    # Shared libraries the binary, mpirun and the MPI plugins need, minus the C runtime
    # and libtorch (the device has its own).
    {
        ldd .gpu/ddpbench .gpu/ompi/bin/orterun
        find .gpu/ompi/lib -name '*.so' -exec ldd {} \; 2>/dev/null
    } | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/torch/|/nvidia/' |
        while read -r lib; do cp -L "$lib" .gpu/lib/; done
    du -sh .gpu
    echo "prepared .gpu: now run 'benchmarks/gpu_validate.sh device' on the GPU machine with .gpu carried"
}

device() {
    [ -x .gpu/ddpbench ] || { echo "no .gpu/ddpbench: run 'benchmarks/gpu_validate.sh prepare' here first" >&2; exit 2; }
    out=${OUT:-results/gpu-validate-$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$out"
    torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
    export LD_LIBRARY_PATH="$PWD/.gpu/lib:$torch_lib:${LD_LIBRARY_PATH:-}"
    export OPAL_PREFIX="$PWD/.gpu/ompi" PATH="$PWD/.gpu/ompi/bin:$PATH"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export DDPBENCH_NCCL_LIB="$torch_lib/../../nvidia/nccl/lib/libnccl.so.2"
    local bin="$PWD/.gpu/ddpbench"
    local mpi=(mpirun --bind-to none --oversubscribe --mca btl self,vader,tcp -x LD_LIBRARY_PATH -x DDPBENCH_NCCL_LIB)
    local runs="$out/runs"
    mkdir -p "$runs"
    {
        nvidia-smi -L || true
        "$bin" topo --ranks 2
    } >"$out/topo.txt" 2>&1
    # Device<->host copy bandwidth of pinned buffers of one bucket's size (25 MiB).
    python3 - >"$out/copy_bw.json" 2>"$out/copy_bw.log" <<'PY' || echo '{}' >"$out/copy_bw.json"
import json, time, torch
n = 25 * 2**20 // 4
d = torch.ones(n, device="cuda"); h = torch.empty(n, pin_memory=True)
def bw(f):
    for _ in range(3): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): f()
    torch.cuda.synchronize(); return 20 * 4 * n / (time.perf_counter() - t)
print(json.dumps({"bytes": 4 * n, "d2h_bytes_per_s": bw(lambda: h.copy_(d)), "h2d_bytes_per_s": bw(lambda: d.copy_(h))}))
PY
    train() { # name ranks args...
        local name=$1 ranks=$2
        shift 2
        "${mpi[@]}" -n "$ranks" "$bin" train --dataset synthetic --device cuda --optimizer sgd \
            --val-samples 0 --out "$runs/$name" "$@" >"$out/$name.log" 2>&1 ||
            echo "FAILED: $name (see $name.log)" | tee -a "$out/failures.txt"
    }
    train mnist-1-nccl-fp32 1 --model mnist-cnn --allreduce nccl --max-steps 400
    train mnist-1-nccl-bf16 1 --model mnist-cnn --allreduce nccl --amp bf16 --max-steps 400
    train mnist-1-mpi-fp32 1 --model mnist-cnn --allreduce mpi --max-steps 400
    train mnist-2-mpi-overlap 2 --model mnist-cnn --allreduce mpi --overlap on --max-steps 300
    train mnist-2-mpi-nooverlap 2 --model mnist-cnn --allreduce mpi --overlap off --max-steps 300
    # 4096 synthetic images (2.4 GB of host memory per rank), not the default 60,000 (36 GB).
    train r50-1-nccl-fp32 1 --model resnet50 --allreduce nccl --batch-size 64 --max-steps 60 --synthetic-samples 4096
    train r50-1-nccl-fp16 1 --model resnet50 --allreduce nccl --amp fp16 --batch-size 64 --max-steps 60 --synthetic-samples 4096
    train r50-2-mpi-fp16 2 --model resnet50 --allreduce mpi --amp fp16 --batch-size 64 --max-steps 40 --synthetic-samples 4096
    python3 benchmarks/pytorch_resnet_amp.py --model resnet50 --batch-size 64 --amp fp16 --steps 50 >"$out/pytorch_r50_fp16.json" 2>"$out/pytorch_r50_fp16.log" || true
    python3 benchmarks/pytorch_resnet_amp.py --model resnet50 --batch-size 64 --amp off --steps 50 >"$out/pytorch_r50_fp32.json" 2>"$out/pytorch_r50_fp32.log" || true
    "$bin" reduce --no-plots --out "$out/reduce" "$runs" >"$out/reduce.txt" 2>&1 || true
    python3 - "$out" <<'PY' | tee "$out/summary.txt"
import csv, glob, json, os, statistics, sys
out = sys.argv[1]
def med(run, col):
    v = []
    for f in glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv"):
        rows = list(csv.DictReader(open(f)))[5:]
        v += [float(r[col]) for r in rows if r[col] != ""]
    return statistics.median(v) if v else float("nan")
for run in sorted(os.listdir(f"{out}/runs")):
    if not os.path.exists(f"{out}/runs/{run}/manifest.json"):
        print(f"{run:24} no manifest (failed at set-up; see {run}.log)")
        continue
    m = json.load(open(f"{out}/runs/{run}/manifest.json"))
    print(f"{run:24} {m['comm_backend']:15} step {med(run,'step_s')*1e3:8.2f} ms  comm {med(run,'comm_s')*1e3:7.3f} ms  "
          f"exposed {med(run,'comm_exposed_s')*1e3:7.3f} ms  d2h {med(run,'comm_stage_d2h_s')*1e3:6.3f}  h2d {med(run,'comm_stage_h2d_s')*1e3:6.3f} ms  "
          f"bytes {m['gradient_bytes']}  {m['ranks'][0]['node_type']}")
cb = json.load(open(f"{out}/copy_bw.json"))
if cb:
    print(f"pinned copy bandwidth: d2h {cb['d2h_bytes_per_s']/1e9:.2f} GB/s, h2d {cb['h2d_bytes_per_s']/1e9:.2f} GB/s")
else:
    print("pinned copy bandwidth: not measured (see copy_bw.log)")
for amp in ("fp16", "fp32"):
    try:
        p = json.loads(open(f"{out}/pytorch_r50_{amp}.json").read())
        ours = med(f"r50-1-nccl-{amp}", "step_s")
        print(f"resnet50 {amp}: ddpbench {ours*1e3:.2f} ms vs PyTorch eager {p['median_step_s']*1e3:.2f} ms = {ours/p['median_step_s']:.3f}x")
    except Exception as e:
        print(f"resnet50 {amp}: no comparison ({e})")
r = "mnist-1-nccl-fp32"
print(f"NCCL single-rank: exposed comm / step = {med(r,'comm_exposed_s')/med(r,'step_s')*100:.2f} %")
r = "r50-2-mpi-fp16"
staged = (med(r, "comm_stage_d2h_s"), med(r, "comm_stage_h2d_s"))
try:
    b = json.load(open(f"{out}/runs/{r}/manifest.json"))["gradient_bytes"]
    print(f"staged copies for {b} B: d2h {b/staged[0]/1e9:.2f} GB/s, h2d {b/staged[1]/1e9:.2f} GB/s "
          f"({b/staged[0]/cb['d2h_bytes_per_s']*100:.0f} % / {b/staged[1]/cb['h2d_bytes_per_s']*100:.0f} % of the pinned copy bandwidth)")
except Exception as e:
    print(f"staged copies: no figure ({e})")
PY
}

case "$mode" in
prepare) prepare ;;
device) device ;;
*)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
