#!/usr/bin/env bash
# Builds containerd 2.x (which has CDI) from the Go module proxy, once, and
# caches it beside the Kubernetes binaries. Debian 12's containerd 1.6 has no
# CDI. Prints the bin directory on its last line.
set -euo pipefail
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CACHE_DIR=${CARVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/carve}
BIN_DIR="$CACHE_DIR/containerd-$CONTAINERD_VERSION-$(go env GOVERSION)/bin"
bins=(containerd ctr containerd-shim-runc-v2)
for b in "${bins[@]}"; do
  [ -x "$BIN_DIR/$b" ] || { need=1; break; }
done
if [ "${need:-0}" = 1 ]; then
  echo "[build-containerd] building containerd $CONTAINERD_VERSION (about 6 minutes cold on 2 cores)" >&2
  start=$(date +%s)
  mkdir -p "$BIN_DIR"
  pkgs=()
  for b in "${bins[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION"); done
  GOBIN="$BIN_DIR" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" -tags no_btrfs "${pkgs[@]}"
  echo "[build-containerd] built in $(( $(date +%s) - start ))s" >&2
fi
echo "$BIN_DIR"
