package e2e

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
)

// noopEnv, set to "<node> <dir>", makes the test binary the do-nothing
// driver (runNoopDriver) and nothing else, until SIGTERM: a process of its
// own, whose memory BenchmarkAgentMemory reads beside the agent's.
const noopEnv = "CARVE_E2E_NOOP_DRIVER"

func TestMain(m *testing.M) {
	if v := os.Getenv(noopEnv); v != "" {
		os.Exit(noopMain(v))
	}
	code := m.Run()
	// The agent and hook built for this process (carveBinary): 63 MB a
	// run, left in /tmp by every test binary before.
	if carveBin != "" {
		_ = os.RemoveAll(filepath.Dir(carveBin))
	}
	os.Exit(code)
}

func noopMain(v string) int {
	var node, dir string
	if _, err := fmt.Sscan(v, &node, &dir); err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want \"<node> <dir>\": %v\n", noopEnv, v, err)
		return 2
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	stop, err := runNoopDriver(node, dir, defaultLimits)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	<-sig
	stop()
	return 0
}
