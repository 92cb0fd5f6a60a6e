#!/usr/bin/env bash
# run.sh KERNEL_DIR INITRAMFS LABEL DIR -- CMD [ARG...]: runs CMD (a test
# binary built on the host) in a throw-away qemu guest of the kernel in
# KERNEL_DIR (kernel.sh), with DIR as its working directory, and exits with
# CMD's exit status. The guest has no network card; the checkout (DIR's
# repository) and CMD's directory are mounted read-only at their host paths,
# the host's /usr and /etc read-only (the guest runs the host's iproute2,
# iperf3 and bash). Its console streams to stdout.
#
# KVM cannot be used on this project's machines (the host's KVM runs only
# PVM guests: README.md beside this file), so the guest is emulated (TCG):
# CPU work is about 7x slower, and rates are judged in a band that fits
# emulation (bpf/nettest.GoodputBand, keyed by CARVE_VMTEST, which the guest
# sets to LABEL).
set -euo pipefail
kdir=${1:?usage: run.sh KERNEL_DIR INITRAMFS LABEL DIR -- CMD [ARG...]}
initramfs=${2:?} label=${3:?} dir=${4:?}
shift 4
[ "${1:-}" = -- ] && shift
[ $# -gt 0 ] || { echo "run.sh: no command" >&2; exit 2; }
# Past this the guest is killed and the run fails: a hung guest is no pass.
VMTEST_GUEST_TIMEOUT=${VMTEST_GUEST_TIMEOUT:-1500}
VMTEST_MEM=${VMTEST_MEM:-2G}
VMTEST_SMP=${VMTEST_SMP:-2}

cmd=$(readlink -f "$1"); shift
dir=$(readlink -f "$dir")
repo=$(git -C "$dir" rev-parse --show-toplevel)
run=$(mktemp -d "${TMPDIR:-/tmp}/carve-vmtest-run.XXXXXX")
trap 'rm -rf "$run"' EXIT
{
  echo "m0 $repo"
  case "$(dirname "$cmd")/" in "$repo"/*) ;; *) echo "m1 $(dirname "$cmd")" ;; esac
} >"$run/mounts"
{
  echo '#!/bin/bash'
  echo 'export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp'
  printf 'export CARVE_VMTEST=%q CARVE_NET_REQUIRED=1\n' "$label"
  printf 'cd %q || exit 125\n' "$dir"
  printf 'exec %q' "$cmd"
  printf ' %q' "$@"
  echo
} >"$run/run"
chmod +x "$run/run"

virtfs() { echo "local,path=$1,mount_tag=$2,security_model=none${3:+,readonly=on}"; }
args=(-accel tcg,thread=multi -cpu max -m "$VMTEST_MEM" -smp "$VMTEST_SMP"
  -nodefaults -nographic -no-reboot -serial stdio -monitor none
  -kernel "$kdir/vmlinuz" -initrd "$initramfs"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rdinit=/init"
  -virtfs "$(virtfs /usr usr ro)" -virtfs "$(virtfs /etc etc ro)" -virtfs "$(virtfs "$run" vmtest)")
while read -r tag path; do args+=(-virtfs "$(virtfs "$path" "$tag" ro)"); done <"$run/mounts"
# A guest that dies before its init starts the test is booted once more:
# multi-threaded TCG now and then faults in the kernel's early boot (an
# int3 Oops in sched_clock_cpu on 6.12, seen once in a dozen runs). One that
# dies in the test is a failure.
for attempt in 1 2; do
  rc=0
  timeout --foreground -k 10 "$VMTEST_GUEST_TIMEOUT" qemu-system-x86_64 "${args[@]}" </dev/null || rc=$?
  if [ -f "$run/rc" ] || [ -f "$run/started" ] || [ $attempt = 2 ]; then
    break
  fi
  echo "run.sh: the guest ($label) died before the test started (qemu exited $rc); booting it again, once" >&2
done
if [ ! -f "$run/rc" ]; then
  echo "run.sh: the guest ($label) wrote no exit status (qemu exited $rc; $([ $rc = 124 ] && echo "killed after ${VMTEST_GUEST_TIMEOUT}s" || echo "a panic or a crash"))" >&2
  exit 1
fi
exit "$(cat "$run/rc")"
