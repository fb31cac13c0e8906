#!/usr/bin/env bash
# The recorder's overhead on CPU (issue 51), benchmarks/recorder_overhead.py on 2 gloo
# ranks. Prints every pair, the median of the per-pair ratio (with / without) and a
# distribution-free 95 %-or-more interval for that median, and the same for the
# difference per step (the recorder's own time per step).
#
# DESIGN=pairs (default): PAIRS (9) pairs of separate runs, one with ddpbench_record and
# one without, the order alternating from pair to pair; STEPS (150) steps per run.
#   PAIRS=9 STEPS=150 benchmarks/recorder_overhead.sh
# DESIGN=blocks: one run; PAIRS (60) pairs of BLOCK-step (10) blocks alternating between a
# recorded and a plain replica after WARMUP_PAIRS (3) pairs left out; then the run folder's
# check. AA=1 leaves both replicas plain (the design's own bias).
#   DESIGN=blocks PAIRS=60 BLOCK=10 benchmarks/recorder_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DDPBENCH_PYTHON:-python3}
DESIGN=${DESIGN:-pairs}
STEPS=${STEPS:-150}
BLOCK=${BLOCK:-10}
WARMUP_PAIRS=${WARMUP_PAIRS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torchrun() {
    PYTHONPATH=python OMP_NUM_THREADS=1 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/recorder_overhead.py "$@"
}
case "$DESIGN" in
pairs)
    PAIRS=${PAIRS:-9}
    for i in $(seq 1 "$PAIRS"); do
        if (( i % 2 )); then order="off on"; else order="on off"; fi
        for mode in $order; do
            torchrun --recorder "$mode" --out "$work/run$i-$mode" --steps "$STEPS" 2>/dev/null | grep mean_step_s \
                | sed "s/^/{\"pair\": $i, \"run\": /; s/$/}/" >> "$work/results.jsonl"
        done
    done
    ;;
blocks)
    PAIRS=${PAIRS:-60}
    extra=()
    if [[ ${AA:-0} == 1 ]]; then extra=(--both-plain); fi
    if ! torchrun --design blocks --pairs "$PAIRS" --block-steps "$BLOCK" --warmup-pairs "$WARMUP_PAIRS" \
        --out "$work/run" "${extra[@]}" > "$work/out.jsonl" 2> "$work/stderr"; then
        tail -20 "$work/stderr" >&2
        exit 1
    fi
    grep '"pair"' "$work/out.jsonl" > "$work/results.jsonl"
    grep '"check"' "$work/out.jsonl" || true
    ;;
*)
    echo "DESIGN=$DESIGN: give pairs or blocks" >&2
    exit 2
    ;;
esac
"$PY" - "$work/results.jsonl" <<'PY'
import json, sys, math
# Per pair: seconds per step (without, with), from either design's lines.
pairs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "run" in r:
        pairs.setdefault(r["pair"], {})[r["run"]["recorder"]] = r["run"]["mean_step_s"]
    else:
        pairs[r["pair"]] = {"off": r["off_s"] / r["steps"], "on": r["on_s"] / r["steps"]}
ratios, diffs = [], []
for i in sorted(pairs):
    p = pairs[i]
    ratios.append(p["on"] / p["off"])
    diffs.append(p["on"] - p["off"])
    print(f"pair {i}: without {p['off']*1e3:.3f} ms, with {p['on']*1e3:.3f} ms, ratio {ratios[-1]:.4f}")
n = len(ratios)
median = lambda r: (r[(n - 1) // 2] + r[n // 2]) / 2  # noqa: E731
# The k-th smallest and largest values bound the median with probability
# 1 - 2 * P(Binomial(n, 1/2) < k): the largest k that keeps it at 95 % or more.
cdf = lambda k: sum(math.comb(n, j) for j in range(k)) / 2**n  # noqa: E731
k = max([k for k in range(1, n // 2 + 1) if 1 - 2 * cdf(k) >= 0.95] or [1])
r, d = sorted(ratios), sorted(diffs)
med = median(r)
print(f"ratios: min {r[0]:.4f}, quartiles {r[n // 4]:.4f} {r[(3 * n) // 4]:.4f}, max {r[-1]:.4f}")
print(f"median ratio {med:.4f} ({(med-1)*100:+.2f} %), interval {r[k-1]:.4f}-{r[n-k]:.4f} "
      f"({(r[k-1]-1)*100:+.2f} % to {(r[n-k]-1)*100:+.2f} %, coverage {1-2*cdf(k):.3f}, {n} pairs)")
print(f"median difference {median(d)*1e6:+.0f} us per step, interval {d[k-1]*1e6:+.0f} to {d[n-k]*1e6:+.0f} us "
      f"(same order statistics)")
PY
