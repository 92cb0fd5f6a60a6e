#!/usr/bin/env bash
# Builds a single-layer OCI image archive from files on this host, with no
# registry, no Docker and no base image: the local test cluster
# (deploy/cluster) cannot pull, so every image it runs is made this way and
# imported with import.sh.
#
# Usage:
#   build.sh --name NAME[:TAG] [options]
# Options (each may repeat unless noted):
#   --file SRC[:DEST]    copy SRC into the image at DEST (default: the same
#                        path as SRC). If SRC is a dynamically linked ELF file,
#                        every shared library `ldd` lists for it, the dynamic
#                        loader included, is copied too, at the path ldd
#                        prints, so cgo binaries run as they do on the host.
#                        Libraries loaded with dlopen (NSS modules, plugins)
#                        are not found by ldd: add them with --file.
#   --dir SRC:DEST       copy the directory tree SRC to DEST (no ldd scan)
#                        with its modes and symlinks (as cp -a)
#   --symlink LINK=TARGET  create the symlink LINK -> TARGET in the image
#                        (LINK absolute; it replaces a file or link there)
#   --entrypoint ARG     append ARG to the image's Entrypoint
#   --cmd ARG            append ARG to the image's Cmd
#   --env KEY=VALUE      add to the image's Env (PATH defaults to
#                        /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
#   --workdir DIR        the image's WorkingDir (once; default /)
#   --out FILE           where to write the archive (once; default
#                        ${CARVE_IMAGE_DIR:-/tmp/carve-images}/<name>_<tag>.tar)
# Prints the archive path as its LAST stdout line; progress goes to stderr.
#
# The image name is stored as containerd's fully qualified reference
# (carve:dev -> docker.io/library/carve:dev), which is what the kubelet asks
# containerd for when a pod says `image: carve:dev`.
#
# Example (the carve agent image), then import into the running cluster:
#   archive=$(deploy/images/build.sh --name carve:dev \
#     --file "$PWD/bin/carve:/carve" --entrypoint /carve | tail -n1)
#   deploy/images/import.sh "$archive"
# and in the pod spec: image: carve:dev, imagePullPolicy: Never.
#
# The archive is an OCI image layout in a tar (oci-layout, index.json,
# blobs/sha256/...) with an uncompressed layer; it is reproducible: the same
# inputs give the same image digest (file times and owners are normalised).
#
# The work is done by the Go program in ./ocibuild (go-containerregistry),
# built once per change of its sources into a cache by deploy/gotool.sh; this
# script keeps the command line every caller uses.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tool=$("$here/../gotool.sh" deploy/images/ocibuild | tail -n1) ||
  { echo "[image-build] ERROR: building deploy/images/ocibuild failed" >&2; exit 1; }
exec "$tool" "$@"
