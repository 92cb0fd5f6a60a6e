package discovery

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// fpgaVendors are the vendors whose processing accelerators (class 0x12) are
// FPGA cards: AMD/Xilinx, Intel (DFL cards) and Altera.
var fpgaVendors = map[string]bool{"0x10ee": true, "0x8086": true, "0x1172": true}

func isFPGA(f PCIFunction) bool { return f.ClassPrefix("12") && fpgaVendors[f.VendorID] }

func isNVIDIAGPU(f PCIFunction) bool { return f.ClassPrefix("03") && f.VendorID == "0x10de" }

// devNodes finds the character devices a driver made for a PCI function: any
// directory below the function (not following symlinks, which lead to the
// driver and subsystem) whose uevent names a DEVNAME. This covers Xilinx XRT
// nodes, Intel DFL's dfl-fme/dfl-port and DRM render nodes alike.
func (t tree) devNodes(addr string) []string {
	sysfsPath, err := t.resolve(filepath.Join("sys/bus/pci/devices", addr))
	if err != nil {
		return nil
	}
	var nodes []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > 5 {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			switch {
			case e.Name() == "uevent" && e.Type().IsRegular():
				if name := ueventDevName(filepath.Join(dir, e.Name())); name != "" {
					nodes = append(nodes, "/dev/"+name)
				}
			case e.IsDir() && e.Type()&os.ModeSymlink == 0:
				walk(filepath.Join(dir, e.Name()), depth+1)
			}
		}
	}
	walk(sysfsPath, 0)
	sort.Strings(nodes)
	return nodes
}

func ueventDevName(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "DEVNAME="); ok {
			// A DEVNAME climbing out of /dev is not a device node.
			if clean := filepath.Clean(v); !strings.HasPrefix(clean, "..") && !filepath.IsAbs(clean) {
				return clean
			}
		}
	}
	return ""
}
