package discovery

import (
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// NetFilter selects the netdevs discovery reports. PCI-backed netdevs are
// reported by default; virtual ones (veth, bridges, lo) only when asked for.
type NetFilter struct {
	// Include, when not empty, keeps only interfaces whose name matches one
	// of these globs.
	Include []string
	// Exclude drops interfaces whose name matches one of these globs.
	Exclude []string
	// IncludeVirtual reports netdevs that have no device behind them.
	IncludeVirtual bool
}

func (f NetFilter) keeps(name string, virtual bool) bool {
	if IsCarveLink(name) {
		return false
	}
	if virtual && !f.IncludeVirtual {
		return false
	}
	if matchAny(f.Exclude, name) {
		return false
	}
	return len(f.Include) == 0 || matchAny(f.Include, name)
}

// carveLinkPattern matches what carve's NIC preparer makes on the node: a
// share's interface before the hook moves it into its pod ("cv" and ten hex
// digits, see netdev.LinkName), a parent's ingress IFB ("cvifb" and the
// parent's ifindex), a parent's egress shaper, a veth pair ("cveg" and the
// parent's ifindex, its peer with an "r" after) and a parent's VLAN
// ("cv<ifindex>.<vlan>").
var carveLinkPattern = regexp.MustCompile(`^(cv[0-9a-f]{10}|cvifb[0-9]+|cveg[0-9]+r?|cv[0-9]+\.[0-9]+)$`)

// IsCarveLink reports whether a link is one carve made for a share. Such
// links are never published as NICs: a share cut from a share would escape
// its parent's shaping.
func IsCarveLink(name string) bool { return carveLinkPattern.MatchString(name) }

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// netDir lists the netdevs, as links into the device tree.
const netDir = "sys/class/net"

// netdevScan is what a Scanner keeps of the last read of sys/class/net:
// its entries (names and inodes) and what was read of each, in the same
// order.
type netdevScan struct {
	entries []dirEntry
	reads   []netdevRead
	// fresh counts the netdevs whose files this read read.
	fresh int
}

// netdevRead is one netdev as read: kept is false where the filter left it
// out; pciAddr is the PCI function it hangs off, "" for virtual ones.
// driverOfPCI says the netdev's device is that function itself, so its
// driver is the function's, as the PCI scan read it (see readNIC).
type netdevRead struct {
	kept        bool
	nic         NIC
	pciAddr     string
	driverOfPCI bool
}

// readNetdevs reads sys/class/net. A netdev of the last read whose entry
// is the same (name and inode) and that changes does not name is taken
// from it, with only its PF's sriov_numvfs read again (enabling VFs sends
// no event for the PF): netlink reports every change of a link's state,
// address, MTU and name, and re-creating one gives its entry a new inode.
func (t tree) readNetdevs(filter NetFilter, pci *pciScan, last *netdevScan, changes Changes) (*netdevScan, error) {
	entries, err := readDirInodes(t.path(netDir))
	if err != nil || len(entries) == 0 {
		return &netdevScan{}, err
	}
	dir, ok, err := t.openDir(netDir)
	if err != nil || !ok {
		return &netdevScan{}, err
	}
	defer dir.close()
	scan := &netdevScan{entries: entries, reads: make([]netdevRead, len(entries))}
	fresh := make([]bool, len(entries))
	err = forEach(len(entries), func(i int) (err error) {
		e := entries[i]
		if last != nil && !changes.rereads(e.name) {
			if j, ok := slices.BinarySearchFunc(last.entries, e.name, func(l dirEntry, n string) int { return strings.Compare(l.name, n) }); ok && last.entries[j] == e {
				scan.reads[i] = last.reads[j]
				return refreshVFCount(dir, &scan.reads[i].nic)
			}
		}
		fresh[i] = true
		scan.reads[i], err = readNetdevEntry(dir, e.name, filter, pci)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, f := range fresh {
		if f {
			scan.fresh++
		}
	}
	return scan, nil
}

// refreshVFCount reads a PF's sriov_numvfs again.
func refreshVFCount(dir dir, nic *NIC) error {
	if nic.SRIOV == nil {
		return nil
	}
	num, _, err := dir.optionalInt(nic.Name + "/device/sriov_numvfs")
	if err != nil {
		return fmt.Errorf("netdev %s: %w", nic.Name, err)
	}
	// A new SRIOV: the last read's is shared with the inventory it gave.
	nic.SRIOV = &SRIOV{TotalVFs: nic.SRIOV.TotalVFs, NumVFs: int(num)}
	return nil
}

// nics are the netdevs kept, in name order, each with its PCI function
// from pci.
func (s *netdevScan) nics(pci *pciScan, fns []PCIFunction) []NIC {
	out := make([]NIC, 0, len(s.reads))
	for _, r := range s.reads {
		if !r.kept {
			continue
		}
		nic := r.nic
		if r.pciAddr != "" {
			if i, ok := pci.lookup(r.pciAddr); ok {
				nic.PCI = &fns[i]
				if r.driverOfPCI {
					nic.Driver = fns[i].Driver
				}
			} else {
				nic.PCI = &PCIFunction{Address: r.pciAddr, NUMANode: -1}
			}
		}
		out = append(out, nic)
	}
	return out
}

// readNetdevEntry reads the netdev name of sys/class/net; kept is false where
// the filter leaves it out or it is gone.
func readNetdevEntry(netDir dir, name string, filter NetFilter, pci *pciScan) (netdevRead, error) {
	// The kernel places netdevs with no device behind them (veth,
	// bridges, lo) under devices/virtual. The link's text is enough to
	// tell, and to find the PCI function, even where the target is gone
	// (a snapshot, a device being removed).
	target, _, err := netDir.optionalLink(name)
	if err != nil {
		return netdevRead{}, err
	}
	hasDevice := !strings.Contains(target, "devices/virtual/")
	if !filter.keeps(name, !hasDevice) {
		return netdevRead{}, nil
	}
	r := netdevRead{}
	if hasDevice {
		r.pciAddr = lastPCIAddress(target)
	}
	// A netdev sits in its device's directory (<device>/net/<name>), and
	// its device link points there. Where that device is a PCI function
	// the scan read, its driver link is the one the scan read: one
	// readlink less for each of a large node's thousands of VFs.
	var fn *PCIFunction
	if r.pciAddr != "" && parentDevice(target) == r.pciAddr {
		if i, ok := pci.lookup(r.pciAddr); ok {
			fn, r.driverOfPCI = &pci.fns[i], true
		}
	}
	nic, ok, err := readNIC(netDir, name, fn)
	if err != nil || !ok {
		return netdevRead{}, err
	}
	nic.Virtual = !hasDevice
	r.kept, r.nic = true, nic
	return r, nil
}

// parentDevice is the directory a netdev's sysfs path sits in, its
// device's: "../../devices/pci0000:80/0000:80:00.1/net/ens0f0v0" gives
// "0000:80:00.1". "" where the path has another form.
func parentDevice(target string) string {
	rest, _, ok := cutLast(target) // the netdev's name
	if !ok {
		return ""
	}
	rest, net, ok := cutLast(rest)
	if !ok || net != "net" {
		return ""
	}
	_, device, _ := cutLast(rest)
	return device
}

// cutLast splits a slash-separated path at its last slash.
func cutLast(p string) (before, after string, found bool) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p, false
	}
	return p[:i], p[i+1:], true
}

// readNIC reads one netdev's attributes, relative to its directory. Where
// fn is the netdev's device, its driver is fn's and is not read again.
func readNIC(netDir dir, name string, fn *PCIFunction) (NIC, bool, error) {
	d, ok, err := netDir.openDir(name)
	if err != nil || !ok {
		return NIC{}, false, err
	}
	defer d.close()
	nic := NIC{Name: name}
	get := func(file string) string {
		if err != nil {
			return ""
		}
		var s string
		s, _, err = d.optionalString(file)
		return s
	}
	getInt := func(file string) (int64, bool) {
		if err != nil {
			return 0, false
		}
		var v int64
		var ok bool
		v, ok, err = d.optionalInt(file)
		return v, ok
	}
	nic.MAC = get("address")
	nic.OperState = get("operstate")
	if v, ok := getInt("mtu"); ok {
		nic.MTU = int(v)
	}
	if v, ok := getInt("carrier"); ok {
		nic.Carrier = v == 1
	}
	// The kernel reports -1 (or refuses the read) when it does not know
	// the speed, as for virtio; that is "unknown", not an error.
	if v, ok := getInt("speed"); ok && v > 0 {
		nic.SpeedMbps = v
	}
	if v, ok := getInt("dev_port"); ok {
		nic.DevPort = int(v)
	}
	nic.PhysFn = d.linkBase("device/physfn")
	// A VF has no VFs of its own: only a PF's files are read.
	if nic.PhysFn == "" {
		if total, ok := getInt("device/sriov_totalvfs"); ok && total > 0 {
			num, _ := getInt("device/sriov_numvfs")
			nic.SRIOV = &SRIOV{TotalVFs: int(total), NumVFs: int(num)}
		}
	}
	if err != nil {
		return NIC{}, false, fmt.Errorf("netdev %s: %w", name, err)
	}
	if fn != nil {
		nic.Driver = fn.Driver
	} else {
		nic.Driver = d.linkBase("device/driver")
	}
	return nic, true, nil
}

// lastPCIAddress returns the deepest PCI address in a sysfs device path: for
// ".../pci0000:00/0000:00:03.0/virtio2/net/eth0" it is "0000:00:03.0".
func lastPCIAddress(p string) string {
	parts := strings.Split(filepath.ToSlash(p), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if pciAddressPattern.MatchString(parts[i]) {
			return parts[i]
		}
	}
	return ""
}
