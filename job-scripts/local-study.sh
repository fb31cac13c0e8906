#!/usr/bin/env bash
# The quick start: set up, then a scaling study on this machine: the MNIST CNN on
# Fashion-MNIST at 1 and 2 CPU ranks, four times each, ending with the speedup table.
#   job-scripts/local-study.sh [STUDY.toml] [ddpbench study options...]
# Each call writes a new folder results/study-quick-<time> (a study folder given with
# --out resumes instead).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
study=${1:-$here/job-scripts/studies/quick.toml}
shift || true
out=$here/results/study-$(basename "$study" .toml)-$(date -u +%Y%m%dT%H%M%SZ)
# --bind-to none: ddpbench pins each rank itself with hwloc (and records it).
# --oversubscribe: allow more ranks than cores on a small machine.
mpirun -n 2 --bind-to none --oversubscribe "$DDPBENCH_BIN" study "$study" --out "$out" "$@"
