package netdev

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
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
	return hook.AddChild(p.h, lower, net1Mode(cfg), name, mac, mtu)
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

// deleteLinkGroup deletes every interface of group in the calling thread's
// network namespace with one RTM_DELLINK (`ip link del group N`): the kernel
// unregisters them together, waiting for one RCU grace period, not one each.
// The netlink library deletes only by index, so the request is built here
// with its nl package.
func deleteLinkGroup(group uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
