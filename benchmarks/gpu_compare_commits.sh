#!/usr/bin/env bash
# One GPU, several commits: the step of ResNet-50 fp16 at batch 64, 1 rank, NCCL,
# --phase-sync events, with SGD and Adam, each binary run in turn (interleaved), three
# repeats. Two halves, as gpu_validate.sh:
#
#   benchmarks/gpu_compare_commits.sh prepare C1 C2 ...   # here: build each commit in a
#                                                         # scratch worktree, strip and xz
#                                                         # its binary into .gpuold/ (ignored)
#   benchmarks/gpu_compare_commits.sh device              # there, with .gpu (from
#                                                         # gpu_validate.sh prepare) and
#                                                         # .gpuold carried; main's binary
#                                                         # runs as HEAD
#
# Results: $OUT/cmp.tgz (else results/gpu-compare-<time>) and a summary of step_s and
# optimizer_s medians per binary with every repeat listed.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
mode=${1:-}
shift || true

prepare() {
    # shellcheck disable=SC1091
    source job-scripts/setup.sh >/dev/null
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.gpuold/' "$exclude" 2>/dev/null || echo '/.gpuold/' >>"$exclude"
    rm -rf .gpuold && mkdir -p .gpuold
    local c wt
    for c in "$@"; do
        wt=$(mktemp -d)/wt
        git worktree add --detach "$wt" "$c" >/dev/null
        cp -a target "$wt/" 2>/dev/null || true
        (cd "$wt" && cargo build --release --quiet)
        strip -o ".gpuold/ddpbench-$c" "$wt/target/release/ddpbench"
        xz -T2 ".gpuold/ddpbench-$c"
        git worktree remove --force "$wt"
    done
    du -sh .gpuold
}

device() {
    [ -x .gpu/ddpbench ] || { echo "no .gpu/ddpbench: run 'benchmarks/gpu_validate.sh prepare' here first" >&2; exit 2; }
    local bins=() f c
    for f in .gpuold/ddpbench-*.xz; do
        [ -e "$f" ] || continue
        c=${f#.gpuold/ddpbench-}
        c=${c%.xz}
        xz -dc "$f" >"/tmp/ddpbench-$c" && chmod +x "/tmp/ddpbench-$c"
        bins+=("$c")
    done
    cp .gpu/ddpbench /tmp/ddpbench-HEAD
    bins+=(HEAD)
    gpu_device_env
    local out
    if [ -n "${OUT:-}" ]; then out=$(mktemp -d)/cmp; else out=results/gpu-compare-$(date -u +%Y%m%dT%H%M%SZ); fi
    mkdir -p "$out"
    local rep opt n
    for rep in 1 2 3; do for opt in sgd adam; do for c in "${bins[@]}"; do
        n=$c-$opt-rep$rep
        echo "[$(date -u +%T)] $n" >&2
        timeout -k 5 90 mpirun --bind-to none --mca btl self,vader,tcp -x LD_LIBRARY_PATH -n 1 "/tmp/ddpbench-$c" train \
            --dataset synthetic --device cuda --optimizer "$opt" --val-samples 0 --model resnet50 --batch-size 64 \
            --synthetic-samples 5120 --allreduce nccl --amp fp16 --max-steps 80 --phase-sync events \
            --out "$out/$n" >"$out/$n.log" 2>&1 || echo "FAILED: $n (see $n.log)" | tee -a "$out/failures.txt"
        [ -z "${OUT:-}" ] || tar czf "$OUT/cmp.tgz" -C "$(dirname "$out")" cmp
    done; done; done
    python3 - "$out" "${bins[@]}" <<'PY' | tee "$out/summary.txt"
import csv, glob, statistics as st, sys
out, bins = sys.argv[1], sys.argv[2:]
def med(run, col):
    v = [float(r[col]) for f in glob.glob(f"{out}/{run}/rank-*[0-9].csv") for r in csv.DictReader(open(f))
         if r["warmup"] == "0" and r[col] not in ("", "nan")]
    return st.median(v) * 1e3 if v else float("nan")
for opt in ("sgd", "adam"):
    for c in bins:
        for col in ("step_s", "optimizer_s"):
            v = [med(f"{c}-{opt}-rep{k}", col) for k in (1, 2, 3)]
            print(f"{opt:4} {c:8} {col:12} {st.median(v):7.2f} ms ({', '.join(f'{x:.2f}' for x in v)})")
PY
    [ -z "${OUT:-}" ] || cp "$out/summary.txt" "$OUT/"
}

case "$mode" in
prepare) prepare "$@" ;;
device) device ;;
*)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
