#!/usr/bin/env bash
# A held-out check of the projection on the two network-namespace "nodes" of
# tests/cluster/netns.sh (created by benchmarks/netns_link.sh up), at each tbf rate in RATES.
#
# SHAPE=2x1 (the default, graded): 2 nodes × 1 rank projected from node1 alone. Per pass
# and per rate, with the veth shaped to that rate:
#   one     1 rank on node1                     (reference)
#   pack    1 node × 2 ranks on node1           (reference: the cores the 2-node run uses)
#   spread  2 nodes × 1 rank over the veth      (measured; never the reference)
#   sweep   `ddpbench allreduce` over 2 nodes × 1 on the shaped link
#   spec    `reduce --link RATE,LATENCY[,SPEC_EXTRA] --project-shape 2x1 one-* pack-* spread`
#           (RATE the tbf rate, LATENCY half the veth's measured round trip)
#   swept   `reduce --interconnect sweep --project-to 2 one-* pack-* spread`
# and one line per path in OUT/forecast.csv: the projected 2 × 1 step, its band
# [step_low_s, step_high_s], the measured step, the error, whether the measured step lies
# inside the band, the link term's bound (comm_bound_s, or comm_s where the binary writes
# no comm_bound_s) beside the all-reduce measured in training, and the speedups:
#   error_pct       100 × (projected step / measured step − 1)
#   inside_band     band_low_s ≤ measured step ≤ band_high_s
#   half_width_pct  100 × (band_high_s − band_low_s) / 2 / projected step
#   bound_holds     comm_bound_s ≤ measured_comm_s
# At the end OUT/forecast-summary.txt: per path and per path × rate the median absolute
# error, the band's coverage and half-width, the bound, the load, and the issue-47 goals.
# The bound is graded on the spec path only (the all-reduce at the line rate); a swept
# link has no line rate, and its line says how often its all-reduce term was not above
# the measured one.
#
# SHAPE=2x2 (reported, not graded): 2 nodes × 2 ranks projected from 1 node × 4 ranks,
# with the intra-node level from a sweep on node1 alone and the inter-node level (a) from
# the spec and (b) from a sweep over the whole 2 × 2 allocation; one line per pass and
# rate, also in OUT/hier-2x2.txt. 4 ranks oversubscribe a 2-core machine, and MPI's
# busy-polling waits then slow small messages by orders of magnitude.
#
#   DDPBENCH_BIN=target/release/ddpbench benchmarks/netns_hier.sh OUT [PASSES]   # as root
#
#   PASSES      passes (default 10 for 2x1, 3 for 2x2)
#   RATES       tbf rates, space-separated (default "1gbit 4gbit"; units bit kbit mbit
#               gbit, decimal as in tc). Each is shaped as "rate R burst B latency 20ms"
#               on both ends of the veth, B = 128 kB per Gbit/s (at least 16 kB), as
#               tests/cluster/netns.sh shapes its links.
#   SPEC_EXTRA  appended to the spec after a comma (empty by default)
#   REF_REPEATS repeats of each reference (one, pack) per pass and rate, interleaved
#               (default 5, as the published check): the projection stands on all of them
#   SHAPE       2x1 (default) or 2x2
#
# OUT must not exist or be empty: nothing is overwritten. Runs go to OUT/passN/RATE/.
# loadavg1 in forecast.csv is /proc/loadavg's 1-minute figure right after the measured
# 2-node run; it includes that run's own two ranks.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: [RATES='1gbit 4gbit'] [SHAPE=2x1|2x2] [SPEC_EXTRA=...] DDPBENCH_BIN=... netns_hier.sh OUT [PASSES]"
out=${1:?$usage}
[ $# -le 2 ] || { echo "netns_hier.sh: at most 2 arguments (the tbf rates are in RATES now); $usage" >&2; exit 2; }
shape=${SHAPE:-2x1}
case $shape in
  2x1) passes=${2:-10} ;;
  2x2) passes=${2:-3} ;;
  *) echo "netns_hier.sh: SHAPE is 2x1 or 2x2, not '$shape'" >&2; exit 2 ;;
