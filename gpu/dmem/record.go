package dmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/prepare/atomicfile"
)

// Record notes in dir, one file per pod, the pod cgroup (below root) that a
// share's hook limited, so that the limit can be checked later (`carve
// shares`). Every container of the pod writes the same file, whole.
func Record(dir, root, pod string) error {
	rel, err := filepath.Rel(root, pod)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("record pod cgroup %s: not below %s", pod, root)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("record pod cgroup %s: %w", pod, err)
	}
	return atomicfile.Write(filepath.Join(dir, filepath.Base(pod)), []byte(rel+"\n"), 0o644)
}

// Recorded lists the pod cgroups recorded in dir, as paths below root. No
// directory: no container of the share has started.
func Recorded(dir, root string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, filepath.Join(root, filepath.Clean("/"+strings.TrimSpace(string(b)))))
	}
	return out, nil
}

// Held checks that each pod cgroup that still exists holds its pod to at
// most limit bytes of region (dmem.max), and sums what they hold
// (dmem.current). A cgroup that is gone is a pod that ended: nothing to
// hold.
func Held(pods []string, region string, limit uint64) (used uint64, problems []string) {
	for _, pod := range pods {
		if _, err := os.Stat(pod); errors.Is(err, os.ErrNotExist) {
			continue
		}
		switch v, err := Read(filepath.Join(pod, "dmem.max"), region); {
		case err != nil:
			problems = append(problems, fmt.Sprintf("dmem.max of %s: %v", pod, err))
		case v == "max":
			problems = append(problems, fmt.Sprintf("dmem.max of %s has no limit for %s", pod, region))
		default:
			if n, err := strconv.ParseUint(v, 10, 64); err != nil || n > limit {
				problems = append(problems, fmt.Sprintf("dmem.max of %s is %s for %s, over the slice of %d", pod, v, region, limit))
			}
		}
		if v, err := Read(filepath.Join(pod, "dmem.current"), region); err == nil {
			n, _ := strconv.ParseUint(v, 10, 64)
			used += n
		}
	}
	return used, problems
}
