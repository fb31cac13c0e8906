#!/usr/bin/env bash
# Reducer at scale: generates a run of RANKS × STEPS rows (default 64 × 100,000,
# about 1.5 GB of CSV), then times `ddpbench reduce` on it (page cache warm, as
# after a job) and reports its peak memory. Goal: ≤ 10 s, memory independent of rows.
#   benchmarks/reduce_scale.sh [RANKS=64] [STEPS=100000] [REPEATS=3]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
ranks=${1:-64}; steps=${2:-100000}; repeats=${3:-3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$here" && cargo build --release --quiet --example gen_run)
t0=$(date +%s.%N)
"$here/target/release/examples/gen_run" "$work/run" "$ranks" "$steps"
echo "generated $ranks x $steps rows ($(du -sh "$work/run" | cut -f1)) in $(echo "$(date +%s.%N) - $t0" | bc) s"
cat "$work"/run/rank-*.csv > /dev/null   # warm the page cache
for i in $(seq 1 "$repeats"); do
  /usr/bin/time -f "run $i: %e s wall, %M KiB peak RSS" "$DDPBENCH_BIN" reduce "$work/run" --no-plots --out "$work/out" > /dev/null
done
