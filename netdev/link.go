package netdev

import (
	"cmp"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// ensureChild creates the share's macvlan or ipvlan interface on lower,
// down, unless it is there already.
func (p *NICPreparer) ensureChild(lower netlink.Link, cfg v1alpha1.NetworkConfig, name string, mac net.HardwareAddr, mtu int) error {
	if existing, err := p.h.LinkByName(name); err == nil {
		if existing.Attrs().ParentIndex != lower.Attrs().Index {
			return fmt.Errorf("interface %s exists on another parent", name)
		}
		return nil
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex, la.MTU = name, lower.Attrs().Index, mtu
	var link netlink.Link
	switch cfg.Mode {
	case "ipvlan":
		mode := map[string]netlink.IPVlanMode{"": netlink.IPVLAN_MODE_L2, "l2": netlink.IPVLAN_MODE_L2, "l3": netlink.IPVLAN_MODE_L3, "l3s": netlink.IPVLAN_MODE_L3S}[cfg.IPVlanMode]
		link = &netlink.IPVlan{LinkAttrs: la, Mode: mode}
	default:
		la.HardwareAddr = mac
		// vepa by default: every frame a share sends leaves through
		// the parent, whose shaper it cannot bypass (bridge mode hands
		// frames between children straight across; see prepare).
		mode := map[string]netlink.MacvlanMode{"": netlink.MACVLAN_MODE_VEPA, "bridge": netlink.MACVLAN_MODE_BRIDGE,
			"private": netlink.MACVLAN_MODE_PRIVATE, "vepa": netlink.MACVLAN_MODE_VEPA, "passthru": netlink.MACVLAN_MODE_PASSTHRU}[cfg.MacvlanMode]
		link = &netlink.Macvlan{LinkAttrs: la, Mode: mode}
	}
	if err := p.h.LinkAdd(link); err != nil {
		return fmt.Errorf("create %s %s on %s: %w", cmp.Or(cfg.Mode, "macvlan"), name, lower.Attrs().Name, err)
	}
	return nil
}

// ensureVLAN returns the parent's VLAN interface, creating it if needed.
func (p *NICPreparer) ensureVLAN(parent netlink.Link, id int) (netlink.Link, error) {
	name := fmt.Sprintf("cv%d.%d", parent.Attrs().Index, id)
	if l, err := p.h.LinkByName(name); err == nil {
		return l, nil
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = name, parent.Attrs().Index
	if err := p.h.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: id}); err != nil {
		return nil, fmt.Errorf("create VLAN %d on %s: %w", id, parent.Attrs().Name, err)
	}
	l, err := p.h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	return l, p.h.LinkSetUp(l)
}
