#!/usr/bin/env bash
# The quickest way to see carve work, on this machine:
#   1. bring up the local cluster: a control plane and one real node (kubelet,
#      containerd with CDI); the first run builds it from the Go module proxy;
#   2. build carve's image and install the chart, as a user would;
#   3. run a pod whose claim asks for a 100M bandwidth share of a NIC (a veth
#      the demo makes) and a whole last-level cache;
#   4. show the slices, the claim, and what the pod sees.
# `make demo-down` removes everything.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
step() { echo; echo "==> $*" >&2; }

step "starting the local cluster (the first run builds Kubernetes and containerd: about 15 minutes on 2 cores)"
kubeconfig=$("$here/cluster/up.sh" | tail -n1)
# shellcheck disable=SC1091
. "$(dirname "$kubeconfig")/cluster.env"
kubectl=("$CARVE_CLUSTER_DIR/bin/kubectl" --kubeconfig "$kubeconfig")
helm="$("$here/cluster/build-tools.sh" | tail -n1)/helm"

step "a NIC to share: the veth pair carve-demo0/carve-demo1"
ip link show carve-demo0 >/dev/null 2>&1 || ip link add carve-demo0 type veth peer name carve-demo1
ip link set carve-demo0 up && ip link set carve-demo1 up

step "building the carve image and importing it into the node"
archive=$("$here/images/build.sh" --name carve:demo --file "$repo/bin/carve:/carve" --file /usr/share/misc/pci.ids:/usr/share/misc/pci.ids --entrypoint /carve | tail -n1)
"$here/images/import.sh" "$archive"

step "installing the chart"
cat >"$CARVE_CLUSTER_DIR/demo-node.yaml" <<YAML
apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  include: ["carve-demo0"]
  includeVirtual: true
  bandwidth:
  - interface: carve-demo0
    egress: 10G
YAML
# hostNetwork and the API server's loopback address: pods of the local
# cluster have no route to it. hostRootPropagation None: / is a private
# mount on this VM.
"$helm" upgrade --install carve "$here/chart/carve" --kubeconfig "$kubeconfig" \
  --namespace carve-system --create-namespace --wait --timeout 120s \
  --set image.repository=carve,image.tag=demo,image.pullPolicy=Never \
  --set kubeletDir="$KUBELET_ROOT_DIR" --set cdiDir="$CARVE_CDI_DIR" --set stateDir="$CARVE_CLUSTER_DIR/carve-state" \
  --set hostNetwork=true --set hostRootPropagation=None --set bpffsPropagation=None --set metricsPort=29464 --set healthPort=29465 \
  --set-string "extraEnv[0].name=KUBERNETES_SERVICE_HOST,extraEnv[0].value=127.0.0.1" \
  --set-string "extraEnv[1].name=KUBERNETES_SERVICE_PORT,extraEnv[1].value=$CARVE_APISERVER_PORT" \
  --set-file nodeConfig="$CARVE_CLUSTER_DIR/demo-node.yaml" >/dev/null

step "a pod with a claim: 100M of carve-demo0's egress bandwidth, and an LLC"
"${kubectl[@]}" apply -f - <<'YAML'
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: demo
spec:
  spec:
    devices:
      requests:
      - name: net
        exactly:
          deviceClassName: nic.carve.dev
          capacity:
            requests:
              egressBandwidth: 100M
      - name: cache
        exactly:
          deviceClassName: llc.carve.dev
---
apiVersion: v1
kind: Pod
metadata:
  name: demo
spec:
  terminationGracePeriodSeconds: 0
  resourceClaims:
  - name: devices
    resourceClaimTemplateName: demo
  containers:
  - name: main
    image: carve-test:latest
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    resources:
      claims:
      - name: devices
YAML
"${kubectl[@]}" wait --for=condition=Ready pod/demo --timeout=120s >/dev/null

step "kubectl get resourceslices,resourceclaims -o wide"
"${kubectl[@]}" get resourceslices,resourceclaims -o wide
step "what the pod sees: its environment"
"${kubectl[@]}" exec demo -- sh -c 'env | grep ^CARVE_ | sort'
step "what the pod sees: its claim, mounted by carve's CDI spec"
"${kubectl[@]}" exec demo -- sh -c 'cat /run/carve/claims/*.json'
echo >&2
echo "kubeconfig: $kubeconfig   (kubectl: $CARVE_CLUSTER_DIR/bin/kubectl)" >&2
echo "tear down with: make demo-down" >&2
