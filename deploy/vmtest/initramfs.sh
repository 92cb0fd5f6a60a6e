#!/usr/bin/env bash
# initramfs.sh KERNEL_DIR OUT: a small uncompressed initramfs for the kernel
# kernel.sh unpacked into KERNEL_DIR: the static busybox, this directory's
# init, and the kernel's modules (already decompressed and depmod'ed) with
# the list of those to load. Built afresh each run (under a second), so it
# always has today's init.
set -euo pipefail
kdir=${1:?usage: initramfs.sh KERNEL_DIR OUT} out=${2:?}
here=$(cd "$(dirname "$0")" && pwd)
busybox=$(command -v busybox) || { echo "initramfs.sh: no busybox (Debian: busybox-static)" >&2; exit 1; }
# A dynamic busybox (Debian's busybox package) would find no libc.
case "$(ldd "$busybox" 2>&1 || true)" in *"not a dynamic"*) ;; *) echo "initramfs.sh: $busybox is not static (Debian: busybox-static)" >&2; exit 1 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/proc" "$tmp/sys" "$tmp/dev" "$tmp/lib"
cp "$busybox" "$tmp/bin/busybox"
cp "$here/init" "$tmp/init" && chmod +x "$tmp/init"
cp -r "$kdir/lib/modules" "$tmp/lib/"
cp "$kdir/load" "$tmp/load"
(cd "$tmp" && find . | busybox cpio -o -H newc 2>/dev/null) >"$out" || { echo "initramfs.sh: cpio" >&2; exit 1; }
