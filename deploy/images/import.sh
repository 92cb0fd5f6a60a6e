#!/usr/bin/env bash
# Imports OCI image archives (from build.sh) into the containerd of the local
# test cluster (deploy/cluster/up.sh), in the k8s.io namespace the kubelet
# uses, so pods can run them with imagePullPolicy: Never.
#
# Usage: import.sh ARCHIVE...
# Environment:
#   CARVE_CLUSTER_DIR        the cluster's state dir (default /tmp/carve-cluster);
#                            its cluster.env names the containerd socket
#   CARVE_CONTAINERD_ADDRESS the containerd socket, overriding cluster.env
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "[image-import] $*" >&2; }
[ $# -gt 0 ] || { log "usage: $0 ARCHIVE..."; exit 2; }

STATE_DIR=${CARVE_CLUSTER_DIR:-/tmp/carve-cluster}
STATE_DIR=${STATE_DIR%/}
address=${CARVE_CONTAINERD_ADDRESS:-}
ctr_bin=""
# cluster.env is KEY=VALUE lines written by up.sh; read the two keys rather
# than sourcing it, so a stray line cannot run anything.
if [ -f "$STATE_DIR/cluster.env" ]; then
  [ -n "$address" ] || address=$(sed -n 's/^CARVE_CONTAINERD_ADDRESS=//p' "$STATE_DIR/cluster.env")
  bin_dir=$(sed -n 's/^CARVE_CONTAINERD_BIN_DIR=//p' "$STATE_DIR/cluster.env")
  [ -z "$bin_dir" ] || ctr_bin=$bin_dir/ctr
fi
[ -n "$address" ] || address=$STATE_DIR/containerd/containerd.sock
# ctr takes a relative socket path for a URL authority and fails.
case "$address" in /*) ;; *) address=$PWD/$address ;; esac
[ -S "$address" ] || { log "ERROR: no containerd socket at $address (is the cluster up with its node?)"; exit 1; }
# The same cached build the cluster runs (a no-op once built).
[ -x "$ctr_bin" ] || ctr_bin=$("$here/../cluster/build-containerd.sh" | tail -n1)/ctr

for archive in "$@"; do
  [ -f "$archive" ] || { log "ERROR: $archive: no such file"; exit 1; }
  # Unpacked on import (the default) into the CRI's snapshotter, so the first
  # container start does not pay for it.
  # ctr warns on every call that cgroup v1 is deprecated; that is the host,
  # not news, so that one line is dropped.
  if ! out=$("$ctr_bin" --address "$address" --namespace k8s.io images import --snapshotter overlayfs "$archive" 2>&1); then
    log "ERROR: importing $archive failed:"
    echo "$out" >&2
    exit 1
  fi
  # ctr's progress table is noise; keep its warnings except the one that
  # every call prints on this host (cgroup v1 is deprecated).
  grep 'level=' <<<"$out" | grep -v 'support for cgroup v1 is deprecated' >&2 || true
  log "imported $archive"
done
