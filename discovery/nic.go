package discovery

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
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
// parent's ifindex) and a parent's VLAN ("cv<ifindex>.<vlan>").
var carveLinkPattern = regexp.MustCompile(`^(cv[0-9a-f]{10}|cvifb[0-9]+|cv[0-9]+\.[0-9]+)$`)

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

// listNICs reads sys/class/net. pci maps addresses to PCI functions.
func (t tree) listNICs(filter NetFilter, pci map[string]PCIFunction) ([]NIC, error) {
	const rel = "sys/class/net"
	entries, err := os.ReadDir(t.path(rel))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", t.path(rel), err)
	}
	netDir, ok, err := t.openDir(rel)
	if err != nil || !ok {
		return nil, err
	}
	defer netDir.close()
	nics := make([]NIC, len(entries))
	kept := make([]bool, len(entries))
	err = forEach(len(entries), func(i int) (err error) {
		nics[i], kept[i], err = readNICEntry(netDir, entries[i].Name(), filter, pci)
		return err
	})
	if err != nil {
		return nil, err
	}
	n := 0
	for i := range nics {
		if kept[i] {
			nics[n] = nics[i]
			n++
		}
	}
	nics = nics[:n]
	sort.Slice(nics, func(i, j int) bool { return nics[i].Name < nics[j].Name })
	return nics, nil
}

// readNICEntry reads the netdev name of sys/class/net; ok is false where the
// filter leaves it out or it is gone.
func readNICEntry(netDir dir, name string, filter NetFilter, pci map[string]PCIFunction) (nic NIC, ok bool, err error) {
	// The kernel places netdevs with no device behind them (veth,
	// bridges, lo) under devices/virtual. The link's text is enough to
	// tell, and to find the PCI function, even where the target is gone
	// (a snapshot, a device being removed).
	target, _, err := netDir.optionalLink(name)
	if err != nil {
		return NIC{}, false, err
	}
	hasDevice := !strings.Contains(target, "devices/virtual/")
	if !filter.keeps(name, !hasDevice) {
		return NIC{}, false, nil
	}
	if nic, ok, err = readNIC(netDir, name); err != nil || !ok {
		return NIC{}, false, err
	}
	nic.Virtual = !hasDevice
	if hasDevice {
		if addr := lastPCIAddress(target); addr != "" {
			if fn, ok := pci[addr]; ok {
				nic.PCI = &fn
			} else {
				nic.PCI = &PCIFunction{Address: addr, NUMANode: -1}
			}
		}
	}
	return nic, true, nil
}

// readNIC reads one netdev's attributes, relative to its directory.
func readNIC(netDir dir, name string) (NIC, bool, error) {
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
	nic.Driver = d.linkBase("device/driver")
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