esac
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "netns_hier.sh: PASSES is a positive integer, not '$passes'" >&2; exit 2; }
read -r -a rates <<<"${RATES:-1gbit 4gbit}"
((${#rates[@]})) || { echo "netns_hier.sh: RATES is empty" >&2; exit 2; }
spec_extra=${SPEC_EXTRA:-}
ref_repeats=${REF_REPEATS:-5}
[[ $ref_repeats =~ ^[1-9][0-9]*$ ]] || { echo "netns_hier.sh: REF_REPEATS is a positive integer, not '$ref_repeats'" >&2; exit 2; }
bin=${DDPBENCH_BIN:?set DDPBENCH_BIN to the ddpbench binary}
[ -x "$bin" ] || { echo "netns_hier.sh: $bin is not an executable" >&2; exit 2; }

# tbf_of RATE and spec_bw_of RATE: tc's arguments for RATE, and the same rate in
# `reduce --link`'s units (both decimal: 1gbit = 1Gbit/s = 10^9 bit/s).
rate_parts() {  # rate_parts RATE: prints "NUMBER UNIT", or fails
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] || return 1
  echo "${BASH_REMATCH[1]} ${BASH_REMATCH[3]}"
}
tbf_of() {
  local n u
  read -r n u < <(rate_parts "$1") || return 1
  python3 -c "
n, u = $n, '$u'
gbit = n * {'bit': 1e-9, 'kbit': 1e-6, 'mbit': 1e-3, 'gbit': 1.0}[u]
print('rate $1 burst %dkb latency 20ms' % max(16, round(128 * gbit)))"
}
spec_bw_of() {
  local n u
  read -r n u < <(rate_parts "$1") || return 1
  case $u in bit) echo "${n}bit/s" ;; kbit) echo "${n}kbit/s" ;; mbit) echo "${n}Mbit/s" ;; gbit) echo "${n}Gbit/s" ;; esac
}
for r in "${rates[@]}"; do
  rate_parts "$r" >/dev/null || { echo "netns_hier.sh: '$r' in RATES is not a tbf rate such as 1gbit or 500mbit" >&2; exit 2; }
done

[ "$(id -u)" = 0 ] || { echo "netns_hier.sh: run as root (ip netns, tc)" >&2; exit 2; }
if [ -e "$out" ] && { [ ! -d "$out" ] || [ -n "$(ls -A "$out")" ]; }; then
  echo "netns_hier.sh: $out exists and is not an empty folder; give a new OUT (nothing is overwritten)" >&2
  exit 2
fi
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)

NET=10.213.77
dir=/tmp/ddpbench-netns-link   # netns_link.sh's agent script and hostfile (node1 slots=1, node2 slots=1)
# The workload of tests/cluster/netns.sh's overlap-off runs (mnist-cnn, the default model).
flags=(--dataset synthetic --synthetic-samples 4096 --batch-size 16 --max-steps 12 --bucket-mb 1
       --warmup-steps 2 --val-samples 64 --bind none --threads 1 --probe-iters 10 --overlap off)
sweep=(allreduce --min-bytes 1K --max-bytes 8M --iters 10 --budget-s 0.3)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
trap '"$here/netns_link.sh" down' EXIT

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
failed() {  # failed PASS RATE WHAT: one line in OUT/failed.txt
  echo "pass $1, $2: $3" | tee -a "$out/failed.txt" >&2
}
spec_of() {  # spec_of RATE LATENCY_US: the --link argument
  echo "$(spec_bw_of "$1"),${2}us${spec_extra:+,$spec_extra}"
}

# ---------------------------------------------------------------- 2 nodes × 1 (graded)
# Writes OUT/forecast.csv's lines for one pass and rate from the two reduces' projection.csv,
# each read by header name: the row nodes=2, ranks_per_node=1, scaling=weak.
FORECAST_PY='
import csv, json, os, sys
d, out, p, rate, utc, load = sys.argv[1:7]
cols = ["pass", "rate", "path", "utc", "loadavg1", "projected_step_s", "band_low_s", "band_high_s",
        "measured_step_s", "error_pct", "inside_band", "half_width_pct", "comm_bound_s", "measured_comm_s",
        "bound_holds", "projected_speedup", "measured_speedup"]
pack = json.load(open(os.path.join(d, "pack-0", "manifest.json")))["run_id"]
def row(name):
    rs = [x for x in csv.DictReader(open(os.path.join(d, name, "projection.csv")))
          if x["nodes"] == "2" and x["ranks_per_node"] == "1" and x["scaling"] == "weak"]
    if len(rs) > 1:  # the rows projected from the pack run (from_runs: space-separated run ids)
        rs = [x for x in rs if pack in (x.get("from_runs") or x.get("from_run") or "").split()]
    assert len(rs) == 1, (name, "rows nodes=2 ranks_per_node=1 weak", len(rs))
    return rs[0]
