// Package memslice hands out and takes back memory slices of shared GPUs:
// it chooses each GPU's enforcement tier at start (dmem, mps-policed or
// none), prepares a share on that tier (its claim's own MPS control daemon
// and /dev/shm tmpfs, the GPU's compute mode, the dmem hook, the pinned
// memory ceiling, policing), undoes it, recovers after a crash, and lists
// the node's GPU shares. What each tier guarantees and does not, and what
// was measured on a real H100 to choose them, is in TIERS.md beside this
// file.
//
// # A memory slice
//
// One GPU can be shared by several pods, each with a memory slice: a GPU
// whose slices this node can enforce has allowMultipleAllocations: true and a
// memory request policy from the node config, e.g.
//
//	requestPolicies:
//	  gpu:
//	    memory: {default: 10Gi, min: 5Gi, step: 5Gi, max: 40Gi}
//
// and a claim asks capacity: {requests: {memory: 10Gi}}. Every GPU carries
// memoryEnforcement, a contract: dmem, mps-policed or none, chosen per GPU
// when the agent first sees it (tier.go). A none GPU, or one without the
// policy, is published whole-device only and the reason is logged once. A
// slice larger than what is left on the GPU (its total less the other
// shares' slices, and no more than NVML's free memory) is refused at
// prepare, whatever the tier. A share's container gets the whole GPU's edits
// (package prep) plus CARVE_<REQUEST>_GPU_MEMORY_SLICE (bytes) and
// _GPU_MEMORY_ENFORCEMENT.
//
// Why tiers: NVIDIA's DRA driver publishes such a capacity and does not
// enforce it; HAMi enforces it with an LD_PRELOAD library that a pod bypasses
// by not loading it.
//
// # One daemon per claim
//
// Each claim's shares of a GPU get an MPS control daemon of their own (see
// DaemonDir), with its own pipe directory, and each claim a tmpfs of its own
// as /dev/shm: <state-dir>/gpushare/mps/<claim id>/<gpu id>/{pipe,log} and
// <state-dir>/gpushare/mps/<claim id>/shm, the ids short hashes of the claim
// UID and GPU UUID, so that the pipe directory stays within the 87 bytes a
// daemon's socket paths allow (mps.MaxPipeDir: a longer one makes the real
// daemon exit 1 silently; carve refuses the share naming --state-dir). Why:
// one daemon serves one user at a time (on the measured H100 a second UID's
// CUDA init waited 6.5 s for the first's process to end, while two daemons
// ran two UIDs' clients at once); and a tenant reaching a shared pipe
// directory or /dev/shm could read, change or delete another tenant's MPS
// segments, fill the tmpfs, remove the daemon's control socket or send it
// quit. So the pipe directory is mounted read-only into the container
// (connecting to a unix socket is not a write, and the kernel's read-only
// mount check does not cover it), the log directory not at all, the pid file
// is read O_NOFOLLOW (and sits in that read-only directory), and a tenant can
// fill or read only its own claim's tmpfs. The daemon's ceiling is
// daemon-wide (set_default_device_pinned_mem_limit), which a client cannot
// raise, unlike the environment variable that is also set. Unprepare quits
// the claim's daemon, unmounts its tmpfs with its last one and removes its
// directories.
//
// # Compute mode
//
// While a GPU has shares it is in compute mode Default, set for its first
// share and restored after its last, never switched per claim:
// EXCLUSIVE_PROCESS admits one MPS server per GPU, and every claim's daemon
// runs one. A process that skips MPS then gets a context of its own: on the
// mps-policed tier policing holds it (it is a process of a share's pod), on
// dmem its pod's dmem.max. Options.KeepComputeMode (--keep-compute-mode of
// the acceptance run on lent machines) leaves the mode as found; under
// EXCLUSIVE_PROCESS only one claim's server can then run on the GPU.
//
// # Reaching the daemon
//
// MPS clients meet their control daemon and server in the pipe directory and
// in POSIX shared memory under /dev/shm; a pod has a /dev/shm of its own, so
// a client in a pod could not attach to a daemon the agent started. The
// agent therefore mounts a tmpfs per claim (the size its config's
// GPUConfig.sharedMemorySize asks, the largest of its shares', grown as they
// come and never shrunk; --mps-shm-size, 1Gi, where it asks none; its pages
// are charged to the pods that write them), starts each of the claim's daemons in a mount
// namespace of its own in which that tmpfs is /dev/shm (mounts are slaves,
// so the bind never reaches the agent or the host), and each share's CDI
// edits mount it over the container's /dev/shm, as NVIDIA's own MPS support
// does. The daemon is started from the container runtime's (the host's)
// mount namespace where the agent runs below a host root
// (mps.StartInNamespace, the one place a daemon is started), so that it and
// its servers load the host's driver libraries, and by the control binary's
// host path; where that namespace cannot be entered it starts from the
// agent's (mps.StartWithShm). Once it answers, the daemon is moved into a
// cgroup of its own (--mps-cgroup, carve-mps, below the root of each of the
// host's hierarchies: package prepare/hostcgroup): started from the agent,
// it is in the agent container's cgroups, whose processes the runtime kills
// when the agent's pod goes, and its clients in other pods would lose their
// server with it. So a daemon outlives an agent's restart or upgrade and
// is adopted by the next agent (TestNodeGPUShares checks its PID is the
// same), and the last claim's unprepare removes the cgroup. A tmpfs per claim rather than per daemon
// because CDI gives a container one /dev/shm: a claim with shares of two GPUs
// reaches both of its daemons through it. Containers mount the host's view of
// the tmpfs, so the agent's mount must reach the host: the chart mounts the
// state directory with mountPropagation: Bidirectional
// (stateDirPropagation); where it does not reach (a private /), GPU memory
// shares are refused saying so (a probe tmpfs at <state-dir>/mps-shm checks
// this at start).
//
// Each GPU's pipe directory is at /run/nvidia-mps/<gpu uuid> in the
// container, and CUDA_MPS_PIPE_DIRECTORY points there. A daemon sees only its
// GPU (CUDA_VISIBLE_DEVICES=<uuid>) and MPS shows a client the daemon's
// devices renumbered from 0, so to a client the GPU is device 0 whatever
// else its container holds: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<slice>M is
// right for every share.
//
// Shares of several GPUs in one container: CDI keeps one value per variable
// and one mount per path (the last device's), so the default
// CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT are one
// share's pair, never a mix, and each share's own pair is also in
// CARVE_<REQUEST>_MPS_PIPE_DIRECTORY and
// CARVE_<REQUEST>_MPS_PINNED_DEVICE_MEM_LIMIT; every GPU's pipe is mounted. A
// process reaches one daemon, so one process uses one shared GPU: a
// container with two runs a process per GPU, each started with that share's
// pair. A process spanning several shared GPUs would need one daemon serving
// them all, which one daemon per claim and GPU does not give. A container
// with shares from two claims gets one claim's tmpfs as /dev/shm (the last
// device's), so only that claim's daemons are reachable from it.
//
// # State and crashes
//
// A GPU's gpu.json (its former compute mode) is written before the mode is
// changed, and a claim daemon's owner.json (claim, GPU, tier) and each of
// its shares' records (share-<key>.json: the whole request) before its
// tmpfs is mounted or it is started; each teardown step finds what an
// interrupted one left. At start the shares the checkpoint holds, and any
// share recorded on the node that it does not (a lost or corrupt
// checkpoint, or a claim that crashed before its record, which the driver
// then rolls back), get their mode, their claim's daemon (a running one is
// adopted; a dead or deaf one restarted) and ceiling back and are policed
// again: losing the checkpoint never tears down what runs. A daemon
// directory no record explains is kept and logged. The kubelet's unprepare
// of a claim the checkpoint does not know reaches UnprepareClaim (through
// gpu/prep, a prepare.ClaimCleaner), which finds the claim's shares and
// daemons by its derived directory and takes them back. A GPU directory
// that no share or daemon holds is given back (mode restored), and so is a
// GPU after its last share and daemon go.
// CARVE_CRASH_AT fault points: gpushare-mode-held, gpushare-daemon-recorded,
// gpushare-shm-mounted, gpushare-daemon-started, gpushare-daemon-stopped,
// gpushare-shm-unmounted, gpushare-claim-released. Kill counts survive
// restarts in <state-dir>/gpushare/usage.json.
//
// # Listing
//
// ListShares is what `carve shares` lists for GPUs (cmd/carve/sharelist):
// claim, shareID, GPU UUID, tier, slice, used, kills so far, and whether the
// share is enforced; a share recorded on the node that the checkpoint lost
// is listed too, marked adopted.
//
// # Known gaps
//
// A claim's pods have its tmpfs as /dev/shm instead of their own, shared by
// the claim's pods: a workload that needs a large /dev/shm (PyTorch's
// DataLoader workers for one) sizes it in its claim's GPUConfig. Not yet run on a real GPU in a pod: the acceptance run
// (package gpu/acceptance) starts its clients with the share's /dev/shm
// through the same mps.StartWithShm, as host processes, and that is where
// the read-only pipe directory and one daemon per claim were measured. The
// dmem tier has not run on real hardware (no lent machine has r615).
package memslice
