package bpf

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/cilium/ebpf"
)

// maxEthertypes is how many ethertypes besides IPv4, ARP and IPv6 a share
// may be allowed (v1alpha1's limit on a class's ethertypes).
const maxEthertypes = 8

// AllowEthertypes lets the share named by mac on parent send frames of
// types (host order), besides IPv4, ARP and IPv6, which every share may:
// its class's ethertypes. The share's earlier entries not in types are
// removed, so that a class's list changed since is not left wider.
// 802.1Q and 802.1ad tags are refused: a share's VLAN is set by the agent.
func (s *Shaper) AllowEthertypes(parent int, mac net.HardwareAddr, types []uint16) error {
	if len(mac) != 6 {
		return fmt.Errorf("MAC %q is not 6 bytes", mac)
	}
	if len(types) > maxEthertypes {
		return fmt.Errorf("%d ethertypes for share %s, at most %d", len(types), mac, maxEthertypes)
	}
	for _, t := range types {
		if t < 0x0600 || t == 0x8100 || t == 0x88a8 {
			return fmt.Errorf("ethertype %#04x for share %s: not one a share may be allowed (a length, or a VLAN tag)", t, mac)
		}
	}
	have, err := s.ethertypesOf(mac)
	if err != nil {
		return err
	}
	var v uint8 = 1
	for _, t := range types {
		k := ethertypeKey(parent, mac, t)
		if err := s.objs.ShareEthertypes.Put(&k, &v); err != nil {
			return fmt.Errorf("allow ethertype %#04x for share %s: %w", t, mac, err)
		}
	}
	for _, k := range have {
		if int(k.Parent) == parent && slices.Contains(types, ntohs(k.Proto)) {
			continue
		}
		if err := s.objs.ShareEthertypes.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget ethertype %#04x of share %s: %w", ntohs(k.Proto), mac, err)
		}
	}
	return nil
}

// Ethertypes lists the ethertypes (host order) the share named by mac is
// allowed besides IPv4, ARP and IPv6, on whatever parent.
func (s *Shaper) Ethertypes(mac net.HardwareAddr) ([]uint16, error) {
	keys, err := s.ethertypesOf(mac)
	var out []uint16
	for _, k := range keys {
		out = append(out, ntohs(k.Proto))
	}
	slices.Sort(out)
	return out, err
}

// deleteEthertypes removes every ethertype entry of the share named by mac.
func (s *Shaper) deleteEthertypes(mac net.HardwareAddr) error {
	keys, err := s.ethertypesOf(mac)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.objs.ShareEthertypes.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget ethertype %#04x of share %s: %w", ntohs(k.Proto), mac, err)
		}
	}
	return nil
}

func (s *Shaper) ethertypesOf(mac net.HardwareAddr) ([]shaperEthertypeKey, error) {
	var out []shaperEthertypeKey
	var k shaperEthertypeKey
	var v uint8
	it := s.objs.ShareEthertypes.Iterate()
	for it.Next(&k, &v) {
		if net.HardwareAddr(k.Mac[:]).String() == mac.String() {
			out = append(out, k)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read share ethertypes: %w", err)
	}
	return out, nil
}

func ethertypeKey(parent int, mac net.HardwareAddr, t uint16) shaperEthertypeKey {
	k := shaperEthertypeKey{Parent: uint32(parent), Proto: htons(t)}
	copy(k.Mac[:], mac)
	return k
}

// htons and ntohs convert a 16-bit value as the frame holds it, which the
// key's field (native order, little-endian here) stores byte for byte.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
func ntohs(v uint16) uint16 { return v<<8 | v>>8 }
