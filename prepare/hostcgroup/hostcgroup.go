// Package hostcgroup moves processes the agent starts, and that must
// outlive its container, into a cgroup of their own on the host.
//
// A process the agent starts is in the agent container's cgroups. When the
// agent's pod goes (an upgrade, a crash loop, a node drain), the runtime
// kills every process in them: runc, for a container that shares the host's
// PID namespace (the chart's hostPID), signals every PID its cgroup holds,
// and the kubelet kills what is left in the pod's cgroup. A claim's MPS
// control daemon is such a process: its clients, CUDA processes in other
// pods, lose their server with it. Moved into a cgroup outside the pod's
// (Group), it stays until the claim's unprepare stops it.
//
// Every mounted hierarchy is joined, cgroup v2 and each v1 controller alike:
// runc finds a v1 container's processes through one controller's hierarchy
// and the kubelet through others, so a process left in any of them is
// still killed.
package hostcgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// Group is a cgroup named Name below the root of every cgroup hierarchy
// mounted in the mount namespace the group is used from.
type Group struct {
	// Name is the cgroup's path below each hierarchy's root, such as
	// "carve-mps": one path component or more, never "..".
	Name string
	// Mountinfo is where the hierarchies' mounts are read;
	// /proc/thread-self/mountinfo (the calling thread's namespace) when
	// empty.
	Mountinfo string
}

// Validate refuses a name that is empty, absolute, or leaves the
// hierarchy's root.
func (g Group) Validate() error {
	if g.Name == "" || filepath.IsAbs(g.Name) || filepath.Clean(g.Name) != g.Name || strings.HasPrefix(g.Name, "..") {
		return fmt.Errorf("cgroup name %q: want a relative path below a hierarchy's root, such as carve-mps", g.Name)
	}
	return nil
}

// hierarchy is one mounted cgroup hierarchy.
type hierarchy struct {
	dir string
	// cpuset: a v1 cpuset hierarchy, whose new cgroups start with no CPUs
	// and no memory nodes, and admit no process until given some.
	cpuset bool
}

// hierarchies lists the cgroup hierarchies mounted in the calling thread's
// mount namespace, each once (the first mount of it).
func (g Group) hierarchies() ([]hierarchy, error) {
	path := g.Mountinfo
	if path == "" {
		path = "/proc/thread-self/mountinfo"
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cgroup hierarchies: %w", err)
	}
	mounts, err := hostmount.ParseMountinfo(data)
	if err != nil {
		return nil, fmt.Errorf("cgroup hierarchies: %w", err)
	}
	var out []hierarchy
	seen := map[string]bool{}
	var below []string
	for _, m := range mounts {
		if m.FSType != "cgroup" && m.FSType != "cgroup2" {
			continue
		}
		key := m.FSType + " " + m.SuperOptions
		if m.Root != "/" {
			// A container's view: its own cgroup as the root, in
			// which a group would not leave it.
			below = append(below, m.MountPoint)
			continue
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, hierarchy{dir: m.MountPoint, cpuset: m.FSType == "cgroup" && hasOption(m.SuperOptions, "cpuset")})
	}
	if len(out) == 0 && len(below) > 0 {
		return nil, fmt.Errorf("the cgroup hierarchies at %s are mounted from below their roots (a container's view): use the host's mount namespace", strings.Join(below, ", "))
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted")
	}
	return out, nil
}

func hasOption(opts, opt string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// Move puts each of pids, with all its threads, into the group in every
// hierarchy, making the group where it is missing. A PID that no longer
// exists is skipped. It is idempotent: a process already there stays.
func (g Group) Move(pids ...int) error {
	if err := g.Validate(); err != nil {
		return err
	}
	hs, err := g.hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		dir := filepath.Join(h.dir, g.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", dir, err))
			continue
		}
		if h.cpuset {
			if err := inheritCpuset(h.dir, dir); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		for _, pid := range pids {
			err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o600)
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("move process %d into cgroup %s: %w", pid, dir, err))
			}
		}
	}
	return errors.Join(errs...)
}

// inheritCpuset gives a v1 cpuset cgroup (and each cgroup between it and the
// hierarchy's root) its parent's CPUs and memory nodes where it has none.
func inheritCpuset(root, dir string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		return err
	}
	parent := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		child := filepath.Join(parent, part)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(child, f))
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", child, err)
			}
			if len(bytes.TrimSpace(cur)) > 0 {
				continue
			}
			from, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", parent, err)
			}
			if err := os.WriteFile(filepath.Join(child, f), bytes.TrimSpace(from), 0o600); err != nil {
				return fmt.Errorf("cgroup %s: set %s from its parent: %w", child, f, err)
			}
		}
		parent = child
	}
	return nil
}

// Members lists the processes in the group, from the first hierarchy that
// has it; none where no hierarchy has it.
func (g Group) Members() ([]int, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	hs, err := g.hierarchies()
	if err != nil {
		return nil, err
	}
	for _, h := range hs {
		data, err := os.ReadFile(filepath.Join(h.dir, g.Name, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", filepath.Join(h.dir, g.Name), err)
		}
		var pids []int
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return pids, nil
	}
	return nil, nil
}

// Remove removes the group from every hierarchy where it holds no process
// (a node without MPS daemons keeps no cgroup of carve's). A group that still
// holds one is kept and is no error: its last process's stop comes back here.
func (g Group) Remove() error {
	if err := g.Validate(); err != nil {
		return err
	}
	hs, err := g.hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		// The name's own directory first, then each parent it made,
		// up to the hierarchy's root.
		for dir := filepath.Join(h.dir, g.Name); dir != h.dir && dir != "." && dir != "/"; dir = filepath.Dir(dir) {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				continue
			}
			if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			}
			break
		}
	}
	return errors.Join(errs...)
}

// FromNamespaces is a Group used from the namespaces of another process:
// its mount namespace, where the host's cgroup hierarchies are mounted at
// their roots, and its cgroup namespace, outside which (cgroup v2) no
// process may be moved. NSDir is that process's /proc/PID/ns: the
// runtime's shim's for the agent's container (hostmount.RuntimeNamespace's
// directory).
type FromNamespaces struct {
	Group Group
	NSDir string
}

// Keep moves pids into the group (Group.Move) from the namespaces.
func (f FromNamespaces) Keep(pids ...int) error {
	return f.in(func() error { return f.Group.Move(pids...) })
}

// Release removes the group where it is empty (Group.Remove).
func (f FromNamespaces) Release() error {
	return f.in(f.Group.Remove)
}

func (f FromNamespaces) in(fn func() error) error {
	if f.NSDir == "" {
		return hostmount.OnOwnThread(fn)
	}
	return hostmount.InNamespace(filepath.Join(f.NSDir, "mnt"), func() error {
		// The thread is in the mount namespace; the cgroup namespace
		// follows where it differs (cgroup v2 with a private one).
		if err := enterCgroupNS(filepath.Join(f.NSDir, "cgroup")); err != nil {
			return err
		}
		return fn()
	})
}

func enterCgroupNS(path string) error {
	var target, self unix.Stat_t
	if err := unix.Stat(path, &target); err != nil {
		return fmt.Errorf("cgroup namespace %s: %w", path, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/cgroup", &self); err == nil && self.Ino == target.Ino && self.Dev == target.Dev {
		return nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("enter cgroup namespace %s: %w", path, err)
	}
	return nil
}
