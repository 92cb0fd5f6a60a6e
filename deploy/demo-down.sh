#!/usr/bin/env bash
# Tears `make demo` down and leaves the host as the demo found it:
#   1. the demo's pods are deleted while the agent still runs, so that the
#      kubelet unprepares their claims (carve removes their classes, links
#      and classifier entries), and carve is uninstalled (its agent removes
#      carve's state from the node);
#   2. the cluster and its node stop (cluster/down.sh);
#   3. should the uninstall not have run, what the agent keeps per parent
#      between shares (the egress shaper's veth pair cveg*, the ingress IFB
#      cvifb*) and its BPF pins go; and the demo's veth and its server
#      namespace.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}

if [ -x "$cluster/bin/kubectl" ] && [ -f "$cluster/admin.kubeconfig" ]; then
  kubectl=("$cluster/bin/kubectl" --kubeconfig "$cluster/admin.kubeconfig" --request-timeout=10s)
  if "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1; then
    "${kubectl[@]}" delete pods --all --namespace default --wait --timeout=60s >/dev/null 2>&1 || true
    # As an operator uninstalls: the agent cleans its node up as it stops.
    helm=$("$here/cluster/build-tools.sh" | tail -n1)/helm
    "$helm" uninstall carve --kubeconfig "$cluster/admin.kubeconfig" --namespace carve-system --wait --timeout 60s >/dev/null 2>&1 || true
  fi
fi
# The iperf3 servers of make demo NODES=N in the segment's server namespace,
# before down.sh removes it. Not `ip netns pids` (see below).
if ns=$(stat -L -c %i /run/netns/carve-mn-srv 2>/dev/null); then
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ns]" ] && kill "${p#/proc/}" 2>/dev/null
  done
fi
"$here/cluster/down.sh"

for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
  case "$link" in
  cveg* | cvifb*) ip link del "$link" 2>/dev/null || true ;;
  esac
done
ip link del carve-demo0 2>/dev/null || true
# The iperf3 servers in the demo's namespace. Not `ip netns pids`: it
# gives up at the first process whose namespace it may not read (PID 1 on
# these VMs), and the servers would outlive the demo.
if ns=$(stat -L -c %i /run/netns/carve-demo-srv 2>/dev/null); then
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/net" 2>/dev/null)" = "net:[$ns]" ] && kill "${p#/proc/}" 2>/dev/null
  done
fi
ip netns del carve-demo-srv 2>/dev/null || true
# The agent's pins, once the agent is gone (it would pin again): only the
# chart's bpfPinDir, only while it is a directory on bpffs.
pins=/sys/fs/bpf/carve
if [ -d "$pins" ] && [ ! -L "$pins" ] && [ "$(stat -f -c %T "$pins" 2>/dev/null)" = bpf_fs ]; then
  rm -rf --one-file-system "$pins"
fi
