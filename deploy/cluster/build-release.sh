#!/usr/bin/env bash
# Builds an earlier release of carve from its commit (deploy/CHANGELOG.md
# records each release's): bin/carve, bin/carve-hook and its chart, from a
# git worktree of this clone, cached like the Kubernetes binaries. The
# upgrade test installs it, then upgrades to the tree under test.
#
# Usage: build-release.sh COMMIT
# Prints the release's directory (bin/, chart/carve) as its last line.
set -euo pipefail
commit=${1:?usage: build-release.sh COMMIT}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
go=${GO:-go}
cache=${CARVE_CACHE_DIR:-$HOME/.cache/carve}/releases/$commit
if [ -x "$cache/bin/carve" ] && [ -x "$cache/bin/carve-hook" ] && [ -f "$cache/chart/carve/Chart.yaml" ]; then
  echo "$cache"
  exit 0
fi
if ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
  # A shallow clone: its history, where the remote gives it.
  git -C "$repo" fetch --quiet --unshallow 2>/dev/null || git -C "$repo" fetch --quiet origin "$commit" 2>/dev/null || true
fi
if ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "build-release: commit $commit is not in this clone's history" >&2
  exit 3
fi
echo "[build-release] building carve at ${commit:0:12} (about a minute)" >&2
tmp=$(mktemp -d)
cleanup() {
  git -C "$repo" worktree remove --force "$tmp/src" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
git -C "$repo" worktree add --detach --quiet "$tmp/src" "$commit"
tags=$(grep -v '^#' "$tmp/src/cmd/carve/buildtags")
(
  cd "$tmp/src"
  "$go" build -tags "$tags" -o "$tmp/out/bin/carve" ./cmd/carve
  CGO_ENABLED=0 "$go" build -trimpath -ldflags '-s -w' -o "$tmp/out/bin/carve-hook" ./cmd/carve-hook
)
mkdir -p "$tmp/out/chart"
cp -r "$tmp/src/deploy/chart/carve" "$tmp/out/chart/"
mkdir -p "$(dirname "$cache")"
rm -rf "$cache"
mv "$tmp/out" "$cache"
echo "$cache"
