// Package gpu reads a node's NVIDIA GPUs and their MIG placements from NVML
// (the real library or go-nvml's mock) into an nvmlinfo.Inventory, within a
// time bound, so that a missing, failing or hung driver costs the node its
// GPUs and never the agent.
//
// carve reads GPUs through go-nvml (github.com/NVIDIA/go-nvml) v0.13.4-1:
// cgo, dlopening libnvidia-ml.so.1 at run time, found below
// --nvidia-driver-root or by the loader, so the binary runs on hosts without
// it. A host without the library, a library that fails to initialise, or a
// call that does not return within --nvml-timeout (10 s; some drivers hang)
// costs the node its GPUs and says so, never the agent: a hung call leaves
// the session wedged and later calls fail at once. A Session's Lane is a way
// into the library of its own, so that a short periodic query (the policing
// loop's) is never delayed by a prepare's long NVML calls (the CDI library's
// file walk, MIG creates). MIG placements are read for each profile NVML
// knows (profiles.go); nothing comes from a built-in table. How GPUs and MIG
// placements are published is package slices.
//
// # The GPU packages
//
//   - gpuopen opens the node's NVML (the library, or a replay file).
//   - nvmlreplay answers NVML from a replay file through go-nvml's mock
//     (discovery/nvmlinfo has the format).
//   - prep prepares whole GPUs (nvcdi) and MIG instances (NVML), and hands
//     memory shares to memslice.
//   - nvcaps makes the /dev/nvidia-caps nodes of MIG instances.
//   - memslice chooses each GPU's enforcement tier and prepares memory
//     slices (its TIERS.md: what each tier guarantees, measured on an H100).
//   - mps runs the per-claim MPS control daemons; police is the policing loop
//     of the mps-policed tier; dmem the dmem cgroup limits of the dmem tier.
//   - acceptance is the acceptance run on a real GPU (results in
//     acceptance/results).
//   - gputest holds test helpers (root checks, short temporary directories).
package gpu
