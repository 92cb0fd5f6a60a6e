package hostmount

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountinfo(t *testing.T) {
	data := []byte(`22 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw
23 22 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
24 23 0:30 / /sys/fs/bpf rw master:3 - bpf bpf rw,mode=700
25 22 0:40 /a /tmp/with\040space rw shared:9 master:2 - tmpfs tmpfs rw
`)
	ms, err := ParseMountinfo(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{ID: 22, ParentID: 1, Dev: "254:1", Root: "/", MountPoint: "/", FSType: "ext4", SuperOptions: "rw"},
		{ID: 23, ParentID: 22, Dev: "0:21", Root: "/", MountPoint: "/sys", FSType: "sysfs", SuperOptions: "rw", Shared: true},
		{ID: 24, ParentID: 23, Dev: "0:30", Root: "/", MountPoint: "/sys/fs/bpf", FSType: "bpf", SuperOptions: "rw,mode=700", Slave: true},
		{ID: 25, ParentID: 22, Dev: "0:40", Root: "/a", MountPoint: "/tmp/with space", FSType: "tmpfs", SuperOptions: "rw", Shared: true, Slave: true},
	}
	if len(ms) != len(want) {
		t.Fatalf("got %d mounts, want %d: %+v", len(ms), len(want), ms)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i+1, ms[i], want[i])
		}
	}
	for _, bad := range []string{"22 1 254:1 / / rw", "x 1 254:1 / / rw - ext4 /dev/vda1 rw", "22 1 254:1 / / rw shared:1 -"} {
		if _, err := ParseMountinfo([]byte(bad + "\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: err = %v, want one naming line 1", bad, err)
		}
	}
}

// inPrivateMountNS runs fn in a mount namespace of its own whose mounts are
// all private, as on a host whose / is private; it ends with fn.
func inPrivateMountNS(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a mount namespace")
	}
	err := OnOwnThread(func() error {
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make / private: %w", err)
		}
		fn()
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

func mountsAt(t *testing.T, dir string) []Mount {
	t.Helper()
	data, err := os.ReadFile(mountinfoPath)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := ParseMountinfo(data)
	if err != nil {
		t.Fatal(err)
	}
	var at []Mount
	for _, m := range ms {
		if m.MountPoint == dir {
			at = append(at, m)
		}
	}
	return at
}

// On a private /, a state directory becomes a shared mount of its own; a
// second call changes nothing; a directory under a shared mount is left
// alone.
func TestEnsureSharedOnAPrivateRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	inPrivateMountNS(t, func() {
		if m, err := MountOf(filepath.Dir(dir)); err != nil || m.Shared {
			t.Errorf("before: the parent's mount %+v (err %v) should be private", m, err)
			return
		}
		did, err := EnsureShared(dir)
		if err != nil || did != "bind-mounted onto itself, made shared" {
			t.Errorf("EnsureShared = %q, %v", did, err)
			return
		}
		if at := mountsAt(t, dir); len(at) != 1 || !at[0].Shared {
			t.Errorf("after: mounts at %s: %+v, want one, shared", dir, at)
		}
		if did, err := EnsureShared(dir); err != nil || did != "" {
			t.Errorf("again: %q, %v; want nothing done", did, err)
		}
		if at := mountsAt(t, dir); len(at) != 1 {
			t.Errorf("again: mounts at %s: %+v, want still one", dir, at)
		}
		under := filepath.Join(dir, "sub")
		if did, err := EnsureShared(under); err != nil || did != "" {
			t.Errorf("under a shared mount: %q, %v; want nothing done", did, err)
		}
	})
}

// Where no bpffs is mounted, one is, shared; where one is, it is kept.
func TestEnsureBPFFS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bpf")
	inPrivateMountNS(t, func() {
		did, err := EnsureBPFFS(dir)
		if err != nil || did != "mounted bpffs, made shared" {
			t.Errorf("EnsureBPFFS = %q, %v", did, err)
			return
		}
		at := mountsAt(t, dir)
		if len(at) != 1 || at[0].FSType != "bpf" || !at[0].Shared {
			t.Errorf("mounts at %s: %+v, want one bpffs, shared", dir, at)
		}
		if did, err := EnsureBPFFS(dir); err != nil || did != "" {
			t.Errorf("again: %q, %v; want nothing done", did, err)
		}
	})
}

// InNamespace runs its function in the namespace named, and says which
// path it could not open.
func TestInNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to enter a mount namespace")
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Skip(err)
	}
	var seen string
	if err := InNamespace("/proc/self/ns/mnt", func() error {
		seen, err = os.Readlink("/proc/thread-self/ns/mnt")
		return err
	}); err != nil || seen != own {
		t.Errorf("InNamespace: %v; ran in %q, want %q", err, seen, own)
	}
	if err := InNamespace("/nonexistent/ns/mnt", func() error { return nil }); err == nil || !strings.Contains(err.Error(), "/nonexistent/ns/mnt") {
		t.Errorf("a missing namespace: %v", err)
	}
}

// The runtime's namespace is the parent's where it can be read.
func TestRuntimeNamespace(t *testing.T) {
	p, err := RuntimeNamespace()
	if err != nil {
		t.Skip(err)
	}
	if want := fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()); p != want {
		t.Errorf("RuntimeNamespace = %s, want the parent's, %s", p, want)
	}
}

// What EnsureShared bound onto itself, RemoveSelfBind unmounts, with what
// was mounted below it; a file system of its own mounted at the directory
// (an operator's disk, here a tmpfs) is left alone.
func TestRemoveSelfBind(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	other := filepath.Join(t.TempDir(), "disk")
	inPrivateMountNS(t, func() {
		if _, err := EnsureShared(dir); err != nil {
			t.Error(err)
			return
		}
		below := filepath.Join(dir, "mps")
		if err := os.MkdirAll(below, 0o755); err != nil {
			t.Error(err)
			return
		}
		if err := unix.Mount("tmpfs", below, "tmpfs", 0, "size=1m"); err != nil {
			t.Error(err)
			return
		}
		did, err := RemoveSelfBind(dir)
		if err != nil || !did {
			t.Errorf("RemoveSelfBind = %v, %v; want unmounted", did, err)
		}
		if at := mountsAt(t, dir); len(at) != 0 {
			t.Errorf("after: mounts at %s: %+v, want none", dir, at)
		}
		if at := mountsAt(t, below); len(at) != 0 {
			t.Errorf("after: mounts at %s: %+v, want none", below, at)
		}
		if did, err := RemoveSelfBind(dir); err != nil || did {
			t.Errorf("again: %v, %v; want nothing done", did, err)
		}

		if err := os.MkdirAll(other, 0o755); err != nil {
			t.Error(err)
			return
		}
		if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
			t.Error(err)
			return
		}
		if did, err := RemoveSelfBind(other); err != nil || did {
			t.Errorf("a tmpfs of its own: %v, %v; want left alone", did, err)
		}
		if at := mountsAt(t, other); len(at) != 1 {
			t.Errorf("a tmpfs of its own: mounts at %s: %+v, want it kept", other, at)
		}
	})
}
