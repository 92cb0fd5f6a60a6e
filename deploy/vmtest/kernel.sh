#!/usr/bin/env bash
# kernel.sh SUITE: the Debian kernel that SUITE's linux-image-amd64
# metapackage depends on today, fetched once into the cache and unpacked to
# what a guest needs: vmlinuz and the modules of MODULES (below) with their
# dependencies, xz-decompressed (busybox's modprobe does not read .ko.xz)
# and depmod'ed here on the host by busybox (kmod need not be installed).
# Prints the kernel's directory on its last line: vmlinuz, release (uname
# -r), version (the package's), load (the modules to load) and
# lib/modules/<release>/.
#
# The package is resolved at run time through a private sources list and
# private apt state (the host's apt configuration and installed packages
# play no part): Debian drops a kernel's package from the suite when its ABI
# changes, so a hard-coded version would stop resolving. Every failure
# exits non-zero, loudly: a kernel that cannot be fetched is never a pass.
set -euo pipefail
suite=${1:?usage: kernel.sh SUITE (trixie, bookworm, ...)}
MIRROR=${VMTEST_MIRROR:-http://deb.debian.org/debian}
KEYRING=${VMTEST_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
CACHE=${VMTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/carve/vmtest}
log() { echo "[vmtest kernel $suite] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# What the tests and the guest need, by module name. Everything in
# net/sched (qdiscs, classifiers and actions, so that a probe finds each
# that the kernel has) is added below; a name the kernel builds in, or
# lacks, is simply not there (the tests probe features, not modules).
# xfrm_user and nfnetlink: vishvananda/netlink opens their netlink families
# with every handle (NETLINK_XFRM, NETLINK_NETFILTER), and fails without.
MODULES=(9p 9pnet_virtio virtio_pci veth macvlan ipvlan 8021q ifb dummy bridge xfrm_user nfnetlink)

apt_dir=$CACHE/apt/$suite
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
echo "deb [signed-by=$KEYRING] $MIRROR $suite main" >"$apt_dir/sources.list"
apt_opts=(-q -o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/dev/null
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Dir::State::status=/dev/null
  -o Acquire::Languages=none -o APT::Architecture=amd64 -o APT::Architectures=amd64)
log "resolving linux-image-amd64 from $MIRROR $suite"
apt-get "${apt_opts[@]}" update >"$apt_dir/update.log" 2>&1 ||
  { cat "$apt_dir/update.log" >&2; die "apt-get update of $suite"; }
# The metapackage's one dependency is the ABI-versioned image package.
pkg=$(apt-cache "${apt_opts[@]}" show linux-image-amd64 2>/dev/null |
  sed -n 's/^Depends: \(linux-image-[^ ,]*\).*/\1/p' | head -n1)
[ -n "$pkg" ] || die "no linux-image-amd64 in $suite, or it names no image package"
version=$(apt-cache "${apt_opts[@]}" show "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n1)
[ -n "$version" ] || die "no version of $pkg in $suite"

# Keyed by the package's version and by what is unpacked from it: bump
# UNPACK when the unpacking below changes.
UNPACK=1
unpacked=$(echo "$UNPACK ${MODULES[*]}" | sha256sum | cut -c1-8)
dir=$CACHE/kernels/$suite/${pkg}_${version//[^A-Za-z0-9.+~_-]/_}_$unpacked
if [ -f "$dir/complete" ]; then
  log "cached: $pkg $version"
  echo "$dir"
  exit 0
fi
log "fetching $pkg $version (about 100 MB)"
rm -rf "$dir" && mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get "${apt_opts[@]}" download "$pkg=$version" >"$tmp/download.log" 2>&1) ||
  { cat "$tmp/download.log" >&2; die "apt-get download $pkg=$version"; }
deb=$(ls "$tmp"/*.deb) || die "apt-get download left no .deb"

# Only what a guest can need: vmlinuz and the module trees that hold the
# wanted modules and their dependencies (lib/ and crypto/ for checksums).
members=$tmp/members
dpkg-deb --fsys-tarfile "$deb" | tar -t |
  grep -E '^\./boot/vmlinuz-|^\./(usr/)?lib/modules/[^/]+/(modules\.[a-z.]+$|kernel/(net|drivers/net|drivers/virtio|fs/9p|fs/netfs|fs/fscache|lib|crypto)/.*\.ko(\.xz)?$)' \
  >"$members" || die "list $deb"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" -T "$members" 2>"$tmp/tar.log" ||
  { cat "$tmp/tar.log" >&2; die "unpack $deb"; }
moddir=
for d in "$tmp"/usr/lib/modules/* "$tmp"/lib/modules/*; do [ -d "$d" ] && moddir=$d && break; done
[ -n "$moddir" ] || die "$deb holds no modules directory"
# depmod -b reads BASE/lib/modules: trixie's modules are under /usr.
[ -e "$tmp/lib/modules" ] || { mkdir -p "$tmp/lib" && ln -s "$(dirname "$moddir")" "$tmp/lib/modules"; }
release=$(basename "$moddir")
cp "$tmp/boot/vmlinuz-$release" "$dir/vmlinuz" || die "$deb holds no vmlinuz-$release"
find "$moddir" -name '*.ko.xz' -exec xz -d {} + || die "xz -d the modules"
busybox depmod -b "$tmp" "$release" 2>"$tmp/depmod.log" || { cat "$tmp/depmod.log" >&2; die "depmod"; }

# The closure of the wanted modules, from modules.dep ("path: dep dep").
dep=$moddir/modules.dep
wanted=()
for m in "${MODULES[@]}"; do
  p=$(grep -E "(^|/)${m//_/[-_]}\.ko:" "$dep" | cut -d: -f1 || true)
  [ -n "$p" ] && wanted+=("$p")
done
while read -r p; do wanted+=("$p"); done < <(grep -oE '^kernel/net/sched/[^:]+\.ko' "$dep")
declare -A keep=()
queue=("${wanted[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}; queue=("${queue[@]:1}")
  [ -n "${keep[$p]:-}" ] && continue
  keep[$p]=1
  for d in $(grep -E "^${p//./\\.}:" "$dep" | cut -d: -f2-); do queue+=("$d"); done
done
out=$dir/lib/modules/$release
mkdir -p "$out"
for p in "${!keep[@]}"; do
  mkdir -p "$out/$(dirname "$p")"
  cp "$moddir/$p" "$out/$p"
done
cp "$moddir"/modules.order "$moddir"/modules.builtin "$out/" 2>/dev/null || true
busybox depmod -b "$dir" "$release" 2>"$tmp/depmod2.log" || { cat "$tmp/depmod2.log" >&2; die "depmod of the kept modules"; }
# The names the guest loads: the wanted ones (their dependencies follow).
for p in "${wanted[@]}"; do basename "$p" .ko; done | sort -u >"$dir/load"
echo "$release" >"$dir/release"
echo "$version" >"$dir/version"
touch "$dir/complete"
log "unpacked $release ($(du -sh "$dir" | cut -f1)): ${#keep[@]} modules"
echo "$dir"
