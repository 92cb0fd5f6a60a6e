package discovery

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

var pciAddressPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciDevicesDir lists every PCI function, as links into the device tree.
const pciDevicesDir = "sys/bus/pci/devices"

// pciScan is what a Scanner keeps of the last PCI enumeration of a root:
// the entries of sys/bus/pci/devices (names and inodes), the pci.ids the
// names came from, and the functions read, in the entries' order.
type pciScan struct {
	entries []dirEntry
	ids     pciIDsStamp
	fns     []PCIFunction
	// named are the names of each vendor and device ID pair the last
	// read of ids gave; nil where there were none (no pci.ids, or it
	// could not be read).
	named map[pciID][2]string
}

// pciID is a function's vendor and device ID.
type pciID struct{ vendor, device string }

func idOf(f PCIFunction) pciID { return pciID{f.VendorID, f.DeviceID} }

// lookup returns the function of an address.
func (s *pciScan) lookup(addr string) (int, bool) {
	return slices.BinarySearchFunc(s.fns, addr, func(f PCIFunction, a string) int { return strings.Compare(f.Address, a) })
}

// scanPCI reads every PCI function under the root: its IDs, NUMA node and
// PCIe root, a few files per function, and its names from pci.ids (see
// pciNames). changed says the functions or pci.ids changed since last.
//
// A function last read keeps what cannot change while its entry (name and
// inode) is the same, and only its driver link, which a rebind changes, is
// read again. pci.ids is read again only where it changed, where its last
// read gave no names, or where a function appeared whose vendor and device
// IDs it did not name: names are those of the IDs, so VFs enabled on a PF
// whose VFs were named take their names from the last read. Where pci.ids
// cannot be read, the IDs are published without names.
func (t tree) scanPCI(ctx context.Context, last *pciScan) (scan *pciScan, changed bool, err error) {
	entries, err := readDirInodes(t.path(pciDevicesDir))
	if err != nil {
		return nil, false, err
	}
	scan = &pciScan{entries: entries, ids: pciIDsStampFor(), fns: make([]PCIFunction, len(entries))}
	changed = last == nil || scan.ids != last.ids || !slices.Equal(entries, last.entries)
	if err := t.readPCIFunctions(scan, last); err != nil {
		return nil, false, err
	}
	if !changed {
		scan.named = last.named
		return scan, false, nil
	}
	if last != nil && scan.ids == last.ids && last.named != nil {
		scan.named = last.named
	}
	for _, f := range scan.fns {
		if _, ok := scan.named[idOf(f)]; !ok {
			scan.named = t.readPCINames(ctx, scan)
			break
		}
	}
	for i := range scan.fns {
		f := &scan.fns[i]
		n := scan.named[idOf(*f)]
		f.VendorName, f.ProductName = n[0], n[1]
	}
	return scan, true, nil
}

// readPCINames names the IDs of scan's functions from its pci.ids; nil
// where there is none or it cannot be read, which is logged.
func (t tree) readPCINames(ctx context.Context, scan *pciScan) map[pciID][2]string {
	logger := klog.FromContext(ctx)
	if scan.ids.path == "" {
		logger.V(4).Info("PCI functions without names", "reason", "no pci.ids")
		return nil
	}
	ids := make([]pciID, 0, len(scan.fns))
	seen := make(map[pciID]bool)
	for _, f := range scan.fns {
		if id := idOf(f); !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	named, err := pciNames(scan.ids, ids)
	if err != nil {
		logger.V(2).Info("PCI functions without names", "reason", err.Error())
		return nil
	}
	return named
}

// readPCIFunctions reads the functions scan lists; those last read under
// the same entry are taken from it, with their driver read again.
func (t tree) readPCIFunctions(scan, last *pciScan) error {
	if len(scan.entries) == 0 {
		return nil
	}
	devices, ok, err := t.openDir(pciDevicesDir)
	if err != nil {
		return err
	}
	if !ok { // gone since it was listed
		scan.entries, scan.fns = nil, nil
		return nil
	}
	defer devices.close()
	return forEach(len(scan.entries), func(i int) (err error) {
		e := scan.entries[i]
		if last != nil {
			if j, ok := slices.BinarySearchFunc(last.entries, e.name, func(l dirEntry, n string) int { return strings.Compare(l.name, n) }); ok && last.entries[j] == e {
				scan.fns[i] = last.fns[j]
				scan.fns[i].Driver = devices.linkBase(e.name + "/driver")
				return nil
			}
		}
		scan.fns[i], err = t.readPCI(devices, e.name)
		return err
	})
}

// readPCI reads one function of sys/bus/pci/devices.
func (t tree) readPCI(devices dir, addr string) (PCIFunction, error) {
	if !pciAddressPattern.MatchString(addr) {
		return PCIFunction{}, fmt.Errorf("PCI function %q under %s: not a domain:bus:device.function address", addr, t.path(pciDevicesDir))
	}
	f := PCIFunction{Address: addr, NUMANode: -1}
	if target, ok, err := devices.optionalLink(addr); err != nil {
		return PCIFunction{}, err
	} else if ok {
		f.PCIeRoot = pcieRootOf(addr, target)
	}
	d, ok, err := devices.openDir(addr)
	if err != nil || !ok {
		return f, err
	}
	defer d.close()
	modalias, ok, err := d.optionalString("modalias")
	if err != nil {
		return PCIFunction{}, err
	}
	if !ok || !parseModalias(modalias, &f) {
		for _, field := range []struct {
			file string
			dst  *string
		}{{"vendor", &f.VendorID}, {"device", &f.DeviceID}, {"class", &f.Class}} {
			v, _, err := d.optionalString(field.file)
			if err != nil {
				return PCIFunction{}, err
			}
			*field.dst = strings.ToLower(v)
		}
	}
	if n, ok, err := d.optionalInt("numa_node"); err != nil {
		return PCIFunction{}, err
	} else if ok {
		f.NUMANode = int(n)
	}
	f.Driver = d.linkBase("driver")
	return f, nil
}

// parseModalias fills the IDs and class from a PCI modalias,
// "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00", and reports
// whether it had that form.
func parseModalias(s string, f *PCIFunction) bool {
	// v, d, sv, sd: 8 hex digits each; bc, sc, i: 2.
	if len(s) < 53 || !strings.HasPrefix(s, "pci:v") || s[13] != 'd' || s[22:24] != "sv" || s[32:34] != "sd" ||
		s[42:44] != "bc" || s[46:48] != "sc" || s[50] != 'i' {
		return false
	}
	lower := strings.ToLower(s)
	f.VendorID = "0x" + lower[9:13]
	f.DeviceID = "0x" + lower[18:22]
	f.Class = "0x" + lower[44:46] + lower[48:50] + lower[51:53]
	return true
}

// pcieRootOf is the root complex a function hangs off, from the target of
// its sys/bus/pci/devices link: "../../../devices/pci0000:16/0000:16:02.0/
// 0000:17:00.0" gives "pci0000:16". A target of another form gives "", as
// deviceattribute.GetPCIeRootAttributeByPCIBusID does.
func pcieRootOf(addr, target string) string {
	if !filepath.IsAbs(target) {
		target = filepath.Join("bus/pci/devices", target)
	} else if i := strings.Index(target, "/devices/pci"); i >= 0 {
		target = target[i+1:]
	}
	if !strings.HasPrefix(target, "devices/pci") || filepath.Base(target) != addr {
		return ""
	}
	root, _, _ := strings.Cut(strings.TrimPrefix(target, "devices/"), "/")
	return root
}
