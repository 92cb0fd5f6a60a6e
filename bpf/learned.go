package bpf

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
)

// LearnedMAC is a MAC the classifier learned from a pod's frames on a
// parent (a pod whose class allows MAC changes): traffic towards it on that
// parent is shaped as the share's ingress.
type LearnedMAC struct {
	Parent int
	MAC    string
	// Share is the MAC naming the share it was learned for.
	Share string
}

// Learned lists the learned MACs.
func (s *Shaper) Learned() ([]LearnedMAC, error) {
	var out []LearnedMAC
	var k shaperLearnedOnParentKey
	var v shaperLearnedKey
	it := s.objs.LearnedOnParent.Iterate()
	for it.Next(&k, &v) {
		out = append(out, LearnedMAC{Parent: int(k.Ifindex), MAC: net.HardwareAddr(k.Mac[:]).String(), Share: net.HardwareAddr(v.Mac[:]).String()})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read learned MACs: %w", err)
	}
	return out, nil
}

// forgetLearned removes every MAC learned for the share named by mac, and
// its count against the cap.
func (s *Shaper) forgetLearned(mac net.HardwareAddr) error {
	learned, err := s.Learned()
	if err != nil {
		return err
	}
	for _, l := range learned {
		if l.Share != mac.String() {
			continue
		}
		hw, _ := net.ParseMAC(l.MAC)
		k := shaperLearnedOnParentKey{Ifindex: uint32(l.Parent)}
		copy(k.Mac[:], hw)
		if err := s.objs.LearnedOnParent.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget MAC %s learned for share %s: %w", l.MAC, mac, err)
		}
	}
	var owner shaperLearnedKey
	copy(owner.Mac[:], mac)
	if err := s.objs.LearnedCount.Delete(&owner); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget the learned count of share %s: %w", mac, err)
	}
	return nil
}

// SetLocalMAC records the MAC of a parent (ifindex): it is never learned
// for a pod, and it is the MAC an address-keyed share's frames carry.
func (s *Shaper) SetLocalMAC(parent int, mac net.HardwareAddr) error {
	if len(mac) != 6 || parent <= 0 {
		return fmt.Errorf("local MAC %q of ifindex %d", mac, parent)
	}
	var k shaperLearnedKey
	copy(k.Mac[:], mac)
	return s.objs.LocalMacs.Put(&k, uint32(parent))
}
