#!/usr/bin/env bash
# Runs a command inside node I of the multi-node local cluster (up.sh with
# CARVE_CLUSTER_NODES >= 2): in its network, mount, UTS and PID namespaces,
# where it sees the node's interfaces, /sys, /run and /var.
#
# Usage: node-exec.sh I COMMAND [ARG...]   (CARVE_CLUSTER_DIR as for up.sh)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NODE_INDEX COMMAND [ARG...]" >&2; exit 2; }
STATE_DIR=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
i=$1
shift
case "$i" in [1-9] | [1-9][0-9]) ;; *) echo "node index '$i' is not a number from 1" >&2; exit 2 ;; esac
# Read the one key rather than sourcing cluster.env.
pid=$(sed -n "s/^CARVE_NODE_${i}_PID=//p" "$STATE_DIR/cluster.env" 2>/dev/null || true)
[ -n "$pid" ] || { echo "no node $i in $STATE_DIR/cluster.env (a multi-node cluster?)" >&2; exit 1; }
exec nsenter --target "$pid" --mount --uts --net --pid -- "$@"
