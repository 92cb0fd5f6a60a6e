// Package prep prepares GPUs for containers: a whole GPU's device nodes,
// libraries and binaries through nvidia-container-toolkit's nvcdi, a MIG
// partition created through NVML at its allocated placement, and a memory
// share of a GPU (package memslice). Preparer is the GPU kinds'
// prepare.Preparer.
//
// # A whole GPU
//
// Its CDI edits carry /dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm,
// /dev/nvidia-uvm-tools, and the driver's libraries and binaries found below
// --nvidia-driver-root for the driver version NVML reports. They are built by
// nvidia-container-toolkit's pkg/nvcdi (v1.20.1, over go-nvlib v0.13.0): it
// is NVIDIA's own list of what a CUDA program needs, it searches the driver
// root rather than assuming paths, and it works over go-nvml's interface, so
// the mock drives it in tests. Where the host has no nvidia-cdi-hook (the
// lent H100 machine has no nvidia-ctk) its hooks are off and carve does
// their work: each versioned library is also mounted under its soname links
// (libcuda.so.1), beside it and in the loader's default directories of
// Debian's and Red Hat's images (/usr/lib/x86_64-linux-gnu, /usr/lib64), and
// no LD_LIBRARY_PATH is set: a CDI edit's variable replaces the image's,
// which a CUDA image needs for its own libraries (TestNodeGPUShares/driver
// libraries: a glibc program in an image with LD_LIBRARY_PATH of its own
// loads the stand-in libcuda.so.1 by its soname and keeps that variable;
// with the variable set by carve it read "/lib64"). --nvidia-cdi-hook turns
// the hooks on. The container also gets
// CARVE_<REQUEST>_GPU_UUID.
//
// # A MIG partition
//
// A MIG allocation creates, through NVML, the GPU instance of the profile at
// the allocated placement and the compute instance that fills it; its edits
// carry the parent's device node, /dev/nvidiactl and the UVM nodes, the
// libraries, and the /dev/nvidia-caps/nvidia-cap<N> nodes of the GPU and
// compute instance (minors from
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<id>[/ci<id>]/access),
// which the agent makes below --root as nvidia-modprobe would (package
// nvcaps: minor, mode and owner from the capability file, the major from
// /proc/devices' nvidia-caps line; a right node is kept, a wrong one replaced
// in one rename, a directory at the path refused), with
// CARVE_<REQUEST>_MIG_PARENT_UUID, _MIG_PROFILE, _MIG_GPU_INSTANCE_ID,
// _MIG_COMPUTE_INSTANCE_ID and _MIG_UUID (the MIG device's own UUID, what
// CUDA_VISIBLE_DEVICES and DCGM name it by; NVML finds it among the GPU's
// MIG devices by the instances' ids, and a card that does not answer it
// leaves the variable out). Unprepare destroys both instances.
//
// The nodes are made through the chart's --root mount, /host, which is
// read-only: only its top mount is, not the mounts below it. On the real
// node (chart defaults, readOnly and no propagation) /host/dev is the
// host's devtmpfs, mounted rw, and mknod there succeeded (measured
// 2026-11-30 with a pod of the chart's mount); a host whose /dev is not a
// mount of its own would refuse it with EROFS, which prepare reports with
// the node's path.
//
// The checkpoint records the claim as started before the instance is made
// and keeps the instance's record (parent, profile Id and index, placement,
// ids). The node keeps one too, under the state directory
// (mig/<hash of the claim's UID>/<device>.json, written atomically before
// the instance is made, again once its ids are known, and removed after it
// is destroyed), so that losing the checkpoint does not leak the instance:
// after a crash the instance is found again from that record (or, without
// one, from the allocation, since the counters gave that placement to this
// claim only) and rolled back. At start, a recorded instance that the
// checkpoint does not hold (it was lost or corrupt) is adopted: it stays its
// claim's, is not reported as unowned, and its placement is given to no
// one else ("Adopting a MIG instance recorded on the node..."); a record
// whose instance is gone is removed. The kubelet's unprepare of a claim the
// checkpoint does not know reaches UnprepareClaim (a prepare.ClaimCleaner,
// as netdev's and llc's preparers are), which destroys the claim's
// recorded instances (one already gone is success, and so is another
// instance at its placement whose GPU instance id is not the recorded one,
// which is left) and removes their records last. A record that does not
// belong where it is found (its claim and device derive another path), or
// that names an instance the checkpoint or another claim's record gives
// another claim, is logged and never acted on. A GPU instance that neither
// the checkpoint nor a record owns (made by hand) is reported in the log,
// never destroyed, and a claim whose placement it holds is refused saying
// so. CARVE_CRASH_AT fault points: mig-recorded (record written, no
// instance yet), mig-created (instance made, its ids not yet recorded),
// mig-destroyed (instance destroyed, record not yet removed).
//
// MIG on has been run against the replay of a real H100 (testdata), not on
// the card: the lent machine's MIG mode must never be changed.
package prep
