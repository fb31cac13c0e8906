#!/usr/bin/env bash
# `ddpbench allreduce` (MPI on host memory) against a plain C MPI_Allreduce loop timed the
# OSU way (benchmarks/allreduce_c.c), same ranks, binding, sizes and iterations,
# alternated REPEATS times so drift hits both alike. Prints, per size >= 64 KiB, the
# median of each and the ratio of ddpbench's busbw to C's (> 0.9 meets the goal), and the
# spread (min-max of the per-repeat ratios).
#   benchmarks/allreduce_vs_c.sh [ranks=2] [repeats=15] [max_bytes=64M] [factor=4] [iters=20]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source job-scripts/setup.sh >/dev/null
ranks=${1:-2} repeats=${2:-15} max=${3:-67108864} factor=${4:-4} iters=${5:-20}
work=$(mktemp -d)
mpicc -O2 -o "$work/allreduce_c" benchmarks/allreduce_c.c
mpi=(mpirun -n "$ranks" --bind-to core --map-by core)
for r in $(seq "$repeats"); do
    "${mpi[@]}" "$work/allreduce_c" 65536 "$max" "$factor" "$iters" 5 >"$work/c-$r.txt"
    "${mpi[@]}" "$DDPBENCH_BIN" allreduce --min-bytes 64K --max-bytes "$max" --factor "$factor" --iters "$iters" --warmup-iters 5 \
        --idle-ms 0 --budget-s 1000 --out "$work/d-$r" >/dev/null
done
python3 - "$work" "$repeats" <<'PY'
import csv, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
c, d = {}, {}
for r in range(1, reps + 1):
    for line in open(f"{work}/c-{r}.txt"):
        b, t = line.split(); c.setdefault(int(b), []).append(float(t))
    for row in csv.DictReader(open(f"{work}/d-{r}/allreduce.csv")):
        if row["buffer"] == "out-of-place":
            d.setdefault(int(row["bytes"]), []).append(float(row["time_s"]) * 1e6)
print(f"{'bytes':>10} {'C us':>10} {'ddpbench us':>12} {'busbw ratio':>11} {'ratio min-max':>14}")
for b in sorted(c):
    if b not in d: continue
    ratios = [ct / dt for ct, dt in zip(c[b], d[b])]
    print(f"{b:>10} {statistics.median(c[b]):>10.1f} {statistics.median(d[b]):>12.1f} "
          f"{statistics.median(c[b]) / statistics.median(d[b]):>11.3f} {min(ratios):>6.3f}-{max(ratios):.3f}")
PY
rm -rf "$work"
