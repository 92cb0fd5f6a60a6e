package police

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/discovery/proccgroup"
)

// podUID finds a pod's UID in a cgroup path, in the kubelet's cgroupfs
// ("pod<uid>") and systemd ("pod<uid with _>.slice") forms, v1 or v2.
var podUID = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// PodOf maps a process to the UID of the pod it runs in, from
// <procRoot>/<pid>/cgroup. A process that is gone, or in no pod, is an
// error.
func PodOf(procRoot string, pid int) (types.UID, error) {
	entries, err := proccgroup.Read(procRoot, pid)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if m := podUID.FindStringSubmatch(e.Path); m != nil {
			return types.UID(strings.ReplaceAll(m[1], "_", "-")), nil
		}
	}
	return "", fmt.Errorf("process %d is in no pod's cgroup", pid)
}

// StartTime is a process's start time in clock ticks since boot (field 22
// of /proc/<pid>/stat); 0 where it cannot be read.
func StartTime(procRoot string, pid int) uint64 {
	v, _ := startTime(procRoot, pid)
	return v
}

// startTime reads field 22 of /proc/<pid>/stat. A process that is gone is
// an error that wraps syscall.ESRCH.
func startTime(procRoot string, pid int) (uint64, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return 0, fmt.Errorf("process %d: %w", pid, syscall.ESRCH)
	}
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces
	// and parentheses: fields are counted from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("%s: %d fields after the command name, want 20 or more", path, len(f))
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: start time %q: %w", path, f[19], err)
	}
	return v, nil
}