fmt3 = lambda v: "%.3f" % float(v) if v != "" else "–"
path = os.path.join(out, "forecast.csv")
new = not os.path.exists(path)
with open(path, "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    if new:
        w.writeheader()
    for name in ("spec", "swept"):
        x = row(name)
        step, low, high, meas = (float(x[c]) for c in ("step_s", "step_low_s", "step_high_s", "measured_step_s"))
        # The all-reduce at line rate where the binary writes it; before that, comm_s.
        bound = float(x["comm_bound_s"] if x.get("comm_bound_s") not in (None, "") else x["comm_s"])
        mcomm = float(x["measured_comm_s"])
        line = {"pass": p, "rate": rate, "path": "spec" if name == "spec" else "sweep", "utc": utc, "loadavg1": load,
                "projected_step_s": x["step_s"], "band_low_s": x["step_low_s"], "band_high_s": x["step_high_s"],
                "measured_step_s": x["measured_step_s"], "error_pct": "%.2f" % (100 * (step / meas - 1)),
                "inside_band": str(low <= meas <= high).lower(),
                "half_width_pct": "%.2f" % (100 * (high - low) / 2 / step),
                "comm_bound_s": "%.9f" % bound, "measured_comm_s": x["measured_comm_s"],
                "bound_holds": str(bound <= mcomm).lower(),
                "projected_speedup": x["speedup"], "measured_speedup": x["measured_speedup"]}
        w.writerow(line)
        print("pass %s, %s, %s path: step %.2f ms [%.2f, %.2f] projected, %.2f measured, error %+.1f %%, inside band: %s, "
              "half-width %.1f %%; all-reduce bound %.2f ms vs %.2f measured (holds: %s); speedup %s vs %s; load %s" % (
              p, rate, line["path"], step * 1e3, low * 1e3, high * 1e3, meas * 1e3, float(line["error_pct"]),
              line["inside_band"], float(line["half_width_pct"]), bound * 1e3, mcomm * 1e3, line["bound_holds"],
              fmt3(x["speedup"]), fmt3(x["measured_speedup"]), load))
'

SUMMARY_PY='
import csv, statistics, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(out + "/forecast.csv")))
lines = []
say = lines.append
def stats(rs):
    e = [float(r["error_pct"]) for r in rs]
    hw = [float(r["half_width_pct"]) for r in rs]
    return {"n": len(rs), "mae": statistics.median(abs(x) for x in e), "emin": min(e), "emax": max(e),
            "cov": sum(r["inside_band"] == "true" for r in rs) / len(rs), "hw": statistics.median(hw), "hwmax": max(hw),
            "bound": sum(r["bound_holds"] == "true" for r in rs)}
def fmt(label, rs):
    s = stats(rs)
    return ("%s: passes %d, median |error| %.1f %% (errors %+.1f … %+.1f %%), coverage %.0f %% (%d of %d inside the band), "
            "band half-width median %.1f %% (max %.1f %%), bound held %d of %d%s" % (
            label, s["n"], s["mae"], s["emin"], s["emax"], 100 * s["cov"], round(s["cov"] * s["n"]), s["n"],
            s["hw"], s["hwmax"], s["bound"], s["n"], " (every pass)" if s["bound"] == s["n"] else ""))
rates = sorted({r["rate"] for r in rows}, key=lambda r: [x["rate"] for x in rows].index(r))
passes = sorted({int(r["pass"]) for r in rows})
load = [float(r["loadavg1"]) for r in rows]
say("forecast.csv: %d lines, passes %s, rates %s" % (len(rows), ",".join(map(str, passes)) or "none", " ".join(rates) or "none"))
if rows:
    say("load average (1 min, after each measured 2-node run): %.2f … %.2f; UTC %s … %s" % (
        min(load), max(load), min(r["utc"] for r in rows), max(r["utc"] for r in rows)))
for path in ("spec", "sweep"):
    rs = [r for r in rows if r["path"] == path]
    if not rs:
        say("%s path: no passes" % path); continue
    say(fmt("%s path, pooled" % path, rs))
    for rate in rates:
        rr = [r for r in rs if r["rate"] == rate]
        if rr: say("  " + fmt("%s path, %s" % (path, rate), rr))
