#!/usr/bin/env bash
# A control plane without kubelets for the scheduler's benchmark and
# integration test: deploy/cluster/up.sh with CARVE_CLUSTER_NODE=0 on this
# module's own directory and ports (so it never touches the default
# cluster), after which the controller manager is restarted with a higher
# API rate limit: at its default 20 QPS, making a thousand pods' claims from
# their templates would take minutes per run.
#
# Usage: cluster.sh up     prints the admin kubeconfig on its last line
#        cluster.sh down
# Environment: CARVE_SCHED_CLUSTER_DIR and CARVE_SCHED_*_PORT (defaults
# below) become up.sh's CARVE_CLUSTER_DIR and ports. They have their own
# names so that a CARVE_CLUSTER_DIR exported by the top-level Makefile (the
# default cluster's) can never point this script at another cluster.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

export CARVE_CLUSTER_DIR=${CARVE_SCHED_CLUSTER_DIR:-/tmp/carve-sched}
export CARVE_CLUSTER_NODE=0
export CARVE_ETCD_PORT=${CARVE_SCHED_ETCD_PORT:-53790}
export CARVE_ETCD_PEER_PORT=${CARVE_SCHED_ETCD_PEER_PORT:-53800}
export CARVE_APISERVER_PORT=${CARVE_SCHED_APISERVER_PORT:-56443}
export CARVE_CONTROLLER_MANAGER_PORT=${CARVE_SCHED_CONTROLLER_MANAGER_PORT:-50257}
export CARVE_SCHEDULER_PORT=${CARVE_SCHED_SCHEDULER_PORT:-50259}
KCM_QPS=${CARVE_KCM_QPS:-500}

log() { echo "[scheduler-cluster] $*" >&2; }

case "${1:-}" in
up)
  kubeconfig=$("$repo/deploy/cluster/up.sh" | tail -n1)
  pidfile=$CARVE_CLUSTER_DIR/pids/kube-controller-manager.pid
  pid=$(cat "$pidfile")
  if ! tr '\0' '\n' <"/proc/$pid/cmdline" | grep -q -- '--kube-api-qps'; then
    mapfile -d '' argv <"/proc/$pid/cmdline"
    log "restarting kube-controller-manager (pid $pid) with --kube-api-qps=$KCM_QPS"
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    # Same command line, same pid and log files, so down.sh stops it as before.
    setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "${argv[@]}" \
      --kube-api-qps="$KCM_QPS" --kube-api-burst=$((KCM_QPS * 2)) \
      </dev/null >>"$CARVE_CLUSTER_DIR/logs/kube-controller-manager.log" 2>&1 9>&- &
    disown "$!"
    for _ in $(seq 100); do
      port_pid=$(cat "$pidfile" 2>/dev/null || true)
      [ -n "$port_pid" ] && [ "$(cat "/proc/$port_pid/comm" 2>/dev/null)" = kube-controller ] && break
      sleep 0.05
    done
  fi
  echo "$kubeconfig"
  ;;
down)
  "$repo/deploy/cluster/down.sh"
  ;;
*)
  echo "usage: $0 up|down" >&2
  exit 2
  ;;
esac
