package bpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// SpoofReason is why the classifier dropped a pod's frame (SPOOF_* in
// shaper.c); its String is the reason's name in metrics and `carve shares`.
type SpoofReason uint8

// The reasons, as shaper.c numbers them.
const (
	SpoofSrcMAC SpoofReason = 1
	SpoofVLAN   SpoofReason = 2
	SpoofSrcIP  SpoofReason = 3
	SpoofARP    SpoofReason = 4
	SpoofND     SpoofReason = 5
	// SpoofEthertype: an ethertype but IPv4, ARP and IPv6.
	SpoofEthertype SpoofReason = 6
	// SpoofLinkLocal: towards an IEEE 802.1 link-local group
	// (01:80:c2:00:00:0x: STP, PAUSE, LACP, EAPOL, LLDP).
	SpoofLinkLocal SpoofReason = 7
	// SpoofRouter: an IPv6 router advertisement or redirect.
	SpoofRouter SpoofReason = 8
	// SpoofIPv6Headers: IPv6 extension headers past what the check walks.
	SpoofIPv6Headers SpoofReason = 9
)

// SpoofReasons lists every reason, in order.
var SpoofReasons = []SpoofReason{SpoofSrcMAC, SpoofVLAN, SpoofSrcIP, SpoofARP, SpoofND, SpoofEthertype, SpoofLinkLocal, SpoofRouter, SpoofIPv6Headers}

func (r SpoofReason) String() string {
	switch r {
	case SpoofSrcMAC:
		return "source-mac"
	case SpoofVLAN:
		return "vlan-tag"
	case SpoofSrcIP:
		return "source-ip"
	case SpoofARP:
		return "arp-sender"
	case SpoofND:
		return "nd-target"
	case SpoofEthertype:
		return "ethertype"
	case SpoofLinkLocal:
		return "link-local-destination"
	case SpoofRouter:
		return "router-message"
	case SpoofIPv6Headers:
		return "ipv6-headers"
	}
	return fmt.Sprintf("reason-%d", uint8(r))
}

// AllowAddr records addr as one the share named by mac may send from on
// parent in VLAN vlan (0 for none; checked for pod shares with CheckIPv4 or
// CheckIPv6). An address another share holds in the same parent and VLAN
// is refused with ErrAddrTaken.
func (s *Shaper) AllowAddr(parent, vlan int, addr netip.Addr, mac net.HardwareAddr) error {
	k, err := addrKey(parent, vlan, addr)
	if err != nil {
		return err
	}
	if len(mac) != 6 {
		return fmt.Errorf("MAC %q is not 6 bytes", mac)
	}
	var v shaperAddrOwner
	copy(v.Mac[:], mac)
	if err := s.objs.AllowedAddrs.Update(&k, &v, ebpf.UpdateNoExist); err == nil || !errors.Is(err, ebpf.ErrKeyExist) {
		return err
	}
	var old shaperAddrOwner
	if err := s.objs.AllowedAddrs.Lookup(&k, &old); err == nil && old.Mac != v.Mac {
		return fmt.Errorf("%w: %s of parent %d (VLAN %d) is share %s's", ErrAddrTaken, addr, parent, vlan, net.HardwareAddr(old.Mac[:]))
	}
	return nil
}

// AllowedAddrs lists every address recorded with AllowAddr.
func (s *Shaper) AllowedAddrs() ([]AddrShare, error) { return readAddrs(s.objs.AllowedAddrs) }

// SpoofDrops are a share's dropped frames by reason.
type SpoofDrops map[SpoofReason]uint64

// SpoofDrops returns the frames the classifier dropped, by share MAC and
// reason, summed over CPUs.
func (s *Shaper) SpoofDrops() (map[string]SpoofDrops, error) {
	return readSpoofDrops(s.objs.SpoofDrops)
}

func readSpoofDrops(m *ebpf.Map) (map[string]SpoofDrops, error) {
	out := map[string]SpoofDrops{}
	var k shaperDropKey
	var per []uint64
	it := m.Iterate()
	for it.Next(&k, &per) {
		var n uint64
		for _, c := range per {
			n += c
		}
		mac := net.HardwareAddr(k.Mac[:]).String()
		if out[mac] == nil {
			out[mac] = SpoofDrops{}
		}
		out[mac][SpoofReason(k.Reason)] += n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read spoof drops: %w", err)
	}
	return out, nil
}

// forgetSpoofDrops removes the drop counts of the share named by mac.
func (s *Shaper) forgetSpoofDrops(mac net.HardwareAddr) error {
	if len(mac) != 6 {
		return nil
	}
	for _, r := range SpoofReasons {
		k := shaperDropKey{Reason: uint8(r)}
		copy(k.Mac[:], mac)
		if err := s.objs.SpoofDrops.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget spoof drops of share %s: %w", mac, err)
		}
	}
	return nil
}