say("goals (issue 47; 2 nodes × 1, at least 2 rates and 10 passes per path):")
def verdict(ok): return "met" if ok else "MISSED"
for path, limit in (("sweep", 10.0), ("spec", 20.0)):
    rs = [r for r in rows if r["path"] == path]
    if not rs:
        say("  %s path: no passes" % path); continue
    s = stats(rs)
    n_rates = len({r["rate"] for r in rs})
    few = [] if s["n"] >= 10 * n_rates and n_rates >= 2 else ["passes %d over rates %d: below the minimum of issue 47" % (s["n"], n_rates)]
    say("  %s path: coverage %.0f %% (goal ≥ 90 %%): %s; band half-width median %.1f %% (goal ≤ 25 %%): %s, "
        "in every pass (max %.1f %%): %s; median |error| %.1f %% (goal ≤ %.0f %%): %s%s" % (
        path, 100 * s["cov"], verdict(s["cov"] >= 0.9), s["hw"], verdict(s["hw"] <= 25), s["hwmax"],
        verdict(s["hwmax"] <= 25), s["mae"], limit, verdict(s["mae"] <= limit), "; " + few[0] if few else ""))
allr = rows
if allr:
    s = stats(allr)
    say("  both paths pooled: coverage %.0f %% (goal ≥ 90 %%): %s" % (100 * s["cov"], verdict(s["cov"] >= 0.9)))
spec = [r for r in rows if r["path"] == "spec"]
if spec:
    b = sum(r["bound_holds"] == "true" for r in spec)
    say("  the bound of the link term (spec path, the all-reduce at line rate) not above the all-reduce measured in training: "
        "%d of %d passes: %s" % (b, len(spec), verdict(b == len(spec))))
sw = [r for r in rows if r["path"] == "sweep"]
if sw:
    say("  (sweep path: its all-reduce term was not above the measured one in %d of %d passes; a swept link has no "
        "line rate, so this is not graded)" % (sum(r["bound_holds"] == "true" for r in sw), len(sw)))
text = "\n".join(lines) + "\n"
open(out + "/forecast-summary.txt", "w").write(text)
print(text, end="")
'

pass_2x1() {  # pass_2x1 PASS RATE: the runs and reduces of one pass at one rate; fails on the first error
  local p=$1 rate=$2 d rtt lat utc load
  d=$out/pass$p/$rate; mkdir -p "$d"
  "$here/netns_link.sh" up "$(tbf_of "$rate")" || { failed "$p" "$rate" "netns_link.sh up"; return 1; }
  rtt=$(rtt_us) || { failed "$p" "$rate" "round trip"; return 1; }
  lat=$(python3 -c "print('%.2f' % ($rtt / 2))")
  # The references' repeats, interleaved: a projection stands on every repeat of its
  # reference point, and its band on their spread.
  local k refs=()
  for ((k = 0; k < ref_repeats; k++)); do
    on_node1 "$d/one-$k.log" "exec mpirun -n 1 --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/one-$k" \
      || { failed "$p" "$rate" "one-$k ($d/one-$k.log)"; return 1; }
    on_node1 "$d/pack-$k.log" "exec mpirun -n 2 --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/pack-$k" \
      || { failed "$p" "$rate" "pack-$k ($d/pack-$k.log)"; return 1; }
    refs+=("$d/one-$k" "$d/pack-$k")
  done
  across 2 "$dir/hostfile" "$d/spread.log" train "${flags[@]}" --out "$d/spread" \
    || { failed "$p" "$rate" "spread ($d/spread.log)"; return 1; }
  utc=$(date -u +%Y-%m-%dT%H:%M:%SZ); load=$(cut -d' ' -f1 /proc/loadavg)
  across 2 "$dir/hostfile" "$d/sweep.log" "${sweep[@]}" --out "$d/sweep" \
    || { failed "$p" "$rate" "sweep ($d/sweep.log)"; return 1; }
  mkdir -p "$d/spec" "$d/swept"
  "$bin" reduce --no-plots --link "$(spec_of "$rate" "$lat")" --project-shape 2x1 \
    --out "$d/spec" "${refs[@]}" "$d/spread" >"$d/spec.log" 2>&1 \
    || { failed "$p" "$rate" "reduce, spec ($d/spec.log)"; return 1; }
  "$bin" reduce --no-plots --interconnect "$d/sweep" --project-to 2 \
    --out "$d/swept" "${refs[@]}" "$d/spread" >"$d/swept.log" 2>&1 \
    || { failed "$p" "$rate" "reduce, sweep ($d/swept.log)"; return 1; }
  echo "$rtt" >"$d/rtt_us"
  python3 -c "$FORECAST_PY" "$d" "$out" "$p" "$rate" "$utc" "$load" \
    || { failed "$p" "$rate" "forecast lines (projection.csv in $d/spec, $d/swept)"; return 1; }
}

