package gputest

import (
	"os"
	"testing"
)

// TempDir is a short directory under /tmp, removed after the test. Never
// under /dev/shm (where make puts TMPDIR): an MPS daemon runs with a tmpfs
// of its own bound over /dev/shm, which would hide a state directory
// beneath it. And short: an MPS pipe directory must be under 88 bytes
// (mps.Daemon refuses longer), and <dir>/gpushare/mps/<12>/<8>/pipe adds 37
// to it, where t.TempDir's /tmp/<TestName><n>/001 is often 40 or more.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "cg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) }) // best effort: a leftover under /tmp fails no test
	return dir
}
