#!/usr/bin/env bash
# GPU proof of ddpbench's CUDA path: NCCL, the CPU-staged all-reduce on device tensors,
# AMP, GPU binding and telemetry. Two halves, because the GPU machine has PyTorch but
# no Rust, no Open MPI and no network:
#
#   benchmarks/gpu_validate.sh prepare    # here: build, gather the stripped binary and
#                                         # Open MPI (binaries, libraries, plugins, help
#                                         # files) into .gpu/ (git-ignored), < 30 MB
#   benchmarks/gpu_validate.sh device     # there, from the repo root, with .gpu carried
#
# With this workplace's device tool: run(command="benchmarks/gpu_validate.sh device",
# carry=[".gpu"]); results land in $OUT (else results/gpu-validate-<time>).
# The binary links libtorch 2.11.0 (cu130 wheel) and runs against the device's own
# PyTorch 2.11.0+cu130, found through python3.
#
# Runs (synthetic data, so nothing else needs carrying), then `ddpbench reduce`:
#   mnist-cnn, resnet50  1 rank NCCL and 2 ranks CPU-staged MPI (sharing the GPU), each at
#                        fp32, fp16 AMP and bf16 AMP: they train and their losses fall
#   equivalence          2 x 32 (MPI-staged) against 1 x 64 (NCCL), --deterministic
#                        --no-dropout, fp32: final parameters within 1e-4 relative
#   overlap              1 rank NCCL, overlap on vs off: same parameters, exposed comm
#   phase-sync           resnet50 fp16 AMP with --phase-sync on vs off: the timers' cost
#   PyTorch eager        benchmarks/pytorch_resnet_amp.py, same batch, AMP and pooled data
#                        (phase-sync, eager and fp32: three interleaved repeats each)
#   copy bandwidth       pinned d2h/h2d against the staged all-reduce's copies (overlap
#                        off: with overlap on, the copies wait behind backward's kernels)
#   telemetry, topo      rank-NNNNN.gpu.csv values during the timed steps, nearest cores
#   study-gpu            `ddpbench study` at 1 and 2 ranks on the GPU, repeated, with the
#                        all-reduce sweep first and the projection in its report
#   allreduce-gpu-1/-2   `ddpbench allreduce --device cuda`: mpi, staged, nccl sweeps
#   shared-gpu, -auto    2 ranks on one GPU: --allreduce nccl refused, auto falls back
#   i26-*                resnet50 fp16 AMP, 1 rank NCCL, three interleaved repeats: phases
#                        from events (read a step late, and at the step's end) against
#                        --phase-sync on (each phase within 5 % or 0.2 ms) and off (the
#                        timers' cost); channels-last against contiguous; batch 256; the
#                        PyTorch peers (eager, eager with a pinned pool, 1-rank DDP) in
#                        the same memory format; batch_copy_s of the default pinned
#                        batches (a GPU rank's 2 workers) against the pinned
#                        host-to-device bandwidth for the batch's bytes, and the step
#                        with batches gathered inline (--workers 0)
#   i38-*                the gradient noise scale's cost: resnet50 fp16 AMP, 1 rank NCCL with
#                        --grad-accum 2 (the micro-batch path) and 2 ranks CPU-staged MPI (the
#                        ranks path), --noise-scale on, every:10 and off, three interleaved
#                        repeats: the step's median against off (goal < 1 % for every:10),
#                        and B_simple from epochs.csv
#
#   i41-*                the optimizer over flat buckets: resnet50 fp16 AMP, batch 64, 1 rank
#                        NCCL, --optimizer adam and sgd, three interleaved repeats:
#                        optimizer_s median per repeat (libtorch's Adam took 8.1 ms on an H200)
#
#   i51-recorder         the PyTorch recorder's CUDA event timing: python/examples/ddp_toy.py
#                        under torchrun, 1 rank: 60 whole rows, phases adding up to step_s
#   i48-target-accuracy  --target-accuracy's validation between steps on the GPU: stops
#                        after the first validation (step 10) on a target below chance
#
# benchmarks/gpu_validate.sh cpu-dry-run runs the i26-*, i38-*, i41-*, i48-* and i51-* runs here, on CPU, small (mnist-cnn,
# CPU-staged MPI, bf16, no PyTorch peers, no bandwidth probe), to check the script itself;
# its figures mean nothing.
#
# GV_ONLY=<extended regex> runs only the runs whose names match (e.g. '^(sync-|pytorch-)').
# One full pass takes about 11 minutes on an H100: run it as two device calls,
# GV_ONLY='^(mnist|r50-[12]-|eq-)' and GV_ONLY='^(ov-|sync-|pytorch-|r50-off|r50-2-mpi-fp16-ovoff)'.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
mode=${1:-}

