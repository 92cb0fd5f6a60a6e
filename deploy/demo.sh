#!/usr/bin/env bash
# The quickest way to see carve work: bring up the local control plane (the
# first run builds it, about 6 minutes), publish this machine's ResourceSlices
# to it exactly as `carve discover` renders them, and show what the API server
# stored. `make demo-down` tears it down.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
node=${NODE_NAME:-$(hostname)}

echo "==> starting the local control plane (progress below; the first run builds Kubernetes from the module proxy)" >&2
kubeconfig=$("$here/cluster/up.sh" | tail -n1)
kubectl=("${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}/bin/kubectl" --kubeconfig "$kubeconfig")

echo "==> carve discover --node-name $node" >&2
"$repo/bin/carve" discover --node-name "$node" ${CARVE_CONFIG:+--config "$CARVE_CONFIG"} >"${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}/slices.yaml"
"${kubectl[@]}" apply -f "${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}/slices.yaml"

echo "==> what the API server stored" >&2
"${kubectl[@]}" get resourceslices -o wide
"${kubectl[@]}" get resourceslices -o yaml | sed -n '/devices:/,/driver:/p'
echo >&2
echo "kubeconfig: $kubeconfig" >&2
echo "tear down with: make demo-down" >&2
