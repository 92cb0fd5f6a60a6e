# shellcheck shell=bash disable=SC2154,SC2153 # here, CDI_DIR...: set by up.sh
# The real node of the local test cluster: containerd 2.x (with CDI), a
# kubelet, bridge CNI. Sourced by up.sh (not run on its own): it uses up.sh's
# variables (STATE_DIR, PKI, LOGS, BIN_DIR, ...) and helpers (log; fail,
# start_daemon, wait_for from daemons.sh; issue, write_kubeconfig from pki.sh;
# kubectl_ from control-plane.sh). down.sh undoes all of it; the host changes
# it makes are listed there.
#
# Everything it can put under the state dir goes there. What cannot, and what
# down.sh therefore cleans by hand:
#   /run/containerd (shim sockets when the state dir path is too long),
#   /var/lib/kubelet/device-plugins (hard-coded in the kubelet),
#   /var/lib/cni (libcni's result cache), /var/log/containers (kubelet
#   symlinks), the cgroup root /carve in every hierarchy, the bridge, the
#   sysctls the kubelet insists on, and ip_forward (set by the bridge plugin).

NODE_DIR=$STATE_DIR/node
CONTAINERD_DIR=$STATE_DIR/containerd
CONTAINERD_ADDRESS=$CONTAINERD_DIR/containerd.sock
KUBELET_ROOT_DIR=$STATE_DIR/kubelet
CNI_DIR=$STATE_DIR/cni
IMAGES_DIR=$STATE_DIR/images
# The sandbox image containerd pins; cluster-images.sh builds it.
PAUSE_IMAGE=docker.io/library/carve-pause:latest
# Debian's runc and CNI plugins (apt packages runc, containernetworking-plugins).
RUNC=/usr/sbin/runc
CNI_BIN_DIR=/usr/lib/cni

# The sysctls the kubelet requires (pkg/kubelet/cm setupKernelTunables): it
# sets them itself unless protectKernelDefaults is on, in which case it refuses
# to start when they differ. We set them (saving the old values) and turn
# protectKernelDefaults on, so the kubelet changes nothing behind our back and
# down.sh knows exactly what to put back. ip_forward is not set here: the
# bridge plugin turns it on (isGateway); it is saved so down.sh restores it.
KERNEL_TUNABLES=(vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1
  kernel.keys.root_maxkeys=1000000 kernel.keys.root_maxbytes=25000000)
SAVED_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv4.conf.all.forwarding)
# Host paths the node may create outside the state dir. up.sh records which
# ones are absent before it starts; down.sh removes those (and only those).
# /run/mount is libmount's (mount/umount's) table of userspace mount options;
# down.sh only removes it when empty.
HOST_PATHS=(/run/containerd /var/lib/kubelet /var/lib/cni /var/log/containers /var/log/pods
  /usr/libexec/kubernetes /run/nri /opt/containerd /opt/cni /etc/cni /run/netns /var/run/cdi /etc/cdi
  /run/mount)

