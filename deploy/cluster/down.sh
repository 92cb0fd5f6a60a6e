#!/usr/bin/env bash
# Stops the cluster that up.sh started (control plane and, if it was started,
# the node: kubelet, containerd, every pod) and removes everything it made:
# the state dir, and on the host the node's mounts, cgroups, bridge, network
# namespaces, the paths outside the state dir it created, and the sysctls it
# changed. Safe to run when nothing is running, and more than once.
#
# Usage: down.sh        (use the same CARVE_CLUSTER_DIR as up.sh)
# CARVE_CLUSTER_LOCK_HELD=1 is for up.sh, which calls it holding the lock.
set -euo pipefail

STATE_DIR=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
STATE_DIR=${STATE_DIR%/}
PIDS=$STATE_DIR/pids
MARKER=$STATE_DIR/.carve-cluster
NODE_DIR=$STATE_DIR/node
log() { echo "[cluster-down] $*" >&2; }

# Same lock as up.sh, so a down.sh cannot pull the state dir out from under an
# up.sh that is still starting (or the other way round).
if [ -d "$(dirname "$STATE_DIR")" ] && [ "${CARVE_CLUSTER_LOCK_HELD:-0}" != 1 ]; then
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

# --- the node ------------------------------------------------------------------
# Only when up.sh started one (it made $NODE_DIR) and the state dir is ours.
# Order matters: the kubelet first (or it restarts what we kill), then every
# pod process, then containerd and its shims (which would otherwise report
# the kills back), then what they leave behind.

# cgroup_dirs: every /carve cgroup directory (the kubelet's cgroupRoot, see
# node.sh; /carve-mn for several nodes) in every v1 hierarchy and the unified one, deepest first.
cgroup_dirs() {
  local hier root=carve
  # Several nodes (nodes.sh) have a root of their own.
  [ ! -f "$NODE_DIR/cgroup-root" ] || root=$(cat "$NODE_DIR/cgroup-root")
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ ! -d "$hier/$root" ] || find "$hier/$root" -depth -type d 2>/dev/null || true
  done
}

# kill_pods: SIGKILL to every process in the /carve cgroups (all pod
# containers and sandboxes; they are in no other pid file or list) until
# none is left. Killing the pause process is not enough: containers of a pod
# without a shared PID namespace live on.
kill_pods() {
  local d pids
  for _ in $(seq 50); do
    pids=$(cgroup_dirs | while read -r d; do cat "$d/cgroup.procs" 2>/dev/null; done | sort -un)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  log "WARNING: processes left in the /carve cgroups: $pids"
}

# unmount_under DIR: unmounts everything mounted at or below DIR, deepest
# first (findmnt lists parents before children; reversed, children come
# first). The kubelet bind-mounts its root dir onto itself (rshared), and
# containerd mounts sandbox /dev/shm, netns (nsfs) files and overlay rootfs;
# pod volumes are tmpfs/bind mounts under the kubelet root dir. A lazy
# unmount is the fallback for one still busy.
unmount_under() {
  local dir=$1 m
  for _ in 1 2 3; do
    local mounts
    mounts=$(findmnt -rn -o TARGET | awk -v d="$dir" '$0 == d || index($0, d "/") == 1' | tac)
    [ -n "$mounts" ] || return 0
    while read -r m; do
      # findmnt -r writes a space as \x20 etc.; printf %b decodes it.
      m=$(printf '%b' "$m")
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done <<<"$mounts"
  done
  log "WARNING: still mounted under $dir: $(findmnt -rn -o TARGET | grep -F "$dir" | tr '\n' ' ')"
  return 1
}

# nodes_down: the nodes of a multi-node cluster (nodes.sh), as listed in
# $NODE_DIR/multi. Each node's PID 1 is SIGKILLed (it ignores SIGTERM; its
# death makes the kernel kill every process of its PID namespace, pods
# included) and waited for, before anything of it is removed; the mount
# namespace and its mounts go with its last process.
nodes_down() {
  local what name pid inits="" left
  while read -r what name; do
    [ "$what" = init ] || continue
    # Only a PID whose parent is unshare is a node's init (a reused PID is
    # left alone).
    pid=$(cut -d' ' -f4 "/proc/$name/stat" 2>/dev/null) || continue
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = unshare ] || continue
    kill -9 "$name" 2>/dev/null || true
    inits="$inits $name"
  done <"$NODE_DIR/multi"
  [ -z "$inits" ] || log "killed the nodes' init processes:$inits"
  for _ in $(seq 100); do
    left=""
    for pid in $inits; do gone "$pid" || left="$left $pid"; done
    [ -n "$left" ] || break
    sleep 0.1
  done
  [ -z "$left" ] || log "WARNING: node init processes still alive:$left"
  node_down
  while read -r what name; do
    case "$what" in
    netns) ip netns del "$name" 2>/dev/null || true ;;
    link) ip link del "$name" 2>/dev/null || true ;;
    esac
  done <"$NODE_DIR/multi"
}

