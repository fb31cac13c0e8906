#!/usr/bin/env bash
# Two "nodes" on one machine: network namespaces node1 and node2 joined by a veth pair
# (a private /24 that exists only inside the two namespaces). Open MPI's mpirun runs
# inside node1 and starts its daemon on node2 through a plm_rsh_agent script instead of
# ssh. `ddpbench train` runs with one rank per node: on the bare veth, then with the
# veth shaped to 1 Gbit/s by tc tbf (both directions), and on the shaped link with
# --overlap off and with --overlap off --grad-dtype bf16; then `ddpbench allreduce` on
# the shaped and the bare link, a 1-rank run, and `reduce` projecting the 2-node runs from
# it with each link's fitted model. Then the link by specification alone: at two tbf rates
# (1 and 4 Gbit/s), `reduce --link RATE,LATENCY` (the tbf rate, and half the veth's
# measured round trip as the latency) projects the 2-node step from the 1-rank run, with
# no sweep; a nominal link bounds the link term, so that projection's all-reduce at line
# rate (comm_bound_s; comm_s where the binary writes no comm_bound_s) must not be slower
# than the one measured in the 2-node run. Whether the measured step lies inside each
# projection's band [step_low_s, step_high_s] is printed per rate and path (band
# coverage); the band's structure is checked. Checks that the runs complete
# across two hosts, that traffic really crossed the veth and the shaping qdisc, the
# order of each step's clocks with and without overlap, and the halved wire bytes.
# The timings themselves (busbw, exposed communication) are printed, not asserted.
#
#   tests/cluster/netns.sh                     # as root; ~1-3 min (2 shared cores)
#   DDPBENCH_TEST_KEEP=/tmp/keep tests/cluster/netns.sh   # also keep the run folders there
#
# Prints the busbw and median comm figures, then `N passed, M failed`;
# exit status is non-zero when any check failed. Namespaces are removed on exit,
# failure or Ctrl-C.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tlog() { printf '[netns-test] %s\n' "$*" >&2; }
pass=0; fail=0
die() { tlog "FATAL: $*"; echo "$pass passed, $((fail + 1)) failed"; exit 2; }

[ "$(id -u)" = 0 ] || die "must run as root (ip netns, tc)"
for c in ip tc unshare flock python3; do command -v "$c" >/dev/null || die "$c not found"; done

NS1=node1; NS2=node2
NET=10.213.77          # the /24, inside the namespaces only
# The two shaped links: tc's rate units are decimal (1gbit = 10^9 bit/s), as are
# `reduce --link`'s (SPEC_BW); the burst is kept at 128 kB per Gbit/s.
RATE_1G="rate 1gbit burst 128kb latency 20ms";  SPEC_BW_1G=1Gbit/s
RATE_4G="rate 4gbit burst 512kb latency 20ms";  SPEC_BW_4G=4Gbit/s
RATE=$RATE_1G
STEPS=12; WARMUP=2
# 1 MiB buckets, so that overlap has buckets to send while backward still runs.
TRAIN_FLAGS=(--dataset synthetic --synthetic-samples 4096 --batch-size 16 --max-steps "$STEPS" --bucket-mb 1
             --warmup-steps "$WARMUP" --val-samples 64 --bind none --threads 1 --probe-iters 10)
RUN_TIMEOUT=100        # seconds for one mpirun

# One run at a time: the namespace names are fixed.
exec 9>/tmp/ddpbench-netns-test.lock
flock -n 9 || die "another tests/cluster/netns.sh is running"

# Installs what is missing, builds, exports LIBTORCH, LD_LIBRARY_PATH,
# OMPI_ALLOW_RUN_AS_ROOT*, DDPBENCH_BIN; returns non-zero if anything (the build) fails.
# shellcheck source=/dev/null
source "$REPO/job-scripts/setup.sh" || die "job-scripts/setup.sh failed (install or build)"
[ -x "${DDPBENCH_BIN:-}" ] || die "no ddpbench binary"
command -v mpirun >/dev/null || die "mpirun not found"

child=   # pid of a running `timeout mpirun`
T=$(mktemp -d /tmp/ddpbench-netns.XXXXXX) || die "mktemp failed"

