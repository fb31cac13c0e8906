#!/usr/bin/env bash
# ddpbench vs PyTorch DDP (torchrun, gloo) on CPU: same network, data, batch, threads.
# Alternates the two REPEATS times (so machine noise hits both alike), then prints
# each run's median step time (warm-up steps excluded) and the ratio of medians.
#   benchmarks/compare_ddp.sh [RANKS=2] [STEPS=200] [BATCH=64] [REPEATS=3]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
ranks=${1:-2}; steps=${2:-200}; batch=${3:-64}; repeats=${4:-3}
threads=$(( $(nproc) / ranks )); ((threads >= 1)) || threads=1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
torchrun=$(dirname "$DDPBENCH_PYTHON")/torchrun
for i in $(seq 1 "$repeats"); do
  mpirun -n "$ranks" --bind-to none --oversubscribe "$DDPBENCH_BIN" train --optimizer sgd --lr 0.01 --max-steps "$steps" \
    --batch-size "$batch" --threads "$threads" --val-samples 0 --warmup-steps 10 --out "$work/ddpbench-$i" 2>/dev/null
  OMP_NUM_THREADS=$threads "$torchrun" --standalone --nproc_per_node "$ranks" \
    "$here/benchmarks/pytorch_ddp_mnist.py" --max-steps "$steps" --batch-size "$batch" \
    --threads "$threads" --out "$work/pytorch-$i" 2>/dev/null
done
"$DDPBENCH_PYTHON" - "$work" "$repeats" <<'PY'
import csv, glob, statistics as st, sys, os
work, repeats = sys.argv[1], int(sys.argv[2])
def med(folder):
    # Median over steps of the slowest rank's step time (steps 10.. on).
    ranks = [list(csv.DictReader(open(f))) for f in sorted(glob.glob(os.path.join(folder, "rank-*.csv")))]
    per_step = [max(float(r[i]["step_s"]) for r in ranks) for i in range(10, len(ranks[0]))]
    return st.median(per_step)
ours = [med(f"{work}/ddpbench-{i}") for i in range(1, repeats + 1)]
theirs = [med(f"{work}/pytorch-{i}") for i in range(1, repeats + 1)]
print("run  ddpbench_step_ms  pytorch_ddp_step_ms  ratio")
for i, (a, b) in enumerate(zip(ours, theirs), 1):
    print(f"{i:>3}  {a*1e3:16.2f}  {b*1e3:19.2f}  {a/b:5.3f}")
print(f"median of runs: ddpbench {st.median(ours)*1e3:.2f} ms, PyTorch DDP {st.median(theirs)*1e3:.2f} ms, ratio {st.median(ours)/st.median(theirs):.3f}")
PY
# The all-reduce inside training against a raw MPI_Allreduce of the same buckets in the same run.
"$DDPBENCH_BIN" reduce "$work"/ddpbench-* --no-plots --out "$work/reduced" > /dev/null
"$DDPBENCH_PYTHON" - "$work/reduced/summary.csv" <<'PY'
import csv, sys
print("run          busbw_train_GB/s  busbw_probe_GB/s  train/probe")
for r in csv.DictReader(open(sys.argv[1])):
    print(f"{r['run_id']:<12} {float(r['busbw_bytes_per_s'])/1e9:16.2f}  {float(r['probe_busbw_bytes_per_s'])/1e9:16.2f}  {float(r['busbw_vs_probe']):11.2f}")
PY
