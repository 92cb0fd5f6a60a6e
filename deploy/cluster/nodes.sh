# shellcheck shell=bash disable=SC2154,SC2153 # here, STATE_DIR, PKI, ...: set by up.sh
# The nodes of a multi-node local cluster (up.sh with CARVE_CLUSTER_NODES=N,
# N >= 2; `make cluster-up NODES=N`). Sourced by up.sh, which keeps the
# control plane on the host, bound to the node network's bridge address.
# Each node is a set of namespaces (node-init.sh is its PID 1):
#   - a network namespace carve-mn-<i> with two veths: eth0, the node's IP
#     on the node network (bridge cvmn-br, MN_NET.0/24, the host and API
#     server at .1, node i at .(10+i)); and seg0, the node's parent NIC with
#     no address, on the tenants' shared L2 segment (bridge cvmn-seg, no
#     hairpin), where the namespace carve-mn-srv also sits at MN_SERVER_IP;
#   - mount, UTS and PID namespaces, a fresh sysfs and bpffs, a tmpfs /run
#     and its own /var ($STATE_DIR/n<i>/var): the chart's default paths
#     (/var/lib/kubelet, /var/run/cdi, /var/lib/carve, /sys/fs/bpf/carve)
#     are the node's own;
#   - containerd and a kubelet, its cgroups below /carve-mn/n<i> (not the
#     single node's /carve: a single-node cluster of another state dir and
#     ports may run beside it).
# down.sh SIGKILLs each node's PID 1 (the kernel then ends every process of
# the node), checks it is gone, and removes the namespaces, links, cgroups
# and directories; the host sysctls the kubelets need are set once for all
# nodes and put back, as for the single node (node.sh).

MN_NET=10.77.0
MN_BRIDGE=cvmn-br
MN_SEGMENT=cvmn-seg
MN_SERVER_NS=carve-mn-srv
MN_SERVER_IP=10.80.0.1
MN_SEGMENT_CIDR=10.80.0.0/24
NODE_DIR=$STATE_DIR/node
RUNC=/usr/sbin/runc
CNI_BIN_DIR=/usr/lib/cni
PAUSE_IMAGE=docker.io/library/carve-pause:latest
IMAGES_DIR=$STATE_DIR/images
# As node.sh: the kubelet's sysctls, set once (they are global), and what
# down.sh puts back. ip_forward is per network namespace: each node's bridge
# plugin sets its own.
KERNEL_TUNABLES=(vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1
  kernel.keys.root_maxkeys=1000000 kernel.keys.root_maxbytes=25000000)
# The nodes have their own /var and /run; these host paths are what a
# kubelet or containerd could still create.
HOST_PATHS=(/usr/libexec/kubernetes /opt/containerd /opt/cni /etc/cni /etc/cdi)

node_name_of() { echo "carve-node-$1"; }
node_ip_of() { echo "$MN_NET.$((10 + $1))"; }
node_dir_of() { echo "$STATE_DIR/n$1"; }

