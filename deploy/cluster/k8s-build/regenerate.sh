#!/usr/bin/env bash
# Re-pins the wrapper module that build-binaries.sh builds Kubernetes and etcd
# from. k8s.io/kubernetes replaces its staging modules with ./staging/..., so
# it cannot be `go install`ed; this module requires it and pins every staging
# module to its matching v0.x release. Writes go.mod and go.sum (go mod tidy
# over tools.go's imports) beside this script, or into DIR; commit both.
#
# Usage: [K8S_VERSION=v1.x.y] regenerate.sh [DIR]
#   K8S_VERSION  the k8s.io/kubernetes release (default: the one go.mod pins)
#
# Every hash is checked against the Go checksum database (GOSUMDB), as for any
# module. Should the database have no entry for a k8s.io/kubernetes release
# (`go: verifying k8s.io/kubernetes@...`: not found), run it once with
# GONOSUMDB=k8s.io/kubernetes: that module's hashes are then taken from the
# module proxy unchecked, so compare them with another source (the
# k8s.io/kubernetes lines of a go.sum that already has them, e.g.
# scheduler/go.sum) before committing. build-binaries.sh never needs it: it
# only builds with the committed go.sum.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here}
log() { echo "[k8s-build] $*" >&2; }

pinned=$(awk '$1 == "require" { $1 = "" } $1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' \
  "$here/go.mod" 2>/dev/null || true)
K8S_VERSION=${K8S_VERSION:-$pinned}
[ -n "$K8S_VERSION" ] || { log "ERROR: set K8S_VERSION (no go.mod to take it from)"; exit 1; }
staging_version="v0.${K8S_VERSION#v1.}"

export GOFLAGS=-mod=mod GOTOOLCHAIN=local GOWORK=off
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/tools.go" "$tmp/"

log "resolving k8s.io/kubernetes@$K8S_VERSION from the module proxy"
k8s_mod=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[ -f "$k8s_mod" ] || { log "ERROR: could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
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
} >"$tmp/go.mod"
(cd "$tmp" && go mod tidy >&2)

mkdir -p "$out"
cp "$tmp/go.mod" "$tmp/go.sum" "$out/"
[ "$out" -ef "$here" ] || cp "$here/tools.go" "$out/"
log "pinned k8s.io/kubernetes $K8S_VERSION in $out/go.mod and go.sum"
