// Package police holds each MPS share of a GPU to its memory slice for the
// whole pod, on the mps-policed tier (package memslice): a loop reads NVML's
// per-process memory, maps each PID to its pod through /proc/<pid>/cgroup
// and to its shares through the claims' reserved pods, and when a pod's
// processes on a GPU hold more than the sum of its shares' slices there,
// kills its newest processes until they fit, records an event on the pod and
// counts the kill.
//
// # The loop
//
// Every 50 ms the loop reads NVML's per-process memory on each shared GPU,
// maps each PID to its pod through /proc/<pid>/cgroup (cgroup v1 or v2,
// cgroupfs or systemd names) and to its share through the claim's
// status.reservedFor pods (asked beside the loop, never in a tick: on Add,
// and at most once a second a claim when a tick sees an unknown pod). A pod's
// shares of one GPU add up: its processes there are held to the sum of their
// slices (shares joined by a pod are one pool). When a pool's processes hold
// more than that, its newest processes are killed (SIGKILL through a pidfd,
// sent only after the process's start time and pod, read once the pidfd is
// open, match what the tick saw: a reused PID is never signalled) until the
// rest fit, a GPUMemorySliceExceeded warning is recorded on the pod, and
// carve_gpu_share_kills_total{claim,share_id} counts it
// (carve_gpu_share_used_bytes is the share's pool's use). Log lines and
// events come at most once per share per 10 s;
// carve_gpu_share_kill_reports_suppressed_total counts the kills not
// reported, and the next report names them. NVML's "not available" memory
// reading is counted as a process, never as bytes. PIDs whose cgroup is
// gone, and processes of no pod (the MPS server), are skipped; another
// pool's processes are never touched.
//
// # The bound
//
// A pod is over its slices for at most one interval (50 ms by default) plus
// one NVML process query per GPU (about 0.6 ms) plus the time the driver
// takes to free a killed process's memory, i.e. within 200 ms. Nothing else
// is in a tick: each GPU's process query goes through an NVML lane of that
// GPU's own (gpu.Lanes; a prepare's long NVML calls, the CDI library's
// file walk and MIG creates, never hold it), the GPUs are looked at at once,
// so that a query hung in the driver for one GPU leaves the others policed,
// and the API server is asked for a claim's pods beside the loop, never in
// it. In that window a pod can hold up to its
// processes times its claim's MPS ceiling, since each process is held to the
// ceiling by MPS itself. On a real H100 every over-limit process was killed
// within 101–162 ms, while another share's process of the same MPS server
// kept computing (gpu/acceptance/results).
//
// # Privileges
//
// The agent needs the host's PID namespace to see and kill the processes
// NVML names (their host PIDs): a pod with PIDs of its own can neither read
// their cgroups by those numbers nor signal them, so the tier is chosen only
// where /proc/self/ns/pid is /proc/1's of the host (the chart's hostPID;
// where PID 1's link is denied, the kernel's initial PID namespace). The
// host's /proc and cgroup v2 mount are read through the host root mount
// (/host/proc, /host/sys/fs/cgroup).
package police
