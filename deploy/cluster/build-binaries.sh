#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries (and etcd) from the Go module
# proxy, once, and caches them outside the repository. k8s.io/kubernetes
# replaces its staging modules with ./staging/..., so it cannot be
# `go install`ed; instead the wrapper module in k8s-build/ requires it and
# pins every staging module to its matching v0.x release. Its committed
# go.sum pins every module's hash, so the build never asks the checksum
# database; k8s-build/regenerate.sh re-pins it for another release.
#
# Usage: build-binaries.sh [component ...]   (default: the control plane)
# Prints the bin directory on its last line.
# K8S_VERSION (default: the release k8s-build/go.mod pins) must be that
# release, unless its binaries are cached already.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODULE_DIR=$here/k8s-build
PINNED_VERSION=$(awk '$1 == "require" { $1 = "" } $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$MODULE_DIR/go.mod")
K8S_VERSION=${K8S_VERSION:-$PINNED_VERSION}
CACHE_DIR=${CARVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/carve}
GO_VERSION=$(go env GOVERSION)
BIN_DIR="$CACHE_DIR/k8s-$K8S_VERSION-$GO_VERSION/bin"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

missing=()
for c in "${components[@]}"; do
  [ -x "$BIN_DIR/$c" ] || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$BIN_DIR"
  exit 0
fi

log() { echo "[build-binaries] $*" >&2; }
if [ "$K8S_VERSION" != "$PINNED_VERSION" ]; then
  log "ERROR: K8S_VERSION=$K8S_VERSION, but $MODULE_DIR pins k8s.io/kubernetes $PINNED_VERSION;"
  log "       re-pin it first: K8S_VERSION=$K8S_VERSION $MODULE_DIR/regenerate.sh"
  exit 1
fi
mkdir -p "$BIN_DIR"
# -mod=readonly: go.mod and go.sum are used as committed; a module missing
# from go.sum is an error, never a checksum-database lookup. GOWORK=off: a
# go.work further up must not pull this module into a workspace.
export GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local GOWORK=off

# Stamp the version the way release builds do: gitVersion v1.37.0, gitMajor 1,
# gitMinor 37. Without it the binaries report v0.0.0-master, and version
# checks (kubectl skew warnings, emulation version) go wrong.
version_core=${K8S_VERSION#v}      # 1.37.0
git_major=${version_core%%.*}      # 1
git_minor=${version_core#*.}       # 37.0
git_minor=${git_minor%%.*}         # 37
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$git_major -X k8s.io/component-base/version.gitMinor=$git_minor"
pkgs=()
for c in "${missing[@]}"; do
  case "$c" in
    etcd) ;;
    *) pkgs+=("k8s.io/kubernetes/cmd/$c") ;;
  esac
done
start=$(date +%s)
if [ ${#pkgs[@]} -gt 0 ]; then
  log "building ${pkgs[*]} (about 10 minutes cold on 2 cores)"
  (cd "$MODULE_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/" "${pkgs[@]}")
fi
for c in "${missing[@]}"; do
  if [ "$c" = etcd ]; then
    log "building etcd at the version k8s.io/kubernetes pins"
    (cd "$MODULE_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd")
  fi
done
log "built ${missing[*]} in $(( $(date +%s) - start ))s"
echo "$BIN_DIR"