prepare() {
    # shellcheck disable=SC1091
    source job-scripts/setup.sh
    cargo build --release
    rm -rf .gpu && mkdir -p .gpu/lib .gpu/ompi/bin
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
    strip -o .gpu/ddpbench target/release/ddpbench
    # Open MPI relocated under OPAL_PREFIX=.gpu/ompi, in Debian's layout.
    local mpilib=/usr/lib/x86_64-linux-gnu/openmpi
    mkdir -p .gpu/ompi/lib/x86_64-linux-gnu .gpu/ompi/share
    cp -a "$mpilib" .gpu/ompi/lib/x86_64-linux-gnu/
    cp -a /usr/share/openmpi .gpu/ompi/share/
    cp -L "$(readlink -f /usr/bin/mpirun)" .gpu/ompi/bin/orterun
    ln -sf orterun .gpu/ompi/bin/mpirun
    cp -L /usr/bin/orted .gpu/ompi/bin/
    # Shared libraries the binary, mpirun and the MPI plugins need, minus the C runtime
    # and libtorch (the device has its own).
    {
        ldd .gpu/ddpbench .gpu/ompi/bin/orterun
        find .gpu/ompi/lib -name '*.so' -exec ldd {} \; 2>/dev/null
    } | awk '$3 ~ /^\// {print $3}' | sort -u |
        grep -Ev '/(libc|libm|libdl|libpthread|librt|libutil|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/torch/|/nvidia/' |
        while read -r lib; do cp -L "$lib" .gpu/lib/; done
    du -sh .gpu
    echo "prepared .gpu: now run 'benchmarks/gpu_validate.sh device' on the GPU machine with .gpu carried"
}

device() {
    local dry=${GV_CPU_DRY_RUN:-}
    [ -n "$dry" ] || [ -x .gpu/ddpbench ] || { echo "no .gpu/ddpbench: run 'benchmarks/gpu_validate.sh prepare' here first" >&2; exit 2; }
    # With the device tool, $OUT returns only a few files, two folders deep: work in a
    # scratch folder and pack it into $OUT/gv.tgz after every run, so a command stopped
    # at its time limit still returns what finished.
    local out
    if [ -n "${OUT:-}" ]; then out=$(mktemp -d)/gv; else out=results/gpu-validate-$(date -u +%Y%m%dT%H%M%SZ); fi
    mkdir -p "$out"
    pack() {
        [ -n "${OUT:-}" ] || return 0
        tar czf "$OUT/gv.tgz" -C "$(dirname "$out")" gv
        cp "$out"/summary.txt "$out"/reduce.txt "$out"/failures.txt "$OUT"/ 2>/dev/null || true
    }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local bin="$PWD/.gpu/ddpbench" gdev=cuda
    if [ -n "$dry" ]; then
        bin="$PWD/target/release/ddpbench" gdev=cpu
    else
        gpu_device_env
    fi
    local mpi=(mpirun --bind-to none --oversubscribe --mca btl self,vader,tcp -x LD_LIBRARY_PATH)
    local runs="$out/runs"
    mkdir -p "$runs"
    {
        nvidia-smi -L || true
        "$bin" topo --ranks 2
    } >"$out/topo.txt" 2>&1
    # Device<->host copy bandwidth of pinned buffers of one bucket's size (25 MiB).
    python3 - >"$out/copy_bw.json" 2>"$out/copy_bw.log" <<'PY' || echo '{}' >"$out/copy_bw.json"
import json, time, torch
n = 25 * 2**20 // 4
d = torch.ones(n, device="cuda"); h = torch.empty(n, pin_memory=True)
def bw(f):
    for _ in range(3): f()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): f()
    torch.cuda.synchronize(); return 20 * 4 * n / (time.perf_counter() - t)
