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
# Stop it with down.sh (same environment).
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
#   K8S_VERSION, CARVE_CACHE_DIR   passed on to build-binaries.sh
#   CONTAINERD_VERSION             passed on to build-containerd.sh
# The node (all optional too):
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
[ "$NODE" = 0 ] || COMPONENTS+=(containerd kubelet)

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
# closed (see start_daemon), or they would hold the lock until they die.
mkdir -p "$(dirname "$STATE_DIR")"
exec 9>"$STATE_DIR.lock"
if ! flock -n 9; then
  log "waiting for another up.sh/down.sh on $STATE_DIR"
  flock 9
fi

# --- helpers ----------------------------------------------------------------

# gone PID: true once PID has exited or is exiting (a zombie: its parent, here
# usually PID 1, has not reaped it yet). Checked via /proc/PID/stat rather than
# /proc/PID/exe, which vanishes early in a process's exit.
gone() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 0
  [ "$st" = Z ]
}

# pid_of NAME: prints the pid from NAME's pid file if that process is alive
# and really is NAME (a stale pid may have been reused). Uses
# /proc/PID/{stat,comm}, which stay valid while a process exits, unlike
# /proc/PID/exe; comm is the binary name cut to 15 characters.
pid_of() {
  local f=$PIDS/$1.pid pid comm
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  ! gone "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [ "$comm" = "${1:0:15}" ] || return 1
  echo "$pid"
}

# port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT
# (bash's /dev/tcp; no extra tools needed).
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_all: kills whatever this state dir's pid files name; used when a start
# fails half way or a half-dead cluster is found. SIGKILL, since the state is
# thrown away anyway and a graceful apiserver shutdown hangs once etcd is gone.
# The state dir (with logs) is kept for debugging; the next up.sh or down.sh
# removes it.
stop_all() {
  local c pid pids="" all
  for c in "${COMPONENTS[@]}"; do
    if pid=$(pid_of "$c"); then
      kill -9 "$pid" 2>/dev/null || true
      pids="$pids $pid"
    fi
  done
  # SIGKILL is asynchronous; wait until they have exited (their sockets can
  # linger a moment longer; the port check before a restart allows for that).
  for _ in $(seq 50); do
    all=1
    for pid in $pids; do
      gone "$pid" || all=0
    done
    [ $all = 0 ] || return 0
    sleep 0.1
  done
}

# fail MSG [COMPONENT...]: prints MSG and the tail of each component's log,
# stops everything, and exits non-zero.
fail() {
  local msg=$1 c
  shift
  log "ERROR: $msg"
  for c in "$@"; do
    if [ -f "$LOGS/$c.log" ]; then
      log "---- last lines of $LOGS/$c.log ----"
      tail -n 25 "$LOGS/$c.log" >&2 || true
    fi
  done
  stop_all
  log "logs kept in $LOGS; run $here/down.sh to clean up"
  exit 1
}

# start_daemon NAME ARGS...: starts $BIN_DIR/NAME detached and records its pid.
# start_daemon_path NAME BINARY ARGS...: the same for a binary elsewhere.
#  - setsid: its own session, so a caller killing its process group (a test
#    harness timing out, the shell's job control) does not take the cluster
#    down with it; down.sh is the way to stop it.
#  - stdin/stdout/stderr redirected, fd 9 (the lock) closed: a caller reading
#    up.sh's stdout through a pipe (e.g. Go's exec.Cmd.Output) would otherwise
#    never see EOF while the daemons live.
#  - the wrapper shell writes its own pid and then execs the binary, so the
#    pid file holds the daemon's pid even if setsid had to fork.
start_daemon() {
  local name=$1
  shift
  start_daemon_path "$name" "$BIN_DIR/$name" "$@"
}
start_daemon_path() {
  local name=$1 bin=$2
  shift 2
  rm -f "$PIDS/$name.pid"
  # shellcheck disable=SC2016 # expanded by the inner sh, on purpose
  setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDS/$name.pid" "$bin" "$@" \
    </dev/null >"$LOGS/$name.log" 2>&1 9>&- &
  # Out of this shell's job table: no "Killed" notices when stop_all kills one.
  disown "$!"
  # Wait for the exec: until then the pid belongs to `sh`, and pid_of (which
  # checks the process name) would take the daemon for dead.
  for _ in $(seq 100); do
    pid_of "$name" >/dev/null && return 0
    sleep 0.05
  done
  fail "$name exited right after starting" "$name"
}

