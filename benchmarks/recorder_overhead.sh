#!/usr/bin/env bash
# The recorder's overhead on CPU (issue 51): PAIRS pairs of 2-rank gloo runs of
# benchmarks/recorder_overhead.py, one with ddpbench_record and one without, the order
# alternating from pair to pair; prints every pair, the median of the per-pair ratio
# (with / without) and a distribution-free 95 %-or-more interval for that median.
#   PAIRS=9 STEPS=150 benchmarks/recorder_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DDPBENCH_PYTHON:-python3}
PAIRS=${PAIRS:-9}
STEPS=${STEPS:-150}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
one() {  # $1 = on|off, $2 = run folder
    PYTHONPATH=python OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/recorder_overhead.py --recorder "$1" --out "$2" --steps "$STEPS" 2>/dev/null | grep mean_step_s
}
for i in $(seq 1 "$PAIRS"); do
    if (( i % 2 )); then order="off on"; else order="on off"; fi
    for mode in $order; do
        one "$mode" "$work/run$i-$mode" | sed "s/^/{\"pair\": $i, \"run\": /; s/$/}/" >> "$work/results.jsonl"
    done
done
"$PY" - "$work/results.jsonl" <<'PY'
import json, sys, math
rows = [json.loads(l) for l in open(sys.argv[1])]
pairs = {}
for r in rows:
    pairs.setdefault(r["pair"], {})[r["run"]["recorder"]] = r["run"]["mean_step_s"]
ratios = []
for i in sorted(pairs):
    p = pairs[i]
    ratios.append(p["on"] / p["off"])
    print(f"pair {i}: without {p['off']*1e3:.3f} ms, with {p['on']*1e3:.3f} ms, ratio {ratios[-1]:.4f}")
r = sorted(ratios)
n = len(r)
med = (r[(n - 1) // 2] + r[n // 2]) / 2
# The k-th smallest and largest ratios bound the median with probability
# 1 - 2 * P(Binomial(n, 1/2) < k): the largest k that keeps it at 95 % or more.
cdf = lambda k: sum(math.comb(n, j) for j in range(k)) / 2**n
k = max([k for k in range(1, n // 2 + 1) if 1 - 2 * cdf(k) >= 0.95] or [1])
print(f"median ratio {med:.4f} ({(med-1)*100:+.2f} %), interval {r[k-1]:.4f}-{r[n-k]:.4f} "
      f"({(r[k-1]-1)*100:+.2f} % to {(r[n-k]-1)*100:+.2f} %, coverage {1-2*cdf(k):.3f}, {n} pairs)")
PY
