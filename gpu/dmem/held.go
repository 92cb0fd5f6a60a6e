package dmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/carve-dra/carve/prepare/hook"
)

// Held checks that each pod cgroup that still exists holds its pod to at
// most limit bytes of region (dmem.max), and sums what they hold
// (dmem.current). A cgroup that is gone is a pod that ended: nothing to
// hold.
func Held(pods []string, region string, limit uint64) (used uint64, problems []string) {
	for _, pod := range pods {
		if _, err := os.Stat(pod); errors.Is(err, os.ErrNotExist) {
			continue
		}
		switch v, err := hook.ReadDmem(filepath.Join(pod, "dmem.max"), region); {
		case err != nil:
			problems = append(problems, fmt.Sprintf("dmem.max of %s: %v", pod, err))
		case v == "max":
			problems = append(problems, fmt.Sprintf("dmem.max of %s has no limit for %s", pod, region))
		default:
			if n, err := strconv.ParseUint(v, 10, 64); err != nil || n > limit {
				problems = append(problems, fmt.Sprintf("dmem.max of %s is %s for %s, over the slice of %d", pod, v, region, limit))
			}
		}
		if v, err := hook.ReadDmem(filepath.Join(pod, "dmem.current"), region); err == nil {
			n, _ := strconv.ParseUint(v, 10, 64)
			used += n
		}
	}
	return used, problems
}
