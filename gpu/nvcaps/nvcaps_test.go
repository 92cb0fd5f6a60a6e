package nvcaps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"
)

// fixture is a host root with the driver's capability files as an H100's
// driver lists them and /proc/devices with nvidia-caps at 237 (and a block
// device of the same name at another major, which must not be taken).
func fixture(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	root := t.TempDir()
	write(t, root, "proc/devices", "Character devices:\n  1 mem\n195 nvidia\n237 nvidia-caps\n509 nvidia-uvm\n\nBlock devices:\n  7 loop\n238 nvidia-caps\n")
	caps := filepath.Join("proc/driver/nvidia/capabilities")
	write(t, root, filepath.Join(caps, "mig/config"), "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
	write(t, root, filepath.Join(caps, "mig/monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	write(t, root, filepath.Join(caps, "gpu0/mig/gi1/access"), "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
	write(t, root, filepath.Join(caps, "gpu0/mig/gi1/ci0/access"), "DeviceFileMinor: 13\nDeviceFileMode: 292\nDeviceFileModify: 0\n")
	return root
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkNode fails unless rel is the character device major:minor with
// this mode.
func checkNode(t *testing.T, root, rel string, major, minor uint32, mode uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
		t.Errorf("%s: %v", rel, err)
		return
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != minor || st.Mode&0o7777 != mode {
		t.Errorf("%s: type %#o, %d:%d, mode %#o; want a character device %d:%d, mode %#o",
			rel, st.Mode&unix.S_IFMT, unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mode&0o7777, major, minor, mode)
	}
}

func TestEnsureMakesTheNodesTheDriverDescribes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := fixture(t)
	old := unix.Umask(0o077) // the mode is the driver's, not the umask's
	defer unix.Umask(old)
	nodes, err := Ensure(ctx, root, GPUInstance(0, 1), ComputeInstance(0, 1, 0), Config, Monitor)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, n := range nodes {
		paths = append(paths, n.Path)
	}
	if got := strings.Join(paths, " "); got != "/dev/nvidia-caps/nvidia-cap12 /dev/nvidia-caps/nvidia-cap13 /dev/nvidia-caps/nvidia-cap1 /dev/nvidia-caps/nvidia-cap2" {
		t.Errorf("paths %s", got)
	}
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap12", 237, 12, 0o444)
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap13", 237, 13, 0o444)
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap1", 237, 1, 0o400)
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap2", 237, 2, 0o444)

	// Again: the right nodes are kept. Where the driver asks
	// (DeviceFileModify: 1) the mode is set back; where not, left.
	if err := os.Chmod(filepath.Join(root, "dev/nvidia-caps/nvidia-cap12"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "dev/nvidia-caps/nvidia-cap13"), 0o600); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	_ = unix.Lstat(filepath.Join(root, "dev/nvidia-caps/nvidia-cap13"), &before)
	if _, err := Ensure(ctx, root, GPUInstance(0, 1), ComputeInstance(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap12", 237, 12, 0o444)
	checkNode(t, root, "dev/nvidia-caps/nvidia-cap13", 237, 13, 0o600)
	var after unix.Stat_t
	_ = unix.Lstat(filepath.Join(root, "dev/nvidia-caps/nvidia-cap13"), &after)
	if after.Ino != before.Ino {
		t.Error("a right node was made again")
	}
}

// Whatever else is at a node's path is replaced by the right node; a
// directory is refused, named.
func TestEnsureReplacesAWrongNode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for name, mk := range map[string]func(path string) error{
		"wrong minor": func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(237, 99))) },
		"wrong major": func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 12))) },
		"block node":  func(p string) error { return unix.Mknod(p, unix.S_IFBLK|0o666, int(unix.Mkdev(237, 12))) },
		"plain file":  func(p string) error { return os.WriteFile(p, nil, 0o644) },
		"symlink":     func(p string) error { return os.Symlink("/dev/null", p) },
	} {
		t.Run(name, func(t *testing.T) {
			root := fixture(t)
			p := filepath.Join(root, "dev/nvidia-caps/nvidia-cap12")
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := mk(p); err != nil {
				t.Fatal(err)
			}
			if _, err := Ensure(ctx, root, GPUInstance(0, 1)); err != nil {
				t.Fatal(err)
			}
			checkNode(t, root, "dev/nvidia-caps/nvidia-cap12", 237, 12, 0o444)
			leftovers(t, root, "nvidia-cap12")
		})
	}
	root := fixture(t)
	if err := os.MkdirAll(filepath.Join(root, "dev/nvidia-caps/nvidia-cap12"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(ctx, root, GPUInstance(0, 1)); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("a directory at the path: %v", err)
	}
	leftovers(t, root, "nvidia-cap12")
}

// leftovers fails on anything in dev/nvidia-caps but the names given.
func leftovers(t *testing.T, root string, want ...string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(root, "dev/nvidia-caps"))
	for _, e := range entries {
		found := false
		for _, w := range want {
			found = found || e.Name() == w
		}
		if !found {
			t.Errorf("left in dev/nvidia-caps: %s", e.Name())
		}
	}
}

// Bad input names the file and makes nothing, not even the directory.
func TestBadInputMakesNothing(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for name, c := range map[string]struct {
		rel, content, want string
	}{
		"missing capability":  {want: "gpu0/mig/gi2/access"},
		"no nvidia-caps":      {rel: "proc/devices", content: "Character devices:\n195 nvidia\nBlock devices:\n237 nvidia-caps\n", want: "proc/devices: no nvidia-caps character device"},
		"no /proc/devices":    {rel: "proc/devices", want: "proc/devices"},
		"garbage minor":       {rel: "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", content: "DeviceFileMinor: twelve\nDeviceFileMode: 292\n", want: "gi1/access: DeviceFileMinor \"twelve\" is not a number"},
		"no minor":            {rel: "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", content: "DeviceFileMode: 292\n", want: "gi1/access: no DeviceFileMinor line"},
		"mode beyond 0777":    {rel: "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", content: "DeviceFileMinor: 12\nDeviceFileMode: 3072\n", want: "gi1/access: DeviceFileMode 3072"},
		"negative minor":      {rel: "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", content: "DeviceFileMinor: -1\nDeviceFileMode: 292\n", want: "is not a number"},
		"garbage major":       {rel: "proc/devices", content: "Character devices:\nx nvidia-caps\n", want: `proc/devices: nvidia-caps major "x"`},
		"binary garbage file": {rel: "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", content: "\x00\xff\xfe::::\n", want: "gi1/access: no DeviceFileMinor line"},
	} {
		t.Run(name, func(t *testing.T) {
			root := fixture(t)
			caps := []string{ComputeInstance(0, 1, 0), GPUInstance(0, 1)}
			switch {
			case c.rel == "":
				caps = append(caps, GPUInstance(0, 2))
			case c.content == "":
				if err := os.Remove(filepath.Join(root, c.rel)); err != nil {
					t.Fatal(err)
				}
			default:
				write(t, root, c.rel, c.content)
			}
			_, err := Ensure(ctx, root, caps...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one naming %q", err, c.want)
			}
			if _, err := os.Stat(filepath.Join(root, "dev")); !os.IsNotExist(err) {
				t.Errorf("something was made: %v", err)
			}
		})
	}
}
