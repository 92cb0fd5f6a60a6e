// Package mps runs NVIDIA MPS control daemons, one per claim and shared
// GPU, with their pipe and log directories under carve's state directory,
// through the nvidia-cuda-mps-control binary: starting or adopting one,
// setting the pinned device memory ceiling of its servers, and stopping
// it. Tests put a fake binary on PATH.
//
// A pipe directory must be at most MaxPipeDir (87) bytes: the daemon binds
// <dir>/control_privileged, which must fit sun_path, and a longer one makes
// the real daemon exit 1 printing nothing; Daemon.Ensure refuses it with the
// reason, and a failed start carries the tail of the daemon's control log.
//
// Each daemon runs in a mount namespace of its own in which its claim's
// tmpfs is /dev/shm (shm.go). StartInNamespace starts it from the container
// runtime's (the host's) mount namespace where the agent runs below a host
// root, so that it and its servers load the host's driver libraries, by the
// control binary's host path; StartWithShm starts it from the agent's own
// where that namespace cannot be entered. Package memslice says why one
// daemon per claim and how containers reach it.
//
// A daemon keeps only Daemon.Capabilities (DefaultCapabilities in the
// agent, --mps-capabilities): the thread that starts it, one of its own
// that ends with the start, narrows its bounding, inheritable and ambient
// sets first, so the daemon, a root process, execs with that set alone and
// the servers it forks and setuid()s inherit no more. A daemon every tenant
// of its claim talks to holds no CAP_SYS_ADMIN, CAP_NET_ADMIN or CAP_BPF
// of the privileged agent. Which capabilities the real daemon needs is the
// container runtimes' default set, in which others run it as root without
// privilege; the acceptance run on a card starts its daemons with the same
// set (TestDaemonKeepsOnlyItsCapabilities here, with the fake).
package mps
