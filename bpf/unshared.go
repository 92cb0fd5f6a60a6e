package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// SetUnsharedClass gives the traffic of no limited share on parent, in
// direction dir, the HTB class classid on the parent's egress shaper or its
// IFB (shaper.c's unshared_class): the classifier then sends the node's own
// frames and unlimited shares' through it, so that the borrowing shares'
// floors hold against them. The parent's shaper or IFB must be attached
// first.
func (s *Shaper) SetUnsharedClass(parent int, dir Direction, classid uint32) error {
	if parent <= 0 || classid == 0 {
		return fmt.Errorf("bad unshared class %#x of ifindex %d", classid, parent)
	}
	// Looked up only once this is set; set first, so the entry is never
	// there unseen.
	if err := s.objs.UnsharedUsed.Put(uint32(0), uint32(1)); err != nil {
		return fmt.Errorf("turn on unshared classes: %w", err)
	}
	if err := s.objs.UnsharedClass.Put(unsharedKey(parent, dir), classid); err != nil {
		return fmt.Errorf("record the %s unshared class of ifindex %d: %w", dir, parent, err)
	}
	return nil
}

// ForgetUnsharedClass stops sending parent's unshared traffic in direction
// dir to its shaper or IFB; none recorded is not an error.
func (s *Shaper) ForgetUnsharedClass(parent int, dir Direction) error {
	if err := s.objs.UnsharedClass.Delete(unsharedKey(parent, dir)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget the %s unshared class of ifindex %d: %w", dir, parent, err)
	}
	return nil
}

// UnsharedClass is parent's unshared class in direction dir, 0 where it
// has none.
func (s *Shaper) UnsharedClass(parent int, dir Direction) (uint32, error) {
	var c uint32
	err := s.objs.UnsharedClass.Lookup(unsharedKey(parent, dir), &c)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, nil
	}
	return c, err
}

func unsharedKey(parent int, dir Direction) uint32 { return uint32(parent)*2 + uint32(dir) }
