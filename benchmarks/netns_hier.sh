#!/usr/bin/env bash
# The hierarchical shape on the two network-namespace "nodes" of tests/cluster/netns.sh:
# 2 nodes × 2 ranks projected from 1 node × 4 ranks plus the inter-node link, against the
# measured 2 × 2 step. The link is given two ways: by its specification (the tbf rate and
# half the veth's measured round trip, `reduce --link`), with the intra-node level from a
# sweep on node1 alone; and by a sweep over the whole 2 × 2 allocation (both levels).
# Not in the test suite: 4 ranks oversubscribe this machine's 2 cores, and MPI's
# busy-polling waits then slow small messages by orders of magnitude.
#
#   DDPBENCH_BIN=target/release/ddpbench benchmarks/netns_hier.sh OUT [PASSES] [TBF]
#       # as root; TBF defaults to "rate 1gbit burst 128kb latency 20ms", SPEC_BW to 1Gbit/s
#
# Each pass writes OUT/passN/{one,pack4,hier,sweep-node,sweep-2x2,spec,swept} and prints
# one line: the projected 2 × 2 step from the spec and from the sweep, and the measured one.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: netns_hier.sh OUT [PASSES] [TBF]}
passes=${2:-3}
tbf=${3:-rate 1gbit burst 128kb latency 20ms}
spec_bw=${SPEC_BW:-1Gbit/s}
bin=${DDPBENCH_BIN:?set DDPBENCH_BIN to the ddpbench binary}
NET=10.213.77
dir=/tmp/ddpbench-netns-link   # netns_link.sh's agent script
flags=(--dataset synthetic --synthetic-samples 4096 --batch-size 16 --max-steps 12 --bucket-mb 1
       --warmup-steps 2 --val-samples 64 --bind none --threads 1 --probe-iters 10 --overlap off)
sweep=(allreduce --min-bytes 1K --max-bytes 8M --iters 10 --budget-s 0.3)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trap '"$here/netns_link.sh" down' EXIT
"$here/netns_link.sh" up "$tbf" || exit 1
printf 'node1 slots=2\nnode2 slots=2\n' >"$dir/hostfile22"

on_node1() {  # on_node1 LOG CMD: runs CMD inside node1 (where mpirun must start)
  local log=$1; shift
  timeout 300 "$dir/agent.sh" node1 "$*" >"$log" 2>&1 || { echo "failed: $* (see $log)" >&2; return 1; }
}
across() {  # across N HOSTFILE LOG ARGS...: N ranks over both nodes
  local n=$1 hf=$2 log=$3; shift 3
  on_node1 "$log" "exec mpirun -n $n --hostfile $hf --bind-to none --mca plm_rsh_agent $dir/agent.sh \
    --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
    -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM $bin $*"
}
rtt_us() {  # the veth's round trip: median of 400 one-byte TCP ping-pongs, µs
  timeout 20 ip netns exec node2 python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("'"$NET.2"'", 47002)); s.listen(1); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)): c.sendall(b)' &
  timeout 20 ip netns exec node1 python3 -c '
import socket, statistics, time
for _ in range(100):
    try: s = socket.create_connection(("'"$NET.2"'", 47002), timeout=1); break
    except OSError: time.sleep(0.05)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for i in range(450):
    a = time.perf_counter(); s.sendall(b"x"); s.recv(1); t.append(time.perf_counter() - a)
print("%.1f" % (statistics.median(t[50:]) * 1e6))'
  wait
}

for p in $(seq 1 "$passes"); do
  d=$out/pass$p; mkdir -p "$d"
  rtt=$(rtt_us) || exit 1
  lat=$(python3 -c "print('%.2f' % ($rtt / 2))")
  on_node1 "$d/one.log" "exec mpirun -n 1 --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/one" || continue
  on_node1 "$d/pack4.log" "exec mpirun -n 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/pack4" || continue
  across 4 "$dir/hostfile22" "$d/hier.log" train "${flags[@]}" --out "$d/hier" || continue
  on_node1 "$d/sweep-node.log" "exec mpirun -n 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH $bin ${sweep[*]} --out $d/sweep-node" || continue
  across 4 "$dir/hostfile22" "$d/sweep-2x2.log" "${sweep[@]}" --levels intra-node,inter-node --out "$d/sweep-2x2" || continue
  mkdir -p "$d/spec" "$d/swept"
  "$bin" reduce --no-plots --interconnect "$d/sweep-node" --link "$spec_bw,${lat}us" --project-shape 2x2 \
    --out "$d/spec" "$d/one" "$d/pack4" "$d/hier" >"$d/spec.log" 2>&1 || { echo "reduce (spec) failed: $d/spec.log" >&2; continue; }
  "$bin" reduce --no-plots --interconnect "$d/sweep-2x2" --project-shape 2x2 \
    --out "$d/swept" "$d/one" "$d/pack4" "$d/hier" >"$d/swept.log" 2>&1 || { echo "reduce (sweep) failed: $d/swept.log" >&2; continue; }
  python3 - "$d" "$lat" <<'EOF'
import csv, json, sys
d, lat = sys.argv[1], sys.argv[2]
rid = json.load(open(d + "/pack4/manifest.json"))["run_id"]
def row(name):
    r = [x for x in csv.DictReader(open("%s/%s/projection.csv" % (d, name)))
         if x["scaling"] == "weak" and x["nodes"] == "2" and x["ranks_per_node"] == "2" and x["from_run"] == rid]
    assert len(r) == 1, (name, [(x["from_run"], x["nodes"], x["ranks_per_node"], x["scaling"]) for x in csv.DictReader(open("%s/%s/projection.csv" % (d, name)))])
    return r[0]
s, w = row("spec"), row("swept")
f = lambda x, c: float(x[c]) * 1e3
print("%s: latency %s us; 2x2 from 1x4: step from spec %.2f ms (own work %.2f, comm %.2f), from sweep %.2f ms (own work %.2f, comm %.2f), "
      "measured %.2f ms (own work %.2f, comm %.2f); spec %+.1f %%, sweep %+.1f %%; spec not slower than measured: %s" % (
    d, lat, f(s, "step_s"), f(s, "own_work_s"), f(s, "comm_s"), f(w, "step_s"), f(w, "own_work_s"), f(w, "comm_s"),
    f(s, "measured_step_s"), f(s, "measured_own_work_s"), f(s, "measured_comm_s"), float(s["error_pct"]), float(w["error_pct"]),
    float(s["step_s"]) <= float(s["measured_step_s"])))
EOF
done