print(json.dumps({"bytes": 4 * n, "d2h_bytes_per_s": bw(lambda: h.copy_(d)), "h2d_bytes_per_s": bw(lambda: d.copy_(h))}))
PY
    # GV_ONLY=<extended regex> runs only the runs (and peers) whose names match.
    want() { [[ -z "${GV_ONLY:-}" || "$1" =~ ${GV_ONLY} ]]; }
    train() { # name ranks args...
        local name=$1 ranks=$2
        shift 2
        want "$name" || return 0
        echo "[$(date -u +%T)] $name" >&2
        # SGD unless the run names its optimizer.
        local opt=(--optimizer sgd)
        [[ " $* " != *" --optimizer "* ]] || opt=()
        timeout -k 10 150 "${mpi[@]}" -n "$ranks" "$bin" train --dataset synthetic --device "$gdev" "${opt[@]}" \
            --val-samples 0 --out "$runs/$name" "$@" >"$out/$name.log" 2>&1 ||
            echo "FAILED: $name (see $name.log)" | tee -a "$out/failures.txt"
        pack
    }
    peer() { # name args...
        local name=$1
        shift
        want "$name" || return 0
        [ -z "$dry" ] || { echo "[dry run] peer $name: python3 benchmarks/pytorch_resnet_amp.py $*" >&2; return 0; }
        echo "[$(date -u +%T)] $name" >&2
        timeout -k 10 150 python3 benchmarks/pytorch_resnet_amp.py "$@" >"$out/$name.json" 2>"$out/$name.log" ||
            echo "FAILED: $name (see $name.log)" | tee -a "$out/failures.txt"
        pack
    }
    # 9600 samples: one epoch holds 150 steps of one rank (75 of two).
    local r50=(--model resnet50 --batch-size 64 --synthetic-samples 9600)
    for amp in off fp16 bf16; do
        train "mnist-1-nccl-$amp" 1 --model mnist-cnn --allreduce nccl --amp "$amp" --max-steps 400
        train "mnist-2-mpi-$amp" 2 --model mnist-cnn --allreduce mpi --amp "$amp" --max-steps 300
        train "r50-1-nccl-$amp" 1 "${r50[@]}" --allreduce nccl --amp "$amp" --max-steps 60
        train "r50-2-mpi-$amp" 2 "${r50[@]}" --allreduce mpi --amp "$amp" --max-steps 40
    done
    # With --overlap off the staged copies run after backward, so their times are copy
    # times, not waits behind backward's kernels on the same stream.
    train r50-2-mpi-fp16-ovoff 2 "${r50[@]}" --allreduce mpi --amp fp16 --max-steps 40 --overlap off
    local eq=(--deterministic --no-dropout --max-steps 50 --seed 7)
    train eq-1x64-nccl 1 --model mnist-cnn "${eq[@]}" --allreduce nccl --batch-size 64
    train eq-2x32-mpi 2 --model mnist-cnn "${eq[@]}" --allreduce mpi --batch-size 32
    train ov-on-nccl 1 --model resnet18 "${eq[@]}" --allreduce nccl --batch-size 64 --bucket-mb 5 --overlap on
    train ov-off-nccl 1 --model resnet18 "${eq[@]}" --allreduce nccl --batch-size 64 --bucket-mb 5 --overlap off
    # Timing comparisons: three interleaved repeats of 150 steps each.
    for rep in 1 2 3; do
        train "sync-on-r50-rep$rep" 1 "${r50[@]}" --allreduce nccl --amp fp16 --max-steps 150 --phase-sync on
        train "sync-off-r50-rep$rep" 1 "${r50[@]}" --allreduce nccl --amp fp16 --max-steps 150 --phase-sync off
        peer "pytorch-r50-fp16-rep$rep" --model resnet50 --batch-size 64 --amp fp16 --steps 140 --samples 4096 --memory-format channels-last
        peer "pytorch-r50-off-rep$rep" --model resnet50 --batch-size 64 --amp off --steps 140 --samples 4096 --memory-format channels-last
        train "r50-off-rep$rep" 1 "${r50[@]}" --allreduce nccl --amp off --max-steps 150
    done
    i26_runs
    i38_runs
    i41_runs
    i51_runs
    # A study on the GPU: per-point communicators, repeats, and the study's report. Two
    # ranks share the one GPU at 2, where NCCL cannot run: every point uses CPU-staged MPI
    # so the ladder stays comparable.
    if want study-gpu; then
        echo "[$(date -u +%T)] study-gpu" >&2
        timeout -k 10 400 "${mpi[@]}" -n 2 "$bin" study --name gpu --ranks 1,2 --models mnist-cnn,resnet18 --allreduce-sweep \
            --datasets synthetic --repeats 2 --out "$out/study-gpu" -- --device cuda --optimizer sgd --allreduce mpi \
            --max-steps 30 --synthetic-samples 2048 --val-samples 256 >"$out/study-gpu.log" 2>&1 ||
            echo "FAILED: study-gpu (see study-gpu.log)" | tee -a "$out/failures.txt"
        pack
    fi
    # Two ranks on the one GPU: NCCL cannot work there. --allreduce nccl must stop on every
    # rank naming the ranks that share it; auto must fall back to CPU-staged MPI and train.
    if want shared-gpu; then
        echo "[$(date -u +%T)] shared-gpu" >&2
        if timeout -k 10 120 "${mpi[@]}" -n 2 "$bin" train --dataset synthetic --device cuda --model mnist-cnn \
            --allreduce nccl --max-steps 5 --val-samples 0 --out "$runs/shared-nccl" >"$out/shared-nccl.log" 2>&1; then
            echo "FAILED: shared-gpu: --allreduce nccl on a shared GPU did not fail" | tee -a "$out/failures.txt"
        elif ! grep -q "shares its GPU" "$out/shared-nccl.log"; then
            echo "FAILED: shared-gpu: no 'shares its GPU' message (see shared-nccl.log)" | tee -a "$out/failures.txt"
        fi
        rm -rf "$runs/shared-nccl"
    fi
    train shared-auto 2 --model mnist-cnn --allreduce auto --max-steps 50
    # The all-reduce sweep on device memory: at 1 rank every backend (NCCL's all-reduce
    # over one rank is a copy); at 2 ranks on the one GPU, MPI and staged (NCCL refused).
    for n in 1 2; do
        if want "allreduce-gpu-$n"; then
            echo "[$(date -u +%T)] allreduce-gpu-$n" >&2
            timeout -k 10 300 "${mpi[@]}" -n "$n" "$bin" allreduce --device cuda --max-bytes 256M \
                --out "$out/allreduce-gpu-$n" >"$out/allreduce-gpu-$n.log" 2>&1 ||
                echo "FAILED: allreduce-gpu-$n (see allreduce-gpu-$n.log)" | tee -a "$out/failures.txt"
            pack
        fi
    done
    "$bin" reduce --no-plots --out "$out/reduce" "$runs" >"$out/reduce.txt" 2>&1 || true
    python3 - "$out" <<'PY' | tee "$out/summary.txt"