del_ns() {  # kill what still runs in the namespaces (by pid), then delete them (and the veth)
  local ns p
  for ns in "$NS1" "$NS2"; do
    ip netns list | grep -qw "^$ns" || continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
  done
  sleep 0.3
  for ns in "$NS1" "$NS2"; do
    ip netns list | grep -qw "^$ns" || continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  tlog "tearing down"
  [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null   # a running `timeout mpirun`
  del_ns
  if [ -n "${DDPBENCH_TEST_KEEP:-}" ]; then
    mkdir -p "$DDPBENCH_TEST_KEEP" && cp -r "$T"/. "$DDPBENCH_TEST_KEEP"/ 2>/dev/null
  fi
  rm -rf "$T"
  exit "$rc"
}
trap teardown EXIT
trap 'tlog "interrupted"; echo "$pass passed, $((fail + 1)) failed"; exit 130' INT TERM

check() {  # check "description" command...
  local what=$1; shift
  if "$@" >/dev/null; then pass=$((pass + 1)); tlog "PASS $what"
  else fail=$((fail + 1)); tlog "FAIL $what"; fi
}
# py 'python code' args...: the code sees its args as sys.argv[1:] and helpers m(dir) (the
# manifest), rows(dir) (rank CSVs); an exception is one line on stderr.
PY_PRELUDE='
import csv, glob, json, os, statistics, sys
def m(d): return json.load(open(os.path.join(d, "manifest.json")))
def rows(d): return [list(csv.DictReader(open(f))) for f in sorted(glob.glob(os.path.join(d, "rank-*.csv")))]
code = sys.argv[1]; sys.argv = sys.argv[1:]
try:
    exec(code)
except Exception as e:
    sys.exit(f"  {e.__class__.__name__}: {e}")
'
py() { python3 -c "$PY_PRELUDE" "$@"; }
tx_bytes() {  # tx_bytes NS DEV: bytes sent by the device
  ip -n "$1" -s -j link show dev "$2" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'
}

# ---------------------------------------------------------------- nodes
del_ns   # leftovers of an interrupted run (same fixed names)
ip netns add "$NS1" && ip netns add "$NS2" || die "ip netns add failed"
ip link add veth-n1 netns "$NS1" type veth peer name veth-n2 netns "$NS2" || die "veth failed"
ip -n "$NS1" addr add "$NET.1/24" dev veth-n1
ip -n "$NS2" addr add "$NET.2/24" dev veth-n2
for ns in "$NS1" "$NS2"; do ip -n "$ns" link set lo up; done
ip -n "$NS1" link set veth-n1 up && ip -n "$NS2" link set veth-n2 up || die "link up failed"
# Both ends up, and a TCP connection node1 -> node2 goes through (no ping on minimal systems).
timeout 10 bash -c "until ip -n $NS1 link show veth-n1 | grep -q LOWER_UP && ip -n $NS2 link show veth-n2 | grep -q LOWER_UP; do sleep 0.05; done" \
  || die "veth did not come up"
timeout 10 ip netns exec "$NS2" python3 -c '
import socket; s = socket.socket(); s.bind(("'"$NET.2"'", 47000)); s.listen(1); s.accept()' &
probe=$!
timeout 10 ip netns exec "$NS1" python3 -c '
import socket, time
for _ in range(100):
    try: socket.create_connection(("'"$NET.2"'", 47000), timeout=1); break
    except OSError: time.sleep(0.05)
else: raise SystemExit(1)' || die "node1 cannot reach node2 over the veth"
wait "$probe"

# The veth's round trip: median of 400 one-byte TCP ping-pongs (Nagle off) between
# node1 and node2; half of it is the latency `reduce --link` is given (α, one way).
timeout 20 ip netns exec "$NS2" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("'"$NET.2"'", 47001)); s.listen(1); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)): c.sendall(b)' &
probe=$!
RTT_US=$(timeout 20 ip netns exec "$NS1" python3 -c '
import socket, statistics, time
for _ in range(100):
    try: s = socket.create_connection(("'"$NET.2"'", 47001), timeout=1); break
    except OSError: time.sleep(0.05)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for i in range(450):
    a = time.perf_counter(); s.sendall(b"x"); s.recv(1); t.append(time.perf_counter() - a)
s.close()
print("%.1f" % (statistics.median(t[50:]) * 1e6))') || die "could not time the round trip over the veth"
wait "$probe"
LAT_US=$(python3 -c "print('%.2f' % ($RTT_US / 2))")
tlog "veth round trip: median ${RTT_US} us; latency given to reduce --link: ${LAT_US} us"

# ssh stand-in for Open MPI: `agent HOST CMD...` runs CMD on "node" HOST (its namespace,
# its own host name), as ssh would run it through a remote shell.
AGENT=$T/ns-agent.sh
cat >"$AGENT" <<'EOF'
#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
EOF
chmod +x "$AGENT"
printf '%s slots=1\n%s slots=1\n' "$NS1" "$NS2" >"$T/hostfile"

run_train() {  # run_train NAME [FLAGS...]: 2 ranks, one per node, into $D/NAME; sets RC
  local out=$D/$1 name=$1
  shift
  # mpirun itself runs on node1 (the root namespace has no route to the /24).
  timeout "$RUN_TIMEOUT" "$AGENT" "$NS1" \
    "exec mpirun -n 2 --hostfile '$T/hostfile' --bind-to none \
       --mca plm_rsh_agent '$AGENT' \
       --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
       -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
       '$DDPBENCH_BIN' train ${TRAIN_FLAGS[*]} $* --out '$out'" >"$D/$name.log" 2>&1 9>&- &
  child=$!   # waited for in the background, so that a signal to this script is handled at once
  wait "$child"; RC=$?
  child=
  tlog "$name: mpirun exit $RC"
  ((RC == 0)) || tail -20 "$D/$name.log" >&2
}
check_run() {  # check_run NAME (run folder $D/NAME)
  local d=$D/$1
  check "$1: mpirun exit code 0" test "$RC" = 0
  check "$1: manifest status completed, world_size 2" py 'x = m(sys.argv[1]); sys.exit(not (x["status"] == "completed" and x["world_size"] == 2))' "$d"
  check "$1: manifest nodes == 2" py 'sys.exit(m(sys.argv[1])["nodes"] != 2)' "$d"
  check "$1: ranks' hosts differ (node1, node2)" py 'sys.exit(sorted(r["host"] for r in m(sys.argv[1])["ranks"]) != ["node1", "node2"])' "$d"
  check "$1: 2 rank CSVs with $STEPS rows each" py "r = rows(sys.argv[1]); sys.exit(not (len(r) == 2 and all(len(f) == $STEPS for f in r)))" "$d"
}

shape() {  # MODE=add|del shape: tbf $RATE on both ends of the veth (a symmetric link)
  local pair
  for pair in "$NS1 veth-n1" "$NS2 veth-n2"; do
    set -- $pair
    if [ "$MODE" = add ]; then
      # shellcheck disable=SC2086
      ip netns exec "$1" tc qdisc add dev "$2" root tbf $RATE || die "tc on $2 failed"
    else
      ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
    fi
  done
}
# ---------------------------------------------------------------- runs
# One run per configuration. How much the link, overlap and bf16 change the timings is
# printed (and recorded in BENCHMARKS.md), never asserted: on this noisy 2-core machine
# a bound on two timings fails by chance. The checks are on structure: exit codes,
# hosts, row counts, bytes through the qdisc, and the order of the CSV's own clocks.
D=$T/runs; mkdir -p "$D"
MODE=del shape
tx0=$(tx_bytes "$NS1" veth-n1)
run_train unshaped; RC_U=$RC
tx1=$(tx_bytes "$NS1" veth-n1)
MODE=add shape
run_train shaped; RC_S=$RC
sent=$(ip netns exec "$NS1" tc -s -j qdisc show dev veth-n1 | python3 -c 'import json,sys; print([q for q in json.load(sys.stdin) if q["kind"]=="tbf"][0]["bytes"])')
run_train shaped-no-overlap --overlap off; RC_N=$RC
run_train shaped-bf16 --overlap off --grad-dtype bf16; RC_B=$RC

# The link model: `ddpbench allreduce` with one rank per node on the shaped and
# the bare link, 1-rank runs on node1 as references (overlap on and off), and `reduce`
# projecting the 2-node runs from them with each link's fitted model.
run_sweep() {  # run_sweep NAME: one rank per node into $D/NAME; sets RC
  timeout "$RUN_TIMEOUT" "$AGENT" "$NS1" \
    "exec mpirun -n 2 --hostfile '$T/hostfile' --bind-to none --mca plm_rsh_agent '$AGENT' \
       --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
       -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
       '$DDPBENCH_BIN' allreduce --min-bytes 1K --max-bytes 8M --iters 10 --budget-s 0.3 --out '$D/$1'" \
    >"$D/$1.log" 2>&1 9>&- &
  child=$!; wait "$child"; RC=$?; child=
  tlog "$1: mpirun exit $RC"
  ((RC == 0)) || tail -20 "$D/$1.log" >&2
}
run_pack() {  # run_pack NAME [FLAGS...]: 2 ranks on node1 (1 node × 2, the cores the 2-node runs use); sets RC
  local name=$1; shift
  timeout "$RUN_TIMEOUT" "$AGENT" "$NS1" \
    "exec mpirun -n 2 --bind-to none -x LD_LIBRARY_PATH '$DDPBENCH_BIN' train ${TRAIN_FLAGS[*]} $* --out '$D/$name'" \
    >"$D/$name.log" 2>&1 9>&-
  RC=$?
  tlog "$name: mpirun exit $RC"
}
run_one() {  # run_one NAME [FLAGS...]: 1 rank on node1; sets RC
  local name=$1; shift
  timeout "$RUN_TIMEOUT" "$AGENT" "$NS1" \
    "exec mpirun -n 1 --bind-to none -x LD_LIBRARY_PATH '$DDPBENCH_BIN' train ${TRAIN_FLAGS[*]} $* --out '$D/$name'" \
    >"$D/$name.log" 2>&1 9>&-
  RC=$?
  tlog "$name: mpirun exit $RC"
}
run_sweep sweep-shaped; RC_SS=$RC
MODE=del shape
# The second rate, for the link by specification (and its sweep, for BENCHMARKS.md).
RATE=$RATE_4G; MODE=add shape
run_train shaped4-no-overlap --overlap off; RC_N4=$RC
run_sweep sweep-shaped4; RC_SS4=$RC
MODE=del shape; RATE=$RATE_1G
run_sweep sweep-unshaped; RC_SU=$RC
run_train unshaped-off --overlap off; RC_UO=$RC
run_one one-node; RC_1=$RC
run_one one-node-off --overlap off; RC_1O=$RC
# Held out at equal core load: 1 node × 2 ranks (pack) as the reference, 2 nodes × 1
# rank (spread: the runs above) projected from it, on each link.
run_pack pack-off --overlap off; RC_PK=$RC
mkdir -p "$D/held-shaped" "$D/held-unshaped"
"$DDPBENCH_BIN" reduce --no-plots --project-to 2 --interconnect "$D/sweep-shaped" --out "$D/held-shaped" \
  "$D/one-node-off" "$D/pack-off" "$D/shaped-no-overlap" >"$D/held-shaped.log" 2>&1; RC_HS=$?
"$DDPBENCH_BIN" reduce --no-plots --project-to 2 --interconnect "$D/sweep-unshaped" --out "$D/held-unshaped" \
  "$D/one-node-off" "$D/pack-off" "$D/unshaped-off" >"$D/held-unshaped.log" 2>&1; RC_HU=$?
# The link by specification alone (no sweep): 2 nodes × 1 projected at each tbf rate
# from each 1-node run (1 rank; 1 node × 2 ranks, the cores the 2-node run uses); and the
# same from each rate's sweep, for BENCHMARKS.md.
proj_reduce() {  # proj_reduce NAME MEASURED REF FLAGS...: `reduce FLAGS` into $D/NAME; failures in REDUCE_FAILED
  local name=$1 measured=$2 ref=$3 runs
  shift 3
  runs=("$D/one-node-off")   # given the 1-rank run too, reduce projects from the pack run
  [ "$ref" = pack-off ] && runs+=("$D/pack-off")
  mkdir -p "$D/$name"
  "$DDPBENCH_BIN" reduce --no-plots "$@" --out "$D/$name" "${runs[@]}" "$D/$measured" >"$D/$name.log" 2>&1 \
    || { REDUCE_FAILED+=" $name"; tail -5 "$D/$name.log" >&2; }
}
REDUCE_FAILED=
for ref in one-node-off pack-off; do
  proj_reduce "spec-1g-$ref" shaped-no-overlap "$ref" --link "$SPEC_BW_1G,${LAT_US}us" --project-shape 2x1
  proj_reduce "spec-4g-$ref" shaped4-no-overlap "$ref" --link "$SPEC_BW_4G,${LAT_US}us" --project-shape 2x1
  proj_reduce "swept-1g-$ref" shaped-no-overlap "$ref" --interconnect "$D/sweep-shaped" --project-to 2
  proj_reduce "swept-4g-$ref" shaped4-no-overlap "$ref" --interconnect "$D/sweep-shaped4" --project-to 2
done
mkdir -p "$D/proj-shaped" "$D/proj-unshaped"
"$DDPBENCH_BIN" reduce --no-plots --project-to 16 --interconnect "$D/sweep-shaped" --out "$D/proj-shaped" \
  "$D/one-node" "$D/one-node-off" "$D/shaped" "$D/shaped-no-overlap" >"$D/proj-shaped.log" 2>&1; RC_PS=$?
"$DDPBENCH_BIN" reduce --no-plots --project-to 16 --interconnect "$D/sweep-unshaped" --out "$D/proj-unshaped" \
  "$D/one-node" "$D/one-node-off" "$D/unshaped" "$D/unshaped-off" >"$D/proj-unshaped.log" 2>&1; RC_PU=$?

# ---------------------------------------------------------------- checks
RC=$RC_U; check_run unshaped
grad=$(py 'print(m(sys.argv[1])["gradient_bytes"])' "$D/unshaped" 2>/dev/null || echo 0)
# Every step all-reduces `grad` bytes; with 2 ranks each side sends at least half of it.
check "unshaped: traffic crossed the veth (node1 sent $((tx1 - tx0)) B)" \
  test "$((tx1 - tx0))" -ge "$((STEPS * grad / 2))" -a "$grad" -gt 0
RC=$RC_S; check_run shaped
check "shaped: traffic went through the tbf qdisc (node1 sent ${sent:-?} B)" \
  test "${sent:-0}" -ge "$((STEPS * grad / 2))" -a "$grad" -gt 0
RC=$RC_N; check_run shaped-no-overlap
RC=$RC_B; check_run shaped-bf16

# Figures for BENCHMARKS.md (printed, not asserted).
py '
med = lambda d, c: statistics.median(float(r[c]) for f in rows(d) for r in f if r["warmup"] == "0")
u, s, n, b = sys.argv[1:5]
bw = lambda d: m(d)["allreduce_probe"]["busbw_bytes_per_s"]
print(f"allreduce_probe busbw: unshaped {bw(u)/1e6:.1f} MB/s, shaped (tbf 1gbit) {bw(s)/1e6:.1f} MB/s")
for name, d in (("unshaped, overlap on", u), ("shaped, overlap on", s), ("shaped, overlap off", n), ("shaped, overlap off, bf16", b)):
    c, e, t, by = med(d, "comm_s"), med(d, "comm_exposed_s"), med(d, "step_s"), rows(d)[0][0]["bytes"]
    print(f"{name}: median comm_s {c*1e3:.2f} ms, comm_exposed_s {e*1e3:.2f} ms, step_s {t*1e3:.2f} ms, bytes {by}")
' "$D/unshaped" "$D/shaped" "$D/shaped-no-overlap" "$D/shaped-bf16"

# Overlap sends buckets while the convolutions' backward runs: the first bucket is handed
# over before backward ends in every step; without overlap only after it, and all of the
# all-reduce work then lies inside the exposed wait.
check "shaped, overlap on: manifest says overlap with 3 backward stages" py '
c = m(sys.argv[1])["comm"]; sys.exit(not (c["overlap"] is True and c["backward_stages"] == 3))' "$D/shaped"
backward_end='float(r["step_start_at_s"]) + sum(float(r[c]) for c in ("data_s", "batch_copy_s", "forward_s", "backward_s"))'
check "shaped, overlap on: every step's first bucket leaves before backward ends" py "
sys.exit(not all(float(r['comm_start_at_s']) < $backward_end for f in rows(sys.argv[1]) for r in f))" "$D/shaped"
check "shaped, overlap off: every step's all-reduce starts when backward has ended" py "
sys.exit(not all(float(r['comm_start_at_s']) >= $backward_end - 1e-6 for f in rows(sys.argv[1]) for r in f))" "$D/shaped-no-overlap"
check "shaped, overlap off: every step's comm_s lies inside its comm_exposed_s" py '
sys.exit(not all(float(r["comm_s"]) <= float(r["comm_exposed_s"]) + 1e-6 for f in rows(sys.argv[1]) for r in f))' "$D/shaped-no-overlap"
check "shaped, bf16: exactly half the bytes of fp32 (both overlap off)" py '
b, f = sys.argv[1:3]
sys.exit(not 2 * int(rows(b)[0][0]["bytes"]) == int(rows(f)[0][0]["bytes"]))' "$D/shaped-bf16" "$D/shaped-no-overlap"

# The sweeps and the projections: structure checked, figures printed for BENCHMARKS.md.
check "sweeps: exit 0 on the shaped and the bare link" test "$RC_SS$RC_SU" = 00
check "sweep (shaped): inter-node level, 2 ranks on 2 nodes, no wrong sums" py '
r = list(csv.DictReader(open(sys.argv[1] + "/allreduce.csv")))
sys.exit(not (r and all(x["level"] == "inter-node" and x["ranks"] == "2" and x["nodes"] == "2" and x["wrong"] == "0" for x in r)))' "$D/sweep-shaped"
check "sweep (shaped): an inter-node fit in link_model.json" py '
x = json.load(open(sys.argv[1] + "/link_model.json"))["models"][0]; sys.exit(x["inter"] is None or x["inter"]["ranks"] != 2)' "$D/sweep-shaped"
check "1-rank references and the bare-link run without overlap: exit 0" test "$RC_1$RC_1O$RC_UO" = 000
check "reduce with each model: exit 0" test "$RC_PS$RC_PU" = 00
PROJ='
def proj(d, overlap):
    r = [x for x in csv.DictReader(open(d + "/projection.csv"))
         if x["scaling"] == "weak" and x["ranks"] == "2" and x["nodes"] == "2" and ("overlap=" + overlap) in x["comparison"]]
    return r[0]
'
check "projection: 2 nodes projected from 1 node and compared with the measured run, between own work and own work + all-reduce" py "$PROJ"'
for d in sys.argv[1:]:
    for o in ("on", "off"):
        p = proj(d, o); s, w, c = float(p["step_s"]), float(p["own_work_s"]), float(p["comm_s"])
        # Cells carry 9 decimals: a sum of three cells is good to 1.5e-9.
        assert p["measured_step_s"] and p["is_reference"] == "false" and w - 1.5e-9 <= s <= w + c + 1.5e-9, p
' "$D/proj-shaped" "$D/proj-unshaped"
check "projection: the slower link projects the longer all-reduce and step" py "$PROJ"'
a, b = proj(sys.argv[1], "off"), proj(sys.argv[2], "off")
sys.exit(not (float(a["comm_s"]) > float(b["comm_s"]) and float(a["step_s"]) > float(b["step_s"])))' "$D/proj-shaped" "$D/proj-unshaped"
py "$PROJ"'
for name, sw, d in (("tbf 1gbit", sys.argv[1], sys.argv[2]), ("bare veth", sys.argv[3], sys.argv[4])):
    f = json.load(open(sw + "/link_model.json"))["models"][0]["inter"]
    print("%s: alpha %.1f us, 1/beta %.1f MB/s, fit |err| max %.1f %%" % (name, f["alpha_s"] * 1e6, f["bandwidth_bytes_per_s"] / 1e6, f["max_abs_rel_error"] * 100))
    for o in ("off", "on"):
        p = proj(d, o)
        print("  overlap %s, 2 nodes: projected step %.2f ms (own work %.2f, comm %.2f, exposed %.2f), measured %.2f ms, error %+.1f %%" % (
            o, float(p["step_s"]) * 1e3, float(p["own_work_s"]) * 1e3, float(p["comm_s"]) * 1e3, float(p["comm_exposed_s"]) * 1e3,
            float(p["measured_step_s"]) * 1e3, float(p["error_pct"])))
' "$D/sweep-shaped" "$D/proj-shaped" "$D/sweep-unshaped" "$D/proj-unshaped"

# Held out: 2 nodes × 1 rank projected from 1 node × 2 ranks (pack), overlap off, on
# each link. Structure checked; the error and the speedups printed for BENCHMARKS.md.
check "pack run and the held-out projections: exit 0" test "$RC_PK$RC_HS$RC_HU" = 000
# The reference runs of a projection row: from_runs (run ids, space-separated), or the
# single from_run of binaries before it.
RUNS='
def runs_of(x):
    return (x.get("from_runs") or x.get("from_run") or "").split()
'
HELD="$RUNS"'
def held(d):
    r = [x for x in csv.DictReader(open(d + "/projection.csv"))
         if x["scaling"] == "weak" and x["nodes"] == "2" and x["ranks_per_node"] == "1"]
    return r[0]
'
check "held out: 2 nodes × 1 projected from the pack run, each term beside its measured counterpart" py "$HELD"'
for d in sys.argv[1:]:
    p = held(d)
    assert runs_of(p) and p["is_reference"] == "false", p
    for c in ("measured_step_s", "measured_own_work_s", "measured_comm_s", "measured_comm_exposed_s", "straggler_s", "fit_error_pct"):
        assert p[c] != "" and float(p[c]) >= 0, (c, p)
    assert p["unreliable"] in ("true", "false") and p["speedup_against"], p
' "$D/held-shaped" "$D/held-unshaped"
py "$HELD"'
for name, d in (("tbf 1gbit", sys.argv[1]), ("bare veth", sys.argv[2])):
    p = held(d)
    f = lambda c: float(p[c]) * 1e3
    ms = p["measured_speedup"]
    print("held out, %s: 2 nodes x 1 from 1 node x 2: step %.2f ms projected, %.2f measured, error %+.1f %%; "
          "own work %.2f vs %.2f (straggler %.2f), all-reduce %.2f vs %.2f, exposed %.2f vs %.2f; "
          "speedup %s projected, %s measured (against the %s); fit error %.1f %%%s" % (
        name, f("step_s"), f("measured_step_s"), float(p["error_pct"]), f("own_work_s"), f("measured_own_work_s"),
        f("straggler_s"), f("comm_s"), f("measured_comm_s"), f("comm_exposed_s"), f("measured_comm_exposed_s"),
        p["speedup"], ms, p["speedup_against"], float(p["fit_error_pct"]), " UNRELIABLE" if p["unreliable"] == "true" else ""))
' "$D/held-shaped" "$D/held-unshaped"

# The link by specification: the projection exists, says its level is nominal, and its
# link term is an optimistic bound on the all-reduce measured in the 2-node run (both
# overlap off, 2 nodes × 1).
RC=$RC_N4; check_run shaped4-no-overlap
check "sweep at 4 Gbit/s: exit 0" test "$RC_SS4" = 0
check "link by spec and by sweep: every reduce exits 0 (failed:${REDUCE_FAILED:- none})" test -z "$REDUCE_FAILED"
SPEC="$RUNS"'
def two_nodes(d, ref):
    rid = m(ref)["run_id"]
    r = [x for x in csv.DictReader(open(d + "/projection.csv"))
         if x["scaling"] == "weak" and x["nodes"] == "2" and x["ranks_per_node"] == "1" and rid in runs_of(x)]
    assert len(r) == 1, (d, r)
    return r[0]
'
for r in 1g 4g; do
  check "link by spec ($r): 2 nodes × 1 projected from each 1-node run, beside the measured 2-node step" py "$SPEC"'
for ref in sys.argv[2:]:
    p = two_nodes(sys.argv[1] + "-" + os.path.basename(ref), ref)
    assert p["is_reference"] == "false" and p["measured_step_s"] != "" and float(p["step_s"]) > 0, p' "$D/spec-$r" "$D/one-node-off" "$D/pack-off"
  check "link by spec ($r): report.json and report.md say the inter-node level is nominal, an optimistic bound" py '
for ref in ("one-node-off", "pack-off"):
    d = sys.argv[1] + "-" + ref
    lv = " ".join(json.load(open(d + "/report.json"))["projection"]["levels"]); md = open(d + "/report.md").read()
    assert "inter-node nominal, from the specification" in lv and "optimistic bound" in lv, lv
    assert "nominal, from the specification" in md and "optimistic bound" in md, d' "$D/spec-$r"
  # The nominal link bounds the link term only: the all-reduce at line rate is never
  # slower than the one measured in training. The whole step also carries own work from
  # the reference run, which the link does not bound (a busy reference makes it slower).
  # comm_bound_s is that all-reduce at line rate; where the binary does not write it,
  # comm_s is (no efficiency applied).
  check "link by spec ($r): the projected all-reduce at line rate is not slower than the one measured in training" py "$SPEC"'
for ref in sys.argv[2:]:
    p = two_nodes(sys.argv[1] + "-" + os.path.basename(ref), ref)
    c = "comm_bound_s" if p.get("comm_bound_s") not in (None, "") else "comm_s"
    assert float(p[c]) <= float(p["measured_comm_s"]), (ref, c, p[c], p["measured_comm_s"])' "$D/spec-$r" "$D/one-node-off" "$D/pack-off"
  # The band: its columns exist and hold the projected step (cells carry 9 decimals).
  # Whether the measured step lies inside it is printed below, never asserted: how often
  # it does is the band's coverage, a figure for BENCHMARKS.md.
  check "link by spec and by sweep ($r): each 2-node projection has a band, step_low_s <= step_s <= step_high_s" py "$SPEC"'
for path in ("spec", "swept"):
    for ref in sys.argv[3:]:
        p = two_nodes("%s/%s-%s-%s" % (sys.argv[1], path, sys.argv[2], os.path.basename(ref)), ref)
        low, step, high = (float(p[c]) for c in ("step_low_s", "step_s", "step_high_s"))
        assert 0 < low <= step + 1e-9 and step <= high + 1e-9, (path, ref, low, step, high)' "$D" "$r" "$D/one-node-off" "$D/pack-off"
done
py "$SPEC"'
for r in ("1g", "4g"):
    for path in ("spec", "swept"):
        for ref in sys.argv[2:]:
            p = two_nodes("%s/%s-%s-%s" % (sys.argv[1], path, r, os.path.basename(ref)), ref)
            low, step, high, meas = (float(p[c]) for c in ("step_low_s", "step_s", "step_high_s", "measured_step_s"))
            print("band coverage (%s, %s path, 2 nodes x 1 from %s): measured %.2f ms %s [%.2f, %.2f] ms (projected %.2f, half-width %.1f %%)" % (
                r, "spec" if path == "spec" else "sweep", os.path.basename(ref), meas * 1e3,
                "inside" if low <= meas <= high else "OUTSIDE", low * 1e3, high * 1e3, step * 1e3, 100 * (high - low) / 2 / step))
' "$D" "$D/one-node-off" "$D/pack-off"
py "$SPEC"'
print("link by spec: latency %s us (half the veth round trip)" % sys.argv[1])
for name, r in (("tbf 1gbit", "1g"), ("tbf 4gbit", "4g")):
    for ref in sys.argv[3:]:
        b = os.path.basename(ref)
        p, w = two_nodes("%s/spec-%s-%s" % (sys.argv[2], r, b), ref), two_nodes("%s/swept-%s-%s" % (sys.argv[2], r, b), ref)
        f = lambda x, c: float(x[c]) * 1e3
        print("  %s, 2 nodes x 1 from %s, overlap off: step from spec %.2f ms (own work %.2f, comm %.2f), from sweep %.2f ms "
              "(comm %.2f), measured %.2f ms (own work %.2f, comm %.2f); spec %+.1f %%, sweep %+.1f %% against measured" % (
            name, b, f(p, "step_s"), f(p, "own_work_s"), f(p, "comm_s"), f(w, "step_s"), f(w, "comm_s"),
            f(p, "measured_step_s"), f(p, "measured_own_work_s"), f(p, "measured_comm_s"), float(p["error_pct"]), float(w["error_pct"])))
' "$LAT_US" "$D" "$D/one-node-off" "$D/pack-off"

echo "$pass passed, $fail failed"
((fail == 0))