# mn_prepare: checks, the host settings down.sh restores, both bridges and
# the server's namespace, each node's namespace and links. Runs before the
# API server, which binds to the node bridge's address.
mn_prepare() {
  [ "$(id -u)" = 0 ] || { log "ERROR: the nodes need root"; exit 1; }
  [ -x "$RUNC" ] && [ -x "$CNI_BIN_DIR/bridge" ] || { log "ERROR: install runc and containernetworking-plugins"; exit 1; }
  command -v nsenter >/dev/null && command -v unshare >/dev/null || { log "ERROR: nsenter and unshare (util-linux) are needed"; exit 1; }
  local l
  for l in "$MN_BRIDGE" "$MN_SEGMENT"; do
    ! ip link show "$l" >/dev/null 2>&1 || { log "ERROR: interface $l exists (another cluster, or run down.sh)"; exit 1; }
  done
  ! ip -4 route show match "$MN_NET.1" | grep -qv '^default' ||
    { log "ERROR: $MN_NET.0/24 overlaps a host route"; exit 1; }
  if [ -d /sys/fs/cgroup/memory/carve-mn ] || [ -d /sys/fs/cgroup/carve-mn ] || [ -d /sys/fs/cgroup/unified/carve-mn ]; then
    log "ERROR: cgroup /carve-mn exists: another multi-node cluster runs here, or its down.sh did not finish"
    exit 1
  fi
  CONTAINERD_BIN_DIR=$("$here/build-containerd.sh" | tail -n1)
  [ -x "$CONTAINERD_BIN_DIR/containerd" ] || { log "ERROR: build-containerd.sh gave no usable bin dir"; exit 1; }

  mkdir -p "$NODE_DIR"
  echo carve-mn >"$NODE_DIR/cgroup-root"
  local k h i
  # Only a value this start changes is put back: one already set (by a
  # single-node cluster beside this one) is that cluster's to restore.
  for k in "${KERNEL_TUNABLES[@]}"; do
    [ "$(sysctl -n "${k%%=*}")" = "${k#*=}" ] || echo "${k%%=*}=$(sysctl -n "${k%%=*}")"
  done >"$NODE_DIR/sysctl.orig"
  for h in "${HOST_PATHS[@]}"; do [ -e "$h" ] || echo "$h"; done >"$NODE_DIR/host-paths-absent"
  # What down.sh removes, written before it is made so a failed start is
  # cleaned up too.
  {
    echo "link $MN_BRIDGE"
    echo "link $MN_SEGMENT"
    echo "netns $MN_SERVER_NS"
    for i in $(seq "$NODES"); do echo "netns carve-mn-$i"; done
  } >"$NODE_DIR/multi"
  for k in "${KERNEL_TUNABLES[@]}"; do sysctl -qw "$k" >/dev/null; done

  local hier
  for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -f "$hier/cgroup.procs" ] || continue
    for d in carve-mn $(for i in $(seq "$NODES"); do echo "carve-mn/n$i"; done); do
      mkdir -p "$hier/$d"
      if [ -f "$hier/cpuset.cpus" ] && [ -f "$hier/$d/cpuset.cpus" ]; then
        cat "$hier/cpuset.cpus" >"$hier/$d/cpuset.cpus"
        cat "$hier/cpuset.mems" >"$hier/$d/cpuset.mems"
      fi
    done
  done

  # The node network: the host (and the API server) at .1.
  ip link add "$MN_BRIDGE" type bridge
  ip addr add "$MN_NET.1/24" dev "$MN_BRIDGE"
  ip link set "$MN_BRIDGE" up
  # The tenants' segment: a plain bridge, no address, no hairpin.
  ip link add "$MN_SEGMENT" type bridge
  ip link set "$MN_SEGMENT" up
  ip netns add "$MN_SERVER_NS"
  ip link add cvmn-srv type veth peer name seg0 netns "$MN_SERVER_NS"
  ip link set cvmn-srv master "$MN_SEGMENT" up
  ip -n "$MN_SERVER_NS" addr add "$MN_SERVER_IP/${MN_SEGMENT_CIDR#*/}" dev seg0
  ip -n "$MN_SERVER_NS" link set seg0 up
  ip -n "$MN_SERVER_NS" link set lo up

  for i in $(seq "$NODES"); do mn_prepare_node "$i"; done
}

