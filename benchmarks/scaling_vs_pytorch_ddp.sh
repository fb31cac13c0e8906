#!/usr/bin/env bash
# Weak scaling from 1 to RANKS ranks of ddpbench beside PyTorch DDP on the same machine
# and workload: mnist-cnn, synthetic data, batch 64 per rank, THREADS threads per rank,
# SGD (momentum 0.9, lr 0.01). PyTorch runs benchmarks/pytorch_ddp_mnist.py under
# torchrun (gloo on CPU, NCCL on GPUs); ddpbench runs `train` under mpirun (MPI on CPU,
# NCCL on GPUs). The four runs (each tool at 1 and at RANKS ranks) are alternated
# REPEATS times, so machine noise hits all alike.
#   benchmarks/scaling_vs_pytorch_ddp.sh [RANKS=2] [STEPS=200] [REPEATS=3] [THREADS=1]
# DEVICE=cpu|cuda (default: cuda where torch sees a GPU). DDPBENCH_BIN: a built
# ddpbench (else job-scripts/setup.sh builds one).
#
# Per run: the median over steps (the first 10, warm-up, left out) of the slowest rank's
# step time. Per alternation i, with the same per-rank batch at both counts:
#   efficiency_i = step_1rank_i / step_Nrank_i, speedup_i = RANKS × efficiency_i
# (throughput at RANKS over throughput at 1). The table gives per tool the median over
# alternations, the range (min-max) and every alternation's value.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${DDPBENCH_BIN:-}" ]; then source "$here/job-scripts/setup.sh" || exit 1; fi
ranks=${1:-2}; steps=${2:-200}; repeats=${3:-3}; threads=${4:-1}
python=${DDPBENCH_PYTHON:-python3}
torchrun=$(dirname "$python")/torchrun
[ -x "$torchrun" ] || torchrun=torchrun
device=${DEVICE:-$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ddpbench() {  # ddpbench NAME RANKS
  mpirun -n "$2" --bind-to none --oversubscribe "$DDPBENCH_BIN" train --model mnist-cnn --dataset synthetic \
    --device "$device" --optimizer sgd --lr 0.01 --max-steps "$steps" --batch-size 64 --threads "$threads" \
    --val-samples 0 --warmup-steps 10 --out "$work/$1" >"$work/$1.log" 2>&1 \
    || { tail -5 "$work/$1.log" >&2; exit 1; }
}
pytorch() {  # pytorch NAME RANKS
  [ "$device" = cpu ] && dev=(env CUDA_VISIBLE_DEVICES=) || dev=(env)
  "${dev[@]}" OMP_NUM_THREADS="$threads" "$torchrun" --standalone --nproc_per_node "$2" \
    "$here/benchmarks/pytorch_ddp_mnist.py" --synthetic --max-steps "$steps" --batch-size 64 \
    --threads "$threads" --out "$work/$1" >"$work/$1.log" 2>&1 \
    || { tail -5 "$work/$1.log" >&2; exit 1; }
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for i in $(seq 1 "$repeats"); do
  ddpbench "ddpbench-1-$i" 1
  pytorch "pytorch-1-$i" 1
  ddpbench "ddpbench-$ranks-$i" "$ranks"
  pytorch "pytorch-$ranks-$i" "$ranks"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "mnist-cnn, synthetic data, batch 64 per rank, $threads thread(s) per rank, SGD, $steps steps (10 warm-up)," \
  "1 and $ranks ranks on $device, $repeats alternations; $(nproc) cores," \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');" \
  "load average (1, 5, 15 min) $load_before before, $load_after after"
"$python" - "$work" "$ranks" "$repeats" "$device" <<'PY'
import csv, glob, os, statistics as st, sys
work, ranks, repeats, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def step_s(folder):
    # Median over steps (warm-up left out) of the slowest rank's step time.
    per_rank = [list(csv.DictReader(open(f))) for f in sorted(glob.glob(os.path.join(folder, "rank-*.csv")))]
    n = min(len(r) for r in per_rank)
    return st.median(max(float(r[i]["step_s"]) for r in per_rank) for i in range(10, n))
tools = [("ddpbench", "ddpbench", "MPI" if device == "cpu" else "NCCL"),
         ("pytorch", "PyTorch DDP", "gloo" if device == "cpu" else "NCCL")]
fmt = lambda v: f"{st.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"
print(f"\n| trainer | all-reduce | step at 1 rank, ms | step at {ranks} ranks, ms | speedup at {ranks} | efficiency at {ranks} | efficiency per alternation |")
print("|---|---|---:|---:|---:|---:|---|")
for key, title, backend in tools:
    one = [step_s(f"{work}/{key}-1-{i}") for i in range(1, repeats + 1)]
    many = [step_s(f"{work}/{key}-{ranks}-{i}") for i in range(1, repeats + 1)]
    eff = [a / b for a, b in zip(one, many)]
    speed = [ranks * e for e in eff]
    ms = lambda v: f"{st.median(v)*1e3:.1f} ({min(v)*1e3:.1f}–{max(v)*1e3:.1f})"
    print(f"| {title} | {backend} | {ms(one)} | {ms(many)} | {fmt(speed)} | {fmt(eff)} | {' / '.join(f'{e:.3f}' for e in eff)} |")
print("\nmedian over alternations (min–max); efficiency = 1-rank step / "
      f"{ranks}-rank step of the same alternation, speedup = {ranks} × efficiency")
PY
