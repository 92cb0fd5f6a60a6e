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
// (libcuda.so.1), and LD_LIBRARY_PATH names the libraries' directories;
// --nvidia-cdi-hook turns the hooks on. The container also gets
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
// CARVE_<REQUEST>_MIG_PARENT_UUID, _MIG_PROFILE, _MIG_GPU_INSTANCE_ID and
// _MIG_COMPUTE_INSTANCE_ID. Unprepare destroys both instances.
//
// The checkpoint records the claim as started before the instance is made
// and keeps the instance's record (parent, profile, placement, ids); after a
// crash the instance is found again from the allocation alone (the counters
// gave that placement to this claim only) and rolled back. A GPU instance
// found at start that no checkpoint entry owns is reported in the log, never
// destroyed, and a claim whose placement it holds is refused saying so.
//
// MIG on has been run against the replay of a real H100 (testdata), not on
// the card: the lent machine's MIG mode must never be changed.
package prep
