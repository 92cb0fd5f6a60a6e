// Package prepare is carve's kubelet plugin core: the Driver answers the
// kubelet's NodePrepareResources and NodeUnprepareResources through the
// k8s.io/dynamic-resource-allocation kubeletplugin helper, and dispatches
// each allocated device to the Preparer of its kind. Prepare begins in
// Driver.PrepareResourceClaims (prepare_claims.go), unprepare in
// unprepare_claims.go.
//
// # The contract of a device kind
//
// A device kind is prepared by a type that implements Preparer (and
// Restorer, where it keeps state in memory): given an Allocation (the claim,
// the device, the ShareID and consumed capacity of a share, and the
// effective carve.dev/v1alpha1 configuration) and the published device, it
// makes the device usable on the host and returns Prepared: the container
// edits, an undo record, and network data for the claim's status. The kinds
// are netdev.NICPreparer, the GPU and MIG preparer in gpu/prep, fpga.Preparer
// (prepare/fpga) and llc.Preparer (prepare/llc); cmd/carve/app wires them
// (kinds.go) and runs the plugin on a node.
//
// # What the driver does around a preparer
//
// Before anything is applied the driver decodes and validates the claim's
// opaque configuration (package api/v1alpha1), checks that every device is
// its own, that an unshared device is not prepared for another claim and
// that shares fit the device's capacity, and records the claim as started
// in the checkpoint (package checkpoint). Where another claim's record
// still holds the device, the claim waits for it (Options.ConflictWait, 10
// s in the agent): the scheduler hands out what an old claim had as soon as
// its allocation is gone from the API server, while the kubelet unprepares
// the old claim on its own time, and a refused prepare would cost the new
// pod the kubelet's retry backoff. After the preparers it writes the
// claim's CDI spec (package cdi) and info file, records the claim as
// completed, and reports network data in the claim's status (package
// status), after the answer to the kubelet rather than inside prepare. A
// claim found started after a crash is rolled back through the preparers'
// Unprepare and prepared again. Calls for different claims never wait on
// each other (one lock per claim).
//
// # What a container gets
//
// One CDI spec per claim, its devices named
// carve.dev/claim=<claim uid>-<request>-<device>[-<share>]. Each container
// using the claim gets:
//
//   - CARVE_<REQUEST>_DEVICE, _KIND, _CLAIM, _SHARE_ID and one variable per
//     consumed capacity (CARVE_NET_EGRESSBANDWIDTH=100M), plus the preparer's
//     own (CARVE_NET_PARENT, CARVE_FPGA_PCI_ADDRESS, CARVE_CACHE_CPUS, ...);
//   - what its kind needs: the device nodes of FPGAs and GPUs,
//     linux.intelRdt and a hook for LLC shares, a hook that moves a NIC share
//     into the pod (the runtime hooks are package prepare/hook);
//   - /run/carve/claims/<claim uid>.json, read-only: the claim's devices,
//     shares and capacities.
//
// # Opaque configuration
//
// carve.dev/v1alpha1 (package api/v1alpha1), from the DeviceClass or the
// claim; for each kind the last one that applies to the request wins, so a
// claim overrides its class. Decoding is strict, and an invalid config fails
// the claim with the field named, applying nothing. A claim's env may not
// name a variable that changes what code a container loads or runs (LD_*,
// *_PRELOAD, CUDA_INJECTION*, NCCL_*PLUGIN*, PYTHON*, NODE_OPTIONS,
// JAVA_TOOL_OPTIONS, BASH_ENV, ENV, PATH and the rest of
// api/v1alpha1/codehooks.go), unless its class lists the name in claimEnv;
// a class that lists names lets its claims set only those:
//
//	apiVersion: carve.dev/v1alpha1
//	kind: DeviceConfig        # any device
//	env: {MY_VAR: value}
//	claimEnv: [MY_VAR]        # the class's only: what its claims may add
//	---
//	apiVersion: carve.dev/v1alpha1
//	kind: NetworkConfig       # NICs (package netdev has every field)
//	interfaceName: net1
//	mtu: 1500
//	---
//	apiVersion: carve.dev/v1alpha1
//	kind: GPUConfig           # GPU memory shares
//	sharedMemorySize: 4Gi     # the claim's /dev/shm; --mps-shm-size when unset
//
// # Crash safety
//
// Prepare and unprepare are idempotent and crash-safe. Each claim is recorded
// in <state-dir>/checkpoint.json (versioned, sha256-checksummed, written by
// temp file + atomic swap under an flock, concurrent updates committed in
// groups; no fsync, as its records are of this boot only) as started before
// anything is applied and completed after its CDI spec is written; a claim found started is rolled back and redone, a
// completed one is answered from the record, records from another boot are
// dropped (with their claim files), and an unreadable checkpoint is kept
// aside as checkpoint.json.corrupt-<time> and counted
// (carve_checkpoint_corrupt_total), never crash-looped on. A checkpoint
// written by a newer carve stops the agent with a clear error instead. The
// state directory is 0711 (a non-root pod's MPS server passes through it to
// its pipe directory), the checkpoint 0600, and the directory of claim
// files 0700; the claim files inside stay 0644.
//
// The file holds every claim, so each write's size grows with the claims
// held (about 1 KiB a network share). A write encodes only the records
// changed since the last one (an update sees checkpoint.Records, its changes
// kept apart until it succeeds) and copies the others' encodings: at 1,000
// claims held a write costs 2–4 ms of copying, hashing and writing, not
// 50 ms of encoding (BenchmarkCheckpointHeld, BenchmarkPrepareHeld). carve_checkpoint_bytes and
// carve_checkpoint_write_duration_seconds follow it.
//
// The crash matrix (deploy/e2e) SIGKILLs the agent at every step of prepare
// and unprepare: package crash holds the fault points, chosen with
// CARVE_CRASH_AT (the GPU share's points, gpushare-*, are listed in
// gpu/memslice; the MIG instance's, mig-*, in gpu/prep).
//
// # Health
//
// Every kind's health sources feed package health's tracker; an unhealthy
// device is tainted carve.dev/unhealthy in its slice and reported unhealthy
// to the kubelet, with the reason, until it has been healthy for the
// hold-down (health/README.md).
//
// # Packages below
//
// api/v1alpha1 (the claim config users write: DeviceConfig, NetworkConfig, GPUConfig;
// scheme, defaults, validation, deepcopy), checkpoint, cdi, status,
// atomicfile (atomic files), crash (fault points), hostmount (the host's side
// of the chart's mounts, `carve host-mounts`, and entering the runtime's
// mount namespace) and hook (the container-runtime hooks netns-attach,
// resctrl-attach and dmem-limit, which cmd/carve-hook builds from alone).
package prepare
