package acceptance

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// What a container would have, made on a bare GPU host without a container
// runtime: the acceptance run starts its clients with a claim's device
// nodes only (StartWithDevices), and the agent in a root of its own image's
// shape with the host at /host (StartChrooted), as the chart runs it.

// basicNodes are the nodes every container's /dev has (the OCI runtime
// spec's defaults), besides a claim's.
var basicNodes = []cdispec.DeviceNode{
	{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
	{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5},
	{Path: "/dev/random", Type: "c", Major: 1, Minor: 8},
	{Path: "/dev/urandom", Type: "c", Major: 1, Minor: 9},
}

// StartWithDevices starts cmd in a mount namespace of its own whose /dev
// holds only the basic nodes and nodes (a claim's CDI edits), as a
// container's does: a MIG device whose capability nodes are not there is
// one CUDA cannot open, so it sees exactly the claim's. A node without its
// numbers in the edits gets those of its host path, as a runtime fills
// them in, and its mode is the edit's or else its host node's (the
// nvidia-caps nodes' 0444 matter to a client that is not root). The /dev
// is read-only once made: a client cannot make the nodes it lacks.
func StartWithDevices(cmd *exec.Cmd, nodes []*cdispec.DeviceNode) error {
	all := append([]cdispec.DeviceNode(nil), basicNodes...)
	for _, n := range nodes {
		all = append(all, *n)
	}
	for i, n := range all {
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		var st unix.Stat_t
		if err := unix.Stat(host, &st); err != nil {
			if n.Major != 0 || n.Minor != 0 {
				continue
			}
			return fmt.Errorf("device node %s: %w", host, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return fmt.Errorf("device node %s is not a character device", host)
		}
		if n.Major == 0 && n.Minor == 0 {
			all[i].Major, all[i].Minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		}
		if n.FileMode == nil {
			mode := os.FileMode(st.Mode & 0o777)
			all[i].FileMode = &mode
		}
	}
	return hostmount.OnOwnThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("a mount namespace for %s: %w", cmd.Path, err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return fmt.Errorf("mounts as slaves: %w", err)
		}
		if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID, "mode=755"); err != nil {
			return fmt.Errorf("a /dev of the claim's nodes: %w", err)
		}
		for _, n := range all {
			if !strings.HasPrefix(n.Path, "/dev/") {
				return fmt.Errorf("device node %s is not below /dev", n.Path)
			}
			if err := os.MkdirAll(filepath.Dir(n.Path), 0o755); err != nil {
				return err
			}
			if n.Type != "" && n.Type != "c" {
				return fmt.Errorf("device node %s: type %q, only character devices are made", n.Path, n.Type)
			}
			perm := os.FileMode(0o666)
			if n.FileMode != nil {
				perm = n.FileMode.Perm()
			}
			if err := unix.Mknod(n.Path, unix.S_IFCHR, int(unix.Mkdev(uint32(n.Major), uint32(n.Minor)))); err != nil {
				return fmt.Errorf("device node %s (%d:%d): %w", n.Path, n.Major, n.Minor, err)
			}
			// Not through mknod's mode, which the umask cuts.
			if err := os.Chmod(n.Path, perm); err != nil {
				return err
			}
		}
		if err := unix.Mount("", "/dev", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
			return fmt.Errorf("make the claim's /dev read-only: %w", err)
		}
		return cmd.Start()
	})
}

// Bind is a mount StartChrooted makes below its root: Source (a host path)
// at Target (a path in the new root), recursively. A bind is a slave of its
// source (the chart's HostToContainer), so that nothing made below it
// reaches the host, unless Shared: then it is a peer of its source, which
// the caller has made a shared mount, and what the child mounts below it
// shows on the host too (the chart's Bidirectional state directory).
type Bind struct {
	Source, Target string
	Shared         bool
}

// BuildRoot makes root a root file system holding only the executable exe
// (at the same path) and the shared libraries it needs, and the libraries
// named in extra where the host has them (what a dlopen needs, which no
// ELF header names), as the agent's image holds carve and its libraries
// and nothing of the host's driver.
func BuildRoot(root, exe string, extra ...string) error {
	files, err := elfClosure(exe)
	if err != nil {
		return err
	}
	for _, lib := range extra {
		for _, d := range libDirs {
			if p := filepath.Join(d, lib); fileExists(p) {
				files = append(files, p)
				break
			}
		}
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(root, f)); err != nil {
			return err
		}
	}
	return nil
}

// libDirs are where the host's dynamic loader finds libraries.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// elfClosure is exe, its interpreter and every library it needs, found
// where the host's dynamic loader would (the usual directories).
func elfClosure(exe string) ([]string, error) {
	dirs := libDirs
	seen := map[string]bool{}
	queue := []string{exe}
	var out []string
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		if seen[f] {
			continue
		}
		seen[f] = true
		out = append(out, f)
		e, err := elf.Open(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		libs, err := e.ImportedLibraries()
		var interp string
		for _, p := range e.Progs {
			if p.Type == elf.PT_INTERP {
				b, rerr := io.ReadAll(p.Open())
				if rerr == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		_ = e.Close()
		if err != nil {
			return nil, fmt.Errorf("libraries of %s: %w", f, err)
		}
		if interp != "" {
			queue = append(queue, interp)
		}
	libs:
		for _, lib := range libs {
			for _, d := range dirs {
				if p := filepath.Join(d, lib); fileExists(p) {
					queue = append(queue, p)
					continue libs
				}
			}
			return nil, fmt.Errorf("%s needs %s, found in none of %v", f, lib, dirs)
		}
	}
	return out, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// StartChrooted starts cmd (its Path inside root) chrooted into root, in a
// mount namespace of its own, with binds made below root first (the host's
// / at /host, /proc, /dev and /sys as a privileged pod with hostPID has
// them, the state directory at its host path). root is made a private
// mount of its own there, so that the binds never show on the host; the
// namespace ends with the child.
func StartChrooted(cmd *exec.Cmd, root string, binds []Bind) error {
	return hostmount.OnOwnThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("a mount namespace for %s: %w", root, err)
		}
		if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over itself: %w", root, err)
		}
		if err := unix.Mount("", root, "", unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make %s private: %w", root, err)
		}
		for _, b := range binds {
			target := filepath.Join(root, b.Target)
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			if err := unix.Mount(b.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("bind %s at %s: %w", b.Source, target, err)
			}
			if b.Shared {
				continue
			}
			if err := unix.Mount("", target, "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
				return fmt.Errorf("make %s a slave: %w", target, err)
			}
		}
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Chroot = root
		if cmd.Dir == "" {
			cmd.Dir = "/"
		}
		return cmd.Start()
	})
}

// ShareMount makes dir a shared mount point (bound over itself), as the
// chart's host-mounts init container makes the state directory, and
// returns what undoes it.
func ShareMount(dir string) (undo func() error, err error) {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind %s over itself: %w", dir, err)
	}
	undo = func() error { return unix.Unmount(dir, unix.MNT_DETACH) }
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return nil, errors.Join(fmt.Errorf("make %s shared: %w", dir, err), undo())
	}
	return undo, nil
}
