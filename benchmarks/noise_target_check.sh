#!/usr/bin/env bash
# The gradient noise scale's prediction against training to a target loss
# (BENCHMARKS.md, "The prediction against training to a target loss"): mnist-cnn on
# Fashion-MNIST, 2 ranks on CPU, global batches 64, 256 and 1024 (32, 128 and 512 per
# rank), each with a 3-value learning-rate grid around the linear rule 0.005 × B/64
# (× 0.5, × 1, × 2), every grid point REPEATS times (repeat r with --seed r: its own
# initial parameters and data order), one run at a time at nice 19, then
# `ddpbench reduce` over all of them (its target table takes the best learning rate per
# batch) and one line per run.
#
# Usage: benchmarks/noise_target_check.sh OUT [REPEATS] [BIN]
#   OUT      folder for the runs (made); a run whose folder exists is not run again, so
#            a stopped check resumes where it stopped
#   REPEATS  runs per grid point (default 2); repeat 1 of every point runs before repeat 2
#   BIN      the ddpbench binary (default target/release/ddpbench)
# FACTORS (default "0.5 1 2") and PER_RANK (default "32 128 512") in the environment
# change the grid and the batches, e.g. FACTORS=4 PER_RANK="32 128" to extend the grid
# where its best learning rate was its largest.
# Every run stops at the target or after 131,072 samples (2.2 epochs), whichever first:
# at most 2048, 512 and 128 steps.
set -euo pipefail
out=${1:?usage: $0 OUT [REPEATS] [BIN]}
repeats=${2:-2}
bin=${3:-target/release/ddpbench}
mkdir -p "$out"
# Open MPI refuses root unless told; the check is often run as root on a test machine.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
common=(--model mnist-cnn --dataset fashion-mnist --optimizer sgd --momentum 0.9
  --warmup-epochs 0.1 --target-loss 0.6 --epochs 5 --noise-scale on --threads 1
  --val-samples 0 --probe-iters 0)
max_samples=131072
for rep in $(seq 1 "$repeats"); do
  for per_rank in ${PER_RANK:-32 128 512}; do
    global=$((2 * per_rank))
    for factor in ${FACTORS:-0.5 1 2}; do
      lr=$(awk -v b="$global" -v f="$factor" 'BEGIN { printf "%g", 0.005 * b / 64 * f }')
      dir="$out/b$global-x$factor-r$rep"
      [ -e "$dir" ] && continue
      start=$(date +%s)
      if ! nice -n 19 mpirun -n 2 "$bin" train "${common[@]}" --seed "$rep" --batch-size "$per_rank" --lr "$lr" \
        --max-steps $((max_samples / global)) --out "$dir" >"$dir.log" 2>&1; then
        echo "b$global x$factor r$rep: failed, see $dir.log"
      fi
      echo "b$global x$factor (lr $lr) r$rep: $(($(date +%s) - start)) s, $(grep -ho 'reached --target-loss.*\|did not reach.*' "$dir.log" | head -1)"
    done
  done
done
"$bin" reduce --no-plots "$out"/b*-r*/ --out "$out/report"
# One line per run: batch, learning rate, repeat, steps, samples and seconds to target.
for m in "$out"/b*-r*/manifest.json; do
  jq -r --arg run "$(basename "$(dirname "$m")")" \
    '[$run, .global_batch_size, (.target.lr_rule // "-"), (.target.reached // false),
      (.target.steps_to_target // "-"), (.target.samples_to_target // "-"),
      (.target.seconds_to_target // "-")] | @tsv' "$m"
done
