#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries (and etcd) from the Go module
# proxy, once, and caches them outside the repository. k8s.io/kubernetes
# replaces its staging modules with ./staging/..., so it cannot be
# `go install`ed; instead a throwaway wrapper module requires it and pins
# every staging module to its matching v0.x release.
#
# Usage: build-binaries.sh [component ...]   (default: the control plane)
# Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.0}
CACHE_DIR=${CARVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/carve}
GO_VERSION=$(go env GOVERSION)
BIN_DIR="$CACHE_DIR/k8s-$K8S_VERSION-$GO_VERSION/bin"
WORK_DIR="$CACHE_DIR/k8s-$K8S_VERSION-$GO_VERSION/wrapper"

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
mkdir -p "$BIN_DIR" "$WORK_DIR"
export GOFLAGS=-mod=mod GONOSUMDB=k8s.io/kubernetes GOTOOLCHAIN=local

if [ ! -f "$WORK_DIR/go.sum" ] || [ ! -f "$WORK_DIR/.resolved" ]; then
  log "resolving k8s.io/kubernetes@$K8S_VERSION from the module proxy"
  k8s_mod=$(cd "$WORK_DIR" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging_version="v0.${K8S_VERSION#v1.}"
  {
    echo "module carve.dev/k8s-binaries"
    echo
    grep -E '^go [0-9]' "$k8s_mod"
    grep -E '^godebug ' "$k8s_mod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # The proxy refuses the sample modules, and nothing built here needs them.
    grep -E '=> \./staging/' "$k8s_mod" | awk '{print $1}' | grep -vE 'k8s.io/sample-(cli-plugin|controller)$' |
      while read -r m; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$WORK_DIR/go.mod"
  cat >"$WORK_DIR/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$WORK_DIR" && go mod tidy >&2)
  touch "$WORK_DIR/.resolved"
fi

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
  (cd "$WORK_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN_DIR/" "${pkgs[@]}")
fi
for c in "${missing[@]}"; do
  if [ "$c" = etcd ]; then
    log "building etcd at the version k8s.io/kubernetes pins"
    (cd "$WORK_DIR" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd")
  fi
done
log "built ${missing[*]} in $(( $(date +%s) - start ))s"
echo "$BIN_DIR"
