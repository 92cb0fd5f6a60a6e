#!/usr/bin/env bash
# Installs the command-line tools the tests use that Debian does not ship
# (helm), from the Go module proxy, once, into a cache outside the repository.
# Prints the bin directory on its last line.
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE_DIR=${CARVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/carve}
BIN_DIR="$CACHE_DIR/tools-$(go env GOVERSION)/bin"
if [ ! -x "$BIN_DIR/helm-$HELM_VERSION" ]; then
  echo "[build-tools] building helm $HELM_VERSION (about 2 minutes cold)" >&2
  mkdir -p "$BIN_DIR"
  tmp=$(mktemp -d)
  GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  mv "$tmp/helm" "$BIN_DIR/helm-$HELM_VERSION"
  rmdir "$tmp"
fi
ln -sf "helm-$HELM_VERSION" "$BIN_DIR/helm"
echo "$BIN_DIR"
