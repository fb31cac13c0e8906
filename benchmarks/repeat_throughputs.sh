#!/usr/bin/env bash
# Many repeats of the quick study's two points (mnist-cnn on Fashion-MNIST, batch 64 per
# rank, 150 steps, 1 and 2 CPU ranks; job-scripts/studies/quick.toml), interleaved as a
# study runs them, and each run's throughput (samples per step over its mean step, as
# `reduce` computes it) into one CSV: the run-to-run spread that the speedup interval's
# coverage test resamples (src/reduce/analysis/interval.rs).
#   benchmarks/repeat_throughputs.sh [REPEATS=24] [OUT=tests/fixtures/throughputs/quick-mnist-cnn.csv]
# The kept files: quick-mnist-cnn.csv (a loaded machine), quick-mnist-cnn-quiet.csv (quiet).
# The header records the machine, the commit and the load average before and after:
# runs on a machine others share are noisier than on a quiet one.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" >/dev/null || exit 1
repeats=${1:-24}
out=${2:-$here/tests/fixtures/throughputs/quick-mnist-cnn.csv}
study=$(mktemp -d)/study; trap 'rm -rf "$(dirname "$study")"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# The 1-minute load average every 10 s while the runs train.
(while sleep 10; do cut -d' ' -f1 /proc/loadavg; done) >"$study.load" &
sampler=$!
mpirun -n 2 --bind-to none --oversubscribe "$DDPBENCH_BIN" study "$here/job-scripts/studies/quick.toml" \
  --repeats "$repeats" --out "$study" >"$study.log" 2>&1 || { kill "$sampler"; tail -20 "$study.log" >&2; exit 1; }
kill "$sampler"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
load_range=$(sort -g "$study.load" | sed -n '1p;$p' | paste -sd' ' | sed 's/ / to /')
{
  echo "# Per-run throughput of the quick study's points, $repeats repeats each, interleaved:"
  echo "#   benchmarks/repeat_throughputs.sh $repeats"
  echo "# commit $(git -C "$here" rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "# started $start; load average (1, 5, 15 min) $load_before before, $load_after after;"
  echo "# 1-min load sampled every 10 s during the runs: ${load_range:-not sampled}"
  echo "ranks,run_id,samples_per_s"
  jq -r '.runs[] | [.ranks, .run_id, .samples_per_s] | @csv' "$study/report/report.json" | tr -d '"' | sort -t, -k1,1n -k2,2V
} >"$out"
echo "wrote $out ($(grep -vc '^#' "$out") lines with the header)"