node_down() {
  local f
  stop kubelet
  kill_pods
  stop containerd
  # Shims whose containers are dead exit on their own once containerd asks;
  # with containerd gone they would linger. Their command line names our
  # containerd socket, which is under the state dir.
  stop containerd-shim-runc-v2

  unmount_under "$STATE_DIR" || true
  # Network namespaces are under the state dir (netns_mounts_under_state_dir);
  # these are for a containerd that put them in the default place anyway: only
  # files that appeared after up.sh started (cni-* names from containerd).
  # Without up.sh's list (a multi-node cluster's nodes each have a /run of
  # their own) none is provably ours: the host's containers' are left be.
  for f in /run/netns/cni-*; do
    [ -e "$f" ] && [ -f "$NODE_DIR/netns-before" ] || continue
    grep -qxF "$f" "$NODE_DIR/netns-before" && continue
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
    rm -f "$f"
  done

  if [ -f "$NODE_DIR/bridge" ]; then
    f=$(cat "$NODE_DIR/bridge")
    if [ -n "$f" ] && ip link show "$f" >/dev/null 2>&1; then
      ip link delete "$f" || log "WARNING: could not delete interface $f"
    fi
  fi
  # The veth host ends go with the pods' network namespaces.

  # cgroups: rmdir deepest first; a v1 cgroup can refuse (EBUSY) for a moment
  # after its last process died, hence the retries.
  local d left
  for _ in $(seq 20); do
    left=$(cgroup_dirs | while read -r d; do rmdir "$d" 2>/dev/null || echo "$d"; done)
    [ -n "$left" ] || break
    sleep 0.1
  done
  [ -z "$left" ] || log "WARNING: could not remove cgroups: $left"

  # libcni caches each attachment's result under /var/lib/cni/results
  # (named NETWORK-CONTAINERID-IFNAME); host-local's leases are under the
  # state dir. Only our network's files, in case /var/lib/cni was there.
  if [ -f "$NODE_DIR/cni-network" ]; then
    local net
    net=$(cat "$NODE_DIR/cni-network")
    [ -z "$net" ] || rm -rf /var/lib/cni/results/"$net"-* /var/lib/cni/networks/"$net"
  fi
  # The kubelet's container-log symlinks point into our pod-logs dir.
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE_DIR/*" -delete 2>/dev/null || true
  fi
  # Paths outside the state dir that did not exist before up.sh and do now
  # are ours (/run/containerd, /var/lib/kubelet with device-plugins, ...).
  # Each is checked for mounts first: rm must never cross into a mount.
  if [ -f "$NODE_DIR/host-paths-absent" ]; then
    while read -r f; do
      if [ -z "$f" ] || [ ! -e "$f" ]; then continue; fi
      if [ "$f" = /run/mount ]; then
        rmdir "$f" 2>/dev/null || true
        continue
      fi
      unmount_under "$f" || { log "WARNING: left $f (still mounted)"; continue; }
      rm -rf --one-file-system "$f"
    done <"$NODE_DIR/host-paths-absent"
  fi

  # Sysctls last: the kernel tunables the kubelet wanted, and ip_forward that
  # the bridge plugin turned on.
  if [ -f "$NODE_DIR/sysctl.orig" ]; then
    while IFS= read -r f; do
      [ -n "$f" ] || continue
      sysctl -qw "$f" >/dev/null 2>&1 || log "WARNING: could not restore sysctl $f"
    done <"$NODE_DIR/sysctl.orig"
  fi
}

# Two stages: etcd must outlive the apiserver. Killed together, the apiserver's
# graceful shutdown hangs retrying etcd and needs SIGKILL after the timeout
# (measured: still alive after 16 s). The node goes first: a kubelet whose
# apiserver vanished keeps retrying, but stops fine either way.
if [ -f "$MARKER" ] && [ -f "$NODE_DIR/multi" ]; then
  nodes_down
elif [ -f "$MARKER" ] && [ -d "$NODE_DIR" ]; then
  node_down
fi
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd

if [ -e "$STATE_DIR" ]; then
  if [ -f "$MARKER" ]; then
    # Nothing may be mounted inside it any more (unmount_under above); if
    # something is, --one-file-system keeps rm from following it onto the
    # host's files.
    unmount_under "$STATE_DIR" || true
    rm -rf --one-file-system "$STATE_DIR" || log "WARNING: could not remove all of $STATE_DIR"
    log "removed $STATE_DIR"
  else
    # Never rm -rf a directory up.sh did not create (a mistyped CARVE_CLUSTER_DIR).
    log "WARNING: $STATE_DIR was not made by up.sh; left in place"
  fi
fi
# The lock file ($STATE_DIR.lock) stays: deleting a lock file that another
# process may be waiting on lets two holders in at once. It is empty.
