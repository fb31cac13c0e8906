#!/usr/bin/env bash
# The gradient noise scale's prediction against training to a target loss
# (BENCHMARKS.md, "The prediction against training to a target loss"): a model on
# Fashion-MNIST, 2 ranks on CPU, global batches 64, 256 and 1024 (32, 128 and 512 per
# rank), each with a learning-rate grid around a rule (LR0 at B = 64, scaled linearly or
# by the square root of B/64, times each of FACTORS), every grid point REPEATS times
# (repeat r with --seed r: its own data order, and its own initial parameters for a
# built-in model), one run at a time at nice 19, then `ddpbench reduce` over all of them
# (its target table takes the best learning rate per batch) and one line per run.
#
# Usage: benchmarks/noise_target_check.sh OUT [REPEATS] [BIN]
#   OUT      folder for the runs (made); a run whose folder exists is not run again, so
#            a stopped check resumes where it stopped
#   REPEATS  runs per grid point (default 2); repeat 1 of every point runs before repeat 2
#   BIN      the ddpbench binary (default target/release/ddpbench)
# In the environment:
#   MODEL      mnist-cnn (default), another built-in name, or "mlp": a TorchScript MLP
#              (784-512-256-10, ReLU) written once into OUT/mlp.pt by $DDPBENCH_PYTHON
#              (or python3) with torch; its initial parameters are the file's, so its
#              repeats differ in data order only
#   OPTIMIZER  sgd (default: SGD with momentum 0.9) or adam
#   LR0        learning rate at B = 64 (default 0.005 for sgd, 0.001 for adam)
#   RULE       linear (default for sgd) or sqrt (default for adam)
#   FACTORS    the grid's multiples of the rule (default "0.5 1 2")
#   PER_RANK   batches per rank (default "32 128 512"), e.g. FACTORS=4 PER_RANK="32 128"
#              extends the grid where its best learning rate was its largest
#   TARGET     target training loss (default 0.6)
#   TARGET_ACCURACY  a target of validation accuracy instead (a fraction, e.g. 0.83):
#              the whole test split is validated every VAL_SAMPLES trained samples
#              (default 1024, at least one step), so samples to the target are known to
#              within that many
# Every run stops at the target or after 131,072 samples (2.2 epochs), whichever first:
# at most 2048, 512 and 128 steps.
set -euo pipefail
out=${1:?usage: $0 OUT [REPEATS] [BIN]}
repeats=${2:-2}
bin=${3:-target/release/ddpbench}
optimizer=${OPTIMIZER:-sgd}
case "$optimizer" in
  sgd) lr0=${LR0:-0.005} rule=${RULE:-linear} opt_flags=(--optimizer sgd --momentum 0.9) ;;
  adam) lr0=${LR0:-0.001} rule=${RULE:-sqrt} opt_flags=(--optimizer adam) ;;
  *) echo "OPTIMIZER must be sgd or adam, not $optimizer" >&2; exit 2 ;;
esac
case "$rule" in linear | sqrt) ;; *) echo "RULE must be linear or sqrt, not $rule" >&2; exit 2 ;; esac
mkdir -p "$out"
model=${MODEL:-mnist-cnn}
model_flags=(--model "$model")
if [ "$model" = mlp ]; then
  if [ ! -e "$out/mlp.pt" ]; then
    # torch.jit.script reads the class's source, so the maker is a file, not stdin.
    cat >"$out/make_mlp.py" <<'PY'
import sys, torch, torch.nn as nn
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 10)
    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
torch.manual_seed(0)
torch.jit.script(Mlp()).save(sys.argv[1])
PY
    "${DDPBENCH_PYTHON:-python3}" "$out/make_mlp.py" "$out/mlp.pt"
  fi
  model_flags=(--model "$out/mlp.pt" --input-shape 1x28x28 --num-classes 10)
fi
# Open MPI refuses root unless told; the check is often run as root on a test machine.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ -n "${TARGET_ACCURACY:-}" ]; then
  target_flags=(--target-accuracy "$TARGET_ACCURACY")
else
  target_flags=(--target-loss "${TARGET:-0.6}" --val-samples 0)
fi
common=("${model_flags[@]}" --dataset fashion-mnist "${opt_flags[@]}"
  --warmup-epochs 0.1 "${target_flags[@]}" --epochs 5 --noise-scale on --threads 1
  --probe-iters 0)
max_samples=131072
for rep in $(seq 1 "$repeats"); do
  for per_rank in ${PER_RANK:-32 128 512}; do
    global=$((2 * per_rank))
    for factor in ${FACTORS:-0.5 1 2}; do
      lr=$(awk -v b="$global" -v f="$factor" -v l="$lr0" -v r="$rule" \
        'BEGIN { s = b / 64; if (r == "sqrt") s = sqrt(s); printf "%g", l * s * f }')
      dir="$out/b$global-x$factor-r$rep"
      [ -e "$dir" ] && continue
      start=$(date +%s)
      val_flags=()
      if [ -n "${TARGET_ACCURACY:-}" ]; then
        val_every=$((${VAL_SAMPLES:-1024} / global))
        val_flags=(--val-every $((val_every > 0 ? val_every : 1)))
      fi
      if ! nice -n 19 mpirun -n 2 "$bin" train "${common[@]}" --seed "$rep" --batch-size "$per_rank" --lr "$lr" \
        --max-steps $((max_samples / global)) "${val_flags[@]}" --out "$dir" >"$dir.log" 2>&1; then
        echo "b$global x$factor r$rep: failed, see $dir.log"
      fi
      echo "b$global x$factor (lr $lr) r$rep: $(($(date +%s) - start)) s, $(grep -ho 'reached --target-[a-z]*.*\|did not reach.*' "$dir.log" | head -1)"
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
