package bpf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// shareByAddr is SHARE_BY_ADDR in shaper.c: the share's entry in `shares`
// is reached through its addresses (share_addrs) or its pod's netns, never
// by a frame's MAC.
const shareByAddr = 1

// AddrShare is one address of a share that is told apart by address (an
// ipvlan child, which sends and receives with its parent's MAC).
type AddrShare struct {
	// Parent is the ifindex of the parent the address is the share's on,
	// and VLAN the share's VLAN there (0 for none): one address may be
	// two shares' in two VLANs of one parent.
	Parent int
	VLAN   int
	Addr   netip.Addr
	// MAC names the share: its entries in the share map and its counters.
	MAC string
}

// ErrAddrTaken is returned when an address already belongs to another share
// of the same parent and VLAN: the classifier could not tell their traffic
// apart.
var ErrAddrTaken = errors.New("the address belongs to another share of this parent")

func addrKey(parent, vlan int, a netip.Addr) (shaperAddrKey, error) {
	var k shaperAddrKey
	if parent <= 0 {
		return k, fmt.Errorf("bad parent ifindex %d", parent)
	}
	if vlan < 0 || vlan > 4094 {
		return k, fmt.Errorf("bad VLAN %d", vlan)
	}
	k.Ifindex, k.Vlan = uint32(parent), uint16(vlan)
	switch a = a.Unmap(); {
	case a.Is4():
		k.Family = 4
		b := a.As4()
		copy(k.Addr[:], b[:])
	case a.Is6():
		k.Family = 6
		b := a.As16()
		copy(k.Addr[:], b[:])
	default:
		return k, fmt.Errorf("address %v is neither IPv4 nor IPv6", a)
	}
	return k, nil
}

func (k shaperAddrKey) addr() netip.Addr {
	if k.Family == 4 {
		return netip.AddrFrom4([4]byte(k.Addr[:4]))
	}
	return netip.AddrFrom16(k.Addr)
}

// SetShareAddr records addr as the share's on parent (its ifindex) in VLAN
// vlan (0 for none): frames leaving parent from addr in that VLAN, and
// frames arriving on parent for it, are the share's, once its entries are
// set with SetShareByAddress. Recording it again for the same share is a
// no-op; an address of another share of the parent and VLAN is refused
// with ErrAddrTaken, and left to that share.
func (s *Shaper) SetShareAddr(parent, vlan int, addr netip.Addr, mac net.HardwareAddr) error {
	k, err := addrKey(parent, vlan, addr)
	if err != nil {
		return err
	}
	if len(mac) != 6 {
		return fmt.Errorf("MAC %q is not 6 bytes", mac)
	}
	// The classifier looks addresses up only once this is set; set
	// before the entry, so that the entry is never there unseen.
	if err := s.objs.AddrsUsed.Put(uint32(0), uint32(1)); err != nil {
		return fmt.Errorf("turn on address lookups: %w", err)
	}
	var v shaperAddrOwner
	copy(v.Mac[:], mac)
	// NOEXIST, then who holds it: never overwrite another share's. A
	// holder that left in between is retried once.
	for range 2 {
		err := s.objs.ShareAddrs.Update(&k, &v, ebpf.UpdateNoExist)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("record address %s of share %s: %w", addr, mac, err)
		}
		var old shaperAddrOwner
		if err := s.objs.ShareAddrs.Lookup(&k, &old); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		} else if err != nil {
			return fmt.Errorf("look up address %s: %w", addr, err)
		}
		if old.Mac != v.Mac {
			return fmt.Errorf("%w: %s is share %s's, not %s's", ErrAddrTaken, addr, net.HardwareAddr(old.Mac[:]), mac)
		}
		return nil
	}
	return fmt.Errorf("record address %s of share %s: it keeps changing hands", addr, mac)
}

// SetShareByAddress is SetShare for a share that is told apart by address:
// its frames reach class classid through its addresses (SetShareAddr) or
// its pod's netns, and a frame's MAC never names it. mac only names the
// share (its entries and counters); with ipvlan no interface carries it.
func (s *Shaper) SetShareByAddress(dir Direction, mac net.HardwareAddr, classid uint32) error {
	return s.putShare(dir, mac, classid, shareByAddr)
}