import csv, glob, json, os, statistics, sys
out = sys.argv[1]
def med(run, col):
    v = []
    for f in glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv"):
        rows = list(csv.DictReader(open(f)))[5:]
        v += [float(r[col]) for r in rows if r[col] != ""]
    return statistics.median(v) if v else float("nan")
for run in sorted(os.listdir(f"{out}/runs")):
    if not os.path.exists(f"{out}/runs/{run}/manifest.json"):
        print(f"{run:24} no manifest (failed at set-up; see {run}.log)")
        continue
    m = json.load(open(f"{out}/runs/{run}/manifest.json"))
    print(f"{run:24} {m['comm_backend']:15} step {med(run,'step_s')*1e3:8.2f} ms  comm {med(run,'comm_s')*1e3:7.3f} ms  "
          f"exposed {med(run,'comm_exposed_s')*1e3:7.3f} ms  d2h {med(run,'comm_stage_d2h_s')*1e3:6.3f}  h2d {med(run,'comm_stage_h2d_s')*1e3:6.3f} ms  "
          f"bytes {m['gradient_bytes']}  {m['ranks'][0]['node_type']}")
cb = json.load(open(f"{out}/copy_bw.json"))
if cb:
    print(f"pinned copy bandwidth: d2h {cb['d2h_bytes_per_s']/1e9:.2f} GB/s, h2d {cb['h2d_bytes_per_s']/1e9:.2f} GB/s")
else:
    print("pinned copy bandwidth: not measured (see copy_bw.log)")
