package discovery

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/jaypipes/ghw"

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
	// named are the names ghw's last answer gave each vendor and device
	// ID pair (from ids); nil where ghw gave none.
	named map[pciID][2]string
}

// pciID is a function's vendor and device ID.
type pciID struct{ vendor, device string }

func idOf(f PCIFunction) pciID { return pciID{f.VendorID, f.DeviceID} }

// lookup returns the function of an address.
func (s *pciScan) lookup(addr string) (int, bool) {
	return slices.BinarySearchFunc(s.fns, addr, func(f PCIFunction, a string) int { return strings.Compare(f.Address, a) })
}

// pciRead is an enumeration under way: ghw, where it was asked, is still
// naming the functions.
type pciRead struct {
	scan *pciScan
	// changed says the functions or pci.ids changed since the last scan.
	changed bool
	// names brings ghw's answer where it was asked; where it was not,
	// the names are known (taken from the last answer) or there are none.
	names chan ghwNames
}

// ghwNames are the vendor and product names ghw gave, by address; why
// says why there are none.
type ghwNames struct {
	byAddr map[string][2]string
	why    string
}

// startPCI reads every PCI function under the root. ghw enumerates them
// too, and names them from pci.ids; their IDs, NUMA node and PCIe root are
// read beside it, a few files per function.
//
// ghw re-reads every function and parses pci.ids on each call (about 100
// ms of CPU and 20 MB on a large node), so it is asked only at the first
// scan, where pci.ids changed, where its last answer gave no names, or
// where a function appeared whose vendor and device IDs its last answer did
// not name: its names are those of the IDs, so VFs enabled on a PF whose
// VFs it named take their names from that answer. It runs while the caller
// reads the netdevs, and wait merges its names. A function last read keeps
// what cannot change while its entry (name and inode) is the same, and
// only its driver link, which a rebind changes, is read again. Where ghw
// cannot run (no pci.ids) or drops functions (it gives up on the whole bus,
// without an error, when one function lacks a modalias), the IDs read from
// sysfs are published without names.
func (t tree) startPCI(last *pciScan) (*pciRead, error) {
	entries, err := readDirInodes(t.path(pciDevicesDir))
	if err != nil {
		return nil, err
	}
	scan := &pciScan{entries: entries, ids: pciIDsStampFor(), fns: make([]PCIFunction, len(entries))}
	r := &pciRead{scan: scan, changed: last == nil || scan.ids != last.ids || !slices.Equal(entries, last.entries)}
	// Names that cannot come from the last answer are asked for at once,
	// while the functions are read.
	fresh := last == nil || scan.ids != last.ids || last.named == nil
	ask := func() {
		r.names = make(chan ghwNames, 1)
		go func() { r.names <- t.ghwNames(len(entries)) }()
	}
	if r.changed && fresh && scan.ids.path != "" {
		ask()
	}
	if err := t.readPCIFunctions(scan, last); err != nil {
		return nil, err
	}
	switch {
	case !r.changed:
		scan.named = last.named
	case !fresh:
		scan.named = last.named
		for i := range scan.fns {
			n, ok := last.named[idOf(scan.fns[i])]
			if !ok {
				ask()
				break
			}
			scan.fns[i].VendorName, scan.fns[i].ProductName = n[0], n[1]
		}
	}
	return r, nil
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

// wait returns the enumeration, named by ghw where it was asked.
func (r *pciRead) wait(ctx context.Context) *pciScan {
	if r.names == nil && (!r.changed || r.scan.named != nil) {
		return r.scan
	}
	names := ghwNames{why: "no pci.ids"}
	if r.names != nil {
		names = <-r.names
	}
	if names.why != "" {
		klog.FromContext(ctx).V(4).Info("PCI functions without names", "reason", names.why)
	}
	r.scan.named = nil
	if names.why == "" {
		r.scan.named = map[pciID][2]string{}
	}
	for i := range r.scan.fns {
		f := &r.scan.fns[i]
		n := names.byAddr[f.Address]
		f.VendorName, f.ProductName = n[0], n[1]
		if r.scan.named != nil {
			r.scan.named[idOf(*f)] = n
		}
	}
	return r.scan
}

// ghwNames asks ghw for the functions' names; want is how many functions
// sysfs lists.
func (t tree) ghwNames(want int) ghwNames {
	info, err := ghw.PCI(ghw.WithChroot(t.root), ghw.WithDisableTools(), ghw.WithDisableTopology(), ghw.WithDisableWarnings())
	switch {
	case err != nil:
		return ghwNames{why: err.Error()}
	case len(info.Devices) != want:
		return ghwNames{why: fmt.Sprintf("ghw skipped functions: it gave %d of %d", len(info.Devices), want)}
	}
	out := ghwNames{byAddr: make(map[string][2]string, len(info.Devices))}
	for _, d := range info.Devices {
		var n [2]string
		if d.Vendor != nil {
			n[0] = knownName(d.Vendor.Name)
		}
		if d.Product != nil {
			n[1] = knownName(d.Product.Name)
		}
		out.byAddr[d.Address] = n
	}
	return out
}

func knownName(s string) string {
	if s == "unknown" {
		return ""
	}
	return s
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
