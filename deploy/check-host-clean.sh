#!/usr/bin/env bash
# Checks that the host holds nothing of carve's, its demo's or its local
# cluster's: CI runs it after `make test` and after `make demo-down`.
# Prints each thing left and exits 1 if there is one.
#
#   check-host-clean.sh --save FILE   record the host's own IFB links (a
#                                     kernel's ifb module makes ifb0, ifb1)
#   check-host-clean.sh [FILE]        check, IFBs in FILE excepted
set -euo pipefail
ifbs() { ip -o -d link show type ifb | awk -F': ' '{split($2, n, "@"); print n[1]}'; }
if [ "${1:-}" = --save ]; then
  ifbs >"${2:?usage: $0 --save FILE}"
  exit 0
fi
baseline=${1:-/dev/null}
left=()

while read -r name kind; do
  case "$name" in
  cv* | carve-demo*) left+=("link $name ($kind)") ;;
  *) [ "$kind" = ifb ] && ! grep -qxF "$name" "$baseline" && left+=("IFB link $name") ;;
  esac
done < <(ip -o -d link show | awk -F': ' '{split($2, n, "@"); kind = "other"; if (match($0, / (veth|ifb|macvlan|ipvlan|bridge) /)) kind = substr($0, RSTART + 1, RLENGTH - 2); print n[1], kind}')

for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  case "$ns" in carve* | cni-*) left+=("network namespace $ns") ;; esac
done

if [ -d /sys/fs/bpf/carve ] && [ -n "$(ls -A /sys/fs/bpf/carve 2>/dev/null)" ]; then
  left+=("BPF pins under /sys/fs/bpf/carve: $(ls /sys/fs/bpf/carve | tr '\n' ' ')")
fi

# Process names as the kernel keeps them: 15 characters at most. A
# teardown signals them and returns: a process gets 15 s to exit.
names='^(kube-apiserver|kube-controller|kube-scheduler|carve-scheduler|kubelet|etcd|containerd|containerd-shim|carve|iperf3)$'
for _ in $(seq 30); do
  pgrep -x -- "$names" >/dev/null 2>&1 || break
  sleep 0.5
done
while read -r pid name; do
  [ -n "$pid" ] && left+=("process $name ($pid)")
done < <(pgrep -l -x -- "$names" 2>/dev/null || true)

cluster=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
mounts=$(findmnt -rn -o TARGET | awk -v d="$cluster" '$0 == d || index($0, d "/") == 1' | tr '\n' ' ')
[ -z "$mounts" ] || left+=("mounts under $cluster: $mounts")

if [ ${#left[@]} -gt 0 ]; then
  echo "the host is not clean:" >&2
  printf '  %s\n' "${left[@]}" >&2
  exit 1
fi
echo "host clean: no carve links, IFBs, namespaces, pins, mounts or cluster processes"