def loss_falls(run):
    v = []
    for f in sorted(glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv"))[:1]:
        v = [float(r["loss"]) for r in csv.DictReader(open(f)) if r["loss"] not in ("", "nan")]
    if len(v) < 20:
        return "too few rows"
    a, b = statistics.mean(v[:10]), statistics.mean(v[-10:])
    return f"loss {a:.3f} -> {b:.3f} ({'falls' if b < a else 'DOES NOT FALL'})"
for run in sorted(os.listdir(f"{out}/runs")):
    print(f"{run:24} {loss_falls(run)}")
def l2(run):
    try:
        return json.load(open(f"{out}/runs/{run}/manifest.json"))["final_param_l2"]
    except Exception:
        return float("nan")
a, b = l2("eq-1x64-nccl"), l2("eq-2x32-mpi")
print(f"equivalence 1x64 vs 2x32: final_param_l2 {a!r} vs {b!r}, relative {abs(a-b)/abs(a) if a else float('nan'):.2e} (need <= 1e-4)")
a, b = l2("ov-on-nccl"), l2("ov-off-nccl")
print(f"overlap on vs off (NCCL): final_param_l2 {a!r} vs {b!r}; exposed comm {med('ov-on-nccl','comm_exposed_s')*1e3:.3f} vs {med('ov-off-nccl','comm_exposed_s')*1e3:.3f} ms")
def rep_meds(prefix, col="step_s"):
    return [med(r, col) for r in sorted(os.listdir(f"{out}/runs")) if r.startswith(prefix + "-rep")]
def spread(v):
    v = [x for x in v if x == x]
    if not v:
        return "no runs", float("nan")
    m = statistics.median(v)
    return f"{m*1e3:.2f} ms (repeats {', '.join(f'{x*1e3:.2f}' for x in v)})", m
son, mon = spread(rep_meds("sync-on-r50"))
soff, moff = spread(rep_meds("sync-off-r50"))
print(f"phase-sync (resnet50 fp16, 1 rank NCCL, median of per-repeat medians): on {son}; off {soff}; on/off = {mon/moff:.3f}")
for amp, ours in (("fp16", "sync-on-r50"), ("off", "r50-off")):
    peers = []
    for f in sorted(glob.glob(f"{out}/pytorch-r50-{amp}-rep*.json")):
        try:
            peers.append(json.loads(open(f).read())["median_step_s"])
        except Exception:
            pass
    so, mo = spread(rep_meds(ours))
    sp, mp = spread(peers)
    print(f"resnet50 {amp} batch 64: ddpbench {so}; PyTorch eager {sp}; ratio {mo/mp:.3f}")
# Telemetry during the timed steps: samples after the first (warm-up) step ended.
for f in sorted(glob.glob(f"{out}/runs/sync-on-r50-rep1/rank-*.gpu.csv"))[:1]:
    steps = list(csv.DictReader(open(f.replace(".gpu.csv", ".csv"))))
    t0 = float(steps[1]["step_start_at_s"]) if len(steps) > 1 else 0.0
    t1 = float(steps[-1]["step_start_at_s"])
    rows = [r for r in csv.DictReader(open(f)) if t0 <= float(r["sample_at_s"]) <= t1]
    def m(c):
        v = [float(r[c]) for r in rows if r[c]]
        return f"{statistics.median(v):.0f}" if v else "n/a"
    print(f"telemetry during steps 1..{len(steps)-1} ({t0:.1f}-{t1:.1f} s): {len(rows)} samples, "
          f"util median {m('gpu_util_pct')} %, SM clock median {m('sm_clock_mhz')} MHz, power median {m('power_w')} W")
try:
    r0 = json.load(open(f"{out}/runs/sync-on-r50-rep1/manifest.json"))["ranks"][0]
    print(f"manifest: CUDA driver {r0.get('cuda_driver_version')}, NVIDIA driver {r0.get('gpu_driver_version')}, "
          f"clocks start {r0.get('gpu_clocks_start')}, end {r0.get('gpu_clocks_end')}")
except Exception as e:
    print(f"manifest GPU fields: {e}")
r = "mnist-1-nccl-off"
print(f"NCCL single-rank: exposed comm / step = {med(r,'comm_exposed_s')/med(r,'step_s')*100:.2f} %")
for r in ("r50-2-mpi-fp16-ovoff", "r50-2-mpi-fp16"):
    staged = (med(r, "comm_stage_d2h_s"), med(r, "comm_stage_h2d_s"))
    try:
        m = json.load(open(f"{out}/runs/{r}/manifest.json"))
        b = m["gradient_bytes"]
        print(f"{r}: staged copies of {b} B: d2h {b/staged[0]/1e9:.2f} GB/s, h2d {b/staged[1]/1e9:.2f} GB/s "
              f"({b/staged[0]/cb['d2h_bytes_per_s']*100:.0f} % / {b/staged[1]/cb['h2d_bytes_per_s']*100:.0f} % of the pinned copy bandwidth)")
    except Exception as e:
        print(f"{r}: no staged-copy figure ({e})")
PY
    i26_summary | tee -a "$out/summary.txt"
    i38_summary | tee -a "$out/summary.txt"
    i41_summary | tee -a "$out/summary.txt"
    i51_summary | tee -a "$out/summary.txt"
    pack
}

# Issue 38's runs: the noise scale's norms on, every 10th step and off, on the
# micro-batch path (1 rank, NCCL, --grad-accum 2) and the ranks path (2 ranks sharing
# the GPU, CPU-staged MPI); on a CPU dry run, mnist-cnn, a few steps.
i38_runs() {
    # 60 steps of 128 samples (2 micro-batches or 2 ranks of 64) fit in one epoch.
    local big=(--model resnet50 --synthetic-samples 7680 --batch-size 64 --amp fp16) one=(--allreduce nccl) steps=60
    if [ -n "$dry" ]; then
        big=(--model mnist-cnn --synthetic-samples 512 --batch-size 16 --warmup-steps 1) one=(--allreduce mpi) steps=8
    fi
    local rep mode
    for rep in 1 2 3; do
        for mode in on every:10 off; do
            train "i38-accum-${mode/:/}-rep$rep" 1 "${big[@]}" "${one[@]}" --grad-accum 2 --max-steps $steps --noise-scale "$mode"
            train "i38-ranks-${mode/:/}-rep$rep" 2 "${big[@]}" --allreduce mpi --max-steps $steps --noise-scale "$mode"
        done
    done
}