# mn_prepare_node I: node I's namespace, links, directories and configs.
mn_prepare_node() {
  local i=$1 ns="carve-mn-$1" dir name ip j
  dir=$(node_dir_of "$i") name=$(node_name_of "$i") ip=$(node_ip_of "$i")
  ip netns add "$ns"
  ip link add "cvmn-n$i" type veth peer name eth0 netns "$ns"
  ip link set "cvmn-n$i" master "$MN_BRIDGE" up
  ip link add "cvmn-s$i" type veth peer name seg0 netns "$ns"
  ip link set "cvmn-s$i" master "$MN_SEGMENT" up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set seg0 up
  ip -n "$ns" link set lo up
  # The other nodes' pods through their node.
  for j in $(seq "$NODES"); do
    [ "$j" = "$i" ] || ip -n "$ns" route add "10.88.$j.0/24" via "$(node_ip_of "$j")"
  done
  # Pods reach the API server on the node network (an agent without
  # hostNetwork): through their node, and back from the host through it.
  # The route goes with the bridge.
  ip route add "10.88.$i.0/24" via "$ip" dev "$MN_BRIDGE"
  mkdir -p "$dir/var/lib/kubelet" "$dir/var/log" "$dir/logs" "$dir/cni/net.d" \
    "$dir/cni/ipam" "$dir/containerd" "$dir/pod-logs" "$dir/volume-plugins"
  # /var/run is /run, the node's tmpfs, as on the host.
  ln -sfn /run "$dir/var/run"
  cat >"$dir/cni/net.d/10-carve.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "carve",
  "plugins": [
    {
      "type": "bridge", "bridge": "carve0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.$i.0/24", "gateway": "10.88.$i.1"}]],
        "routes": [{"dst": "$ip/32"}, {"dst": "$MN_NET.1/32"}],
        "dataDir": "$dir/cni/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF
  cat >"$dir/config.toml" <<EOF
version = 3
root = '$dir/containerd/root'
state = '$dir/containerd/state'
temp = '$dir/containerd/tmp'
imports = []
[grpc]
  address = '$dir/containerd.sock'
[ttrpc]
  address = '$dir/containerd.sock.ttrpc'
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = ['/var/run/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RUNC'
          Root = '$dir/containerd/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$CNI_BIN_DIR']
      conf_dir = '$dir/cni/net.d'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
  [plugins.'io.containerd.internal.v1.opt']
    path = '$dir/containerd/opt'
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '$dir/containerd/image-verifier'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '$dir/s'
EOF
}

# mn_certs: each kubelet's client and serving certificates and kubeconfig.
mn_certs() {
  local i name ip
  for i in $(seq "$NODES"); do
    name=$(node_name_of "$i") ip=$(node_ip_of "$i")
    issue ca "kubelet-$i" "/O=system:nodes/CN=system:node:$name" client
    issue ca "kubelet-server-$i" "/CN=$name" server "IP:$ip,DNS:$name"
    write_kubeconfig "$(node_dir_of "$i")/kubelet.kubeconfig" "system:node:$name" "$PKI/kubelet-$i.crt" "$PKI/kubelet-$i.key"
  done
}

# mn_start: starts every node's PID 1 (node-init.sh), which starts its
# containerd and kubelet. The node lease is short (20 s, renewed every 5 s)
# so the node lifecycle controller, on in this cluster, sees a killed node
# soon (controllers_start: --node-monitor-grace-period).
mn_start() {
  local i dir name ip gates="featureGates: {}"
  if [ -n "$FEATURE_GATES" ]; then
    gates="featureGates:
$(tr ',' '\n' <<<"$FEATURE_GATES" | sed -n 's/^ *\([^=]*\)=\(.*\)$/  \1: \2/p')"
  fi
  for i in $(seq "$NODES"); do
    dir=$(node_dir_of "$i") name=$(node_name_of "$i") ip=$(node_ip_of "$i")
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-server-$i.crt
tlsPrivateKeyFile: $PKI/kubelet-server-$i.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$dir/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /carve-mn/n$i
failCgroupV1: false
failSwapOn: false
maxPods: 300
crashLoopBackOff: {maxContainerRestartPeriod: 1s}
makeIPTablesUtilChains: false
protectKernelDefaults: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeLeaseDurationSeconds: 20
nodeStatusUpdateFrequency: 5s
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
clusterDomain: cluster.local
serializeImagePulls: false
$gates
EOF
    printf '%s\n' --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
      --root-dir=/var/lib/kubelet --cert-dir="$dir/kubelet-certs" --hostname-override="$name" \
      --node-ip="$ip" --v=1 >"$dir/kubelet.args"
    log "starting node $name ($ip)"
    # setsid: out of the caller's process group; unshare's child is the
    # node's PID 1, whose host PID down.sh kills.
    setsid nsenter --net="/run/netns/carve-mn-$i" unshare --mount --uts --pid --fork --kill-child \
      --propagation private bash "$here/node-init.sh" "$name" "$dir" "$CONTAINERD_BIN_DIR" "$BIN_DIR/kubelet" \
      </dev/null >"$dir/logs/init.log" 2>&1 9>&- &
    echo "$!" >"$dir/unshare.pid"
    disown "$!"
  done
  local pid child
  for i in $(seq "$NODES"); do
    dir=$(node_dir_of "$i")
    pid=$(cat "$dir/unshare.pid") child=""
    for _ in $(seq 100); do
      child=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null | awk '{print $1}')
      [ -z "$child" ] || break
      sleep 0.05
    done
    [ -n "$child" ] || fail "node $i's init did not start: $(cat "$dir/logs/init.log")"
    echo "$child" >"$dir/init.pid"
    echo "init $child" >>"$NODE_DIR/multi"
  done
}

