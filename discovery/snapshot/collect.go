package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// attributes are the sysfs files discovery reads (see package discovery).
var attributes = map[string]bool{
	// PCI functions
	"vendor": true, "device": true, "class": true, "numa_node": true, "modalias": true, "revision": true,
	"subsystem_vendor": true, "subsystem_device": true, "sriov_totalvfs": true, "sriov_numvfs": true, "uevent": true,
	"local_cpulist": true,
	// netdevs
	"address": true, "operstate": true, "mtu": true, "carrier": true, "speed": true, "dev_port": true,
	// FPGAs: what is loaded (DFL regions and ports)
	"afu_id": true, "compat_id": true,
	// CPU caches
	"level": true, "type": true, "id": true, "size": true, "ways_of_associativity": true, "shared_cpu_list": true,
}

// links are the sysfs symlinks discovery follows.
func isLink(name string) bool {
	return name == "driver" || name == "physfn" || name == "device" || name == "subsystem" || strings.HasPrefix(name, "virtfn")
}

// walks are the sysfs trees discovery reads: attributes and links below
// them are kept, nothing else.
var walks = []string{"sys/devices", "sys/bus/pci/devices", "sys/class/net"}

// whole are copied as they are where they exist.
var whole = []string{"sys/fs/resctrl/info", "proc/config.gz", "proc/sys/kernel/osrelease",
	"usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids.gz", "usr/share/hwdata/pci.ids.gz"}

// collect copies what discovery reads below root into dst, with the same
// paths.
func collect(root, dst string) error {
	for _, w := range walks {
		if err := walk(root, dst, w); err != nil {
			return err
		}
	}
	drivers, _ := os.ReadDir(filepath.Join(root, "sys/bus/pci/drivers"))
	for _, d := range drivers {
		if err := os.MkdirAll(filepath.Join(dst, "sys/bus/pci/drivers", d.Name()), 0o755); err != nil {
			return err
		}
	}
	rels := append([]string(nil), whole...)
	if release, err := os.ReadFile(filepath.Join(root, "proc/sys/kernel/osrelease")); err == nil {
		rels = append(rels, "boot/config-"+strings.TrimSpace(string(release)))
	}
	for _, rel := range rels {
		if err := copyTree(root, dst, rel); err != nil {
			return err
		}
	}
	return nil
}

// walk copies the attributes and links below rel, without following links.
func walk(root, dst, rel string) error {
	start := filepath.Join(root, rel)
	err := filepath.WalkDir(start, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		name := d.Name()
		r, _ := filepath.Rel(root, path)
		switch {
		case d.IsDir():
			if path != start && skipDir(r, name) {
				return filepath.SkipDir
			}
		case d.Type()&fs.ModeSymlink != 0:
			if isLink(name) || filepath.Dir(r) == "sys/bus/pci/devices" || filepath.Dir(r) == "sys/class/net" {
				return copyLink(path, filepath.Join(dst, r))
			}
		case d.Type().IsRegular() && attributes[name]:
			return copyFile(path, filepath.Join(dst, r))
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// skipDir prunes what discovery never reads: everything in sys/devices but
// PCI, virtual netdevs and CPU caches, and per-device noise.
func skipDir(rel, name string) bool {
	switch name {
	case "power", "msi_irqs", "queues", "statistics", "holders", "slaves", "wakeup", "firmware_node", "iommu", "iommu_group":
		return true
	}
	if parts := strings.Split(rel, "/"); len(parts) >= 3 && parts[0] == "sys" && parts[1] == "devices" {
		switch {
		case strings.HasPrefix(parts[2], "pci"):
		case parts[2] == "virtual":
			return len(parts) >= 4 && parts[3] != "net"
		case parts[2] == "system":
			return len(parts) >= 4 && parts[3] != "cpu"
		default:
			return true
		}
	}
	return false
}

func copyLink(src, dst string) error {
	target, err := os.Readlink(src)
	if err != nil {
		return fmt.Errorf("read link %s: %w", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(target, dst); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// copyFile copies a sysfs attribute; one the kernel refuses to read now
// (the speed of a link that is down) is left out, as discovery treats it.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// copyTree copies a file or a directory's files as they are.
func copyTree(root, dst, rel string) error {
	src := filepath.Join(root, rel)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			r, _ := filepath.Rel(root, path)
			return copyFile(path, filepath.Join(dst, r))
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