# wait_for DESC COMPONENT CMD...: retries CMD every 0.25 s until it succeeds,
# the component dies, or TIMEOUT passes.
wait_for() {
  local desc=$1 comp=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    pid_of "$comp" >/dev/null || fail "$comp exited while waiting for $desc" "$comp"
    [ $SECONDS -lt $deadline ] || fail "timed out after ${TIMEOUT}s waiting for $desc" "${COMPONENTS[@]}"
    sleep 0.25
  done
}

# write_kubeconfig FILE USER CERT KEY: a kubeconfig with embedded credentials,
# so it stays valid if copied elsewhere.
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: carve
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 <"$3")
    client-key-data: $(base64 -w0 <"$4")
contexts:
- name: carve
  context:
    cluster: carve
    user: $2
current-context: carve
EOF
  chmod 600 "$1"
}

# make_ca NAME CN: a self-signed EC P-256 CA. EC keys because they generate in
# milliseconds; Go's TLS accepts them.
make_ca() {
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$1.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$1.crt" 2>/dev/null
}

# issue CA NAME SUBJECT EXTENSIONS: an EC P-256 key and a certificate for it
# signed by CA (a make_ca name).
issue() {
  local ca=$1 name=$2 subj=$3 ext=$4
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -CAserial "$PKI/$ca.srl" -days 365 -sha256 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# --- already running? -------------------------------------------------------
alive=0
for c in "${COMPONENTS[@]}"; do
  if pid_of "$c" >/dev/null; then alive=$((alive + 1)); fi
done
# cluster.env is written last, so its presence means a start that finished.
if [ $alive -eq ${#COMPONENTS[@]} ] && [ -f "$STATE_DIR/cluster.env" ]; then
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
if ! command -v openssl >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing openssl"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2; }
  else
    log "ERROR: openssl is required (apt-get install openssl)"
    exit 1
  fi
fi

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

# --- certificates -------------------------------------------------------------
# One CA signs everything: apiserver serving cert, client certs for the admin,
# controller manager and scheduler, and the apiserver's kubelet client cert
# (unused until a kubelet exists, but cheap). Fresh on every cold start.
# A second CA is the front-proxy (request-header) CA, as kubeadm sets up: the
# controller manager and scheduler read it from the
# extension-apiserver-authentication ConfigMap for delegated authentication
# and log an error every few seconds, forever, when it is missing; it also
# makes aggregated API servers work should a test need one.
log "generating certificates in $PKI"
make_ca ca carve-test-ca
make_ca front-proxy-ca carve-test-front-proxy-ca
server_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
issue ca apiserver "/CN=kube-apiserver" "$server_ext"
# system:masters bypasses RBAC: tests act as cluster admin.
issue ca admin "/O=system:masters/CN=carve-admin" "$client_ext"
# These user names are what the bootstrap RBAC roles are bound to.
issue ca controller-manager "/CN=system:kube-controller-manager" "$client_ext"
issue ca scheduler "/CN=system:kube-scheduler" "$client_ext"
issue ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
issue front-proxy-ca front-proxy-client "/CN=front-proxy-client" "$client_ext"
# Service-account tokens are signed with an RSA key: RS256 is what every
# token consumer supports.
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null

write_kubeconfig "$ADMIN_KUBECONFIG" carve-admin "$PKI/admin.crt" "$PKI/admin.key"
write_kubeconfig "$STATE_DIR/controller-manager.kubeconfig" system:kube-controller-manager \
  "$PKI/controller-manager.crt" "$PKI/controller-manager.key"
write_kubeconfig "$STATE_DIR/scheduler.kubeconfig" system:kube-scheduler \
  "$PKI/scheduler.crt" "$PKI/scheduler.key"

# --- the node, part 1 -------------------------------------------------------
# containerd starts now, so it is up by the time the apiserver is; the images
# are built and imported meanwhile.
if [ "$NODE" = 1 ]; then
  # shellcheck source-path=SCRIPTDIR source=node.sh
  . "$here/node.sh"
  node_prepare
  node_certs
fi

# --- etcd -----------------------------------------------------------------------
# Plain HTTP on loopback: only the apiserver talks to it. --unsafe-no-fsync
# because the data is thrown away anyway and fsync dominates write latency on
# a VM disk.
log "starting etcd on 127.0.0.1:$ETCD_PORT"
start_daemon etcd \
  --name=carve \
  --data-dir="$STATE_DIR/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="carve=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync \
  --log-level=warn
wait_for "etcd to listen" etcd port_open "$ETCD_PORT"

# --- kube-apiserver -----------------------------------------------------------
# - resource.k8s.io/v1 is GA and served by default in v1.37; the runtime-config
#   only makes that explicit (and keeps working if a default changes).
#   ValidatingAdmissionPolicy is GA and on by default, nothing to set.
# - --endpoint-reconciler-type=none: the reconciler would publish 127.0.0.1 as
#   the `kubernetes` Service endpoint, which is invalid for an Endpoints object.
# - TaintNodesByCondition is disabled because no kubelet ever clears the
#   not-ready taint it puts on new Node objects, so nothing would schedule onto
#   the fake nodes tests create.
# - --cert-dir points into the state dir so nothing is ever written to
#   /var/run/kubernetes (the default).
log "starting kube-apiserver on https://127.0.0.1:$APISERVER_PORT"
start_daemon kube-apiserver \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 \
  --secure-port="$APISERVER_PORT" \
  --cert-dir="$PKI" \
  --tls-cert-file="$PKI/apiserver.crt" \
  --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP \
  --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
  --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User \
  --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
  --proxy-client-key-file="$PKI/front-proxy-client.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --authorization-mode=Node,RBAC \
  --endpoint-reconciler-type=none \
  --disable-admission-plugins=TaintNodesByCondition \
  --allow-privileged=true \
  --runtime-config=resource.k8s.io/v1=true \
  --feature-gates="$FEATURE_GATES" \
  --profiling=false \
  --v=1
kubectl_() { "$BIN_DIR/kubectl" --kubeconfig="$ADMIN_KUBECONFIG" --request-timeout=5s "$@"; }
# /readyz (not /healthz) also waits for the RBAC bootstrap roles the
# controller manager and scheduler need.
[ "$NODE" = 0 ] || node_images
wait_for "kube-apiserver /readyz" kube-apiserver kubectl_ get --raw /readyz

# The kubelet needs only the apiserver; started now, it registers and gets
# Ready while the controller manager creates ServiceAccounts (several seconds).
[ "$NODE" = 0 ] || node_start

# --- controller manager and scheduler -------------------------------------------
# Started only once the apiserver is ready: the controller manager gives up and
# exits if the apiserver is not healthy within 10 s of its start, which can
# happen on a loaded 2-core machine.
#  - node-lifecycle-controller is off: with no kubelet it would mark every Node
#    NotReady and taint/evict from it.
#  - --use-service-account-credentials: see USE_SA_CREDENTIALS above; the
#    token controller signs with --service-account-private-key-file.
#  - --flex-volume-plugin-dir: the default is under /usr/libexec, which the
#    controller manager would create.
#  - the cluster-signing files let the CSR signer issue kubelet certs later.
log "starting kube-controller-manager and kube-scheduler"
start_daemon kube-controller-manager \
  --kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 \
  --secure-port="$KCM_PORT" \
  --leader-elect=false \
  --controllers='*,-node-lifecycle-controller' \
  --flex-volume-plugin-dir="$STATE_DIR/flexvolume" \
  --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" \
  --use-service-account-credentials="$USE_SA_CREDENTIALS" \
  --cluster-signing-cert-file="$PKI/ca.crt" \
  --cluster-signing-key-file="$PKI/ca.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --feature-gates="$FEATURE_GATES" \
  --profiling=false \
  --v=1
# The scheduler takes its client settings from a config file: with --config,
# the old --kubeconfig/--leader-elect flags would be ignored.
cat >"$STATE_DIR/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $STATE_DIR/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
start_daemon kube-scheduler \
  --config="$STATE_DIR/scheduler.yaml" \
  --authentication-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 \
  --secure-port="$SCHEDULER_PORT" \
  --feature-gates="$FEATURE_GATES" \
  --profiling=false \
  --v=1

# Pods cannot be created until the controller manager has made the namespace's
# `default` ServiceAccount; that is the sign it is working.
wait_for "the default ServiceAccount" kube-controller-manager \
  kubectl_ get serviceaccount default --namespace default
pid_of kube-scheduler >/dev/null || fail "kube-scheduler exited" kube-scheduler

# --- the node, part 2 ---------------------------------------------------------
[ "$NODE" = 0 ] || node_wait_ready

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
if [ "$NODE" = 1 ]; then
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

if [ "$NODE" = 1 ]; then
  log "control plane and node $NODE_NAME ready in $((SECONDS - started))s (state and logs in $STATE_DIR)"
else
  log "control plane ready in $((SECONDS - started))s (state and logs in $STATE_DIR)"
fi
echo "$ADMIN_KUBECONFIG"
