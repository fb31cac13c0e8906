#!/usr/bin/env bash
# The communication options against each other on 2 CPU ranks (shared memory):
# --overlap on/off and --grad-dtype fp32/bf16 with 1 MiB buckets (so that some leave
# while backward still runs), alternated REPEATS times so machine
# noise hits all alike. Prints per configuration the medians over runs of each run's
# median (over steps 10.. and both ranks) of step_s, backward_s, comm_s, comm_exposed_s.
#   benchmarks/comm_options.sh [STEPS=150] [REPEATS=3] [MODEL=mnist-cnn] [BATCH=64]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
steps=${1:-150}; repeats=${2:-3}; model=${3:-mnist-cnn}; batch=${4:-64}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
configs=("overlap-on:--overlap on" "overlap-off:--overlap off" "bf16-overlap-on:--overlap on --grad-dtype bf16" "bf16-overlap-off:--overlap off --grad-dtype bf16")
for i in $(seq 1 "$repeats"); do
  for c in "${configs[@]}"; do
    name=${c%%:*}; flags=${c#*:}
    # shellcheck disable=SC2086
    mpirun -n 2 --bind-to none --oversubscribe "$DDPBENCH_BIN" train --model "$model" --dataset synthetic \
      --batch-size "$batch" --optimizer sgd --max-steps "$steps" --warmup-steps 10 --val-samples 0 --bucket-mb 1 \
      $flags --out "$work/$name-$i" 2>/dev/null
  done
done
"$DDPBENCH_PYTHON" - "$work" "$repeats" "${configs[@]%%:*}" <<'PY'
import csv, glob, os, statistics as st, sys
work, repeats, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cols = ["step_s", "backward_s", "comm_s", "comm_exposed_s"]
def run_medians(d):
    rows = [r for f in sorted(glob.glob(os.path.join(d, "rank-*.csv"))) for r in list(csv.DictReader(open(f)))[10:]]
    return {c: st.median(float(r[c]) for r in rows) for c in cols}
print("config            " + "  ".join(f"{c:>16}" for c in cols) + "   (ms, median of run medians)")
for n in names:
    runs = [run_medians(f"{work}/{n}-{i}") for i in range(1, repeats + 1)]
    print(f"{n:18}" + "  ".join(f"{st.median(r[c] for r in runs)*1e3:16.2f}" for c in cols))
PY
