#!/usr/bin/env bash
# PID 1 of one node of the multi-node local cluster (nodes.sh starts it with
# nsenter --net=<the node's netns> unshare --mount --uts --pid --fork
# --kill-child --propagation private). It gives the node a view of its own:
# /proc of its PID namespace, a fresh sysfs (so /sys/class/net lists the
# node's interfaces, not the host's), a bpffs of its own at /sys/fs/bpf, a
# tmpfs /run and its own /var; then it starts the node's containerd and
# kubelet and reaps orphans until it is SIGKILLed (down.sh), which ends the
# whole PID namespace, pods included, and with the last process the mount
# namespace and every mount made here.
#
# Usage: node-init.sh NAME NODE_DIR CONTAINERD_BIN_DIR KUBELET
# NODE_DIR holds config.toml (containerd), kubelet.yaml, kubelet.kubeconfig,
# var/ (bound on /var) and logs/; the kubelet's flags are in kubelet.args,
# one a line.
set -euo pipefail
name=$1 dir=$2 containerd_bin=$3 kubelet=$4

mount -t proc proc /proc
# A fresh sysfs hides the host's cgroup mounts below /sys/fs/cgroup: the
# kubelet needs them, so they are moved aside and back.
mkdir -p "$dir/cgroup-aside"
mount --rbind /sys/fs/cgroup "$dir/cgroup-aside"
mount -t sysfs sysfs /sys
mount --move "$dir/cgroup-aside" /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs -o mode=755 tmpfs /run
mount --bind "$dir/var" /var
# Every mount shared within the node, as systemd leaves a host: the chart's
# Bidirectional mounts (bpffs, the state dir) need it. The node's mount
# namespace was made private, so nothing propagates to the host.
mount --make-rshared /
hostname "$name"
ip link set lo up

PATH="$containerd_bin:$PATH" "$containerd_bin/containerd" --config "$dir/config.toml" --log-level warn \
  </dev/null >"$dir/logs/containerd.log" 2>&1 &
# The socket exists before containerd serves; a kubelet started before then
# exits at once.
for _ in $(seq 240); do
  "$containerd_bin/ctr" --address "$dir/containerd.sock" version >/dev/null 2>&1 && break
  sleep 0.25
done
mapfile -t args <"$dir/kubelet.args"
"$kubelet" "${args[@]}" </dev/null >"$dir/logs/kubelet.log" 2>&1 &

# PID 1 of the namespace inherits every orphan (containerd's shims); bash
# reaps any child on wait. A daemon that exits is left dead (the node's
# kubelet is NotReady then, as on a real machine).
trap '' TERM INT HUP
while :; do
  wait -n 2>/dev/null || sleep 1
done
