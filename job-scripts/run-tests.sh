#!/usr/bin/env bash
# Sets up (same as the quick start) and runs the whole test suite: unit tests and
# integration tests that launch real `mpirun -n 2` jobs on CPU.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
cd "$here"
cargo test --release -- --test-threads=1 "$@"
