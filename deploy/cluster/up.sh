#!/usr/bin/env bash
# Starts a throwaway Kubernetes cluster for tests of the carve DRA driver: a
# control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) on 127.0.0.1 and, unless CARVE_CLUSTER_NODE=0, one real node:
# containerd 2.x (with CDI) + kubelet + bridge CNI, on the machine's own
# address (node.sh). Tests that only need an API server can skip the node;
# they may still create kubelet-less fake Nodes as plain API objects.
#
# The node needs root. It runs images built locally (deploy/images/build.sh,
# imported with deploy/images/import.sh; pods use imagePullPolicy: Never):
#   carve-test:latest   busybox-static (sh, ls, cat, env, sleep, ip, ...)
#   carve-pause:latest  the pod sandbox image
# A DaemonSet running carve's kubelet plugin hostPath-mounts
# $KUBELET_ROOT_DIR/plugins and $KUBELET_ROOT_DIR/plugins_registry, and writes
# CDI specs to $CARVE_CDI_DIR (all three are in cluster.env). Pods cannot reach
# the apiserver on the pod network (it listens on 127.0.0.1 only and there is
# no kube-proxy): such a pod needs hostNetwork: true and
# KUBERNETES_SERVICE_HOST=127.0.0.1, KUBERNETES_SERVICE_PORT=$CARVE_APISERVER_PORT.
# Only one cluster with a node can run per machine (shared cgroup root /carve,
# bridge, ports).
#
# Usage: up.sh
# Prints progress on stderr; the LAST LINE on stdout is the admin kubeconfig
# path, so callers can do KUBECONFIG=$(deploy/cluster/up.sh | tail -n1).
# If the cluster is already up (live pid files), it just prints that path.
# Stop it with down.sh (same environment). A start that fails at any step (or
# is interrupted) stops every daemon it started and keeps the state dir with
# the logs; the next up.sh or down.sh removes it.
#
# up.sh holds the configuration and runs the steps in order; the steps live in
# files it sources: daemons.sh (starting, watching and stopping daemons),
# pki.sh (certificates and kubeconfigs), control-plane.sh (etcd,
# kube-apiserver, controller manager, scheduler) and node.sh (the node).
#
# Environment (all optional):
#   CARVE_CLUSTER_DIR              state dir: pki, kubeconfigs, data, logs, pids
#                                  (default /tmp/carve-cluster)
#   CARVE_ETCD_PORT                etcd client port        (default 23790)
#   CARVE_ETCD_PEER_PORT           etcd peer port          (default 23800)
#   CARVE_APISERVER_PORT           kube-apiserver port     (default 26443)
#   CARVE_CONTROLLER_MANAGER_PORT  controller-manager port (default 20257)
#   CARVE_SCHEDULER_PORT           scheduler port          (default 20259)
#   CARVE_FEATURE_GATES            --feature-gates for all three components
#                                  (default DRAConsumableCapacity=true)
#   CARVE_CLUSTER_TIMEOUT          seconds to wait for each readiness step (60)
#   CARVE_USE_SA_CREDENTIALS       controller manager's
#                                  --use-service-account-credentials (true)
#   K8S_VERSION, CARVE_CACHE_DIR   passed on to build-binaries.sh (K8S_VERSION:
#                                  the release k8s-build/go.mod pins)
#   CONTAINERD_VERSION             passed on to build-containerd.sh
# The node (all optional too):
#   CARVE_CLUSTER_NODES            how many nodes (default 1). 1: the node
#                                  below, on the host's network. 2 or more:
#                                  each node a set of namespaces (nodes.sh),
#                                  the API server on the node network's
#                                  bridge (10.77.0.1), the node lifecycle
#                                  controller on; the CARVE_NODE_* settings
#                                  below are for the single node only
#   CARVE_CLUSTER_NODE             1: start the node (default), 0: control
#                                  plane only
#   CARVE_NODE_NAME                Node name               (default carve-node)
#   CARVE_NODE_IP                  node address (default: eth0's IPv4, else
#                                  the first global IPv4; not loopback)
#   CARVE_CDI_DIR                  CDI spec dir containerd reads, first in its
#                                  cdi_spec_dirs before /var/run/cdi
#                                  (default $CARVE_CLUSTER_DIR/cdi)
#   CARVE_POD_CIDR                 pod network, an IPv4 /24 or larger that no
#                                  host route overlaps (default 10.88.0.0/16)
#   CARVE_CNI_BRIDGE               the pods' bridge interface (default carve0)
#   CARVE_KUBELET_PORT             kubelet API on the node IP   (default 20250)
#   CARVE_KUBELET_HEALTHZ_PORT     kubelet healthz on 127.0.0.1 (default 20248)
#
# The default ports are below the kernel's ephemeral range (32768-60999), so an
# outgoing connection never happens to hold one, and away from the well-known
# Kubernetes ports, so a real cluster on the machine does not collide.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

