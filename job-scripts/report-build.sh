#!/usr/bin/env bash
# The report-only binary (`--no-default-features --features report`): reduce, compare,
# trace and diagnose, without libtorch, MPI or hwloc. Checks, in order:
#  1. it builds, in its own target folder (target/report), so the main build's cache
#     stays valid;
#  2. ldd: it links no libtorch (libtorch*, libc10), no MPI (libmpi), no hwloc;
#  3. its --help lists reduce, compare, trace and diagnose and none of the trainer's
#     commands, and it runs with libtorch's folder off LD_LIBRARY_PATH;
#  4. `reduce`, `compare` and `diagnose` on the kept fixtures (tests/fixtures/) write the same bytes,
#     print the same lines and exit the same as the full binary (target/release/ddpbench,
#     built first when missing);
#  5. with --tests only: the test files that need no trainer pass under it too (Cargo.toml
#     marks the others `required-features = ["train"]`). They run the same code as under
#     the full binary, which run-tests.sh has tested already, so the suite leaves them
#     out; run them after changing what the `report` feature compiles in or out.
#
#   job-scripts/report-build.sh [--tests [HARNESS ARGUMENTS...]]
# e.g. `job-scripts/report-build.sh --tests reduce_fixtures`.
set -euo pipefail
tests=0
if [ "${1:-}" = --tests ]; then
  tests=1
  shift
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
target=${DDPBENCH_REPORT_TARGET:-target/report}
features=(--release --no-default-features --features report --target-dir "$target")
cargo build "${features[@]}"
report=$target/release/ddpbench
full=target/release/ddpbench
[ -x "$full" ] || cargo build --release

echo "report-only binary: $report ($(du -h "$report" | cut -f1))"
if ldd "$report" | grep -Ei 'libtorch|libc10|libmpi|libhwloc'; then
  echo "FAIL: the report-only binary links the libraries above" >&2
  exit 1
fi
help=$(env -u LD_LIBRARY_PATH "$report" --help)
for cmd in reduce compare trace diagnose; do
  grep -qE "^  $cmd " <<<"$help" || { echo "FAIL: --help lacks $cmd:"$'\n'"$help" >&2; exit 1; }
done
for cmd in train study allreduce loader topo models gen-bigmnist; do
  if grep -qE "^  $cmd " <<<"$help"; then
    echo "FAIL: --help lists $cmd:"$'\n'"$help" >&2
    exit 1
  fi
done

# The same command by each binary (`$ddpbench` in it) on the same copy of a fixture:
# outputs may name their paths, so both run at one path. Compared: the fixture's folder
# after it (the files written), stdout, stderr and the exit status.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
same_output() {
  local name=$1 fixture=$2 command=$3
  for side in full report; do
    local bin=$full
    [ "$side" = report ] && bin=$report
    rm -rf "$work/run"
    cp -r "$fixture" "$work/run"
    local status=0
    (cd "$work/run" && ddpbench="$here/$bin" env -u LD_LIBRARY_PATH sh -c "$command" >"$work/stdout" 2>"$work/stderr") || status=$?
    echo "$status" >"$work/status"
    mkdir -p "$work/$side"
    mv "$work/run" "$work/$side/$name"
    mv "$work/stdout" "$work/stderr" "$work/status" "$work/$side/$name/"
  done
  if ! diff -r "$work/full/$name" "$work/report/$name"; then
    echo "FAIL: $name: the report-only binary's output differs from the full binary's" >&2
    exit 1
  fi
  echo "same bytes: $name ($(find "$work/report/$name/out" -type f 2>/dev/null | wc -l) files in out/, exit $(cat "$work/report/$name/status"))"
}
same_output schema2 tests/fixtures/schema2 '$ddpbench reduce single study/runs --interconnect sweep --out out'
same_output schema2-94331d7 tests/fixtures/schema2-94331d7 '$ddpbench reduce single --interconnect sweep --out out'
same_output schema4 tests/fixtures/schema4-967f27a '$ddpbench reduce runs/one runs/two runs/two-force --interconnect sweep --out out'
same_output compare tests/fixtures/schema4-967f27a \
  '$ddpbench reduce runs/one runs/two --no-plots --out a && $ddpbench reduce runs/one runs/two-force --no-plots --out b && $ddpbench compare a b --out out'
same_output diagnose tests/fixtures/schema4-967f27a '$ddpbench diagnose runs/one'
if [ "$tests" = 1 ]; then
  cargo test "${features[@]}" -- --test-threads=1 "$@"
fi
echo "report-only build: all checks passed"
