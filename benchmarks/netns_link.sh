#!/usr/bin/env bash
# Two "nodes" (network namespaces node1, node2, a veth between them) for measuring a
# link by hand, as tests/cluster/netns.sh builds them; as root.
#
#   benchmarks/netns_link.sh up ["rate 1gbit burst 128kb latency 20ms"]   # tbf on both ends
#   benchmarks/netns_link.sh run PROGRAM ARGS...    # 2 ranks, one per node, over the veth
#   benchmarks/netns_link.sh down
#
# With the C programs beside it (`mpicc -O2 -o /tmp/idle benchmarks/link_idle_c.c`):
#   benchmarks/netns_link.sh run /tmp/idle 1048576 5 0 10     # 5 × 1 MiB back to back
#   benchmarks/netns_link.sh run /tmp/idle 1048576 5 21 10    # the same after 21 ms idle
set -euo pipefail
NET=10.213.77
dir=/tmp/ddpbench-netns-link
if [ "${1:-}" = up ] || [ "${1:-}" = down ]; then
    # tests/cluster/netns.sh holds this lock while its namespaces, of the same names, live.
    exec 9>/tmp/ddpbench-netns-test.lock
    flock -n 9 || { echo "tests/cluster/netns.sh is running: its node1/node2 are in use" >&2; exit 1; }
fi
case "${1:-}" in
up)
    for ns in node1 node2; do ip netns del "$ns" 2>/dev/null || true; done
    ip netns add node1 && ip netns add node2
    ip link add veth-n1 netns node1 type veth peer name veth-n2 netns node2
    ip -n node1 addr add "$NET.1/24" dev veth-n1 && ip -n node2 addr add "$NET.2/24" dev veth-n2
    for ns in node1 node2; do ip -n "$ns" link set lo up; done
    ip -n node1 link set veth-n1 up && ip -n node2 link set veth-n2 up
    if [ -n "${2:-}" ]; then
        # shellcheck disable=SC2086
        ip netns exec node1 tc qdisc add dev veth-n1 root tbf $2
        # shellcheck disable=SC2086
        ip netns exec node2 tc qdisc add dev veth-n2 root tbf $2
    fi
    mkdir -p "$dir"
    printf '#!/bin/sh\nhost=$1; shift\nexec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"\n' >"$dir/agent.sh"
    chmod +x "$dir/agent.sh"
    printf 'node1 slots=1\nnode2 slots=1\n' >"$dir/hostfile"
    sleep 0.5 ;;
run)
    shift
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    pass=${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH}
    "$dir/agent.sh" node1 "exec mpirun -n 2 --hostfile $dir/hostfile --bind-to none --mca plm_rsh_agent $dir/agent.sh \
        --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
        $pass -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM $*" ;;
down)
    for ns in node1 node2; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir" ;;
*)
    sed -n '2,11p' "$0"; exit 2 ;;
esac
