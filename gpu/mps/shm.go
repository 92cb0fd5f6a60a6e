package mps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// The control daemon, its servers and their clients meet in two places: the
// pipe directory and POSIX shared memory, which lives in /dev/shm. A pod has
// a /dev/shm of its own, so a client in a pod cannot attach to a daemon that
// sees another one. carve therefore gives a claim's daemons and its shares'
// containers one tmpfs as /dev/shm: mounted per claim (MountShm), bound over
// /dev/shm in a mount namespace of each daemon's own (StartWithShm,
// StartInNamespace), and mounted over the container's /dev/shm by the
// share's CDI edits. A tmpfs per claim, not per node: what one tenant writes
// there (MPS segments, or bytes to fill it) no other tenant sees. Two
// daemons with their own pipe directories and their own tmpfs ran clients
// on one GPU at once (the measured H100).

// DefaultShmSize bounds a claim's tmpfs. Its pages are charged to the memory
// cgroup of the process that writes them (the pod), so the size is a cap,
// not a reservation.
const DefaultShmSize = 1 << 30

// MountShm mounts a tmpfs of size bytes at dir (made if missing) unless one
// is mounted there already.
func MountShm(dir string, size uint64) error {
	if size == 0 {
		size = DefaultShmSize
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	if ok, err := IsShm(dir); err != nil || ok {
		return err
	}
	// 1777: clients run as any user in their pods; sticky, as /dev/shm is,
	// so that none removes another's files.
	opts := "mode=1777,size=" + strconv.FormatUint(size, 10)
	if err := unix.Mount("carve-mps-shm", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mount the MPS shared memory tmpfs at %s: %w", dir, err)
	}
	return nil
}

// GrowShm raises the size of the tmpfs mounted at dir to size bytes where
// it is smaller; it never shrinks one (a claim's pods may hold its pages).
func GrowShm(dir string, size uint64) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	if uint64(fs.Blocks)*uint64(fs.Bsize) >= size {
		return nil
	}
	opts := "mode=1777,size=" + strconv.FormatUint(size, 10)
	if err := unix.Mount("carve-mps-shm", dir, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("grow the MPS shared memory tmpfs at %s to %d bytes: %w", dir, size, err)
	}
	return nil
}

// IsShm reports whether dir is the mount point of a tmpfs: a tmpfs whose
// device differs from its parent's (a directory on a tmpfs, as /dev/shm
// itself is, is not one).
func IsShm(dir string) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return false, nil
	}
	var self, parent unix.Stat_t
	if err := unix.Stat(dir, &self); err != nil {
		return false, fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("MPS shared memory %s: %w", dir, err)
	}
	return self.Dev != parent.Dev, nil
}

// SameShm reports whether a and b are the same tmpfs (one superblock), as
// the agent's view of its mount and the host's view through the host root
// mount are where the mount propagates to the host.
func SameShm(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	okA, _ := IsShm(a)
	okB, _ := IsShm(b)
	return okA && okB && sa.Dev == sb.Dev
}

// UnmountShm detaches the tmpfs at dir (containers that bound it keep
// theirs until they end) and removes the directory. No mount, no directory:
// nothing to do. Every mount on dir's directory in this thread's mount
// namespace goes, under whatever path: one left makes the directory busy.
// An agent started after the claim's tmpfs was mounted sees it twice: at
// dir, from its container's bind of the state directory, and below the
// host root's mount (/host), a slave copy of the host's that the unmount
// at dir does not reach.
func UnmountShm(dir string) error {
	for i := 0; ; i++ {
		ok, err := IsShm(dir)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if i == maxStacked {
			return fmt.Errorf("the MPS shared memory tmpfs at %s is still mounted after %d unmounts", dir, i)
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount the MPS shared memory tmpfs at %s: %w", dir, err)
		}
	}
	for i := 0; i < maxStacked; i++ {
		more := aliases(dir)
		if len(more) == 0 {
			break
		}
		for _, alias := range more {
			if err := unix.Unmount(alias, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount the MPS shared memory tmpfs at %s (%s seen from elsewhere): %w", alias, dir, err)
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s%s: %w", dir, mountsAt(dir), err)
	}
	return nil
}

// maxStacked bounds UnmountShm's unmounts of one directory.
const maxStacked = 16

// aliases are the mount points in this thread's mount namespace, other than
// dir, on dir's own directory: a path that ends in dir, below a directory
// that is dir's parent (the same inode), such as /host + dir.
func aliases(dir string) []string {
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil
	}
	var parent unix.Stat_t
	if unix.Stat(filepath.Dir(dir), &parent) != nil {
		return nil
	}
	mounts, err := hostmount.ParseMountinfo(data)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range mounts {
		// dir is absolute: a path ending in it is dir below another.
		if m.MountPoint == dir || !strings.HasSuffix(m.MountPoint, dir) {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Dir(m.MountPoint), &st) == nil && st.Dev == parent.Dev && st.Ino == parent.Ino && !slices.Contains(out, m.MountPoint) {
			out = append(out, m.MountPoint)
		}
	}
	// Deepest first: a mount stacked on another's path goes before it.
	slices.Reverse(out)
	return out
}

// mountsAt lists, for an error message, what this thread's mount namespace
// has mounted at dir or at a path ending in it.
func mountsAt(dir string) string {
	data, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return ""
	}
	var at []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasSuffix(f[4], dir) {
			at = append(at, l)
		}
	}
	if len(at) == 0 {
		return " (nothing mounted there in this mount namespace)"
	}
	return " (mounted there: " + strings.Join(at, "; ") + ")"
}

