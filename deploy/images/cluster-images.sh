#!/usr/bin/env bash
# Builds the two images every local test cluster needs (deploy/cluster/up.sh
# imports them into its containerd):
#   carve-pause:latest  the pod sandbox image: the static pause program in
#                       ./pause (containerd's pinned sandbox image)
#   carve-test:latest   a small test image: Debian's busybox-static as
#                       /bin/busybox plus applet symlinks (sh, ls, cat, ...);
#                       run it as e.g. `command: ["sleep", "3600"]`
# Usage: cluster-images.sh OUT_DIR
# Prints the two archive paths, one per line, on stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: cluster-images.sh OUT_DIR}
mkdir -p "$out"

# Static, so the image is just the one file. The Go build cache makes this a
# fraction of a second after the first time.
(cd "$here/pause" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/pause" .)
"$here/build.sh" --name carve-pause:latest --file "$out/pause:/pause" \
  --entrypoint /pause --out "$out/carve-pause.tar" | tail -n1

# busybox-static: dynamically linked /bin/busybox would drag in libc too; the
# static one is self-contained. The applets are symlinks, as the busybox
# package's own install does.
busybox=/bin/busybox
# ldd exits 1 for a static binary, hence the `|| true`.
if [ ! -x "$busybox" ] || ! { ldd "$busybox" 2>&1 || true; } | grep -q "not a dynamic"; then
  echo "[cluster-images] ERROR: $busybox is missing or not static; apt-get install busybox-static" >&2
  exit 1
fi
links=()
applets=$("$busybox" --list)
for applet in sh ash ls cat env sleep echo ps mount grep sed mkdir rm cp mv ln ip ping nc wget id hostname uname head tail wc sort tr test true false kill date touch find xargs printf stat readlink df du free top timeout; do
  # Only applets this busybox build has (`busybox --list` names them).
  if grep -qx "$applet" <<<"$applets"; then links+=(--symlink "/bin/$applet=busybox"); fi
done
"$here/build.sh" --name carve-test:latest --file "$busybox:/bin/busybox" "${links[@]}" \
  --cmd /bin/sh --out "$out/carve-test.tar" | tail -n1
