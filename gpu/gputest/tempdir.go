package gputest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TempDir is t.TempDir, except that it is never under /dev/shm (where make
// puts TMPDIR): an MPS daemon runs with a tmpfs of its own bound over
// /dev/shm, which would hide a state directory beneath it.
func TempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if !strings.HasPrefix(filepath.Clean(dir)+"/", "/dev/shm/") {
		return dir
	}
	dir, err := os.MkdirTemp("/tmp", "carve-gpu-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
