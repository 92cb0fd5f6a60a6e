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

// dflNodeDrivers are the drivers of an Intel DFL card's character devices:
// the FPGA management engine (dfl-fme.N) and the port its AFU sits behind
// (dfl-port.N). The card's other children (flash, SPI, hwmon) are the
// host's to manage, not a workload's.
var dflNodeDrivers = map[string]bool{"dfl-fme": true, "dfl-afu": true}

// listFPGAs groups the FPGA functions into cards and finds what each card's
// drivers made. An AMD/Xilinx XRT card has a management function (xclmgmt)
// and a user function (xocl) in one PCI slot behind one bridge; the card is
// published once, as its first function, with the nodes of both.
func (t tree) listFPGAs(fns []PCIFunction) []FPGA {
	type card struct {
		fpga FPGA
		dirs []string
	}
	var cards []*card
	bySlot := map[string]*card{}
	for _, f := range fns {
		if !isFPGA(f) {
			continue
		}
		dir, err := t.resolve(filepath.Join("sys/bus/pci/devices", f.Address))
		if err != nil {
			continue
		}
		// The slot: the same parent in the device tree and the same
		// device number, i.e. the address without its function.
		slot := filepath.Dir(dir) + "/" + f.Address[:len(f.Address)-2]
		if c, ok := bySlot[slot]; ok {
			c.fpga.Functions = append(c.fpga.Functions, f.Address)
			c.dirs = append(c.dirs, dir)
			continue
		}
		c := &card{fpga: FPGA{PCIFunction: f, Functions: []string{f.Address}}, dirs: []string{dir}}
		bySlot[slot] = c
		cards = append(cards, c)
	}
	out := make([]FPGA, 0, len(cards))
	for _, c := range cards {
		seen := map[string]bool{}
		for _, dir := range c.dirs {
			for _, n := range t.cardNodes(dir) {
				if !seen[n.devName] {
					seen[n.devName] = true
					c.fpga.DevNodes = append(c.fpga.DevNodes, "/dev/"+n.devName)
				}
				if n.driver == "dfl-afu" && c.fpga.AFUID == "" {
					c.fpga.AFUID = t.fpgaID(filepath.Join(n.dir, "afu_id"))
				}
			}
			if c.fpga.CompatID == "" {
				c.fpga.CompatID = t.regionCompatID(dir)
			}
		}
		sort.Strings(c.fpga.DevNodes)
		out = append(out, c.fpga)
	}
	return out
}

// sysfsNode is a device below a PCI function that has a /dev node.
type sysfsNode struct {
	dir, devName, driver string
}

// cardNodes finds the character devices a driver made below one PCI
// function: every directory (not following symlinks, which lead to drivers
// and subsystems) whose uevent names a DEVNAME. XRT's xclmgmt node, its
// xfpga subdevices and the user function's DRM nodes are all found this
// way; on a DFL card only the FME and port nodes, recognized by the driver
// their device is bound to, are taken.
func (t tree) cardNodes(fnDir string) []sysfsNode {
	dfl := filepath.Base(t.linkTarget(filepath.Join(fnDir, "driver"))) == "dfl-pci"
	var nodes []sysfsNode
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > 6 {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			switch {
			case e.Name() == "uevent" && e.Type().IsRegular():
				name := ueventDevName(filepath.Join(dir, e.Name()))
				if name == "" {
					continue
				}
				driver := filepath.Base(t.linkTarget(filepath.Join(dir, "driver")))
				if dfl && !dflNodeDrivers[driver] {
					continue
				}
				nodes = append(nodes, sysfsNode{dir: dir, devName: name, driver: driver})
			case e.IsDir() && e.Type()&os.ModeSymlink == 0:
				walk(filepath.Join(dir, e.Name()), depth+1)
			}
		}
	}
	walk(fnDir, 0)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].devName < nodes[j].devName })
	return nodes
}

// regionCompatID is the compat_id of the first FPGA region below a
// function that has one: the interface a partial bitstream must match
// (a DFL card's FME region). Regions without one (the card's container
// region) fail the read with ENOENT and are skipped.
func (t tree) regionCompatID(fnDir string) string {
	var found string
	_ = filepath.WalkDir(fnDir, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil
		case d.IsDir() && strings.Count(strings.TrimPrefix(path, fnDir), "/") > 8:
			return filepath.SkipDir
		case d.Name() == "compat_id" && filepath.Base(filepath.Dir(filepath.Dir(path))) == "fpga_region":
			if found = t.fpgaID(path); found != "" {
				return filepath.SkipAll
			}
		}
		return nil
	})
	return found
}

// fpgaID reads a 128-bit id as sysfs prints it (32 hex digits); anything
// else, or a missing file, is "".
func (t tree) fpgaID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	v := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"))
	if len(v) != 32 || strings.Trim(v, "0123456789abcdef") != "" {
		return ""
	}
	return v
}

// linkTarget is where an absolute symlink path points, "" when it is none.
func (t tree) linkTarget(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return target
}

func ueventDevName(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }() // read only
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
