package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/hostmount"
)

// unmountUnder unmounts every mount at or below dir on the host, deepest
// first, as `make demo-down` does for the cluster's directory.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	mounts, err := hostmount.ParseMountinfo(data)
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	var at []string
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			at = append(at, m.MountPoint)
		}
	}
	sort.Slice(at, func(i, j int) bool { return len(at[i]) > len(at[j]) })
	for _, p := range at {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return nil
}