// StartWithShm starts cmd in a mount namespace of its own in which
// opts.Shm, where given, is bound over /dev/shm, with opts.Capabilities
// alone; what cmd forks (the daemon, its servers) stays there.
// The namespace is made on a thread locked for the purpose, which forks the
// child and then ends, so that no other goroutine ever runs in it. Mounts
// are slaves of the caller's, so that the bind never reaches the caller nor
// the host.
func StartWithShm(cmd *exec.Cmd, opts StartOptions) error {
	if err := checkNotUnderShm(cmd); err != nil {
		return err
	}
	return hostmount.OnOwnThread(func() error { return startInMountNS(cmd, opts) })
}

// StartClient starts an MPS client as a share's container has it: shm over
// /dev/shm, and each of readOnly (the pipe directory) bound read-only over
// itself, in a mount namespace of its own (the acceptance run's clients).
func StartClient(cmd *exec.Cmd, shm string, readOnly ...string) error {
	return hostmount.OnOwnThread(func() error {
		if err := newSlaveNS(cmd.Path); err != nil {
			return err
		}
		for _, dir := range readOnly {
			if err := bindReadOnly(dir); err != nil {
				return err
			}
		}
		if err := unix.Mount(shm, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over /dev/shm for %s: %w", shm, cmd.Path, err)
		}
		return cmd.Start()
	})
}

// bindReadOnly makes dir read-only in the calling thread's mount namespace.
// A unix socket in it still takes connections: connect(2) writes nothing to
// the file system, and the read-only check of a mount applies to writes.
func bindReadOnly(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", dir, err)
	}
	return nil
}

// newSlaveNS moves the calling (locked) thread to a new mount namespace
// whose mounts are slaves of the caller's.
func newSlaveNS(what string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace for %s: %w", what, err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("mounts of %s as slaves: %w", what, err)
	}
	return nil
}

// StartInNamespace is a Starter that starts the daemon from the mount
// namespace at nsPath (the container runtime's, which is the host's:
// hostmount.RuntimeNamespace) rather than from this process's, so that the
// daemon and the servers it forks load the host's driver libraries, not
// whatever the agent's image holds; shm is bound over /dev/shm in a slave
// namespace made from that one, as StartWithShm does from this process's.
// root is where this process sees the host's root: cmd.Path is below it
// here and is started by its host path. Every other path the daemon is
// given (its pipe and log directories, shm) must be the same on the host,
// as the state directory's hostPath mount is.
func StartInNamespace(nsPath, root string) Starter {
	return func(cmd *exec.Cmd, opts StartOptions) error {
		if err := checkNotUnderShm(cmd); err != nil {
			return err
		}
		if root != "" && root != "/" {
			rel, err := filepath.Rel(root, cmd.Path)
			if err != nil || strings.HasPrefix(rel, "..") {
				return fmt.Errorf("the MPS control binary %s is not below the host root %s", cmd.Path, root)
			}
			cmd.Path = "/" + rel
			cmd.Args[0] = cmd.Path
			cmd.Env = hostPaths(root, cmd.Env)
		}
		return hostmount.InNamespace(nsPath, func() error { return startInMountNS(cmd, opts) })
	}
}

// hostPaths is env with the directories of its PATH and LD_LIBRARY_PATH
// that lie below root (the host's root as this process sees it) given as
// the host sees them.
func hostPaths(root string, env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" || k == "LD_LIBRARY_PATH" {
			dirs := strings.Split(v, ":")
			for i, d := range dirs {
				if rel, err := filepath.Rel(root, d); err == nil && !strings.HasPrefix(rel, "..") && filepath.IsAbs(d) {
					dirs[i] = filepath.Join("/", rel)
				}
			}
			kv = k + "=" + strings.Join(dirs, ":")
		}
		out = append(out, kv)
	}
	return out
}

// checkNotUnderShm refuses a pipe or log directory that the tmpfs bound over
// /dev/shm would hide from the daemon, which would never answer.
func checkNotUnderShm(cmd *exec.Cmd) error {
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		if (k == "CUDA_MPS_PIPE_DIRECTORY" || k == "CUDA_MPS_LOG_DIRECTORY") && strings.HasPrefix(filepath.Clean(v)+"/", "/dev/shm/") {
			return fmt.Errorf("the MPS daemon's %s %s is under /dev/shm, which the daemon gets a tmpfs of its own over: put the state directory elsewhere", k, v)
		}
	}
	return nil
}

// startInMountNS starts cmd from the calling thread (one of its own), with
// opts.Shm over /dev/shm in a slave mount namespace where it is given, and
// the thread's capabilities narrowed to opts.Capabilities first: what it
// forks inherits both.
func startInMountNS(cmd *exec.Cmd, opts StartOptions) error {
	if opts.Shm != "" {
		if err := newSlaveNS(cmd.Path); err != nil {
			return err
		}
		if err := unix.Mount(opts.Shm, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over /dev/shm for %s: %w", opts.Shm, cmd.Path, err)
		}
	}
	if err := opts.Capabilities.restrict(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return cmd.Start()
}
