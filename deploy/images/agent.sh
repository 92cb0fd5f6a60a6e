#!/usr/bin/env bash
# Builds the agent's image archive from bin/carve and bin/carve-hook (make
# build): what the chart runs, for the demo and for `make release`.
#
# Usage: agent.sh NAME:TAG [--out FILE]
# Prints the archive path as its last stdout line (build.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
name=${1:?usage: agent.sh NAME:TAG [--out FILE]}
shift
# libnvidia-ml.so.1 is dlopened from the host's driver root; what it needs
# beside libc is added here, since ldd cannot see a dlopen.
nvml_deps=()
libdir=$(dirname "$(ldd "$repo/bin/carve" | awk '/libc.so.6/ {print $3}')")
for lib in libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
  [ -e "$libdir/$lib" ] && nvml_deps+=(--file "$libdir/$lib")
done
exec "$here/build.sh" --name "$name" --file "$repo/bin/carve:/carve" --file "$repo/bin/carve-hook:/carve-hook" \
  --file /usr/share/misc/pci.ids:/usr/share/misc/pci.ids "${nvml_deps[@]}" --entrypoint /carve "$@"
