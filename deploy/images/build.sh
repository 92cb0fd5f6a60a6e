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
#   --symlink LINK=TARGET  create the symlink LINK -> TARGET in the image
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
set -euo pipefail

log() { echo "[image-build] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

name="" out="" workdir=/
files=() dirs=() links=() entrypoint=() cmd=() env=()
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1 needs a value (see the usage at the top of $0)"
  case "$1" in
    --name) name=$2 ;;
    --file) files+=("$2") ;;
    --dir) dirs+=("$2") ;;
    --symlink) links+=("$2") ;;
    --entrypoint) entrypoint+=("$2") ;;
    --cmd) cmd+=("$2") ;;
    --env) env+=("$2") ;;
    --workdir) workdir=$2 ;;
    --out) out=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done
[ -n "$name" ] || die "--name is required"
[ ${#files[@]} -gt 0 ] || [ ${#dirs[@]} -gt 0 ] || die "nothing to put in the image (--file/--dir)"
for tool in tar sha256sum ldd stat; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# --- the reference containerd will store ----------------------------------
# Same normalisation as the docker/containerd reference parser: a missing tag
# is :latest, a first component without '.' or ':' (and not localhost) is not
# a registry, so docker.io is prefixed, plus library/ for a single component.
ref=$name
case "${ref##*/}" in *:*) ;; *) ref="$ref:latest" ;; esac
first=${ref%%/*}
if [ "$first" = "$ref" ]; then
  ref="docker.io/library/$ref"
else
  case "$first" in
    *.* | *:* | localhost) ;;
    *) ref="docker.io/$ref" ;;
  esac
fi
tag=${ref##*:}

if [ -z "$out" ]; then
  base=${name//\//_}
  base=${base//:/_}
  case "$name" in *:*) ;; *) base="${base}_latest" ;; esac
  out="${CARVE_IMAGE_DIR:-/tmp/carve-images}/$base.tar"
fi
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

work=$(mktemp -d "${TMPDIR:-/tmp}/carve-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
layout=$work/layout
mkdir -p "$root" "$layout/blobs/sha256"
# Mount points runc expects; it would create them, but an image that has them
# behaves the same on every runtime. /tmp is world-writable as usual.
mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"

# put SRC DEST: copies one file (following symlinks: the image gets the
# content, e.g. libc.so.6 rather than a dangling link to libc-2.36.so).
put() {
  [ -f "$1" ] || die "$1: not a file"
  mkdir -p "$root$(dirname "$2")"
  cp -L --preserve=mode "$1" "$root$2"
}

# libs FILE: prints the absolute paths of FILE's shared libraries and loader,
# one per line, nothing for a static binary or a non-ELF file. ldd lines look
# like "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
libs() {
  local hdr
  hdr=$(head -c 4 "$1" | od -An -c | tr -d ' ')
  [ "$hdr" = 177ELF ] || return 0
  # ldd exits non-zero for static binaries ("not a dynamic executable").
  { ldd "$1" 2>/dev/null || true; } | awk '
    /=> not found/ { print "MISSING " $1; next }
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }'
}

for spec in "${files[@]}"; do
  src=${spec%%:*}
  dest=$src
  [ "$spec" = "$src" ] || dest=${spec#*:}
  case "$dest" in /*) ;; *) die "--file $spec: destination must be absolute" ;; esac
  put "$src" "$dest"
  while read -r lib; do
    [ -n "$lib" ] || continue
    case "$lib" in MISSING*) die "$src needs ${lib#MISSING }, which ldd cannot find" ;; esac
    [ -e "$root$lib" ] || put "$lib" "$lib"
  done < <(libs "$src")
done
for spec in "${dirs[@]}"; do
  src=${spec%%:*} dest=${spec#*:}
  [ -d "$src" ] || die "--dir $spec: $src is not a directory"
  mkdir -p "$root$dest"
  cp -a "$src/." "$root$dest/"
done
for spec in "${links[@]}"; do
  link=${spec%%=*} target=${spec#*=}
  mkdir -p "$root$(dirname "$link")"
  ln -sfn "$target" "$root$link"
done

# --- layer -------------------------------------------------------------------
# Sorted names, fixed owner and time: the digest depends only on the content.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$root" -cf "$work/layer.tar" .

# blob FILE MEDIATYPE: moves FILE into the layout's blob store and prints the
# OCI descriptor JSON for it.
blob() {
  local digest size
  digest=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  mv "$1" "$layout/blobs/sha256/$digest"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$digest" "$size"
}

# json_str S: S as a JSON string (escapes backslash, quote and control chars
# that can plausibly occur in arguments: tab, newline, carriage return).
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  printf '"%s"' "$s"
}
# json_list ARG...: a JSON array of strings.
json_list() {
  local sep="" a
  printf '['
  for a in "$@"; do
    printf '%s%s' "$sep" "$(json_str "$a")"
    sep=,
  done
  printf ']'
}

diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer_desc=$(blob "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)

has_path=0
for e in "${env[@]}"; do
  case "$e" in PATH=*) has_path=1 ;; esac
done
[ $has_path = 1 ] || env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "${env[@]}")

arch=$(uname -m)
case "$arch" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
esac
{
  printf '{"architecture":"%s","os":"linux","config":{' "$arch"
  printf '"Env":%s,"WorkingDir":%s' "$(json_list "${env[@]}")" "$(json_str "$workdir")"
  [ ${#entrypoint[@]} -eq 0 ] || printf ',"Entrypoint":%s' "$(json_list "${entrypoint[@]}")"
  [ ${#cmd[@]} -eq 0 ] || printf ',"Cmd":%s' "$(json_list "${cmd[@]}")"
  printf '},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},' "$diff_id"
  printf '"history":[{"created_by":"deploy/images/build.sh"}]}'
} >"$work/config.json"
config_desc=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
  "$config_desc" "$layer_desc" >"$work/manifest.json"
manifest_desc=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)

# io.containerd.image.name makes `ctr images import` store exactly this
# reference; org.opencontainers.image.ref.name is the standard (tag-only) name.
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,"annotations":{"io.containerd.image.name":%s,"org.opencontainers.image.ref.name":%s}}]}' \
  "${manifest_desc%\}}" "$(json_str "$ref")" "$(json_str "$tag")" >"$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$out.tmp" .
mv "$out.tmp" "$out"
manifest_digest=$(printf '%s' "$manifest_desc" | sed 's/.*"digest":"\([^"]*\)".*/\1/')
log "built $ref ($(du -h "$out" | cut -f1), manifest $manifest_digest) -> $out"
echo "$out"
