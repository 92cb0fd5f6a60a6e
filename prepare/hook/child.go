package hook

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// TimeoutSeconds bounds the netns-attach hook (the CDI spec gives the
// runtime this timeout): the runtime kills it after this long, and the
// hook gives up by itself a little before. Its work is a dozen requests
// that each take the kernel's RTNL, which a burst of pods shares with
// every sandbox's CNI and every share's classes: with 250 share pods
// created at once and a bound of 15 s (13 s its own), containerd logged
// 101 hook errors, each of a hook still waiting there, and their
// containers started again after the kubelet's back-off, doing the work
// twice. A minute turns those failures into waits; a hook stuck for good
// still fails its container, well within the kubelet's runtime request
// timeout (2 minutes).
const TimeoutSeconds = 60

// AliasOf is the alias (IFLA_IFALIAS) carve gives a share's interface. It
// travels with the interface into the pod, where the hook checks it: an
// interface of the pod's that only has the right name (the CNI's eth0) is
// never taken for the share's.
func AliasOf(hostName string) string { return "carve:" + hostName }

// ChildKind is the link type of a mode from net1Mode.
func ChildKind(mode string) string {
	if len(mode) >= 6 && mode[:6] == "ipvlan" {
		return "ipvlan"
	}
	return "macvlan"
}

// NewChild is the share's macvlan or ipvlan interface on lower, as a link
// to add: named, MAC'd (macvlan) and in its mode.
func NewChild(lower netlink.Link, mode, name string, mac net.HardwareAddr, mtu int) (netlink.Link, error) {
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex, la.MTU = name, lower.Attrs().Index, mtu
	// ipvlan in vepa: like macvlan's default, a share's frames to
	// another child of the parent leave through the parent (and its
	// shaper) instead of being handed across inside the kernel. ipvlan
	// keeps one mode and one set of flags per parent, set by the child
	// made last, so every ipvlan child carve makes is vepa.
	const vepa = netlink.IPVLAN_FLAG_VEPA
	switch mode {
	case "ipvlan-l2":
		return &netlink.IPVlan{LinkAttrs: la, Mode: netlink.IPVLAN_MODE_L2, Flag: vepa}, nil
	case "ipvlan-l3":
		return &netlink.IPVlan{LinkAttrs: la, Mode: netlink.IPVLAN_MODE_L3, Flag: vepa}, nil
	case "ipvlan-l3s":
		return &netlink.IPVlan{LinkAttrs: la, Mode: netlink.IPVLAN_MODE_L3S, Flag: vepa}, nil
	}
	la.HardwareAddr = mac
	switch mode {
	case "macvlan-bridge":
		return &netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE}, nil
	case "macvlan-private":
		return &netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_PRIVATE}, nil
	case "macvlan-vepa":
		return &netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_VEPA}, nil
	}
	return nil, fmt.Errorf("interface mode %q is not one carve makes", mode)
}

// AddChild creates the child on lower in h's namespace, down, with carve's
// alias.
func AddChild(h *netlink.Handle, lower netlink.Link, mode, name string, mac net.HardwareAddr, mtu int) error {
	link, err := NewChild(lower, mode, name, mac, mtu)
	if err != nil {
		return err
	}
	if err := h.LinkAdd(link); err != nil {
		return fmt.Errorf("create %s %s on %s: %w", ChildKind(mode), name, lower.Attrs().Name, err)
	}
	if err := h.LinkSetAlias(link, AliasOf(name)); err != nil {
		_ = h.LinkDel(link)
		return fmt.Errorf("mark %s as carve's: %w", name, err)
	}
	return nil
}
