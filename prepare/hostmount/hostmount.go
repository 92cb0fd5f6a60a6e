// Package hostmount prepares the host's side of the mounts the agent's pod
// asks to share with the host, before the pod's containers are made.
//
// A container runtime refuses a Bidirectional mount of a host path whose
// mount is not shared ("is mounted on / but it is not a shared mount"), and
// a HostToContainer one whose mount is neither shared nor a slave. systemd
// makes / shared, so there every path passes; a host whose / is private (a
// VM or container whose init is not systemd) fails the agent's pod at
// creation, before the agent can say anything. The chart's init container
// runs `carve host-mounts` in the host's mount namespace to make just the
// paths the agent needs shared (each bind-mounted onto itself first where it
// is not a mount point, as the kubelet does with its root directory), and
// to mount bpffs where the host has none. / itself is never changed.
package hostmount

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// InNamespace runs fn in the mount namespace at nsPath on an OS thread of
// its own (OnOwnThread). A thread that shares its filesystem attributes
// cannot enter a mount namespace, so the thread unshares them first.
func InNamespace(nsPath string, fn func() error) error {
	return OnOwnThread(func() error {
		fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mount namespace %s: %w", nsPath, err)
		}
		defer unix.Close(fd)
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare filesystem attributes: %w", err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter mount namespace %s: %w", nsPath, err)
		}
		return fn()
	})
}

// OnOwnThread runs fn on a thread locked for the purpose and never
// unlocked: the runtime ends the thread with the goroutine, and with it
// whatever namespace fn entered. Never on the main thread, which the runtime
// does not end but keeps, wedged, in that namespace, and whose namespaces
// are those /proc/self names: fn then runs on another thread while the main
// one is held, unchanged, and is given back.
func OnOwnThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			errc <- OnOwnThread(fn)
			runtime.UnlockOSThread()
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// RuntimeNamespace is the mount namespace to make host mounts in: that of
// the process that started this one, which in a container with hostPID is
// its runtime's shim (a subreaper that adopts the container's first
// process), living in the mount namespace where the runtime checks a
// mount's propagation; else PID 1's. PID 1's comes second because a host
// may deny it: on the VMs this project runs on, even root may not read
// /proc/1/ns (PID 1 holds a capability the rest of the system lacks).
func RuntimeNamespace() (string, error) {
	return firstReadable("ns/mnt")
}

// RuntimeRoot is the root directory of the same process as
// RuntimeNamespace's, through which this process sees the host's mounts
// as they are now, whatever its own mounts' propagation.
func RuntimeRoot() (string, error) {
	return firstReadable("root")
}

func firstReadable(entry string) (string, error) {
	var errs []string
	for _, pid := range []int{os.Getppid(), 1} {
		p := fmt.Sprintf("/proc/%d/%s", pid, entry)
		if _, err := os.Stat(p); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("no host mount namespace to enter (run with hostPID): %s", strings.Join(errs, "; "))
}

// Mount is one line of a mountinfo file: what this package needs of it.
type Mount struct {
	ID int
	// ParentID is the mount this one is mounted on.
	ParentID int
	// Dev is the file system's major:minor.
	Dev string
	// Root is the directory of the file system mounted here, "/" for its
	// whole (a bind mount of a subdirectory has that subdirectory).
	Root       string
	MountPoint string
	FSType     string
	// SuperOptions are the file system's own options (a cgroup v1
	// hierarchy's controllers among them).
	SuperOptions string
	// Shared: the mount is in a peer group (optional field shared:N).
	Shared bool
	// Slave: the mount receives from a master (optional field master:N).
	Slave bool
}

// mountinfoPath is the calling thread's own view: /proc/self would be the
// main thread's, which InNamespace leaves in the agent's namespace.
const mountinfoPath = "/proc/thread-self/mountinfo"

// currentMounts are the calling thread's mounts.
func currentMounts() ([]Mount, error) {
	data, err := os.ReadFile(mountinfoPath)
	if err != nil {
		return nil, err
	}
	mounts, err := ParseMountinfo(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mountinfoPath, err)
	}
	return mounts, nil
}

