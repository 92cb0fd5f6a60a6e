package mps

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// An agent that starts after a claim's tmpfs was mounted sees it twice: at
// its path, and at that path below the host root's mount (/host), on the
// same directory. UnmountShm takes both down, or the directory stays busy.
// Made in a mount namespace of the test's own.
func TestUnmountShmSeenTwice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	base := t.TempDir()
	state, host := filepath.Join(base, "state"), filepath.Join(base, "host")
	shm := filepath.Join(state, "claim", "shm")
	for _, d := range []string{shm, host} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	err := hostmount.OnOwnThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		// The host root's view: the whole file system again at host,
		// where shm's directory is host + shm.
		if err := unix.Mount("/", host, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		alias := filepath.Join(host, shm)
		if err := unix.Mount("tmpfs", alias, "tmpfs", 0, "size=1m"); err != nil {
			return err
		}
		if err := MountShm(shm, 1<<20); err != nil {
			return err
		}
		if err := UnmountShm(shm); err != nil {
			t.Errorf("UnmountShm: %v", err)
		}
		if _, err := os.Stat(shm); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", shm, err)
		}
		return unix.Unmount(host, unix.MNT_DETACH)
	})
	if err != nil {
		t.Fatal(err)
	}
}
