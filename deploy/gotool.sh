#!/usr/bin/env bash
# Builds one of the deploy scripts' Go tools (a main package of this module,
# e.g. deploy/images/ocibuild) once, into a cache outside the repository, and
# prints the binary's path as its LAST stdout line. Scripts that run a tool
# many times (build.sh runs per image, tests build many images) pay for the
# compile once per change of its sources rather than a `go run` each time.
#
# Usage: gotool.sh PKG_DIR   (relative to the repository root)
# Environment: CARVE_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/carve)
#
# The cache key is the Go version, go.mod, go.sum and the package's own .go
# files. That is the whole input only because these tools import nothing
# else from this module: keep it so, or add what they import to the key.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pkg=${1:?usage: gotool.sh PKG_DIR}
pkg=${pkg%/}
name=$(basename "$pkg")
[ -d "$root/$pkg" ] || { echo "[gotool] ERROR: no package directory $root/$pkg" >&2; exit 1; }
cache=${CARVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/carve}/gotools

# File names are hashed too, so a rename changes the key.
key=$(
  cd "$root"
  {
    go env GOVERSION
    cat go.mod go.sum
    for f in "$pkg"/*.go; do
      echo "$f"
      cat "$f"
    done
  } | sha256sum | cut -c1-16
) || { echo "[gotool] ERROR: cannot read the sources of $pkg (is go on PATH?)" >&2; exit 1; }
bin=$cache/$name-$key

if [ ! -x "$bin" ]; then
  echo "[gotool] building $name (once per change of its sources)" >&2
  mkdir -p "$cache"
  # Built beside its final name and renamed: callers running at the same
  # time (parallel tests) each see a whole binary or none. No cgo: the tools
  # need none, and the Makefile's CGO_ENABLED=1 would make them depend on
  # the host's libc.
  tmp=$(mktemp "$cache/.$name.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" "./$pkg") >&2
  mv -f "$tmp" "$bin"
fi
echo "$bin"