// ParseMountinfo reads proc(5)'s mountinfo format.
func ParseMountinfo(data []byte) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 7 || sep < 0 || sep+1 >= len(f) {
			return nil, fmt.Errorf("mountinfo line %d: %q: too few fields", n, sc.Text())
		}
		id, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: mount ID %q: %w", n, f[0], err)
		}
		m := Mount{ID: id, Dev: f[2], Root: unescape(f[3]), MountPoint: unescape(f[4]), FSType: f[sep+1]}
		m.ParentID, _ = strconv.Atoi(f[1])
		if sep+3 < len(f) {
			m.SuperOptions = f[sep+3]
		}
		for _, opt := range f[6:sep] {
			m.Shared = m.Shared || strings.HasPrefix(opt, "shared:")
			m.Slave = m.Slave || strings.HasPrefix(opt, "master:")
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescape decodes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountOf is the mount that holds path, found by the mount ID statx reports
// (a bind mount of a directory onto itself has its parent's device, so
// devices cannot tell).
func MountOf(path string) (Mount, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return Mount{}, fmt.Errorf("statx %s: %w", path, err)
	}
	mounts, err := currentMounts()
	if err != nil {
		return Mount{}, err
	}
	for _, m := range mounts {
		if uint64(m.ID) == stx.Mnt_id {
			return m, nil
		}
	}
	return Mount{}, fmt.Errorf("%s: no mount %d, which statx gives for %s", mountinfoPath, stx.Mnt_id, path)
}

// Action says what an Ensure call changed; empty when nothing.
type Action string

// EnsureShared makes dir (created if missing) a shared mount: left alone
// where the mount holding it is shared already; else bind-mounted onto
// itself where it is not a mount point, and made shared.
func EnsureShared(dir string) (Action, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("shared mount %s: %w", dir, err)
	}
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("shared mount %s: %w", dir, err)
	}
	m, err := MountOf(dir)
	if err != nil {
		return "", err
	}
	if m.Shared {
		return "", nil
	}
	var did []string
	if m.MountPoint != dir {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("bind %s onto itself: %w", dir, err)
		}
		did = append(did, "bind-mounted onto itself")
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return Action(strings.Join(did, ", ")), fmt.Errorf("make %s shared: %w", dir, err)
	}
	return Action(strings.Join(append(did, "made shared"), ", ")), nil
}

// EnsureBPFFS mounts bpffs at dir where none is (the mount holding dir is
// not one), then makes it shared as EnsureShared does.
func EnsureBPFFS(dir string) (Action, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bpffs %s: %w", dir, err)
	}
	m, err := MountOf(dir)
	if err != nil {
		return "", err
	}
	var did []string
	if m.FSType != "bpf" || m.MountPoint != filepath.Clean(dir) {
		if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
			return "", fmt.Errorf("mount bpffs at %s: %w", dir, err)
		}
		did = append(did, "mounted bpffs")
	}
	shared, err := EnsureShared(dir)
	if shared != "" {
		did = append(did, string(shared))
	}
	return Action(strings.Join(did, ", ")), err
}

// RemoveSelfBind undoes what EnsureShared did to dir: where dir is a bind
// mount of itself (the same file system and directory as its parent mount
// shows there), it is unmounted, lazily, with whatever is mounted below
// it. A mount of anything else at dir (an operator's own disk) is left
// alone. It reports whether it unmounted.
func RemoveSelfBind(dir string) (bool, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, fmt.Errorf("self-bind %s: %w", dir, err)
	}
	mounts, err := currentMounts()
	if err != nil {
		return false, err
	}
	byID := map[int]Mount{}
	var top *Mount
	for i, m := range mounts {
		byID[m.ID] = m
		if m.MountPoint == dir {
			top = &mounts[i] // the last one at dir is the one on top
		}
	}
	if top == nil {
		return false, nil
	}
	parent, ok := byID[top.ParentID]
	if !ok || !selfBind(*top, parent) {
		return false, nil
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return false, fmt.Errorf("unmount %s: %w", dir, err)
	}
	return true, nil
}

// selfBind reports whether m shows at its mount point the same directory of
// the same file system that parent shows there.
func selfBind(m, parent Mount) bool {
	if m.Dev != parent.Dev {
		return false
	}
	rel, err := filepath.Rel(parent.MountPoint, m.MountPoint)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	return filepath.Join(parent.Root, rel) == m.Root
}

// HasMountBelow reports whether path, or anything below it, is a mount
// point in the calling thread's mount namespace.
func HasMountBelow(path string) (bool, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	mounts, err := currentMounts()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.MountPoint == path || strings.HasPrefix(m.MountPoint, path+"/") {
			return true, nil
		}
	}
	return false, nil
}