# node_prepare: checks and host set-up that need no running control plane;
# ends by starting containerd, which then comes up while etcd and the
# apiserver start.
node_prepare() {
  [ "$(id -u)" = 0 ] || { log "ERROR: the node needs root (or set CARVE_CLUSTER_NODE=0)"; exit 1; }

  # --- packages -------------------------------------------------------------
  local pkgs=()
  [ -x "$RUNC" ] || pkgs+=(runc)
  [ -x "$CNI_BIN_DIR/bridge" ] || pkgs+=(containernetworking-plugins)
  { ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic" || pkgs+=(busybox-static)
  if [ ${#pkgs[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { log "ERROR: install ${pkgs[*]}"; exit 1; }
    log "installing ${pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >&2; }
  fi
  grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
    { log "ERROR: the kernel has no overlay filesystem (containerd's snapshotter)"; exit 1; }

  # --- addresses --------------------------------------------------------------
  # The kubelet refuses a loopback node IP; the apiserver reaches it (for
  # exec/logs) on the node's InternalIP. eth0's first global IPv4, else the
  # first global IPv4 of any interface.
  if [ -z "$NODE_IP" ]; then
    NODE_IP=$(ip -4 -o addr show dev eth0 scope global 2>/dev/null | awk '{print $4; exit}')
    [ -n "$NODE_IP" ] || NODE_IP=$(ip -4 -o addr show scope global | awk '{print $4; exit}')
    NODE_IP=${NODE_IP%/*}
  fi
  [ -n "$NODE_IP" ] || { log "ERROR: no global IPv4 address found; set CARVE_NODE_IP"; exit 1; }
  # The pod network must not overlap a network the host already routes (a
  # default route matches everything and does not count; the bridge itself is
  # ours, left over at worst).
  local clash
  clash=$(ip -4 route show match "$POD_GATEWAY" | grep -v '^default' | grep -v "dev $CNI_BRIDGE" || true)
  [ -z "$clash" ] || { log "ERROR: CARVE_POD_CIDR=$POD_CIDR overlaps a host route: $clash"; exit 1; }
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    log "ERROR: network interface $CNI_BRIDGE already exists (another cluster, or run down.sh)"
    exit 1
  fi
  local p
  for p in "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT"; do
    if port_open "$p" || (exec 3<>"/dev/tcp/$NODE_IP/$p") 2>/dev/null; then
      log "ERROR: port $p is in use; set CARVE_KUBELET_PORT / CARVE_KUBELET_HEALTHZ_PORT"
      exit 1
    fi
  done
  # One node per host: the cgroup root, bridge and kubelet paths are shared.
  if [ -d /sys/fs/cgroup/memory/carve ] || [ -d /sys/fs/cgroup/carve ] || [ -d /sys/fs/cgroup/unified/carve ]; then
    log "ERROR: cgroup /carve exists: another carve node runs here, or its down.sh did not finish"
    exit 1
  fi

  CONTAINERD_BIN_DIR=$("$here/build-containerd.sh" | tail -n1)
  [ -x "$CONTAINERD_BIN_DIR/containerd" ] || { log "ERROR: build-containerd.sh gave no usable bin dir"; exit 1; }

  # --- record the host state down.sh restores ---------------------------------
  mkdir -p "$NODE_DIR"
  local k h
  for k in "${SAVED_SYSCTLS[@]}"; do
    echo "$k=$(sysctl -n "$k")"
  done >"$NODE_DIR/sysctl.orig"
  for h in "${HOST_PATHS[@]}"; do
    [ -e "$h" ] || echo "$h"
  done >"$NODE_DIR/host-paths-absent"
  # Also remembered here (not only in cluster.env, written at the end) so a
  # failed start can be cleaned up.
  ls -d /run/netns/* 2>/dev/null >"$NODE_DIR/netns-before" || true
  echo "$CNI_BRIDGE" >"$NODE_DIR/bridge"
  echo "$CNI_NETWORK" >"$NODE_DIR/cni-network"

  # --- sysctls, cgroup root ----------------------------------------------------
  for k in "${KERNEL_TUNABLES[@]}"; do
    sysctl -qw "$k" >/dev/null
  done
  # All pods go below /carve in every hierarchy (kubelet cgroupRoot), so
  # down.sh can kill and remove exactly what this node made. A fresh cpuset
  # cgroup has no cpus/mems: copy the root's, or nothing can run in it.
  local hier
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -f "$hier/cgroup.procs" ] || continue
    mkdir -p "$hier/carve"
    if [ -f "$hier/cpuset.cpus" ] && [ -f "$hier/carve/cpuset.cpus" ]; then
      cat "$hier/cpuset.cpus" >"$hier/carve/cpuset.cpus"
      cat "$hier/cpuset.mems" >"$hier/carve/cpuset.mems"
    fi
  done

  # --- CNI ------------------------------------------------------------------
  # Bridge + host-local IPAM (its leases under the state dir) + loopback.
  # - ipMasq false: no NAT rules on the host.
  # - isGateway: the bridge gets the pod network's first address, so pods
  #   reach the host; the only route pods get besides their subnet is to the
  #   node IP, via the bridge. No default route: nothing from a pod is ever
  #   forwarded out of eth0.
  mkdir -p "$CNI_DIR/net.d" "$CNI_DIR/ipam" "$CDI_DIR"
  cat >"$CNI_DIR/net.d/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
        "routes": [{"dst": "$NODE_IP/32"}],
        "dataDir": "$CNI_DIR/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF

  # --- containerd -------------------------------------------------------------
  # Version 3 schema (containerd 2.0+). Every path that has a setting points
  # into the state dir; imports=[] so /etc/containerd/conf.d is not read; NRI
  # off (its socket is under /var/run/nri).
  # - restrict_oom_score_adj: this VM has no CAP_SYS_RESOURCE; without it
  #   runc fails every sandbox ("can't get final child's PID from pipe").
  # - netns_mounts_under_state_dir: pod network namespaces are bind-mounted
  #   under the state dir instead of /var/run/netns.
  # - the shim sockets go under the state dir when the path fits (containerd
  #   allows at most 42 characters), else to /run/containerd/s.
  mkdir -p "$CONTAINERD_DIR"
  local shim_sockets="" shim_cfg=""
  if [ ${#STATE_DIR} -le 40 ]; then
    shim_sockets=$STATE_DIR/s
    shim_cfg="  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '$shim_sockets'"
  fi
  cat >"$CONTAINERD_DIR/config.toml" <<EOF
version = 3
root = '$CONTAINERD_DIR/root'
state = '$CONTAINERD_DIR/state'
temp = '$CONTAINERD_DIR/tmp'
imports = []

[grpc]
  address = '$CONTAINERD_ADDRESS'

[ttrpc]
  address = '$CONTAINERD_ADDRESS.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = ['$CDI_DIR', '/var/run/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RUNC'
          # runc's own state (default /run/containerd/runc).
          Root = '$CONTAINERD_DIR/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$CNI_BIN_DIR']
      conf_dir = '$CNI_DIR/net.d'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'

  [plugins.'io.containerd.internal.v1.opt']
    path = '$CONTAINERD_DIR/opt'

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '$CONTAINERD_DIR/image-verifier'

  [plugins.'io.containerd.nri.v1.nri']
    disable = true
$shim_cfg
EOF
  # The shim binary is found through PATH.
  PATH="$CONTAINERD_BIN_DIR:$PATH" start_daemon_path containerd "$CONTAINERD_BIN_DIR/containerd" \
    --config "$CONTAINERD_DIR/config.toml" --log-level warn
}

# node_images: builds the pause and test images and imports them, once
# containerd answers. Runs while the apiserver starts.
node_images() {
  wait_for "containerd's socket" containerd "$CONTAINERD_BIN_DIR/ctr" --address "$CONTAINERD_ADDRESS" version
  local archives
  archives=$("$here/../images/cluster-images.sh" "$IMAGES_DIR") || fail "building the node images failed"
  # shellcheck disable=SC2086 # two paths, no spaces (the state dir has none)
  CARVE_CONTAINERD_ADDRESS=$CONTAINERD_ADDRESS "$here/../images/import.sh" $archives 2>/dev/null ||
    fail "importing the node images failed" containerd
}

# node_certs: the kubelet's client cert (user system:node:NAME in group
# system:nodes, what the Node authorizer and NodeRestriction expect) and its
# serving cert (for the node IP), both from the cluster CA.
node_certs() {
  issue ca kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" client
  issue ca kubelet-server "/CN=$NODE_NAME" server "IP:$NODE_IP,DNS:$NODE_NAME"
  write_kubeconfig "$STATE_DIR/kubelet.kubeconfig" "system:node:$NODE_NAME" "$PKI/kubelet.crt" "$PKI/kubelet.key"
}

# node_start: starts the kubelet; node_wait_ready waits for its Node.
node_start() {
  mkdir -p "$KUBELET_ROOT_DIR" "$STATE_DIR/pod-logs" "$STATE_DIR/volume-plugins"
  # The feature gates as a YAML map (the --feature-gates flag is deprecated
  # for the kubelet): "A=true,B=false" -> "  A: true" lines.
  local gates="featureGates: {}"
  if [ -n "$FEATURE_GATES" ]; then
    gates="featureGates:
$(tr ',' '\n' <<<"$FEATURE_GATES" | sed -n 's/^ *\([^=]*\)=\(.*\)$/  \1: \2/p')"
  fi
  # - authentication: client certs from the cluster CA (the apiserver's
  #   kubelet client cert, for exec/logs) and bearer tokens via TokenReview;
  #   no anonymous access even though the port is on the node IP.
  #   authorization Webhook: the apiserver decides (SubjectAccessReview).
  # - cgroupRoot /carve: see node_prepare.
  # - failCgroupV1 false: this VM has hybrid cgroups (v1 + v2).
  # - makeIPTablesUtilChains false: no kube-proxy, no iptables changes.
  # - imageGCHighThresholdPercent 100: images imported with ctr cannot be
  #   pulled again, so the kubelet must never garbage-collect them.
  # - eviction thresholds low: a nearly full disk must not evict test pods.
  # - podLogsDir, volumePluginDir: into the state dir (defaults are under
  #   /var/log and /usr/libexec).
  cat >"$STATE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-server.crt
tlsPrivateKeyFile: $PKI/kubelet-server.key
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CONTAINERD_ADDRESS
cgroupDriver: cgroupfs
cgroupRoot: /carve
failCgroupV1: false
failSwapOn: false
# Room for the many-pods soak run (issue 29: 250 share pods).
maxPods: 300
# A container that exits is started again within a second, not after a
# backoff that doubles to five minutes: the soak test SIGKILLs the agent a
# hundred times (KubeletCrashLoopBackOffMax, beta and on in 1.37).
crashLoopBackOff:
  maxContainerRestartPeriod: 1s
makeIPTablesUtilChains: false
protectKernelDefaults: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
podLogsDir: $STATE_DIR/pod-logs
volumePluginDir: $STATE_DIR/volume-plugins
clusterDomain: cluster.local
serializeImagePulls: false
$gates
EOF
  log "starting kubelet (node $NODE_NAME, $NODE_IP:$KUBELET_PORT, root dir $KUBELET_ROOT_DIR)"
  start_daemon kubelet \
    --config="$STATE_DIR/kubelet.yaml" \
    --kubeconfig="$STATE_DIR/kubelet.kubeconfig" \
    --root-dir="$KUBELET_ROOT_DIR" \
    --cert-dir="$PKI/kubelet-certs" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" \
    --v=1
}

node_wait_ready() {
  wait_for "node $NODE_NAME to be Ready" kubelet node_ready
  # The not-ready taint is normally added by the TaintNodesByCondition
  # admission plugin and removed by the node-lifecycle controller. up.sh
  # turns both off (tests also create kubelet-less fake Nodes), so the taint
  # should not be there; if something added it, clear it now that the node
  # is Ready.
  if kubectl_ get node "$NODE_NAME" -o jsonpath='{.spec.taints[*].key}' | grep -qw node.kubernetes.io/not-ready; then
    kubectl_ taint node "$NODE_NAME" node.kubernetes.io/not-ready- >/dev/null
  fi
}

node_ready() {
  [ "$(kubectl_ get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
