#!/usr/bin/env bash
# The quick start: set up, train the MNIST CNN data-parallel on 2 CPU ranks for one
# epoch of Fashion-MNIST, then reduce the run and print its summary.
#   job-scripts/local-mpirun.sh [RANKS] [extra ddpbench train flags...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
ranks=${1:-2}; shift || true
run=$here/results/local-n$ranks-$(date -u +%Y%m%dT%H%M%SZ)
# --bind-to none: ddpbench pins each rank itself with hwloc (and records it).
# --oversubscribe: allow more ranks than cores on a small machine.
mpirun -n "$ranks" --bind-to none --oversubscribe \
  "$DDPBENCH_BIN" train --model mnist-cnn --dataset fashion-mnist --epochs 1 --out "$run" "$@"
"$DDPBENCH_BIN" reduce "$run"
