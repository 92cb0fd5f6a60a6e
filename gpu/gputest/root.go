package gputest

import (
	"os"
	"testing"

	"github.com/carve-dra/carve/bpf/nettest"
)

// NeedRoot skips a test that mounts (the MPS daemon's shared memory tmpfs,
// its mount namespace) where it is not root, and fails it where the tests
// must not skip for lack of privilege (make unit as root sets
// CARVE_NET_REQUIRED=1).
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		nettest.SkipUnlessRequired(t, "needs root to mount the MPS shared memory tmpfs and a mount namespace")
	}
}