# Issue 38's figures from i38_runs: per path, the median step with the norms against
# without, repeats listed, and the last epoch's B_simple.
i38_summary() {
    python3 - "$out" "${dry:+dry}" <<'PY'
import csv, glob, os, statistics, sys
out, dry = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "dry"
def med(run):
    v = []
    for f in sorted(glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv")):
        v += [float(x["step_s"]) for x in csv.DictReader(open(f)) if x["warmup"] == "0"]
    return statistics.median(v) if v else float("nan")
print("== issue 38" + (" (CPU dry run: the script's mechanics only; these numbers mean nothing)" if dry else ""))
for path in ("accum", "ranks"):
    off = [med(f"i38-{path}-off-rep{k}") for k in (1, 2, 3)]
    for mode in ("on", "every10"):
        m = [med(f"i38-{path}-{mode}-rep{k}") for k in (1, 2, 3)]
        costs = [(a / b - 1) * 100 for a, b in zip(m, off)]
        shown = ", ".join(f"{c:+.2f}" for c in costs)
        print(f"noise scale {mode}, {path} path: step cost against off {statistics.median(costs):+.2f} % ({shown}) (goal < 1 % for every10)")
    e = f"{out}/runs/i38-{path}-on-rep1/epochs.csv"
    if os.path.exists(e):
        last = list(csv.DictReader(open(e)))[-1]
        print(f"  B_simple ({path}, on, rep 1, last epoch): {last.get('b_simple') or 'undetermined'} "
              f"[{last.get('b_simple_low')}, {last.get('b_simple_high') or 'unbounded'}] over {last.get('noise_steps')} steps")
PY
}

# Issue 41's runs: the optimizer phase of resnet50 fp16 AMP at batch 64, 1 rank NCCL,
# with SGD and with Adam (each updated bucket by bucket over flat buffers); on a CPU dry
# run, mnist-cnn, a few steps.
i41_runs() {
    local big=(--model resnet50 --synthetic-samples 4096 --batch-size 64 --amp fp16 --allreduce nccl) steps=60
    if [ -n "$dry" ]; then
        big=(--model mnist-cnn --synthetic-samples 512 --batch-size 16 --warmup-steps 1 --allreduce mpi) steps=8
    fi
    local rep opt
    for rep in 1 2 3; do
        for opt in adam sgd; do
            train "i41-$opt-rep$rep" 1 "${big[@]}" --optimizer "$opt" --max-steps $steps
        done
    done
}

# Newer GPU-side parts, never run on a device before: the PyTorch recorder's CUDA
# event timing and a GradScaler's scale (python/examples/ddp_toy.py under torchrun, 1
# rank: its rows read a step late; steps 0 and 3 overflow), and --target-accuracy's validation between steps (mnist-cnn, 1 rank, a target
# below chance so that the first validation, after step 10, reaches it).
i51_runs() {
    local py=${DDPBENCH_PYTHON:-python3}
    if want i51-recorder; then
        echo "[$(date -u +%T)] i51-recorder" >&2
        timeout -k 10 150 env PYTHONPATH=python OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone \
            --nproc-per-node 1 python/examples/ddp_toy.py --out "$runs/i51-recorder" --steps 60 \
            --scaler --overflow-at 0,3 >"$out/i51-recorder.log" 2>&1 || echo "FAILED: i51-recorder (see i51-recorder.log)" | tee -a "$out/failures.txt"
        pack
    fi
    if want i48-target-accuracy; then
        echo "[$(date -u +%T)] i48-target-accuracy" >&2
        timeout -k 10 150 "${mpi[@]}" -n 1 "$bin" train --dataset synthetic --device "$gdev" --model mnist-cnn \
            --optimizer sgd --synthetic-samples 2048 --max-steps 60 --target-accuracy 0.01 --val-every 10 \
            --val-samples 256 --out "$runs/i48-target-accuracy" >"$out/i48-target-accuracy.log" 2>&1 ||
            echo "FAILED: i48-target-accuracy (see i48-target-accuracy.log)" | tee -a "$out/failures.txt"
        pack
    fi
}

# Checks of i51_runs: the recorder's rows whole (phases adding up to step_s), its timer
# the device's; the target run stopped after the first validation, with its accuracy.
i51_summary() {
    python3 - "$out" <<'PY'
import csv, json, os, statistics, sys
out = sys.argv[1]
phases = ["data_s", "batch_copy_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "other_s"]
print("== issues 51 and 48 on the device")
run = f"{out}/runs/i51-recorder"
try:
    m = json.load(open(f"{run}/manifest.json"))
    rows = list(csv.DictReader(open(f"{run}/rank-00000.csv")))
    worst = max(abs(sum(float(r[p]) for p in phases) - float(r["step_s"])) for r in rows)
    steps = [float(r["step_s"]) for r in rows if r["warmup"] == "0"]
    ok = m["status"] == "completed" and len(rows) == 60 and worst <= 1e-8
    print(f"recorder: {m['status']}, timer {m['config']['timer']!r}, {len(rows)} rows (60 asked), phases add up to "
          f"step_s within {worst:.1e} s; median step {statistics.median(steps)*1e3:.3f} ms: {'ok' if ok else 'FAILED'}")
    # The GradScaler's scale, read a step late from a copy of its device tensor: 2**16,
    # halved after each of the two overflowing steps (0 and 3), which it skipped.
    skipped = [i for i, r in enumerate(rows) if r["step_skipped"] == "1"]
    scales = [float(r["loss_scale"]) for r in rows]
    ok = skipped == [0, 3] and scales[0] == 65536 and scales[-1] == 16384
    print(f"recorder's loss scale: skipped steps {skipped} ([0, 3] expected), scale {scales[0]:g} to {scales[-1]:g} "
          f"(65536 to 16384 expected): {'ok' if ok else 'FAILED'}")
except Exception as e:
    print(f"recorder: no figure ({e!r})")
run = f"{out}/runs/i48-target-accuracy"
try:
    t = json.load(open(f"{run}/manifest.json"))["target"]
    rows = sum(1 for _ in open(f"{run}/rank-00000.csv")) - 1
    ok = t["reached"] and t["steps_to_target"] == 10 and rows == 10
    print(f"target accuracy: reached {t['reached']} after {t['steps_to_target']} steps (10 expected), {rows} rows, "
          f"validation accuracy {t['val_accuracy']}: {'ok' if ok else 'FAILED'}")
except Exception as e:
    print(f"target accuracy: no figure ({e!r})")
PY
}

# Issue 41's figures from i41_runs: optimizer_s and step_s medians after warm-up, per repeat.
i41_summary() {
    python3 - "$out" "${dry:+dry}" <<'PY'
import csv, glob, statistics, sys
out, dry = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "dry"
def med(run, col):
    v = []
    for f in sorted(glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv")):
        v += [float(x[col]) for x in csv.DictReader(open(f)) if x["warmup"] == "0"]
    return statistics.median(v) * 1e3 if v else float("nan")
print("== issue 41" + (" (CPU dry run: the script's mechanics only; these numbers mean nothing)" if dry else ""))
for opt in ("adam", "sgd"):
    o = [med(f"i41-{opt}-rep{k}", "optimizer_s") for k in (1, 2, 3)]
    s = [med(f"i41-{opt}-rep{k}", "step_s") for k in (1, 2, 3)]
    print(f"--optimizer {opt}: optimizer_s median {statistics.median(o):.2f} ms ({', '.join(f'{x:.2f}' for x in o)}), "
          f"step_s {statistics.median(s):.2f} ms ({', '.join(f'{x:.2f}' for x in s)})")
PY
}

# Issue 26's runs (called by device, whose variables and functions they use): three
# interleaved repeats of resnet50 fp16 on 1 rank with NCCL; on a CPU dry run, mnist-cnn
# with CPU-staged MPI and bf16, a few steps, and no peers.
i26_runs() {
    # One epoch holds every step (--max-steps stops within the first epoch): samples =
    # steps x batch, from the 256 MiB pool.
    local big=(--model resnet50) g=(--allreduce nccl --amp fp16) s64=150 s256=80 n64=9600 n256=20480
    if [ -n "$dry" ]; then
        big=(--model mnist-cnn --warmup-steps 1) g=(--allreduce mpi --amp bf16) s64=8 s256=4 n64=512 n256=1024
    fi
    big64=("${big[@]}" --synthetic-samples $n64) big256=("${big[@]}" --synthetic-samples $n256)
    # The pinned host-to-device copy of one batch's bytes (resnet50, batch 64, fp32).
    [ -n "$dry" ] || python3 - >"$out/i26_h2d.json" 2>"$out/i26_h2d.log" <<'PY' || echo '{}' >"$out/i26_h2d.json"
import json, time, torch
n = 64 * 3 * 224 * 224
d = torch.empty(n, device="cuda"); h = torch.ones(n).pin_memory()
for _ in range(3): d.copy_(h, non_blocking=True)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): d.copy_(h, non_blocking=True)
torch.cuda.synchronize()
print(json.dumps({"bytes": 4 * n, "h2d_bytes_per_s": 20 * 4 * n / (time.perf_counter() - t)}))
PY
    local rep b
    for rep in 1 2 3; do
        train "i26-ev-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --phase-sync events
        train "i26-evend-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --phase-sync events-at-end
        train "i26-on-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --phase-sync on
        train "i26-off-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --phase-sync off
        train "i26-nchw-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --memory-format contiguous
        # Batches gathered inline and copied from pageable memory (the default before a
        # GPU rank got 2 workers).
        train "i26-inline-b64-rep$rep" 1 "${big64[@]}" "${g[@]}" --batch-size 64 --max-steps $s64 --workers 0
        train "i26-ev-b256-rep$rep" 1 "${big256[@]}" "${g[@]}" --batch-size 256 --max-steps $s256
        for b in 64 256; do
            local steps=$s64
            [ "$b" = 256 ] && steps=$s256
            peer "i26-pt-eager-cl-b$b-rep$rep" --model resnet50 --batch-size "$b" --amp fp16 --steps "$steps" --samples 4096
            peer "i26-pt-ddp-cl-b$b-rep$rep" --model resnet50 --batch-size "$b" --amp fp16 --steps "$steps" --samples 4096 --ddp
            peer "i26-pt-eager-pin-b$b-rep$rep" --model resnet50 --batch-size "$b" --amp fp16 --steps "$steps" --samples 4096 --pin-memory
        done
        peer "i26-pt-eager-nchw-b64-rep$rep" --model resnet50 --batch-size 64 --amp fp16 --steps $s64 --samples 4096 \
            --memory-format contiguous
    done
}

# Issue 26's figures from i26_runs: medians over steps after warm-up, per repeat, then
# the median of the repeats with every repeat listed.
i26_summary() {
    python3 - "$out" "${dry:+dry}" <<'PY'
import csv, glob, json, os, statistics, sys
out, dry = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "dry"
phases = ["data_s", "batch_copy_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s", "other_s"]
def rows(run):
    r = []
    for f in sorted(glob.glob(f"{out}/runs/{run}/rank-*[0-9].csv")):
        r += [x for x in csv.DictReader(open(f)) if x["warmup"] == "0"]
    return r
def med(run, col):
    v = [float(x[col]) for x in rows(run) if x[col] not in ("", "nan")]
    return statistics.median(v) if v else float("nan")
def reps(prefix, col="step_s"):
    return [med(f"{prefix}-rep{k}", col) for k in (1, 2, 3) if os.path.isdir(f"{out}/runs/{prefix}-rep{k}")]
def peer_reps(prefix):
    v = []
    for k in (1, 2, 3):
        try:
            v.append(json.load(open(f"{out}/{prefix}-rep{k}.json"))["median_step_s"])
        except Exception:
            pass
    return v
def show(v):
    v = [x for x in v if x == x]
    if not v:
        return "no runs", float("nan")
    m = statistics.median(v)
    return f"{m*1e3:.2f} ms ({', '.join(f'{x*1e3:.2f}' for x in v)})", m
print("== issue 26" + (" (CPU dry run: the script's mechanics only; these numbers mean nothing)" if dry else ""))
for b in ("b64", "b256"):
    t, m = show(reps(f"i26-ev-{b}"))
    print(f"ddpbench resnet50 fp16 {b} channels-last, events: step {t}")
    for p in ("eager-cl", "ddp-cl", "eager-pin"):
        tp, mp = show(peer_reps(f"i26-pt-{p}-{b}"))
        print(f"  PyTorch {p} {b}: {tp}; ddpbench / peer = {m/mp:.3f}" if mp == mp else f"  PyTorch {p} {b}: {tp}")
ti, mi = show(reps("i26-inline-b64"))
print(f"batches inline from pageable memory (--workers 0) b64: step {ti}; default (workers) / inline = {show(reps('i26-ev-b64'))[1]/mi:.3f}")
tn, mn = show(reps("i26-nchw-b64"))
tc, mc = show(reps("i26-ev-b64"))
tpn, mpn = show(peer_reps("i26-pt-eager-nchw-b64"))
print(f"contiguous b64: ddpbench {tn}; PyTorch eager {tpn}; channels-last / contiguous (ddpbench) = {mc/mn:.3f}")
for mode in ("ev", "evend", "off"):
    t, m = show(reps(f"i26-{mode}-b64"))
    _, mon = show(reps("i26-on-b64"))
    print(f"--phase-sync {mode}: step {t}; / on = {m/mon:.3f}")
_, moff = show(reps("i26-off-b64"))
for mode in ("ev", "evend"):
    _, m = show(reps(f"i26-{mode}-b64"))
    print(f"timers' cost, {mode} against off: {(m/moff - 1)*100:+.2f} % of the step (goal < 1 %)")
for mode in ("ev", "evend"):
    worst = []
    for p in phases:
        _, a = show(reps(f"i26-{mode}-b64", p))
        _, b = show(reps("i26-on-b64", p))
        ok = abs(a - b) <= max(0.05 * b, 0.0002)
        worst.append(f"{p} {a*1e3:.3f} vs {b*1e3:.3f} ms {'ok' if ok else 'OUTSIDE'}")
    print(f"phases {mode} vs on (within 5 % or 0.2 ms): " + "; ".join(worst))
try:
    h2d = json.load(open(f"{out}/i26_h2d.json"))
    t, m = show(reps("i26-ev-b64", "batch_copy_s"))
    batch_bytes = 64 * 3 * 224 * 224 * 4 + 64 * 8
    print(f"pinned batches (default workers on a GPU): batch_copy_s {t}: {batch_bytes/m/1e9:.2f} GB/s against pinned h2d "
          f"{h2d['h2d_bytes_per_s']/1e9:.2f} GB/s = {batch_bytes/m/h2d['h2d_bytes_per_s']:.2f} (goal >= 0.8)")
except Exception as e:
    print(f"pinned batches: no figure ({e!r})")
_, e = show(reps("i26-ev-b64", "comm_exposed_s"))
_, st = show(reps("i26-ev-b64"))
print(f"NCCL exposed / step (events, b64): {e/st*100:.2f} % (goal < 1 %)")
PY
}

case "$mode" in
prepare) prepare ;;
device) device ;;
cpu-dry-run)
    # shellcheck disable=SC1091
    source job-scripts/setup.sh >/dev/null
    GV_CPU_DRY_RUN=1 GV_ONLY=${GV_ONLY:-^(i26|i38|i41|i48|i51)-} device
    ;;
*)
    sed -n '2,45p' "$0"
    exit 2
    ;;
esac
