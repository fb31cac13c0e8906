#!/usr/bin/env bash
# Sets up (same as the quick start) and runs the test suite.
#
#   job-scripts/run-tests.sh [--quick] [TEST NAME FILTER...]
#
# --quick: only the quick tier, the loop to run while working: the unit tests and the
# test files marked `// tier: quick` (no MPI: reduce on fixtures, the module graph, ...),
# all in parallel, built incrementally (Cargo.toml's `quick` profile). Without it, the
# whole suite:
#  0. clippy's default lints as errors, its function-length check (no function over
#     120 lines outside tests), `cargo doc` without a warning, and `cargo fmt --check`;
#     every build and test is --locked (Cargo.lock as committed);
#  1. the quick tier, in parallel (DDPBENCH_TEST_TIER=quick: a marked file that launches
#     MPI fails, naming what it launched); then every other test file, one test at a
#     time: they launch real `mpirun -n 2` jobs on CPU (training, equivalence, bad input,
#     reducer, models, bigMNIST, studies) that want the machine's cores. Beside them, in
#     a second lane, the files marked `// tier: beside`, one test at a time; then, alone,
#     those marked `// tier: quiet`;
#  2. the report-only build (no libtorch, MPI or hwloc) and its checks:
#     job-scripts/report-build.sh;
#  3. the cluster emulation (as root only): the sbatch scripts on a private Slurm with
#     2 fake nodes × 4 fake GPUs, and 2 ranks in network namespaces over a shaped link.
# The page and timeline tests need Debian's chromium and speedscope from npm: installed
# here once (as root), speedscope under DDPBENCH_HOME.
# Set DDPBENCH_CLUSTER_TESTS=0 to skip part 3.
set -euo pipefail
started=$SECONDS
since() {  # since WHAT START: how long WHAT took, on stdout
  echo "[run-tests] $1: $(($SECONDS - $2)) s"
}
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$quick" = 1 ] && [ -x "$here/target/release/ddpbench" ]; then
  # Set up already: the environment only; cargo test below rebuilds what changed, the
  # binary included, in one build.
  source "$here/job-scripts/setup.sh" --env || exit 1
else
  source "$here/job-scripts/setup.sh" "" || exit 1
