package hostcgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, name := range []string{"", "/carve", "../carve", "a/../../b", "carve/"} {
		if err := (Group{Name: name}).Validate(); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	for _, name := range []string{"carve-mps", "carve/mps"} {
		if err := (Group{Name: name}).Validate(); err != nil {
			t.Errorf("name %q: %v", name, err)
		}
	}
}

// A container's view has its hierarchies mounted from its own cgroup: a
// group made there would not leave the container, and Move says so.
func TestContainerViewRefused(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	lines := "30 25 0:26 /kubepods/pod1/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n" +
		"31 25 0:27 /kubepods/pod1/abc /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
	if err := os.WriteFile(mi, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Group{Name: "carve-mps", Mountinfo: mi}.Move(os.Getpid())
	if err == nil || !strings.Contains(err.Error(), "below their roots") {
		t.Fatalf("Move from a container's view: %v", err)
	}
}

// The hierarchies are those mounted at their roots, each once, with v1
// cpuset marked.
func TestHierarchies(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	lines := "22 1 0:20 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" +
		"23 22 0:21 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n" +
		"24 22 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
		"25 22 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n" +
		"26 1 0:22 / /mnt/memory-again rw - cgroup cgroup rw,memory\n"
	if err := os.WriteFile(mi, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	hs, err := Group{Name: "x", Mountinfo: mi}.hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	want := []hierarchy{{"/sys/fs/cgroup/cpuset", true}, {"/sys/fs/cgroup/memory", false}, {"/sys/fs/cgroup/unified", false}}
	if !slices.Equal(hs, want) {
		t.Fatalf("hierarchies = %v, want %v", hs, want)
	}
}

// On the host's real cgroup file system: a process moved into the group is
// in it in every hierarchy, Remove keeps a group that holds a process, and
// removes it, in every hierarchy, once the process is gone.
func TestMoveOnHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	g := Group{Name: fmt.Sprintf("carve-test-%d/daemons", os.Getpid())}
	hs, err := g.hierarchies()
	if err != nil {
		t.Skipf("no cgroup hierarchy to test with: %v", err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = g.Remove() }()
	pid := cmd.Process.Pid
	if err := g.Move(pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Move(pid, 1<<30); err != nil { // again, and a PID that does not exist
		t.Fatalf("second Move: %v", err)
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < len(hs) {
		t.Fatalf("/proc/%d/cgroup has %d lines for %d hierarchies", pid, len(lines), len(hs))
	}
	for _, l := range lines {
		// hierarchy-ID:controllers:path; every mounted hierarchy's path
		// is the group's.
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && parts[2] != "/"+g.Name && mountedHierarchy(hs, parts[1]) {
			t.Errorf("process %d not in the group in hierarchy %q: %s", pid, parts[1], l)
		}
	}
	if m, err := g.Members(); err != nil || !slices.Contains(m, pid) {
		t.Fatalf("Members = %v, %v; want %d among them", m, err, pid)
	}
	if err := g.Remove(); err != nil {
		t.Fatalf("Remove with a process in the group: %v", err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h.dir, g.Name)); err != nil {
			t.Errorf("the group in %s was removed while it held a process: %v", h.dir, err)
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h.dir, filepath.Dir(g.Name))); !os.IsNotExist(err) {
			t.Errorf("the group's parent in %s is left: %v", h.dir, err)
		}
	}
}

// mountedHierarchy reports whether a /proc/PID/cgroup line's controllers
// name one of hs: a v1 hierarchy by its controllers ("memory",
// "name=systemd"), v2 by "".
func mountedHierarchy(hs []hierarchy, controllers string) bool {
	for _, h := range hs {
		base := filepath.Base(h.dir)
		if controllers == "" && (base == "unified" || base == "cgroup") {
			return true
		}
		for _, c := range strings.Split(controllers, ",") {
			if c == base || strings.TrimPrefix(c, "name=") == base {
				return true
			}
		}
	}
	return false
}
