#!/usr/bin/env bash
# Sets up (same as the quick start) and runs the whole test suite:
#  0. clippy's function-length check (no function over 120 lines outside tests);
#  1. cargo tests: unit tests and integration tests that launch real `mpirun -n 2`
#     jobs on CPU (training, equivalence, bad input, reducer, models, bigMNIST, studies);
#  2. the report-only build (no libtorch, MPI or hwloc) and its checks:
#     job-scripts/report-build.sh;
#  3. the cluster emulation (as root only): the sbatch scripts on a private Slurm with
#     2 fake nodes × 4 fake GPUs, and 2 ranks in network namespaces over a shaped link.
# Set DDPBENCH_CLUSTER_TESTS=0 to skip part 3.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
cd "$here"
# No function over 120 lines outside tests (clippy.toml sets the threshold).
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --release --quiet --lib --bins -- -A clippy::all -D clippy::too_many_lines
else
  echo "clippy not installed: function-length check skipped (rustup component add clippy)"
fi
# tests/report_page.rs reads report.html in a real browser: Debian's Chromium, headless.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the report page test (about 2 minutes, once)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null
  else
    echo "chromium missing and not root: tests/report_page.rs will fail (apt-get install chromium)"
  fi
fi
# One test at a time: each launches MPI jobs that want the machine's cores.
cargo test --release -- --test-threads=1 "$@"
job-scripts/report-build.sh
if [ "${DDPBENCH_CLUSTER_TESTS:-1}" = 0 ]; then
  echo "cluster emulation tests skipped (DDPBENCH_CLUSTER_TESTS=0)"
elif [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "cluster emulation tests skipped: they need root and iproute2 (Slurm daemons, network namespaces)"
else
  tests/cluster/slurm.sh
  tests/cluster/netns.sh
fi