STATE_DIR=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
STATE_DIR=${STATE_DIR%/}
ETCD_PORT=${CARVE_ETCD_PORT:-23790}
ETCD_PEER_PORT=${CARVE_ETCD_PEER_PORT:-23800}
APISERVER_PORT=${CARVE_APISERVER_PORT:-26443}
KCM_PORT=${CARVE_CONTROLLER_MANAGER_PORT:-20257}
SCHEDULER_PORT=${CARVE_SCHEDULER_PORT:-20259}
# DRAConsumableCapacity is beta and on by default in v1.37, but carve depends
# on it (allowMultipleAllocations, capacity requestPolicy), so it is named
# explicitly: the apiserver silently drops those fields when it is off, and the
# scheduler and controller manager must agree with the apiserver.
# DRAResourceClaimDeviceStatus is deliberately NOT set: it is GA and locked to
# true in v1.37 (setting it false is a startup error, true only logs a warning).
FEATURE_GATES=${CARVE_FEATURE_GATES:-DRAConsumableCapacity=true}
TIMEOUT=${CARVE_CLUSTER_TIMEOUT:-60}
# Each controller runs under its own ServiceAccount, as in real clusters, so
# RBAC gaps (e.g. in the resourceclaim controller's role) show up here too.
# It costs about 5 s of start-up (a token per controller); set false to trade
# that realism for speed.
USE_SA_CREDENTIALS=${CARVE_USE_SA_CREDENTIALS:-true}
SERVICE_CIDR=10.96.0.0/12
NODE=${CARVE_CLUSTER_NODE:-1}
case "$NODE" in 0 | 1) ;; *) echo "[cluster-up] ERROR: CARVE_CLUSTER_NODE must be 0 or 1" >&2; exit 1 ;; esac
NODES=${CARVE_CLUSTER_NODES:-1}
case "$NODES" in [1-9] | [1-9][0-9]) ;; *) echo "[cluster-up] ERROR: CARVE_CLUSTER_NODES must be 1 to 99" >&2; exit 1 ;; esac
[ "$NODES" = 1 ] || [ "$NODE" = 1 ] || { echo "[cluster-up] ERROR: CARVE_CLUSTER_NODES=$NODES with CARVE_CLUSTER_NODE=0" >&2; exit 1; }
# Where the API server listens: loopback for one node on the host's
# network; the node network's bridge, which every node's namespace reaches,
# for several (nodes.sh).
APISERVER_HOST=127.0.0.1
[ "$NODES" = 1 ] || APISERVER_HOST=10.77.0.1
NODE_NAME=${CARVE_NODE_NAME:-carve-node}
NODE_IP=${CARVE_NODE_IP:-}
CDI_DIR=${CARVE_CDI_DIR:-${STATE_DIR}/cdi}
POD_CIDR=${CARVE_POD_CIDR:-10.88.0.0/16}
# The bridge's address: the network address plus one (10.88.0.0 -> 10.88.0.1).
pod_net=${POD_CIDR%/*}
POD_GATEWAY=${pod_net%.*}.$((${pod_net##*.} + 1))
CNI_BRIDGE=${CARVE_CNI_BRIDGE:-carve0}
CNI_NETWORK=carve
KUBELET_PORT=${CARVE_KUBELET_PORT:-20250}
KUBELET_HEALTHZ_PORT=${CARVE_KUBELET_HEALTHZ_PORT:-20248}
SERVICE_IP=10.96.0.1 # first address of SERVICE_CIDR: the `kubernetes` Service

# Every process runs one of these binaries; down.sh knows the same list.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
# Several nodes' daemons run inside the nodes, and are theirs to watch.
[ "$NODE" = 0 ] || [ "$NODES" != 1 ] || COMPONENTS+=(containerd kubelet)

PKI=$STATE_DIR/pki
LOGS=$STATE_DIR/logs
PIDS=$STATE_DIR/pids
ADMIN_KUBECONFIG=$STATE_DIR/admin.kubeconfig
# up.sh only ever deletes a directory carrying this marker, so a mistyped
# CARVE_CLUSTER_DIR (say $HOME) cannot be wiped.
MARKER=$STATE_DIR/.carve-cluster

log() { echo "[cluster-up] $*" >&2; }

# --- serialise up.sh/down.sh ---------------------------------------------
# `go test ./...` runs packages in parallel, and each may call up.sh; without a
# lock two of them would race to build binaries, generate certs and start
# etcd. The lock file sits beside the state dir, not in it, because down.sh
# deletes the state dir while holding the lock. Daemons are started with fd 9
# closed (see start_daemon in daemons.sh), or they would hold the lock until
# they die.
mkdir -p "$(dirname "$STATE_DIR")"
exec 9>"$STATE_DIR.lock"
if ! flock -n 9; then
  log "waiting for another up.sh/down.sh on $STATE_DIR"
  flock 9
fi

# --- helpers ----------------------------------------------------------------
# shellcheck source-path=SCRIPTDIR source=daemons.sh
. "$here/daemons.sh"
# shellcheck source-path=SCRIPTDIR source=pki.sh
. "$here/pki.sh"
# shellcheck source-path=SCRIPTDIR source=control-plane.sh
. "$here/control-plane.sh"

# --- already running? -------------------------------------------------------
alive=0
for c in "${COMPONENTS[@]}"; do
  if pid_of "$c" >/dev/null; then alive=$((alive + 1)); fi
done
# Several nodes: each node's PID 1 is alive too, and cluster.env says as
# many nodes as are wanted (a single node's says none).
nodes_match=1
if [ -f "$STATE_DIR/cluster.env" ]; then
  have=$(sed -n 's/^CARVE_CLUSTER_NODES=//p' "$STATE_DIR/cluster.env")
  [ "${have:-1}" = "$NODES" ] || nodes_match=0
  for p in $(sed -n 's/^CARVE_NODE_[0-9]*_PID=//p' "$STATE_DIR/cluster.env"); do
    gone "$p" && nodes_match=0
  done
fi
# cluster.env is written last, so its presence means a start that finished.
if [ $alive -eq ${#COMPONENTS[@]} ] && [ -f "$STATE_DIR/cluster.env" ] && [ $nodes_match = 1 ]; then
  log "already running in $STATE_DIR"
  echo "$ADMIN_KUBECONFIG"
  exit 0
fi
if [ $alive -gt 0 ]; then
  # Half a cluster (e.g. one component crashed, or a control plane without the
  # node that is now wanted) is not worth repairing: its state is throwaway,
  # so start again from nothing.
  log "only $alive of ${#COMPONENTS[@]} components alive in $STATE_DIR; restarting from scratch"
fi
if [ -e "$STATE_DIR" ]; then
  [ -f "$MARKER" ] || { log "ERROR: $STATE_DIR exists but was not made by up.sh; refusing to reuse it"; exit 1; }
  # down.sh rather than rm -rf: a node leaves processes, mounts, cgroups and
  # host settings behind that must be undone first. We hold the lock already.
  CARVE_CLUSTER_LOCK_HELD=1 "$here/down.sh"
  [ ! -e "$STATE_DIR" ] || { log "ERROR: down.sh could not remove $STATE_DIR"; exit 1; }
fi

# --- prerequisites ----------------------------------------------------------
# The certificate tool (Go, built once into the cache).
pki_prepare || exit 1

# Port conflicts give confusing errors deep in component logs; catch them here.
# A few seconds of grace: right after stop_all (or down.sh) a killed Go
# process can still hold its listening socket, because its main thread shows
# as a zombie while the other threads are still exiting.
for p in "CARVE_ETCD_PORT=$ETCD_PORT" "CARVE_ETCD_PEER_PORT=$ETCD_PEER_PORT" \
  "CARVE_APISERVER_PORT=$APISERVER_PORT" "CARVE_CONTROLLER_MANAGER_PORT=$KCM_PORT" \
  "CARVE_SCHEDULER_PORT=$SCHEDULER_PORT"; do
  for _ in $(seq 50); do
    port_open "${p#*=}" || break
    sleep 0.1
  done
  if port_open "${p#*=}"; then
    log "ERROR: port ${p#*=} on 127.0.0.1 is in use; set ${p%%=*} to a free port"
    exit 1
  fi
done

# Built once and cached outside the repo; a no-op when the binaries exist,
# about 10 minutes cold (its progress goes to stderr).
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
[ "$NODE" = 0 ] || binaries+=(kubelet)
BIN_DIR=$("$here/build-binaries.sh" "${binaries[@]}" | tail -n1)
[ -x "$BIN_DIR/kube-apiserver" ] || { log "ERROR: build-binaries.sh gave no usable bin dir ($BIN_DIR)"; exit 1; }

started=$SECONDS
mkdir -p "$PKI" "$LOGS" "$PIDS" "$STATE_DIR/etcd" "$STATE_DIR/flexvolume"
# etcd warns about a data dir more open than 0700; the pki holds private keys.
chmod 700 "$STATE_DIR" "$PKI" "$STATE_DIR/etcd"
touch "$MARKER"
# Handy for callers: $CARVE_CLUSTER_DIR/bin/kubectl matches the server version.
ln -sfn "$BIN_DIR" "$STATE_DIR/bin"

# From here on up.sh makes the cluster: if the start ends before it is ready,
# in any way (a failed step or check, an error, a signal), the EXIT trap stops
# every daemon it started and keeps the logs. HUP, INT and TERM are trapped
# so they end the script through it; their default would skip it.
STOP_ON_EXIT=1
trap stop_on_failure EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

cluster_pki

# --- the node, part 1 -------------------------------------------------------
# containerd starts now, so it is up by the time the apiserver is; the images
# are built and imported meanwhile.
if [ "$NODES" != 1 ]; then
  # shellcheck source-path=SCRIPTDIR source=nodes.sh
  . "$here/nodes.sh"
  mn_prepare
  mn_certs
elif [ "$NODE" = 1 ]; then
  # shellcheck source-path=SCRIPTDIR source=node.sh
  . "$here/node.sh"
  node_prepare
  node_certs
fi

# --- the control plane --------------------------------------------------------
etcd_start
apiserver_start
if [ "$NODES" != 1 ]; then
  apiserver_wait_ready
  mn_start
  mn_images
else
  [ "$NODE" = 0 ] || node_images
  apiserver_wait_ready
  # The kubelet needs only the apiserver; started now, it registers and gets
  # Ready while the controller manager creates ServiceAccounts (several seconds).
  [ "$NODE" = 0 ] || node_start
fi

# Started only once the apiserver is ready: the controller manager gives up and
# exits if the apiserver is not healthy within 10 s of its start, which can
# happen on a loaded 2-core machine.
controllers_start
controllers_wait_ready

# --- the node, part 2 ---------------------------------------------------------
if [ "$NODES" != 1 ]; then
  mn_wait_ready
else
  [ "$NODE" = 0 ] || node_wait_ready
fi

# For scripts that want the ports without re-deriving the defaults.
cat >"$STATE_DIR/cluster.env" <<EOF
KUBECONFIG=$ADMIN_KUBECONFIG
CARVE_CLUSTER_DIR=$STATE_DIR
CARVE_K8S_BIN_DIR=$BIN_DIR
CARVE_ETCD_PORT=$ETCD_PORT
CARVE_APISERVER_PORT=$APISERVER_PORT
CARVE_CONTROLLER_MANAGER_PORT=$KCM_PORT
CARVE_SCHEDULER_PORT=$SCHEDULER_PORT
CARVE_CLUSTER_NODE=$NODE
EOF
# The node's paths: a DaemonSet with carve's kubelet plugin mounts
# KUBELET_PLUGINS_DIR (its DRA socket) and KUBELET_REGISTRY_DIR (plugin
# registration) and writes CDI specs to CARVE_CDI_DIR.
if [ "$NODES" != 1 ]; then
  mn_env >>"$STATE_DIR/cluster.env"
elif [ "$NODE" = 1 ]; then
  cat >>"$STATE_DIR/cluster.env" <<EOF
CARVE_NODE_NAME=$NODE_NAME
CARVE_NODE_IP=$NODE_IP
KUBELET_ROOT_DIR=$KUBELET_ROOT_DIR
KUBELET_PLUGINS_DIR=$KUBELET_ROOT_DIR/plugins
KUBELET_REGISTRY_DIR=$KUBELET_ROOT_DIR/plugins_registry
CARVE_CDI_DIR=$CDI_DIR
CARVE_CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS
CARVE_CONTAINERD_BIN_DIR=$CONTAINERD_BIN_DIR
CARVE_POD_CIDR=$POD_CIDR
CARVE_CNI_BRIDGE=$CNI_BRIDGE
CARVE_KUBELET_PORT=$KUBELET_PORT
EOF
fi
# Ready: from here on only down.sh stops the cluster.
STOP_ON_EXIT=0
trap - EXIT HUP INT TERM

if [ "$NODES" != 1 ]; then
  log "control plane and $NODES nodes ready in $((SECONDS - started))s (state and logs in $STATE_DIR)"
elif [ "$NODE" = 1 ]; then
  log "control plane and node $NODE_NAME ready in $((SECONDS - started))s (state and logs in $STATE_DIR)"
else
  log "control plane ready in $((SECONDS - started))s (state and logs in $STATE_DIR)"
fi
echo "$ADMIN_KUBECONFIG"
