// Package proccgroup reads /proc/<pid>/cgroup: which cgroups a process is
// in. The runtime hook finds a container's pod cgroup with it, and GPU
// policing a process's pod; it is one parser, so the two agree.
package proccgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Entry is one line of /proc/<pid>/cgroup: "hierarchy-ID:controllers:path".
// Hierarchy 0 with no controllers is cgroup v2's unified hierarchy.
type Entry struct {
	Hierarchy   int
	Controllers []string
	Path        string
}

// Read reads <procRoot>/<pid>/cgroup.
func Read(procRoot string, pid int) ([]Entry, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	return Parse(string(b))
}

// Parse parses the file's lines; an empty line is skipped, a malformed one
// is an error naming it.
func Parse(s string) ([]Entry, error) {
	var out []Entry
	for n, line := range strings.Split(s, "\n") {
		if line == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(line, ":")
		ctl, path, ok2 := strings.Cut(rest, ":")
		h, err := strconv.Atoi(id)
		if !ok1 || !ok2 || err != nil || h < 0 {
			return nil, fmt.Errorf("cgroup line %d: %q is not hierarchy:controllers:path", n+1, line)
		}
		e := Entry{Hierarchy: h, Path: path}
		if ctl != "" {
			e.Controllers = strings.Split(ctl, ",")
		}
		out = append(out, e)
	}
	return out, nil
}

// Unified is the process's cgroup v2 path, "" where it is in none.
func Unified(entries []Entry) string {
	for _, e := range entries {
		if e.Hierarchy == 0 && len(e.Controllers) == 0 {
			return e.Path
		}
	}
	return ""
}