// AddressKeyed lists the share entries set with SetShareByAddress.
func (s *Shaper) AddressKeyed() (map[Key]bool, error) {
	out := make(map[Key]bool)
	var k shaperShareKey
	var v shaperShareVal
	it := s.objs.Shares.Iterate()
	for it.Next(&k, &v) {
		if v.Flags&shareByAddr != 0 {
			out[k.key()] = true
		}
	}
	return out, it.Err()
}

// ShareAddrs lists every recorded share address.
func (s *Shaper) ShareAddrs() ([]AddrShare, error) { return readAddrs(s.objs.ShareAddrs) }

func readAddrs(m *ebpf.Map) ([]AddrShare, error) {
	var out []AddrShare
	var k shaperAddrKey
	var v shaperAddrOwner
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, AddrShare{Parent: int(k.Ifindex), VLAN: int(k.Vlan), Addr: k.addr(), MAC: net.HardwareAddr(v.Mac[:]).String()})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read share addresses: %w", err)
	}
	return out, nil
}

// DeleteShareAddrs removes every address recorded for the share named by
// mac, on whatever parent: unprepare needs nothing but the share's MAC,
// even after a crash. Deleting none is not an error.
func (s *Shaper) DeleteShareAddrs(mac net.HardwareAddr) error {
	return deleteAddrsOf(s.objs.ShareAddrs, mac)
}

// deleteAddrsOf removes the entries of an address map owned by mac.
func deleteAddrsOf(m *ebpf.Map, mac net.HardwareAddr) error {
	all, err := readAddrs(m)
	if err != nil {
		return err
	}
	for _, a := range all {
		if a.MAC != mac.String() {
			continue
		}
		k, _ := addrKey(a.Parent, a.VLAN, a.Addr)
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete address %s of share %s: %w", a.Addr, mac, err)
		}
	}
	return nil
}

// CopyAddrsToVLAN copies the address entries of the share named by mac
// that carry no VLAN (both maps: its classifier addresses and its allowed
// sources) into VLAN vlan, and reports how many it copied. Agents before
// addresses were kept by VLAN recorded a VLAN share's addresses with none;
// the agent copies them at its start (netdev's Restore). The untagged
// entries stay while the share lives: programs an older agent loaded look
// there (a running pod's guard, a parent's classifier until the next
// prepare replaces it), as does an older agent after a rollback. Both go
// at unprepare (DeletePodShares, DeleteShareAddrs: by MAC). An entry the
// VLAN already holds for another share is left, and reported in the error.
func (s *Shaper) CopyAddrsToVLAN(mac net.HardwareAddr, vlan int) (int, error) {
	if vlan <= 0 || vlan > 4094 {
		return 0, fmt.Errorf("bad VLAN %d", vlan)
	}
	copied := 0
	var errs []error
	for _, m := range []*ebpf.Map{s.objs.ShareAddrs, s.objs.AllowedAddrs} {
		all, err := readAddrs(m)
		if err != nil {
			return copied, err
		}
		for _, a := range all {
			if a.MAC != mac.String() || a.VLAN != 0 {
				continue
			}
			k, _ := addrKey(a.Parent, vlan, a.Addr)
			var v shaperAddrOwner
			copy(v.Mac[:], mac)
			err := m.Update(&k, &v, ebpf.UpdateNoExist)
			if err == nil {
				copied++
				continue
			}
			if !errors.Is(err, ebpf.ErrKeyExist) {
				errs = append(errs, fmt.Errorf("address %s of share %s into VLAN %d: %w", a.Addr, mac, vlan, err))
				continue
			}
			var owner shaperAddrOwner
			if err := m.Lookup(&k, &owner); err == nil && owner.Mac != v.Mac {
				errs = append(errs, fmt.Errorf("%w: %s in VLAN %d is share %s's", ErrAddrTaken, a.Addr, vlan, net.HardwareAddr(owner.Mac[:])))
			}
		}
	}
	return copied, errors.Join(errs...)
}