fi
since "set-up" "$started"
cd "$here"
# The tiers: a test file marked `// tier: quick` launches no MPI job.
# A file marked `// tier: beside` launches jobs that need no quiet machine and use under
# half of its CPU (they wait for a watchdog, a signal, a stalled pipe, a sleeping rank):
# the full suite runs those files one at a time beside the other MPI files, which run
# one at a time. A file marked
# `// tier: quiet` holds a test whose figures come from timings (a measured step inside
# a projected band): it runs alone, after both.
quick_tests=()
mpi_tests=()
waiting_tests=()
quiet_tests=()
for f in tests/*.rs; do
  name=$(basename "$f" .rs)
  case $(grep -m1 -oE '^// tier: [a-z]+' "$f" || true) in
    "// tier: quick") quick_tests+=(--test "$name") ;;
    "// tier: beside") waiting_tests+=(--test "$name") ;;
    "// tier: quiet") quiet_tests+=(--test "$name") ;;
    "") mpi_tests+=(--test "$name") ;;
    *) echo "$f: unknown tier marker (quick, beside or quiet)" >&2; exit 2 ;;
  esac
done
# --quick builds with the `quick` profile (release code, incremental, in target/quick):
# after a one-line change it recompiles in seconds instead of rebuilding the crate. Its
# first build is a full one (about 6 minutes on 2 cores). The full suite stays on release.
profile=release
[ "$quick" = 1 ] && profile=quick
quick_tier() {
  DDPBENCH_TEST_TIER=quick cargo test --locked --profile "$profile" --no-fail-fast --lib --bins --examples "${quick_tests[@]}" -- "$@"
}
if [ "$quick" = 1 ]; then
  quick_tier "$@"
  exit
fi
# Clippy's default lints are errors everywhere (Cargo.toml's [lints.clippy] allows two,
# each with its reason), and no function outside tests is over 120 lines (clippy.toml
# sets the threshold).
gates=$SECONDS
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --locked --release --quiet --lib --bins -- -D warnings -D clippy::too_many_lines
  cargo clippy --locked --release --quiet --tests --examples -- -D warnings
else
  echo "clippy not installed: function-length check skipped (rustup component add clippy)"
fi
# The documentation builds without a warning: every intra-doc link resolves, no text
# reads as an HTML tag (release profile: the build scripts' outputs are the tests').
RUSTDOCFLAGS="-D warnings" cargo doc --locked --release --quiet --no-deps --document-private-items --lib
since "clippy and cargo doc" "$gates"
# tests/report_page.rs reads report.html in a real browser: Debian's Chromium, headless.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the report page test (about 2 minutes, once)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null
  else
    echo "chromium missing and not root: tests/report_page.rs will fail (apt-get install chromium)"
  fi
fi
# tests/trace_mpirun.rs opens a merged timeline in a real viewer: speedscope from npm,
# in the same headless Chromium, from DDPBENCH_HOME (outside the clone).
speedscope_npm="${DDPBENCH_HOME:-$HOME/.cache/ddpbench}/npm"
if [ ! -f "$speedscope_npm/node_modules/speedscope/dist/release/index.html" ]; then
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing npm for the timeline viewer test (once)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm >/dev/null
  fi
  if command -v npm >/dev/null 2>&1; then
    echo "installing speedscope 1.25.0 from npm for the timeline viewer test (once)"
    npm install --prefix "$speedscope_npm" speedscope@1.25.0 --no-audit --no-fund >/dev/null
  else
    echo "npm missing and not root: the speedscope test in tests/trace_mpirun.rs will fail (apt-get install npm)"
  fi
fi
export DDPBENCH_SPEEDSCOPE="$speedscope_npm/node_modules/speedscope/dist/release"
# The quick tier in parallel, then the MPI tier one test at a time. Every part runs
# even when an earlier one failed (cargo's --no-fail-fast, then the report-only build,
# then the cluster emulation), so one failure hides nothing; the summary at the
# end names every failing test and part, and the exit status is non-zero if any failed.
log=$(mktemp "${TMPDIR:-/tmp}/ddpbench-tests.XXXXXX")
trap 'rm -f "$log"' EXIT
failed=()
part() {  # part NAME command...: runs it, keeps going, remembers a failure
  local name=$1 start=$SECONDS; shift
  if ! "$@"; then failed+=("$name"); fi
  since "$name" "$start"
}
quick_tests_logged() {
  quick_tier "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
mpi_tests_logged() {
  # One build for both lanes, then the waiting lane in the background (its output is
  # printed after the other lane's) beside the other MPI files.
  cargo test --release --locked --no-run "${mpi_tests[@]}" "${waiting_tests[@]}" "${quiet_tests[@]}" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || return 1
  local lane waiting='' status=0
  lane=$(mktemp "${TMPDIR:-/tmp}/ddpbench-beside.XXXXXX")
  if ((${#waiting_tests[@]})); then
    cargo test --release --locked --no-fail-fast "${waiting_tests[@]}" -- --test-threads=1 "$@" >"$lane" 2>&1 &
    waiting=$!
  fi
  cargo test --release --locked --no-fail-fast "${mpi_tests[@]}" -- --test-threads=1 "$@" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  if [ -n "$waiting" ]; then
    wait "$waiting" || status=1
    echo "--- the files marked \`// tier: beside\`, run beside the above:"
    tee -a "$log" <"$lane"
  fi
  rm -f "$lane"
  if ((${#quiet_tests[@]})); then
    echo "--- the files marked \`// tier: quiet\`, alone:"
    cargo test --release --locked --no-fail-fast "${quiet_tests[@]}" -- --test-threads=1 "$@" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  fi
  return "$status"
}
if cargo fmt --version >/dev/null 2>&1; then
  part "cargo fmt --check" cargo fmt --check
else
  echo "rustfmt not installed: format check skipped (rustup component add rustfmt)"
fi
part "cargo test (quick tier)" quick_tests_logged "$@"
part "cargo test (MPI tier)" mpi_tests_logged "$@"
part "job-scripts/report-build.sh" job-scripts/report-build.sh
if [ "${DDPBENCH_CLUSTER_TESTS:-1}" = 0 ]; then
  echo "cluster emulation tests skipped (DDPBENCH_CLUSTER_TESTS=0)"
elif [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
  echo "cluster emulation tests skipped: they need root and iproute2 (Slurm daemons, network namespaces)"
else
  part "tests/cluster/slurm.sh" tests/cluster/slurm.sh
  part "tests/cluster/netns.sh" tests/cluster/netns.sh
fi
echo
since "everything" "$started"
if ((${#failed[@]} == 0)); then
  echo "run-tests.sh: every part passed"
  exit 0
fi
echo "run-tests.sh: FAILED parts: ${failed[*]}"
# libtest prints "test NAME ... FAILED" for each failing test; cargo names each binary.
grep -E '^test .* \.\.\. FAILED$|^error: .*target.* failed|^    `--(test|lib)' "$log" | sed 's/^/  /' || true
exit 1
