#!/usr/bin/env bash
# Two ddpbench binaries (e.g. before and after a change) on the same training run,
# alternated REPEATS times; per run the median over steps (warm-up excluded) of the
# slowest rank's step time and of each phase of rank 0, and per binary the median of
# runs with the range.
#   benchmarks/compare_builds.sh OLD_BIN NEW_BIN [REPEATS=5] -- [train flags for both]
#   NEW_FLAGS="--malloc default" adds flags for NEW_BIN only (flags OLD_BIN lacks).
# Defaults (before --): 2 ranks, mnist-cnn, batch 64, SGD, 150 steps, 1 thread per rank.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" >/dev/null || exit 1
old=$1; new=$2; shift 2
repeats=5
if [ $# -gt 0 ] && [ "$1" != -- ]; then repeats=$1; shift; fi
[ "${1:-}" = -- ] && shift
flags=("$@")
((${#flags[@]})) || flags=(--dataset synthetic --optimizer sgd --lr 0.01 --max-steps 150 --batch-size 64 --threads 1)
read -r -a new_flags <<< "${NEW_FLAGS:-}"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$repeats"); do
  mpirun -n 2 --bind-to none --oversubscribe "$old" train "${flags[@]}" --val-samples 0 --warmup-steps 10 --out "$work/old-$i" 2>/dev/null
  mpirun -n 2 --bind-to none --oversubscribe "$new" train "${flags[@]}" "${new_flags[@]}" --val-samples 0 --warmup-steps 10 --out "$work/new-$i" 2>/dev/null
done
echo "old: $old"; echo "new: $new ${NEW_FLAGS:-}"; echo "flags: ${flags[*]}; $repeats alternations"
"$DDPBENCH_PYTHON" - "$work" "$repeats" <<'PY'
import csv, glob, statistics as st, sys, os
work, repeats = sys.argv[1], int(sys.argv[2])
def rows(d): return [list(csv.DictReader(open(f)))[10:] for f in sorted(glob.glob(os.path.join(d, "rank-*.csv")))]
def step(d):
    r = rows(d)
    return st.median(max(float(x[i]["step_s"]) for x in r) for i in range(len(r[0])))
def phase(d, c):
    r0 = rows(d)[0]
    return st.median(float(x[c]) for x in r0) if c in r0[0] else float("nan")
t = {k: [step(f"{work}/{k}-{i}") for i in range(1, repeats + 1)] for k in ("old", "new")}
for k in ("old", "new"):
    v = t[k]
    print(f"{k}: step median {st.median(v)*1e3:.2f} ms, range {min(v)*1e3:.2f}-{max(v)*1e3:.2f} ms")
    print("     rank 0 phase medians (ms, median of runs): " + " ".join(
        f"{c[:-2]}={st.median(phase(f'{work}/{k}-{i}', c) for i in range(1, repeats + 1))*1e3:.2f}"
        for c in ("data_s", "batch_copy_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "other_s")))
pair = [a / b for a, b in zip(t["new"], t["old"])]
print(f"new / old: {st.median(t['new'])/st.median(t['old']):.3f} (ratio of medians); per alternation {min(pair):.3f}-{max(pair):.3f}")
PY
