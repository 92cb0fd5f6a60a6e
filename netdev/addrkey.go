package netdev

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
)

// An ipvlan child has no MAC of its own: it sends and receives with its
// parent's. A bandwidth share of one is told apart by its addresses instead
// (the classifier's share_addrs): egress by source address, ingress by
// destination address, each mapped to the MAC that still names the share's
// classifier entries and counters. The pod's network namespace, recorded by
// the hook, names its egress share first, as for macvlan.

// keysByAddress reports whether a share made with cfg is told apart by
// address: ipvlan children, and every share where a test asked for it.
func (p *NICPreparer) keysByAddress(cfg v1alpha1.NetworkConfig) bool {
	return hook.ChildKind(net1Mode(cfg)) == "ipvlan" || p.addressKeys
}

// checkAddressable refuses, before anything is made, a share to be told
// apart by address that would have none.
func checkAddressable(cfg v1alpha1.NetworkConfig) error {
	if len(cfg.Addresses)+len(cfg.Pools) > 0 {
		return nil
	}
	return errors.New("a bandwidth share of an ipvlan interface needs an address (addresses or pools): " +
		"ipvlan children carry their parent's MAC, so carve tells their traffic apart by address")
}

// keyByAddress records the share's addresses for its parent in the
// classifier, in its VLAN (u.VLAN), then makes its class entries reachable
// through them (and its pod's netns) alone. An address another share of
// the parent holds in the same VLAN is refused: their traffic could not be
// told apart.
func (p *NICPreparer) keyByAddress(parent netlink.Link, mac net.HardwareAddr, u *undoRecord) error {
	u.AddressKeyed = true // before any entry: undo then looks for them
	for _, s := range u.Addresses {
		addr, err := addressOf(s)
		if err != nil {
			return err
		}
		if err := p.opts.Shaper.SetShareAddr(parent.Attrs().Index, u.VLAN, addr, mac); err != nil {
			return fmt.Errorf("classifier entry for address %s: %w", s, err)
		}
	}
	for _, c := range []struct {
		dir   bpf.Direction
		minor uint16
	}{{bpf.Egress, u.EgressMinor}, {bpf.Ingress, u.IngressMinor}} {
		if c.minor == 0 {
			continue // no class (none asked, or EDT pacing by share_rates)
		}
		if err := p.opts.Shaper.SetShareByAddress(c.dir, mac, uint32(netlink.MakeHandle(1, c.minor))); err != nil {
			return fmt.Errorf("%s classifier entry: %w", c.dir, err)
		}
	}
	return nil
}

// forgetAddresses removes the classifier's address entries of the share
// named by mac, found by the MAC alone (so also after a crash, when there
// is no record). Where the record says the share was never keyed by
// address (keyed false) there is nothing to look for.
func (p *NICPreparer) forgetAddresses(mac net.HardwareAddr, keyed bool) error {
	if p.opts.Shaper == nil || !keyed {
		return nil
	}
	return p.opts.Shaper.DeleteShareAddrs(mac)
}

// addressOf parses a share's address, with or without its prefix length.
func addressOf(s string) (netip.Addr, error) {
	if pfx, err := netip.ParsePrefix(s); err == nil {
		return pfx.Addr(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("address %q: %w", s, err)
	}
	return a, nil
}
