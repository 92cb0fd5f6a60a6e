package main

import "os"

// The agent's state and pin directories. The chart sets the environment
// variables in the agent's container to the directories it passes the
// agent, so that a command run there (`kubectl exec ... carve shares`)
// reads what the agent wrote wherever the chart put it.
const (
	envStateDir = "CARVE_STATE_DIR"
	envPinDir   = "CARVE_BPF_PIN_DIR"
	// envDaemonSet names the agent's DaemonSet (namespace/name).
	envDaemonSet    = "CARVE_DAEMONSET"
	defaultStateDir = "/var/lib/carve"
	defaultPinDir   = "/sys/fs/bpf/carve"
)

// envOr is the environment variable name's value, or def where it is unset
// or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
