#!/usr/bin/env bash
# Runs the Slurm job scripts for real on a private, throw-away Slurm cluster on this
# one machine: 2 fake nodes (n1, n2) × 4 fake GPUs, each slurmd in its own UTS
# namespace so that the nodes have their own host names (see
# /work/shared/cluster-emulation.md). Submits job-scripts/slurm-2node-4gpu.sbatch,
# job-scripts/slurm-1gpu.sbatch and job-scripts/study.sbatch (packed, then spread) with
# `sbatch --wait`, checks the run folders, then tears everything down (also on failure
# or Ctrl-C).
#
#   tests/cluster/slurm.sh            # as root, Debian/Ubuntu; ~1 min once installed
#   DDPBENCH_TEST_KEEP=/tmp/keep tests/cluster/slurm.sh   # also copy logs, config and run folders there
#
# Installs slurmctld slurmd slurm-client munge (and openmpi-bin) if missing. Nothing is
# written outside one temp dir (config, state, spool, logs, munge key and socket, the
# submit dir holding results/ and %x-%j.out). Prints `N passed, M failed` last; exit
# status is non-zero when any check failed.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tlog() { printf '[slurm-test] %s\n' "$*" >&2; }
pass=0; fail=0
die() { tlog "FATAL: $*"; echo "$pass passed, $((fail + 1)) failed"; exit 2; }

[ "$(id -u)" = 0 ] || die "must run as root (starts munged/slurmctld/slurmd, mknod)"

# Extra ddpbench flags so that a job finishes in seconds on 2 cores.
STEPS=6
TRAIN_FLAGS=(--dataset synthetic --synthetic-samples 2048 --batch-size 16 --max-steps "$STEPS"
             --val-samples 64 --bind none --threads 1 --probe-iters 3)
# Seconds for one job, from its submission to its end (a job runs ~10 s here). The job is
# polled every half second: `sbatch --wait` sleeps 2, 8, then 32 s between its polls, so
# it returned up to 30 s after a job had ended.
JOB_TIMEOUT=150

