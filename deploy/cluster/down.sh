#!/usr/bin/env bash
# Stops the control plane that up.sh started and removes its state dir.
# Safe to run when nothing is running, and more than once.
#
# Usage: down.sh        (use the same CARVE_CLUSTER_DIR as up.sh)
set -euo pipefail

STATE_DIR=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
STATE_DIR=${STATE_DIR%/}
PIDS=$STATE_DIR/pids
MARKER=$STATE_DIR/.carve-cluster
# Reverse start order: clients first, etcd last, so nothing logs a storm of
# connection errors on the way down.
COMPONENTS=(kube-scheduler kube-controller-manager kube-apiserver etcd)

log() { echo "[cluster-down] $*" >&2; }

# Same lock as up.sh, so a down.sh cannot pull the state dir out from under an
# up.sh that is still starting (or the other way round).
if [ -d "$(dirname "$STATE_DIR")" ]; then
  exec 9>"$STATE_DIR.lock"
  if ! flock -n 9; then
    log "waiting for another up.sh/down.sh on $STATE_DIR"
    flock 9
  fi
fi

# Prints the pids of our components: those named by the pid files, plus any
# process running one of the component binaries whose command line mentions
# the state dir (every component's flags do). The second pass catches daemons
# whose pid file was lost, e.g. when up.sh was killed between start and write.
# Matching on the executable name guards against a reused pid.
our_pids() {
  local c pid exe cmdline p
  for c in "${COMPONENTS[@]}"; do
    [ -f "$PIDS/$c.pid" ] || continue
    pid=$(cat "$PIDS/$c.pid" 2>/dev/null) || continue
    [ -n "$pid" ] || continue
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    [ "$(basename "$exe")" = "$c" ] && echo "$pid"
  done
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case "$(basename "$exe")" in
      etcd | kube-apiserver | kube-controller-manager | kube-scheduler) ;;
      *) continue ;;
    esac
    cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    case "$cmdline" in
      *"$STATE_DIR/"*) echo "${p#/proc/}" ;;
    esac
  done
}

pids=$(our_pids | sort -un)
if [ -n "$pids" ]; then
  log "stopping $(echo $pids | wc -w) process(es) of $STATE_DIR"
  # SIGTERM first: etcd and the apiserver shut down cleanly in well under a
  # second when asked; a component stuck for 10 s gets SIGKILL.
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  for _ in $(seq 40); do
    left=""
    for pid in $pids; do
      kill -0 "$pid" 2>/dev/null && left="$left $pid"
    done
    [ -z "$left" ] && break
    sleep 0.25
  done
  if [ -n "$left" ]; then
    log "killing stuck process(es):$left"
    # shellcheck disable=SC2086
    kill -9 $left 2>/dev/null || true
    sleep 0.5
  fi
fi

if [ -e "$STATE_DIR" ]; then
  if [ -f "$MARKER" ]; then
    rm -rf "$STATE_DIR"
    log "removed $STATE_DIR"
  else
    # Never rm -rf a directory up.sh did not create (a mistyped CARVE_CLUSTER_DIR).
    log "WARNING: $STATE_DIR was not made by up.sh; left in place"
  fi
fi
# The lock file ($STATE_DIR.lock) stays: deleting a lock file that another
# process may be waiting on lets two holders in at once. It is empty.
