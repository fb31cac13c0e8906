#!/usr/bin/env bash
# The equality-of-training tests under every CPU kernel setting this machine allows, one
# variable at a time, at seeds 1 to 3: what another CPU would compute, on this one.
#
#   benchmarks/kernel_settings.sh OUT [SEEDS]      (SEEDS default "1 2 3")
#
# libtorch picks its CPU kernels by ATEN_CPU_CAPABILITY (default, avx2, avx512), MKL its
# code path by MKL_CBWR (COMPATIBLE, AVX2, AVX512), oneDNN (most CPU convolutions) its own
# by ONEDNN_MAX_CPU_ISA (SSE41, AVX, AVX2, AVX512_CORE). A setting above what the CPU has
# is skipped and said. Each test prints `equality TEST seed=S same=D other=O bound=B ENV`
# (tests/common/mod.rs, assert_equal_training) before it asserts; this script collects
# those lines into OUT/equality.tsv, each test's pass or fail into OUT/runs.tsv, and
# prints per compared pair the largest difference, the smallest other-seed distance, the
# bound, and the headroom on both sides (bound / largest, smallest other / bound).
# Writes nothing but OUT, which must not exist. Takes about 40 min on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: benchmarks/kernel_settings.sh OUT [SEEDS]}
seeds=${2:-1 2 3}
[ -e "$out" ] && { echo "$out exists already: give a new folder" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "${KS_REUSE:-}" ]; then
  # KS_REUSE=DIR: the test binaries an earlier run copied into DIR/bin, and the built
  # binary as it is (no build: a second part of the same measurement).
  venv=${DDPBENCH_HOME:-$HOME/.cache/ddpbench}/venv
  LIBTORCH=$("$venv/bin/python" -c 'import torch,os; print(os.path.dirname(torch.__file__))') || exit 1
  export LIBTORCH LD_LIBRARY_PATH=$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export DDPBENCH_PYTHON=$venv/bin/python OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
else
  source "$here/job-scripts/setup.sh" >/dev/null || exit 1
fi
cd "$here"

# The tests that compare two ways of training (or of averaging one step) that must agree.
tests=(
  "train_mpirun two_ranks_of_batch_32_equal_one_rank_of_batch_64"
  "train_mpirun accumulation_and_worker_threads_preserve_the_arithmetic"
  "script_model a_torchscript_cnn_at_2_ranks_of_32_trains_as_1_rank_of_64"
  "study_mpirun two_points_of_a_study_train_as_one_rank_of_twice_the_batch"
  "noise_scale_mpirun one_rank_of_two_micro_batches_and_two_ranks_measure_the_same_mean_gradient"
  "param_dtypes fp16_bf16_and_fp64_models_train_in_their_dtype_and_fp64_is_summed_in_fp64"
  "comm_mpirun overlap_gives_the_same_model_and_sends_buckets_during_backward"
)
# The test binaries as built now, copied into OUT: an edit or a rebuild while the script
# runs changes nothing it measures (cargo would rebuild them before each run).
mkdir -p "$out/bin"
if [ -n "${KS_REUSE:-}" ]; then
  cp -a "$KS_REUSE/bin/." "$out/bin/"
else cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, shutil, sys
want = set(sys.argv[2:])
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("kind") == ["test"] and t["name"] in want:
        shutil.copy2(m["executable"], sys.argv[1] + "/" + t["name"])
' "$out/bin" $(printf '%s\n' "${tests[@]}" | cut -d' ' -f1 | sort -u)
fi

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
settings=("baseline=")
for v in default avx2 avx512; do
  case $v in avx2) has avx2 || continue ;; avx512) has avx512f || continue ;; esac
  settings+=("ATEN_CPU_CAPABILITY=$v")
done
for v in COMPATIBLE AVX2 AVX512; do
  case $v in AVX2) has avx2 || continue ;; AVX512) has avx512f || continue ;; esac
  settings+=("MKL_CBWR=$v")
done
for v in SSE41 AVX AVX2 AVX512_CORE; do
  case $v in AVX) has avx || continue ;; AVX2) has avx2 || continue ;; AVX512_CORE) has avx512f || continue ;; esac
  settings+=("ONEDNN_MAX_CPU_ISA=$v")
done
# KS_SETTINGS="baseline= MKL_CBWR=COMPATIBLE ..." runs those settings only (e.g. a part).
[ -n "${KS_SETTINGS:-}" ] && read -r -a settings <<<"$KS_SETTINGS"
# KS_TESTS="train_mpirun ..." runs only the tests of those binaries.
if [ -n "${KS_TESTS:-}" ]; then
  kept=()
  for t in "${tests[@]}"; do [[ " $KS_TESTS " == *" ${t%% *} "* ]] && kept+=("$t"); done
  tests=("${kept[@]}")
fi
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "settings: ${settings[*]}"
  echo "skipped (the CPU lacks them): $(for s in ATEN_CPU_CAPABILITY=avx512 MKL_CBWR=AVX512 ONEDNN_MAX_CPU_ISA=AVX512_CORE; do
    [[ " ${settings[*]} " == *" $s "* ]] || printf '%s ' "$s"; done)"
  echo "seeds: $seeds"
  echo "started: $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

printf 'setting\tseed\ttest\tstatus\tseconds\n' >"$out/runs.tsv"
for setting in "${settings[@]}"; do
  var=${setting%%=*} val=${setting#*=}
  for seed in $seeds; do
    for t in "${tests[@]}"; do
      bin=${t%% *} name=${t#* }
      log="$out/logs/$var-$val-$seed-$name.log"
      mkdir -p "$out/logs"
      env_args=(DDPBENCH_EQUALITY_SEED="$seed")
      [ "$var" = baseline ] || env_args+=("$var=$val")
      start=$(date +%s)
      if env "${env_args[@]}" "$out/bin/$bin" --exact "$name" --nocapture --test-threads=1 >"$log" 2>&1; then
        status=pass
      else
        status=FAIL
      fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$setting" "$seed" "$name" "$status" "$(($(date +%s) - start))" >>"$out/runs.tsv"
      # libtest prints `test NAME ... ` and the test's own line follows on the same line.
      grep -o 'equality [^ ]* seed=.*' "$log" | sed "s/^/$setting /" >>"$out/equality.txt" || true
      echo "$setting seed $seed $bin::$name: $status"
    done
  done
done
echo "ended: $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

# Per compared pair: the largest difference, the smallest other-seed distance, the bound.
python3 - "$out/equality.txt" <<'EOF' | tee "$out/summary.txt"
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = line.split()
    setting, test = parts[0], parts[2]
    kv = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
    rows[test].append((setting, int(kv["seed"]), float(kv["same"]), float(kv["other"]), float(kv["bound"])))
print("%-22s %5s %11s %-30s %11s %11s %9s %9s" % ("pair", "runs", "largest", "at", "other min", "bound", "bound/lg", "other/bd"))
for test, r in sorted(rows.items()):
    lg = max(r, key=lambda x: x[2]); om = min(x[3] for x in r); bound = r[0][4]
    ratio = bound / lg[2] if lg[2] > 0 else float("inf")
    print("%-22s %5d %11.3e %-30s %11.3e %11.3e %9.1f %9.1f" % (
        test, len(r), lg[2], "%s seed %d" % (lg[0], lg[1]), om, bound, ratio, om / bound))
EOF
