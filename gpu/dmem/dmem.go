// Package dmem holds a pod to its GPU memory slice through the cgroup v2
// dmem controller: it finds a GPU's region in dmem.capacity, and writes a
// share's slice to dmem.max (and its guarantee to dmem.min) of the pod's
// cgroup, from a container runtime hook. The cgroup root is configurable so
// that tests run against a fake cgroupfs.
package dmem

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// Capacity reads <root>/dmem.capacity: each region's name and size in
// bytes. A missing file (no CONFIG_CGROUP_DMEM, or cgroup v1) is an error
// wrapping os.ErrNotExist.
func Capacity(root string) (map[string]uint64, error) {
	f, err := os.Open(filepath.Join(root, "dmem.capacity"))
	if err != nil {
		return nil, fmt.Errorf("dmem regions: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	return ParseCapacity(f)
}

// ParseCapacity parses dmem.capacity lines: "<region> <bytes>".
func ParseCapacity(r io.Reader) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("dmem.capacity line %d: want \"<region> <bytes>\", got %q", n, sc.Text())
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("dmem.capacity line %d: size %q: %w", n, fields[1], err)
		}
		out[fields[0]] = v
	}
	return out, sc.Err()
}

// RegionFor finds the NVIDIA video memory region of the GPU at this PCI
// address ("0000:19:00.0"): "nvidia/<pci>/vidmem". The PCI part is matched
// in either of NVML's and sysfs's forms.
func RegionFor(capacity map[string]uint64, pciAddress string) (string, bool) {
	want, err := nvmlinfo.NormalizeBusID(pciAddress)
	if err != nil {
		return "", false
	}
	for name := range capacity {
		parts := strings.Split(name, "/")
		if len(parts) != 3 || parts[0] != "nvidia" || parts[2] != "vidmem" {
			continue
		}
		if got, err := nvmlinfo.NormalizeBusID(parts[1]); err == nil && got == want {
			return name, true
		}
	}
	return "", false
}