# ---------------------------------------------------------------- 1. packages, build
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
need=()
for p in slurmctld slurmd slurm-client munge openmpi-bin; do have_pkg "$p" || need+=("$p"); done
if ((${#need[@]})); then
  tlog "installing ${need[*]}"
  timeout 300 apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq "${need[@]}" >/dev/null \
    || die "apt-get install ${need[*]} failed"
fi
# Installs what is missing, builds, exports LIBTORCH, LD_LIBRARY_PATH,
# OMPI_ALLOW_RUN_AS_ROOT*, DDPBENCH_BIN; returns non-zero if anything (the build) fails.
# shellcheck source=/dev/null
source "$REPO/job-scripts/setup.sh" || die "job-scripts/setup.sh failed (install or build)"
[ -x "${DDPBENCH_BIN:-}" ] || die "no ddpbench binary"

# ---------------------------------------------------------------- 2. teardown (trap)
T=$(mktemp -d /tmp/ddpbench-slurm.XXXXXX) || die "mktemp failed"
chmod 755 "$T"   # munged (user munge) must traverse it
uts_ns=()        # UTS namespace ids of the fake nodes: every job process lives in one
daemon_pids=()

kill_ns_members() {  # kill every process in the fake nodes' UTS namespaces, by pid
  local sig=$1 p ns
  ((${#uts_ns[@]})) || return 0
  for p in /proc/[0-9]*; do
    ns=$(readlink "$p/ns/uts" 2>/dev/null) || continue
    for u in "${uts_ns[@]}"; do
      [ "$ns" = "$u" ] && kill "-$sig" "${p#/proc/}" 2>/dev/null
    done
  done
}
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  tlog "tearing down"
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ]; then
    timeout 10 scancel --full --quiet --user=root >/dev/null 2>&1
  fi
  for p in "${daemon_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  kill_ns_members TERM
  for _ in $(seq 50); do   # up to 5 s for daemons and step processes to go
    alive=0
    for p in "${daemon_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${daemon_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  kill_ns_members KILL
  [ -f "$T/munge-run/munged.pid" ] && kill -TERM "$(cat "$T/munge-run/munged.pid")" 2>/dev/null
  sleep 0.2
  if [ -n "${DDPBENCH_TEST_KEEP:-}" ]; then   # debugging: keep logs and run folders
    mkdir -p "$DDPBENCH_TEST_KEEP" && cp -r "$T/submit" "$T/log" "$T/etc" "$DDPBENCH_TEST_KEEP"/ 2>/dev/null
  fi
  rm -rf "$T"
  exit "$rc"
}
trap teardown EXIT
trap 'tlog "interrupted"; echo "$pass passed, $((fail + 1)) failed"; exit 130' INT TERM

# ---------------------------------------------------------------- 3. checks
check() {  # check "description" command...
  local what=$1; shift
  if "$@" >/dev/null; then pass=$((pass + 1)); tlog "PASS $what"
  else fail=$((fail + 1)); tlog "FAIL $what"; fi
}
both_in() { grep -q -- "$2" "$1" && grep -q -- "$3" "$1"; }
# py_check RUN_DIR 'python expression' over d (the run folder), m (manifest.json), files
# (rank-*.csv paths), rows (each rank's rows as dicts), env (each rank's launcher_env)
py_check() {
  local dir=$1 expr=$2
  python3 - "$dir" "$expr" <<'EOF'
import csv, glob, json, os, sys
d, expr = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(os.path.join(d, "manifest.json")))
    files = sorted(glob.glob(os.path.join(d, "rank-*.csv")))
    rows = [list(csv.DictReader(open(f))) for f in files]
    env = [dict(r["launcher_env"]) for r in m["ranks"]]
    ok = eval(expr)
except Exception as e:
    sys.exit(f"  {e.__class__.__name__}: {e}")
if not ok:
    print("  not true:", expr, file=sys.stderr)
sys.exit(0 if ok else 1)
EOF
}

# ---------------------------------------------------------------- 4. cluster up
free_port() {  # first port >= $1 with nothing listening on it or the next $2-1
  local p=$1 n=$2 k busy
  while :; do
    busy=0
    for ((k = 0; k < n; k++)); do
      ss -Htln "sport = :$((p + k))" | grep -q . && { busy=1; break; }
    done
    ((busy)) || { echo "$p"; return; }
    p=$((p + n))
  done
}
base=$(free_port $((17000 + RANDOM % 2000 * 4)) 3)
CTLD_PORT=$base; N1_PORT=$((base + 1)); N2_PORT=$((base + 2))
HOST=$(hostname)

mkdir -p "$T"/{etc,state,log,dev,submit} "$T"/spool/{n1,n2} "$T"/tmp/{n1,n2} "$T/munge" "$T/munge-run"
for i in 0 1 2 3; do mknod "$T/dev/nvidia$i" c 195 "$i" || die "mknod failed"; done

# munge: own key, socket, pid, log and seed, as the munge user.
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$T/munge" "$T/munge-run"; chmod 700 "$T/munge"; chmod 755 "$T/munge-run"
chmod 400 "$T/munge/munge.key"
SOCK=$T/munge-run/munge.socket.2   # its dir must be searchable by all (clients)
runuser -u munge -- munged --socket="$SOCK" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge-run/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" || die "munged did not start"
timeout 10 bash -c "until munge -S '$SOCK' -n </dev/null | unmunge -S '$SOCK' >/dev/null 2>&1; do sleep 0.1; done" \
  || die "munged not answering: $(cat "$T/munge/munged.log" 2>/dev/null)"

export SLURM_CONF=$T/etc/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=ddpbtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
TmpFS=$T/tmp/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
GresTypes=gpu
SwitchType=switch/none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
# 32 CPUs per fake node: the job scripts ask 4 tasks x --cpus-per-task=8 per node.
NodeName=n[1-2] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$N1_PORT-$N2_PORT CPUs=32 Gres=gpu:4 State=UNKNOWN
PartitionName=test Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$T/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=n[1-2] Name=gpu File=$T/dev/nvidia[0-3]
EOF

slurmctld -D -f "$SLURM_CONF" >"$T/log/slurmctld.stdout" 2>&1 &
daemon_pids+=($!); disown
timeout 30 bash -c 'until scontrol ping 2>/dev/null | grep -q UP; do sleep 0.2; done' \
  || die "slurmctld not up: $(tail -5 "$T/log/slurmctld.log" "$T/log/slurmctld.stdout")"

for n in n1 n2; do
  # Own UTS and mount namespace with a private /dev/shm: Open MPI's shared-memory
  # segments (vader_segment.HOST.UID.JOBID.RANK; job ids restart at 1 in every private
  # cluster) collide neither between the fake nodes nor with another run of this test,
  # whose overlapping job of the same number crashed ranks in mca_btl_vader.
  unshare --uts --mount --propagation private \
    sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname $n && exec slurmd -D -N $n -f '$SLURM_CONF'" \
    >"$T/log/slurmd-$n.stdout" 2>&1 &
  pid=$!; daemon_pids+=("$pid"); disown
  timeout 5 bash -c "until [ \"\$(readlink /proc/$pid/ns/uts)\" != \"\$(readlink /proc/self/ns/uts)\" ]; do sleep 0.05; done"
  uts_ns+=("$(readlink "/proc/$pid/ns/uts")")
done
timeout 60 bash -c 'until [ "$(sinfo -h -N -o "%N %T" 2>/dev/null | grep -c " idle$")" = 2 ]; do sleep 0.5; done' \
  || die "nodes not idle: $(sinfo -N 2>&1); $(tail -5 "$T"/log/slurmd-*.log)"
tlog "cluster up: $(sinfo -h -N -o '%N:%T:%G' | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"

# ---------------------------------------------------------------- 5. jobs
cd "$T/submit" || die "no submit dir"   # SLURM_SUBMIT_DIR: results/ and %x-%j.out land here

job_exit() {  # job_exit ID: the ended job's exit status as `sbatch --wait` gives it, or nothing
  local line state code
  line=$(scontrol -o show job "$1" 2>/dev/null) || return 0
  state=$(grep -oE 'JobState=[A-Z_]+' <<<"$line") state=${state#JobState=}
  case $state in
    PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | RESIZING | '') return 0 ;;
  esac
  code=$(grep -oE ' ExitCode=[0-9]+:[0-9]+' <<<"$line") code=${code# ExitCode=}
  if [ "${code#*:}" != 0 ]; then echo $((128 + ${code#*:})); else echo "${code%:*}"; fi
}
submit() {  # submit SCRIPT [ARGS...] -> sets JOBID, JOBRC; ARGS default to the train flags
  local out script=$1 start=$SECONDS
  shift
  local args=("$@")
  ((${#args[@]})) || args=("${TRAIN_FLAGS[@]}")
  JOBRC=
  if ! timeout 30 sbatch --parsable --export=ALL "$REPO/job-scripts/$script" "${args[@]}" \
    >"$T/sbatch.out" 2>"$T/sbatch.err"; then
    JOBID= JOBRC=1
    cat "$T/sbatch.err" >&2
    return
  fi
  out=$(head -1 "$T/sbatch.out")
  JOBID=${out%%;*}
  until JOBRC=$(job_exit "$JOBID") && [ -n "$JOBRC" ]; do
    if ((SECONDS - start > JOB_TIMEOUT)); then
      JOBRC=124
      timeout 10 scancel --quiet "$JOBID" 2>/dev/null
      break
    fi
    sleep 0.5
  done
  # A job is COMPLETED before its step daemons have finished cleaning up after it (Open
  # MPI's session directory in the node's TMPDIR among them): a job started on that node
  # meanwhile lost its shared-memory files and crashed. The next job waits for them.
  local quiet=$SECONDS
  while pgrep -x slurmstepd >/dev/null && ((SECONDS - quiet < 30)); do sleep 0.2; done
  tlog "$script: job ${JOBID:-?} exit $JOBRC after $((SECONDS - start)) s"
  ((JOBRC == 0)) || { cat "$T/sbatch.err" >&2; cat "$T"/submit/*-"$JOBID".out >&2 2>/dev/null; }
}

# 5a. Two nodes × four GPUs: eight ranks.
t0=$SECONDS
submit slurm-2node-4gpu.sbatch
run=results/ddpbench-2n4g-$JOBID
outf=ddpbench-2n4g-$JOBID.out
check "2n4g: sbatch --wait exit code 0" test "$JOBRC" = 0
check "2n4g: manifest.json status completed" py_check "$run" 'm["status"] == "completed"'
check "2n4g: world_size 8" py_check "$run" 'm["world_size"] == 8'
check "2n4g: nodes 2" py_check "$run" 'm["nodes"] == 2'
check "2n4g: ranks on hosts n1 ×4, n2 ×4" py_check "$run" \
  'sorted(r["host"] for r in m["ranks"]) == ["n1"]*4 + ["n2"]*4'
check "2n4g: 8 rank-*.csv files" py_check "$run" 'len(files) == 8'
check "2n4g: each rank CSV has $STEPS rows" py_check "$run" "len(rows) == 8 and all(len(r) == $STEPS for r in rows)"
check "2n4g: launcher_env has SLURM_PROCID (= rank) on every rank" py_check "$run" \
  'all(e.get("SLURM_PROCID") == str(r["rank"]) for e, r in zip(env, m["ranks"]))'
check "2n4g: launcher_env has CUDA_VISIBLE_DEVICES on every rank" py_check "$run" \
  'all(e.get("CUDA_VISIBLE_DEVICES", "") != "" for e in env)'
check "2n4g: every rank fell back to device Cpu" py_check "$run" 'all(r["device"] == "Cpu" for r in m["ranks"])'
# The recorded binding against the allocation: the script asks --cpus-per-task=8 and
# passes it on to srun (SRUN_CPUS_PER_TASK, -c); every rank here can run on fewer CPUs
# than that (the machine's real ones), a starved rank that ddpbench must warn of once
# and record.
check "2n4g: every rank was allocated 8 CPUs per task" py_check "$run" \
  'all(e.get("SLURM_CPUS_PER_TASK") == "8" for e in env)'
check "2n4g: the starved ranks are recorded (fewer_cores_than_allocated, 8 allocated)" py_check "$run" \
  "$(nproc) >= 8 or [w['code'] for w in m['warnings'] if 'the 8 Slurm allocated' in w['message']] == ['fewer_cores_than_allocated']"
check "2n4g: the starved ranks are warned of once in $outf" \
  test "$(grep -c "fewer than the 8 Slurm allocated" "$outf")" = "$(( $(nproc) >= 8 ? 0 : 1 ))"
check "2n4g: $outf exists" test -s "$outf"
# The reduce table (a row or heading naming the run, not a log line) and its "wrote ..." line.
check "2n4g: $outf holds the reduce summary" \
  both_in "$outf" "^\(run \)\?ddpbench-2n4g-$JOBID[: ]" "^wrote .*summary\.csv"
check "2n4g: summary.csv counts 8 ranks" py_check "$run" \
  'sum(int(r["ranks"]) for r in csv.DictReader(open(os.path.join(d + "-report", "summary.csv")))) == 8'
tlog "2n4g took $((SECONDS - t0)) s"

# 5b. One rank on one GPU.
t0=$SECONDS
submit slurm-1gpu.sbatch
run=results/ddpbench-1gpu-$JOBID
outf=ddpbench-1gpu-$JOBID.out
check "1gpu: sbatch --wait exit code 0" test "$JOBRC" = 0
check "1gpu: manifest.json status completed, world_size 1, nodes 1" py_check "$run" \
  'm["status"] == "completed" and m["world_size"] == 1 and m["nodes"] == 1'
check "1gpu: 1 rank CSV with $STEPS rows" py_check "$run" "len(files) == 1 and len(rows[0]) == $STEPS"
check "1gpu: launcher_env has SLURM_PROCID=0 and one CUDA_VISIBLE_DEVICES entry" py_check "$run" \
  'env[0].get("SLURM_PROCID") == "0" and len(env[0].get("CUDA_VISIBLE_DEVICES", "").split(",")) == 1 and env[0]["CUDA_VISIBLE_DEVICES"] != ""'
check "1gpu: device Cpu" py_check "$run" 'm["ranks"][0]["device"] == "Cpu"'
check "1gpu: $outf holds the reduce summary" \
  both_in "$outf" "^\(run \)\?ddpbench-1gpu-$JOBID[: ]" "^wrote .*summary\.csv"
tlog "1gpu took $((SECONDS - t0)) s"

# 5c. A study over the ladder 1, 4, 8 in one allocation of 2 nodes × 4: each point on a
# sub-communicator of the 8 ranks, packed onto as few nodes as it fits.
t0=$SECONDS
JOB_TIMEOUT=300
submit study.sbatch "$REPO/job-scripts/studies/slurm-test.toml"
st=results/study-slurm-test
pt() { echo "$st/runs/$1-mnist-cnn-synthetic-b16-r$2-rep0"; }
check "study: sbatch --wait exit code 0" test "$JOBRC" = 0
check "study: points.csv has 3 completed points" python3 -c "
import csv, sys
rows = list(csv.DictReader(open('$st/points.csv')))
sys.exit(0 if [r['status'] for r in rows] == ['completed'] * 3 else 1)"
check "study: the 1-rank point ran on 1 rank" py_check "$(pt 000 1)" \
  'm["world_size"] == 1 and len(files) == 1 and len(rows[0]) == 6'
check "study: the 4-rank point's ranks sit on one node" py_check "$(pt 001 4)" \
  'm["world_size"] == 4 and m["nodes"] == 1 and len({r["host"] for r in m["ranks"]}) == 1 and len(files) == 4'
check "study: the 8-rank point's ranks sit on n1 ×4, n2 ×4" py_check "$(pt 002 8)" \
  'm["world_size"] == 8 and sorted(r["host"] for r in m["ranks"]) == ["n1"]*4 + ["n2"]*4'
check "study: threads per rank are 1 at every point" python3 -c "
import glob, json, sys
ms = [json.load(open(f)) for f in glob.glob('$st/runs/*/manifest.json')]
sys.exit(0 if len(ms) == 3 and all(r['threads'] == 1 for m in ms for r in m['ranks']) else 1)"
# The verdict's words (report/verdict.rs): a direction, or a speedup without one.
check "study: report/study.md and the speedup table" \
  both_in "$st/report/study.md" "^| 002-mnist-cnn-synthetic-b16-r8 " "has speedup\\|scales: speedup\\|scales negatively"
tlog "study took $((SECONDS - t0)) s"

# 5d. node_fill = "spread" in the same allocation: the 2-rank point puts one rank on each
# node; a 4-rank point would put two on one of the 2 nodes, and is refused before any
# point runs, the refusal said once.
t0=$SECONDS
submit study.sbatch "$REPO/job-scripts/studies/slurm-test.toml" --node-fill spread --ranks 1,2 \
  --out results/study-slurm-spread
check "spread: sbatch --wait exit code 0" test "$JOBRC" = 0
check "spread: the 2-rank point's ranks sit on n1 and n2" \
  py_check results/study-slurm-spread/runs/001-mnist-cnn-synthetic-b16-r2-spread-rep0 \
  'm["world_size"] == 2 and sorted(r["host"] for r in m["ranks"]) == ["n1", "n2"]'
submit study.sbatch "$REPO/job-scripts/studies/slurm-test.toml" --node-fill spread --ranks 1,4 \
  --out results/study-slurm-spread-4
outf=ddpbench-study-$JOBID.out
check "spread: a 4-rank point on 2 nodes is refused (non-zero exit)" test "$JOBRC" != 0
check "spread: the refusal names the point and the allocation, once, in $outf" \
  test "$(grep -c "its 4-rank point needs 4 nodes.*the widest point has ranks (sbatch -N 4" "$outf")" = 1
check "spread: the refusal names the allocation of 2 nodes" grep -q "the allocation has 2 nodes (n1, n2, 8 rank(s))" "$outf"
check "spread: no point of the refused study ran" test ! -e results/study-slurm-spread-4/runs
tlog "spread took $((SECONDS - t0)) s"

cd / || true
echo "$pass passed, $fail failed"
((fail == 0))
