#!/usr/bin/env bash
# vmtest.sh: make vmtest. For each kernel of VMTEST_KERNELS (Debian suites;
# kernel.sh fetches each suite's current kernel), runs the test binary of
# each package of VMTEST_PKGS, one after the other, in a throw-away guest
# of that kernel (run.sh), one guest at a time, with -test.run VMTEST_RUN. Exits non-zero if any package
# fails on any kernel, or any kernel cannot be fetched or booted.
# README.md beside this file says which tests run on which kernel, and why
# the default VMTEST_RUN is a subset.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
VMTEST_KERNELS=${VMTEST_KERNELS:-trixie bookworm}
VMTEST_PKGS=${VMTEST_PKGS:-./bpf ./netdev ./netdev/kernelprobe ./prepare/hook}
# VMTEST_RUN, when set, is every package's -run. Unset, the oldest kernel
# the project supports (VMTEST_MINIMUM, bookworm's 6.1: cls_bpf, act_mirred,
# no netns cookie helper) runs every test of each package but netdev, which
# runs NETDEV_RUN: under emulation all of netdev takes 3.5 minutes a kernel.
# Every newer kernel runs what it adds over that kernel and the host's
# (6.18: TCX, no ipvlan, 802.1Q or fq_codel): TCX attach beside ipvlan,
# VLANs and fq_codel leaves, and the CO-RE netns cookie read under TCX
# (NETDEV_NEWER_RUN, BPF_NEWER_RUN); the classifier's load is
# netdev/kernelprobe's, run whole everywhere. README.md beside this file
# has the table, and CI's budget.
VMTEST_MINIMUM=${VMTEST_MINIMUM:-bookworm}
# netdev's datapath tests: conformance (rates, by MAC and by address, the
# IFB, the shaper), spoofing, crash and restart, ipvlan, VLANs, the
# fq_codel leaf, and what unprepare leaves.
NETDEV_RUN='^(TestSharesHoldTheirRates|TestOnlyShareTrafficTakesTheIFB|TestShareToShareCannotBypassShaping|TestParentRootUntouchedWhileShaped'\
'|TestSpoofedFramesNeverLeave|TestAllowedMACChangeStaysInItsShare|TestKernelARPRepliesForAStolenAddressNeverLeave|TestSocketlessFramesOfAChangedMACNeverLeave|TestClosedFamilies|TestNestedLinksAreRemoved'\
'|TestQueuedRemovalResumesAfterACrash|TestUnprepareAfterRestart|TestLostCheckpointNeitherUnshapesNorLeaks'\
'|TestIPVlanShare|TestVLANShareStaysOnItsVLAN|TestSameAddressInTwoVLANs'\
'|TestShareClassesHaveBoundedLeaves|TestShareInterfaceQueueSettings|TestSparseFlowsGetTheirOwnClass|TestShareMetricsFromShapersAndIFBs'\
'|TestUnprepareLeavesNothing)$'
NETDEV_NEWER_RUN='^(TestSharesHoldTheirRates|TestOnlyShareTrafficTakesTheIFB|TestSocketlessFramesOfAChangedMACNeverLeave|TestNestedLinksAreRemoved'\
'|TestIPVlanShare|TestVLANShareStaysOnItsVLAN|TestSameAddressInTwoVLANs'\
'|TestShareClassesHaveBoundedLeaves|TestShareInterfaceQueueSettings|TestUnprepareLeavesNothing)$'
BPF_NEWER_RUN='^(TestAttachAheadOfPassingProgram|TestReattachRetakesHead|TestAttachUpdateDetach|TestCleanupDefunct'\
'|TestNetnsCookieBothWays|TestPodGuard|TestSocketlessFramesAreGuarded|TestClassifyHTB)$'
runOf() {
  local pkg=$1 suite=$2
  if [ -n "${VMTEST_RUN+set}" ]; then echo "$VMTEST_RUN"; return; fi
  case "$pkg:$([ "$suite" = "$VMTEST_MINIMUM" ] && echo minimum || echo newer)" in
  ./netdev:minimum) echo "$NETDEV_RUN" ;;
  ./netdev:newer) echo "$NETDEV_NEWER_RUN" ;;
  ./bpf:newer) echo "$BPF_NEWER_RUN" ;;
  esac
}
VMTEST_TIMEOUT=${VMTEST_TIMEOUT:-20m}
VMTEST_V=${VMTEST_V:-1}
GO=${GO:-go}
start=$(date +%s)
stamp() { echo "[vmtest +$(( $(date +%s) - start ))s] $*"; }
command -v qemu-system-x86_64 >/dev/null ||
  { echo "vmtest: no qemu-system-x86_64 (Debian: apt-get install --no-install-recommends qemu-system-x86)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/carve-vmtest.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$repo"
# Built once, on the host, static: the guest has the host's /usr, but a
# static binary does not depend on it matching.
for pkg in $VMTEST_PKGS; do
  name=$(echo "${pkg#./}" | tr / _)
  stamp "build $pkg"
  CGO_ENABLED=0 $GO test -c -o "$work/$name.test" "$pkg"
done

# One guest per kernel runs every package's binary, one after the other, in
# its package directory (a boot and its modules are about 20 s under
# emulation: a guest per package and kernel spent 2 minutes of CI's budget
# booting). The guest's script stamps each package as ok or FAIL, and exits
# non-zero when any failed.
failed=()
for suite in $VMTEST_KERNELS; do
  kdir=$("$here/kernel.sh" "$suite" | tail -n1)
  release=$(cat "$kdir/release")
  label=$suite-$release
  "$here/initramfs.sh" "$kdir" "$work/initramfs-$suite.cpio"
  script=$work/guest-$suite.sh
  {
    echo '#!/bin/bash'
    echo 'start=$(date +%s) failed=()'
    echo 'stamp() { echo "[vmtest guest +$(( $(date +%s) - start ))s] $*"; }'
  } >"$script"
  for pkg in $VMTEST_PKGS; do
    name=$(echo "${pkg#./}" | tr / _)
    [ -x "$work/$name.test" ] || { stamp "$pkg has no tests"; continue; }
    args=(-test.timeout "$VMTEST_TIMEOUT" -test.count 1)
    [ "$VMTEST_V" = 1 ] && args+=(-test.v)
    run=$(runOf "$pkg" "$suite")
    [ -n "$run" ] && args+=(-test.run "$run")
    # VMTEST_ARGS: more flags for the test binaries, say
    # '-test.bench=BenchmarkLatencyUnderLoad/tcp8 -test.benchtime=1x'.
    read -r -a extra <<<"${VMTEST_ARGS:-}"
    args+=("${extra[@]}")
    {
      printf 'stamp %q; t0=$(date +%%s)\n' "$pkg on $label"
      printf 'if (cd %q && %q' "$repo/${pkg#./}" "$work/$name.test"
      printf ' %q' "${args[@]}"
      printf '); then stamp %q"($(( $(date +%%s) - t0 ))s)"; else stamp %q"($(( $(date +%%s) - t0 ))s)"; failed+=(%q); fi\n' \
        "ok   $pkg on $label " "FAIL $pkg on $label " "$pkg"
    } >>"$script"
  done
  echo '[ ${#failed[@]} = 0 ] || { stamp "failed: ${failed[*]}"; exit 1; }' >>"$script"
  chmod +x "$script"
  stamp "the packages on $label, in one guest"
  t0=$(date +%s)
  if "$here/run.sh" "$kdir" "$work/initramfs-$suite.cpio" "$label" "$repo" -- "$script"; then
    stamp "ok   $label ($(( $(date +%s) - t0 ))s)"
  else
    stamp "FAIL $label ($(( $(date +%s) - t0 ))s): the guest's stamps above name the packages"
    failed+=("$label")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  stamp "failed: ${failed[*]}"
  exit 1
fi
stamp "all passed on: $VMTEST_KERNELS"