# mn_images: the pause and test images, built once, imported into every
# node's containerd once it answers.
mn_images() {
  local archives i dir
  archives=$("$here/../images/cluster-images.sh" "$IMAGES_DIR") || fail "building the node images failed"
  for i in $(seq "$NODES"); do
    dir=$(node_dir_of "$i")
    wait_for "node $i's containerd" kube-apiserver "$CONTAINERD_BIN_DIR/ctr" --address "$dir/containerd.sock" version
    # shellcheck disable=SC2086 # two paths, no spaces
    CARVE_CONTAINERD_ADDRESS=$dir/containerd.sock "$here/../images/import.sh" $archives 2>/dev/null ||
      fail "importing the images into node $i failed"
  done
}

mn_wait_ready() {
  local i name
  for i in $(seq "$NODES"); do
    name=$(node_name_of "$i")
    wait_for "node $name to be Ready" kube-apiserver mn_node_ready "$name"
  done
}

mn_node_ready() {
  [ "$(kubectl_ get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# mn_env: the nodes in cluster.env. KUBELET_ROOT_DIR and CARVE_CDI_DIR are
# the paths inside every node (the chart's defaults).
mn_env() {
  local i names=""
  for i in $(seq "$NODES"); do names="$names $(node_name_of "$i")"; done
  cat <<EOF
CARVE_CLUSTER_NODES=$NODES
CARVE_NODE_NAMES=${names# }
CARVE_APISERVER_HOST=$APISERVER_HOST
KUBELET_ROOT_DIR=/var/lib/kubelet
CARVE_CDI_DIR=/var/run/cdi
CARVE_CONTAINERD_BIN_DIR=$CONTAINERD_BIN_DIR
CARVE_SEGMENT_SERVER_NS=$MN_SERVER_NS
CARVE_SEGMENT_SERVER_IP=$MN_SERVER_IP
CARVE_SEGMENT_CIDR=$MN_SEGMENT_CIDR
CARVE_SEGMENT_PARENT=seg0
CARVE_SEGMENT_BRIDGE=$MN_SEGMENT
EOF
  for i in $(seq "$NODES"); do
    cat <<EOF
CARVE_NODE_${i}_NAME=$(node_name_of "$i")
CARVE_NODE_${i}_IP=$(node_ip_of "$i")
CARVE_NODE_${i}_PID=$(cat "$(node_dir_of "$i")/init.pid")
CARVE_NODE_${i}_DIR=$(node_dir_of "$i")
CARVE_NODE_${i}_CONTAINERD_ADDRESS=$(node_dir_of "$i")/containerd.sock
EOF
  done
}

# mn_kill_inits: SIGKILLs the nodes' PID 1s started so far and waits for
# them (stop_all, when a start fails; down.sh does the same from the list).
mn_kill_inits() {
  local i pid pids=""
  for i in $(seq "$NODES"); do
    pid=$(cat "$(node_dir_of "$i")/unshare.pid" 2>/dev/null) || continue
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = unshare ] || continue
    pid=$(awk '{print $1}' "/proc/$pid/task/$pid/children" 2>/dev/null) || continue
    [ -n "$pid" ] || continue
    kill -9 "$pid" 2>/dev/null || true
    pids="$pids $pid"
  done
  for _ in $(seq 50); do
    local left=""
    for pid in $pids; do gone "$pid" || left=1; done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
}
