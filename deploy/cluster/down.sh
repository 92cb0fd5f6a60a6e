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

# our_pids NAME...: prints the pids of our processes running one of the NAME
# binaries: those named by the pid files, plus any process running such a
# binary whose command line mentions the state dir (every component's flags
# do). The second pass catches daemons whose pid file was lost, e.g. when
# up.sh was killed between start and write. Matching on the executable name
# guards against a reused pid.
our_pids() {
  local c pid exe cmdline p
  for c in "$@"; do
    [ -f "$PIDS/$c.pid" ] || continue
    pid=$(cat "$PIDS/$c.pid" 2>/dev/null) || continue
    [ -n "$pid" ] || continue
    # comm (the binary name cut to 15 characters) rather than exe: it stays
    # readable while a process exits.
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${c:0:15}" ] && echo "$pid"
  done
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case " $* " in
      *" $(basename "$exe") "*) ;;
      *) continue ;;
    esac
    cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    case "$cmdline" in
      *"$STATE_DIR/"*) echo "${p#/proc/}" ;;
    esac
  done | sort -un
}

# gone PID: true once PID has exited; a zombie (not yet reaped by whoever
# inherited it) counts as gone, it holds no ports or files.
gone() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 0
  [ "$st" = Z ]
}

# stop NAME...: SIGTERM to those components, up to 10 s for them to exit
# (they shut down cleanly in 1-3 s), then SIGKILL for any that hang.
stop() {
  local pids left pid
  pids=$(our_pids "$@")
  [ -n "$pids" ] || return 0
  log "stopping $*"
  # shellcheck disable=SC2086
  kill $pids 2>/dev/null || true
  for _ in $(seq 40); do
    left=""
    for pid in $pids; do
      gone "$pid" || left="$left $pid"
    done
    [ -z "$left" ] && return 0
    sleep 0.25
  done
  log "killing stuck process(es):$left"
  # shellcheck disable=SC2086
  kill -9 $left 2>/dev/null || true
  sleep 0.5
}

# Two stages: etcd must outlive the apiserver. Killed together, the apiserver's
# graceful shutdown hangs retrying etcd and needs SIGKILL after the timeout
# (measured: still alive after 16 s).
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd

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
