#!/usr/bin/env bash
# make demo NODES=N (N >= 2): the demo on a local cluster of N nodes, each
# made of namespaces (deploy/cluster/nodes.sh), whose parent NICs (seg0)
# share one L2 segment with a server:
#   1. bring the cluster up and install carve by its chart with one node
#      config for all nodes, whose address pool is cluster-wide;
#   2. run a pod on every node with a bandwidth share of its seg0 and an
#      address of that pool (100M on node 1, 200M on node 2, ...);
#   3. show the distinct addresses, their records in the API server, and
#      each pod's share held from inside the pod.
# `make demo-down` removes everything. demo.sh runs it for NODES >= 2.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
step() { echo; echo "==> $*" >&2; }

step "starting the local cluster with $CARVE_CLUSTER_NODES nodes"
kubeconfig=$("$here/cluster/up.sh" | tail -n1)
state=$(dirname "$kubeconfig")
env_of() { sed -n "s/^$1=//p" "$state/cluster.env"; }
nodes=$(env_of CARVE_CLUSTER_NODES)
kubectl=("$state/bin/kubectl" --kubeconfig "$kubeconfig")
helm="$("$here/cluster/build-tools.sh" | tail -n1)/helm"
server_ns=$(env_of CARVE_SEGMENT_SERVER_NS)
server_ip=$(env_of CARVE_SEGMENT_SERVER_IP)

step "building the carve image and importing it into every node"
net_archive=$("$here/images/build.sh" --name carve-net:demo --file /bin/busybox:/bin/busybox --file /usr/bin/iperf3:/usr/bin/iperf3 \
  --symlink /bin/sh=busybox --symlink /bin/ip=busybox --symlink /bin/sleep=busybox | tail -n1)
archive=$("$here/images/agent.sh" carve:demo | tail -n1)
for i in $(seq "$nodes"); do
  CARVE_CLUSTER_DIR=$state CARVE_CONTAINERD_ADDRESS=$(env_of "CARVE_NODE_${i}_CONTAINERD_ADDRESS") \
    "$here/images/import.sh" "$net_archive" "$archive" >/dev/null
done

step "installing the chart: one node config, its pool cluster-wide (each address once in the cluster)"
cat >"$state/demo-node.yaml" <<YAML
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: ["seg0"]
  includeVirtual: true
  bandwidth:
  - {interface: seg0, egress: 10G}
  pools:
  - {name: demo, cidr: $(env_of CARVE_SEGMENT_CIDR), gateway: $server_ip, scope: Cluster}
YAML
# The chart's default paths are each node's own; the agents reach the API
# server on the node network.
"$helm" upgrade --install carve "$here/chart/carve" --kubeconfig "$kubeconfig" \
  --namespace carve-system --create-namespace --wait --timeout 180s \
  --set image.repository=carve,image.tag=demo,image.pullPolicy=Never --set hostNetwork=true \
  --set-string "extraEnv[0].name=KUBERNETES_SERVICE_HOST,extraEnv[0].value=$(env_of CARVE_APISERVER_HOST)" \
  --set-string "extraEnv[1].name=KUBERNETES_SERVICE_PORT,extraEnv[1].value=$(env_of CARVE_APISERVER_PORT)" \
  --set-file nodeConfig="$state/demo-node.yaml" >/dev/null

step "a pod on every node, each with a share of its node's seg0 and an address of the pool"
for i in $(seq "$nodes"); do
  ip netns exec "$server_ns" iperf3 -s -p $((5200 + i)) -D
  "${kubectl[@]}" apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: net-$i}
spec:
  devices:
    requests:
    - name: net
      exactly:
        deviceClassName: nic.carve.dev
        capacity: {requests: {egressBandwidth: ${i}00M, ingressBandwidth: ${i}00M}}
    config:
    - requests: [net]
      opaque:
        driver: carve.dev
        parameters: {apiVersion: carve.dev/v1alpha1, kind: NetworkConfig, interfaceName: net1, pools: [demo]}
---
apiVersion: v1
kind: Pod
metadata: {name: net-$i}
spec:
  nodeSelector: {kubernetes.io/hostname: $(env_of "CARVE_NODE_${i}_NAME")}
  terminationGracePeriodSeconds: 0
  resourceClaims: [{name: net, resourceClaimName: net-$i}]
  containers:
  - {name: main, image: carve-net:demo, imagePullPolicy: Never, command: [sleep, "3600"], resources: {claims: [{name: net}]}}
YAML
done
pods=()
for i in $(seq "$nodes"); do pods+=("pod/net-$i"); done
"${kubectl[@]}" wait --for=condition=Ready "${pods[@]}" --timeout=180s >/dev/null
"${kubectl[@]}" get pods -o wide
step "the addresses, and their records in the API server (one Lease an address)"
for i in $(seq "$nodes"); do
  echo "net-$i: $("${kubectl[@]}" exec "net-$i" -- ip -4 -o addr show net1 | awk '{print $4}')"
done
"${kubectl[@]}" -n carve-system get leases -l carve.dev/address-pool \
  -o custom-columns='ADDRESS:.metadata.annotations.carve\.dev/address,HOLDER:.spec.holderIdentity'

step "every share at once, from inside its pod to the server on the segment"
for i in $(seq "$nodes"); do
  "${kubectl[@]}" exec "net-$i" -- iperf3 -c "$server_ip" -p $((5200 + i)) -t 4 -O 1 -f m |
    awk '/receiver/ {print $(NF-2)}' >"$state/demo-$i.rate" &
done
wait
printf '\n%-8s %-14s %-10s %-22s %s\n' pod node allocated "measured (Mbit/s)" "ratio (0.956 = limit met within 1%)"
missed=0
for i in $(seq "$nodes"); do
  m=$(cat "$state/demo-$i.rate")
  ratio=$(awk -v m="$m" -v l="${i}00" 'BEGIN {printf "%.3f", m/l}')
  printf '%-8s %-14s %-10s %-22s %s\n' "net-$i" "$(env_of "CARVE_NODE_${i}_NAME")" "${i}00M" "$m" "$ratio"
  awk -v r="$ratio" 'BEGIN {exit !(r >= 0.946 && r <= 0.966)}' || { echo "net-$i: ratio $ratio is outside 0.946-0.966" >&2; missed=1; }
done
echo >&2
echo "kubeconfig: $kubeconfig   (kubectl: $state/bin/kubectl; a command inside node I: deploy/cluster/node-exec.sh I CMD)" >&2
echo "tear down with: make demo-down" >&2
[ "$missed" = 0 ] || { echo "the demo's shares missed their limits" >&2; exit 1; }
