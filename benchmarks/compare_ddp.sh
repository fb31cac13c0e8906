#!/usr/bin/env bash
# ddpbench against PyTorch DDP (torchrun, gloo) on CPU with the same network (mnist-cnn),
# data, batch, threads per rank and optimizer (SGD, momentum 0.9, lr 0.01), and each
# against its own floor without communication: ddpbench --allreduce none and PyTorch
# without the DDP wrapper (processes side by side). The four runs are alternated
# REPEATS times, so machine noise hits all alike; then per run the median over steps
# (warm-up excluded) of the slowest rank's step time, and per tool the median of runs
# with the range.
#   benchmarks/compare_ddp.sh [RANKS=2] [STEPS=200] [BATCH=64] [REPEATS=5] [DATA=synthetic]
# DATA: synthetic (random-normal inputs in both tools) or fashion-mnist.
# MALLOC=tuned|default: ddpbench's --malloc. PT_MALLOC=tuned runs PyTorch with the same
# glibc settings (MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_ max); default: none.
# BIN=path: the ddpbench binary to time (default: the one set-up builds), e.g. an older build.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
bin=${BIN:-$DDPBENCH_BIN}
ranks=${1:-2}; steps=${2:-200}; batch=${3:-64}; repeats=${4:-5}; data=${5:-synthetic}
malloc=${MALLOC:-tuned}; pt_malloc=${PT_MALLOC:-default}
threads=$(( $(nproc) / ranks )); ((threads >= 1)) || threads=1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
torchrun=$(dirname "$DDPBENCH_PYTHON")/torchrun
case $data in
  synthetic) dd_data=(--dataset synthetic); pt_data=(--synthetic) ;;
  fashion-mnist) dd_data=(--dataset fashion-mnist); pt_data=() ;;
  *) echo "DATA must be synthetic or fashion-mnist" >&2; exit 2 ;;
esac
pt_env=()
[ "$pt_malloc" = tuned ] && pt_env=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=2147483647)
ddpbench() {  # ddpbench NAME [flags]
  local name=$1; shift
  mpirun -n "$ranks" --bind-to none --oversubscribe "$bin" train "${dd_data[@]}" --optimizer sgd --lr 0.01 \
    --max-steps "$steps" --batch-size "$batch" --threads "$threads" --val-samples 0 --warmup-steps 10 \
    --malloc "$malloc" --out "$work/$name" "$@" 2>/dev/null
}
pytorch() {  # pytorch NAME [flags]
  local name=$1; shift
  env "${pt_env[@]}" OMP_NUM_THREADS="$threads" "$torchrun" --standalone --nproc_per_node "$ranks" \
    "$here/benchmarks/pytorch_ddp_mnist.py" "${pt_data[@]}" --max-steps "$steps" --batch-size "$batch" \
    --threads "$threads" --out "$work/$name" "$@" 2>/dev/null
}
for i in $(seq 1 "$repeats"); do
  ddpbench "ddpbench-$i"
  pytorch "pytorch-$i"
  ddpbench "ddpbench_none-$i" --allreduce none
  pytorch "pytorch_noddp-$i" --no-ddp
done
echo "ddpbench: $bin; ranks $ranks, steps $steps, batch $batch per rank, threads $threads per rank, data $data, ddpbench --malloc $malloc, PyTorch malloc $pt_malloc, $repeats alternations"
"$DDPBENCH_PYTHON" - "$work" "$repeats" <<'PY'
import csv, glob, statistics as st, sys, os
work, repeats = sys.argv[1], int(sys.argv[2])
def med(folder):
    # Median over steps of the slowest rank's step time (steps 10.. on).
    ranks = [list(csv.DictReader(open(f))) for f in sorted(glob.glob(os.path.join(folder, "rank-*.csv")))]
    per_step = [max(float(r[i]["step_s"]) for r in ranks) for i in range(10, len(ranks[0]))]
    return st.median(per_step)
kinds = ["ddpbench", "pytorch", "ddpbench_none", "pytorch_noddp"]
t = {k: [med(f"{work}/{k}-{i}") for i in range(1, repeats + 1)] for k in kinds}
print("run " + "".join(f"{k + '_ms':>18}" for k in kinds) + "   ddpbench/pytorch")
for i in range(repeats):
    print(f"{i+1:>3} " + "".join(f"{t[k][i]*1e3:18.2f}" for k in kinds) + f"   {t['ddpbench'][i]/t['pytorch'][i]:16.3f}")
m = {k: st.median(v) for k, v in t.items()}
for k in kinds:
    print(f"{k}: median {m[k]*1e3:.2f} ms, range {min(t[k])*1e3:.2f}-{max(t[k])*1e3:.2f} ms")
pair = [a / b for a, b in zip(t["ddpbench"], t["pytorch"])]
print(f"ddpbench / PyTorch DDP: {m['ddpbench']/m['pytorch']:.3f} (ratio of medians); per alternation {min(pair):.3f}-{max(pair):.3f}")
print(f"ddpbench / ddpbench --allreduce none: {m['ddpbench']/m['ddpbench_none']:.3f}")
print(f"PyTorch DDP / PyTorch without DDP: {m['pytorch']/m['pytorch_noddp']:.3f}")
print(f"ddpbench --allreduce none / PyTorch without DDP: {m['ddpbench_none']/m['pytorch_noddp']:.3f}")
PY
