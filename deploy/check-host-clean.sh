#!/usr/bin/env bash
# Checks that the host holds nothing of carve's, its demo's or its local
# cluster's: CI runs it after `make test` and after `make demo-down`.
# Prints each thing left and exits 1 if there is one.
#
#   check-host-clean.sh --save FILE   record the host's own IFB links (a
#                                     kernel's ifb module makes ifb0, ifb1)
#   check-host-clean.sh [FILE]        check, IFBs in FILE excepted
#   check-host-clean.sh --node [FILE]  what an uninstall must leave: the
#                                     node's carve state only, while the
#                                     cluster runs (no process or cluster
#                                     mount checks)
#
# Where carve's agent kept its files is read from the environment, with the
# chart's defaults: CARVE_STATE_DIR (/var/lib/carve), CARVE_BPF_PIN_DIR
# (/sys/fs/bpf/carve), CARVE_CDI_DIR (/var/run/cdi), KUBELET_DIR
# (/var/lib/kubelet) and CARVE_DRIVER (carve.dev).
set -euo pipefail
ifbs() { ip -o -d link show type ifb | awk -F': ' '{split($2, n, "@"); print n[1]}'; }
if [ "${1:-}" = --save ]; then
  ifbs >"${2:?usage: $0 --save FILE}"
  exit 0
fi
node_only=
if [ "${1:-}" = --node ]; then
  node_only=1
  shift
fi
baseline=${1:-/dev/null}
left=()
state=${CARVE_STATE_DIR:-/var/lib/carve}
pins=${CARVE_BPF_PIN_DIR:-/sys/fs/bpf/carve}
cdi=${CARVE_CDI_DIR:-/var/run/cdi}
kubelet=${KUBELET_DIR:-/var/lib/kubelet}
driver=${CARVE_DRIVER:-carve.dev}

while read -r name kind; do
  case "$name" in
  # A multi-node cluster's own links (cluster/nodes.sh) are that
  # cluster's, not this node's carve state: the full check still lists them.
  cvmn-*) [ -z "$node_only" ] && left+=("link $name ($kind)") ;;
  cv* | carve-demo*) left+=("link $name ($kind)") ;;
  *) [ -z "$node_only" ] && [ "$kind" = ifb ] && ! grep -qxF "$name" "$baseline" && left+=("IFB link $name") ;;
  esac
done < <(ip -o -d link show | awk -F': ' '{split($2, n, "@"); kind = "other"; if (match($0, / (veth|ifb|macvlan|ipvlan|bridge) /)) kind = substr($0, RSTART + 1, RLENGTH - 2); print n[1], kind}')

if [ -z "$node_only" ]; then
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in carve* | cni-*) left+=("network namespace $ns") ;; esac
  done
fi

if [ -d "$pins" ] && [ -n "$(ls -A "$pins" 2>/dev/null)" ]; then
  left+=("BPF pins under $pins: $(ls "$pins" | tr '\n' ' ')")
fi
# carve's programs (only carve's agent loads programs of these names; the
# kernel keeps their names to 15 characters).
carve_progs='^(classify_egres|classify_ingre|edt_egress|redirect_ingre|return_shaped|pod_guard|share_dequeue)'
if [ -z "$node_only" ]; then
  # Loaded anywhere: on any link, by TCX or cls_bpf, or held by a process.
  if command -v bpftool >/dev/null 2>&1; then
    progs=$(bpftool prog show 2>/dev/null | awk '$2 == "sched_cls" && $3 == "name" {print $4}' | grep -E "$carve_progs" | sort -u | tr '\n' ' ' || true)
    [ -z "$progs" ] || left+=("carve's BPF programs loaded: $progs")
  fi
else
  # This node's only: another cluster's nodes on the same host (a
  # multi-node cluster, cluster/nodes.sh, beside the single node) run
  # agents of their own. A program of this node's is held by a process
  # outside that cluster's cgroup root (/carve-mn), or attached by cls_bpf
  # to a link of this network namespace; a TCX attachment outlives the
  # agent only by a pin, which the pin check above sees.
  if command -v bpftool >/dev/null 2>&1; then
    while read -r name pid; do
      grep -q ':/carve-mn/' "/proc/$pid/cgroup" 2>/dev/null && continue
      [ -e "/proc/$pid" ] && left+=("carve's BPF program $name held by process $pid ($(cat "/proc/$pid/comm" 2>/dev/null))")
    done < <(bpftool prog show 2>/dev/null | awk '
      $2 == "sched_cls" && $3 == "name" {name = $4; next}
      /^[0-9]+: / {name = ""; next}
      name != "" && $1 == "pids" {for (i = 2; i <= NF; i++) {p = $i; sub(/^.*\(/, "", p); sub(/\).*$/, "", p); print name, p}}' |
      grep -E "$carve_progs" || true)
  fi
  for dev in $(ip -o link show | awk -F': ' '{split($2, n, "@"); print n[1]}'); do
    for hook in ingress egress root; do
      # A cls_bpf filter reads "... bpf ... id N name <program> tag ...".
      names=$(tc filter show dev "$dev" "$hook" 2>/dev/null | grep -oE ' name [A-Za-z0-9_]+ tag ' | awk '{print $2}' | grep -E "$carve_progs" | sort -u | tr '\n' ' ' || true)
      [ -z "$names" ] || left+=("carve's BPF programs attached to $dev ($hook): $names")
    done
  done
fi
[ ! -f "$state/checkpoint.json" ] || left+=("the agent's checkpoint $state/checkpoint.json")
specs=$(ls "$cdi" 2>/dev/null | grep -E "^\.?${driver//./\\.}-claim_" | tr '\n' ' ' || true)
[ -z "$specs" ] || left+=("CDI specs in $cdi: $specs")
[ ! -d "$kubelet/plugins/$driver" ] || left+=("kubelet plugin directory $kubelet/plugins/$driver")
socks=$(ls "$kubelet/plugins_registry" 2>/dev/null | grep -E "^${driver//./\\.}-.*reg\.sock$" | tr '\n' ' ' || true)
[ -z "$socks" ] || left+=("registration sockets in $kubelet/plugins_registry: $socks")
mounts=$(findmnt -rn -o TARGET | awk -v d="$state" '$0 == d || index($0, d "/") == 1' | tr '\n' ' ')
[ -z "$mounts" ] || left+=("mounts under $state: $mounts")

if [ -n "$node_only" ]; then
  if [ ${#left[@]} -gt 0 ]; then
    echo "the node is not clean:" >&2
    printf '  %s\n' "${left[@]}" >&2
    exit 1
  fi
  echo "node clean: no carve links, IFBs, pins, programs, checkpoint, CDI specs, plugin sockets or mounts"
  exit 0
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

# A multi-node cluster's cgroup root (cluster/nodes.sh), in any hierarchy.
for hier in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ ! -d "$hier/carve-mn" ] || left+=("cgroup ${hier%/}/carve-mn (a multi-node cluster's)")
done

cluster=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
mounts=$(findmnt -rn -o TARGET | awk -v d="$cluster" '$0 == d || index($0, d "/") == 1' | tr '\n' ' ')
[ -z "$mounts" ] || left+=("mounts under $cluster: $mounts")

if [ ${#left[@]} -gt 0 ]; then
  echo "the host is not clean:" >&2
  printf '  %s\n' "${left[@]}" >&2
  exit 1
fi
echo "host clean: no carve links, IFBs, namespaces, pins, mounts or cluster processes"