# ---------------------------------------------------------------- 2 nodes × 2 (reported)
pass_2x2() {  # pass_2x2 PASS RATE: one line, the projected 2 × 2 step from the spec and the sweep, and the measured one
  local p=$1 rate=$2 d rtt lat
  d=$out/pass$p/$rate; mkdir -p "$d"
  "$here/netns_link.sh" up "$(tbf_of "$rate")" || { failed "$p" "$rate" "netns_link.sh up"; return 1; }
  printf 'node1 slots=2\nnode2 slots=2\n' >"$dir/hostfile22"
  rtt=$(rtt_us) || { failed "$p" "$rate" "round trip"; return 1; }
  lat=$(python3 -c "print('%.2f' % ($rtt / 2))")
  on_node1 "$d/one.log" "exec mpirun -n 1 --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/one" || { failed "$p" "$rate" one; return 1; }
  on_node1 "$d/pack4.log" "exec mpirun -n 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH $bin train ${flags[*]} --out $d/pack4" || { failed "$p" "$rate" pack4; return 1; }
  across 4 "$dir/hostfile22" "$d/hier.log" train "${flags[@]}" --out "$d/hier" || { failed "$p" "$rate" hier; return 1; }
  on_node1 "$d/sweep-node.log" "exec mpirun -n 4 --oversubscribe --bind-to none -x LD_LIBRARY_PATH $bin ${sweep[*]} --out $d/sweep-node" || { failed "$p" "$rate" sweep-node; return 1; }
  across 4 "$dir/hostfile22" "$d/sweep-2x2.log" "${sweep[@]}" --levels intra-node,inter-node --out "$d/sweep-2x2" || { failed "$p" "$rate" sweep-2x2; return 1; }
  mkdir -p "$d/spec" "$d/swept"
  "$bin" reduce --no-plots --interconnect "$d/sweep-node" --link "$(spec_of "$rate" "$lat")" --project-shape 2x2 \
    --out "$d/spec" "$d/one" "$d/pack4" "$d/hier" >"$d/spec.log" 2>&1 || { failed "$p" "$rate" "reduce, spec ($d/spec.log)"; return 1; }
  "$bin" reduce --no-plots --interconnect "$d/sweep-2x2" --project-shape 2x2 \
    --out "$d/swept" "$d/one" "$d/pack4" "$d/hier" >"$d/swept.log" 2>&1 || { failed "$p" "$rate" "reduce, sweep ($d/swept.log)"; return 1; }
  python3 - "$d" "$lat" <<'EOF' | tee -a "$out/hier-2x2.txt"
import csv, json, sys
d, lat = sys.argv[1], sys.argv[2]
rid = json.load(open(d + "/pack4/manifest.json"))["run_id"]
def row(name):
    r = [x for x in csv.DictReader(open("%s/%s/projection.csv" % (d, name)))
         if x["scaling"] == "weak" and x["nodes"] == "2" and x["ranks_per_node"] == "2" and rid in (x.get("from_runs") or x.get("from_run") or "").split()]
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
}

for p in $(seq 1 "$passes"); do
  for rate in "${rates[@]}"; do
    "pass_$shape" "$p" "$rate"
  done
done
if [ "$shape" = 2x1 ]; then
  if [ -f "$out/forecast.csv" ]; then
    python3 -c "$SUMMARY_PY" "$out"
  else
    echo "netns_hier.sh: no pass completed; nothing in $out/forecast.csv" >&2; exit 1
  fi
fi
[ ! -s "$out/failed.txt" ] || { echo "netns_hier.sh: some passes failed, see $out/failed.txt" >&2; exit 1; }
