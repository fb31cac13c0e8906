#!/usr/bin/env bash
# A torchvision ResNet-50 saved as TorchScript against the built-in resnet50, on CPU:
# 1 rank, the same batch, threads, synthetic data, optimizer and `--overlap off`,
# alternated REPEATS times so machine noise hits both alike. Installs torchvision
# into the PyTorch venv when it is missing (from PyPI, the version built for its torch).
# Prints each run's median and fastest step (steps after warm-up), per model the median
# and range of the run medians and the median of the run minima (the figure least moved
# by other work on a shared machine), and both ratios (file / built-in).
#   benchmarks/torchscript_resnet50.sh [STEPS=14] [REPEATS=5] [BATCH=8] [THREADS=2]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
steps=${1:-14}; repeats=${2:-5}; batch=${3:-8}; threads=${4:-2}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$DDPBENCH_PYTHON" -c "import torchvision" 2>/dev/null \
  || "$DDPBENCH_PYTHON" -m pip install -q --disable-pip-version-check torchvision
"$DDPBENCH_PYTHON" - "$work/resnet50.pt" <<'PY'
import sys, torch, torchvision
torch.jit.script(torchvision.models.resnet50()).save(sys.argv[1])
PY
common=(--dataset synthetic --synthetic-samples 512 --batch-size "$batch" --threads "$threads" --bind none
        --optimizer sgd --max-steps "$steps" --warmup-steps 4 --val-samples 0 --probe-iters 0 --overlap off)
for i in $(seq 1 "$repeats"); do
  mpirun -n 1 --bind-to none "$DDPBENCH_BIN" train --model resnet50 "${common[@]}" --out "$work/builtin-$i" 2>/dev/null
  mpirun -n 1 --bind-to none "$DDPBENCH_BIN" train --model "$work/resnet50.pt" --input-shape 3x224x224 \
    --num-classes 1000 "${common[@]}" --out "$work/file-$i" 2>/dev/null
done
"$DDPBENCH_PYTHON" - "$work" "$repeats" <<'PY'
import csv, statistics as st, sys
work, repeats = sys.argv[1], int(sys.argv[2])
phases = ["step_s", "forward_s", "backward_s", "optimizer_s"]
def run(d):
    rows = [r for r in csv.DictReader(open(f"{d}/rank-00000.csv")) if r["warmup"] == "0"]
    out = {p: st.median(float(r[p]) for r in rows) for p in phases}
    out["min"] = min(float(r["step_s"]) for r in rows)
    return out
res = {m: [run(f"{work}/{m}-{i}") for i in range(1, repeats + 1)] for m in ["builtin", "file"]}
for i in range(repeats):
    b, f = res["builtin"][i], res["file"][i]
    print(f"run {i+1}: built-in median {b['step_s']*1e3:8.1f} min {b['min']*1e3:7.1f} ms   "
          f"file median {f['step_s']*1e3:8.1f} min {f['min']*1e3:7.1f} ms   ratio {f['step_s']/b['step_s']:.3f}")
for m in res:
    s = [r["step_s"] * 1e3 for r in res[m]]
    parts = "  ".join(f"{p[:-2]} {st.median(r[p] for r in res[m])*1e3:.1f}" for p in phases[1:])
    print(f"{m:8} step: median of run medians {st.median(s):8.1f} ms (range {min(s):.1f}-{max(s):.1f}), "
          f"median of run minima {st.median(r['min'] for r in res[m])*1e3:.1f} ms;  {parts}")
med = {m: st.median(r["step_s"] for r in res[m]) for m in res}
mins = {m: st.median(r["min"] for r in res[m]) for m in res}
print(f"ratio file / built-in: medians {med['file'] / med['builtin']:.3f}, minima {mins['file'] / mins['builtin']:.3f}")
PY
