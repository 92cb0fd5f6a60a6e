// Package dmem holds a pod to its GPU memory slice through the cgroup v2
// dmem controller: it finds a GPU's region in dmem.capacity, and writes a
// share's slice to dmem.max (and its guarantee to dmem.min) of the pod's
// cgroup, from a container runtime hook. The cgroup root is configurable so
// that tests run against a fake cgroupfs.
package dmem

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

// DefaultRoot is where cgroup v2 is mounted.
const DefaultRoot = "/sys/fs/cgroup"

// Capacity reads <root>/dmem.capacity: each region's name and size in
// bytes. A missing file (no CONFIG_CGROUP_DMEM, or cgroup v1) is an error
// wrapping os.ErrNotExist.
func Capacity(root string) (map[string]uint64, error) {
	f, err := os.Open(filepath.Join(root, "dmem.capacity"))
	if err != nil {
		return nil, fmt.Errorf("dmem regions: %w", err)
	}
	defer f.Close()
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

// Limit is what a share's pod may hold of one region.
type Limit struct {
	Region string
	// Max is the hard limit (dmem.max); allocations past it fail.
	Max uint64
	// Min is the guarantee (dmem.min); 0 leaves dmem.min alone.
	Min uint64
}

func (l Limit) validate() error {
	if l.Region == "" || strings.ContainsAny(l.Region, " \n\t") {
		return fmt.Errorf("dmem region %q is not a region name", l.Region)
	}
	if l.Max == 0 {
		return errors.New("dmem limit of 0 bytes")
	}
	if l.Min > l.Max {
		return fmt.Errorf("dmem guarantee %d exceeds the limit %d", l.Min, l.Max)
	}
	return nil
}

// Apply writes the limit to the cgroup at dir (a path below root), first
// enabling the dmem controller in cgroup.subtree_control of every ancestor
// from root down to dir's parent, which is what makes dir's dmem files
// exist. Writing the same limit again changes nothing.
func Apply(root, dir string, l Limit) error {
	if err := l.validate(); err != nil {
		return err
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup %s is not below the cgroup root %s", dir, root)
	}
	cur := root
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		if err := enableDmem(cur); err != nil {
			return err
		}
		cur = filepath.Join(cur, part)
	}
	if err := writeLine(filepath.Join(dir, "dmem.max"), fmt.Sprintf("%s %d", l.Region, l.Max)); err != nil {
		return err
	}
	if l.Min > 0 {
		return writeLine(filepath.Join(dir, "dmem.min"), fmt.Sprintf("%s %d", l.Region, l.Min))
	}
	return nil
}

// enableDmem adds dmem to a cgroup's subtree_control unless it is there.
func enableDmem(dir string) error {
	ctl := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(ctl)
	if err != nil {
		return fmt.Errorf("enable dmem below cgroup %s: %w", dir, err)
	}
	for _, c := range strings.Fields(string(b)) {
		if c == "dmem" {
			return nil
		}
	}
	if err := writeLine(ctl, "+dmem"); err != nil {
		return fmt.Errorf("enable dmem below cgroup %s: %w", dir, err)
	}
	return nil
}

// writeLine writes one control line, as a single write, to a cgroup file.
func writeLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", line, path, err)
	}
	_, werr := f.WriteString(line + "\n")
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", line, path, werr)
	}
	return cerr
}

// Read returns a region's value in a dmem.max or dmem.min file: its bytes,
// or "max".
func Read(path, region string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == region {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s has no line for region %s", path, region)
}
