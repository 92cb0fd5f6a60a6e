package bpf

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// AttachEgressShaper makes a veth pair the egress shaper of parent (ifindexes
// in the caller's netns, as Attach): from the next frame on, classify_egress
// on parent sends each frame of a limited share to shaper's egress, whose
// HTB holds the share classes, and return_shaped on the ingress of its peer
// back sends it out of parent again, past classify_egress. shaperMAC is
// shaper's own address: what the node sends from it is dropped at back,
// never sent out of parent. Idempotent; the program on back outlives this
// process, like Attach's.
func (s *Shaper) AttachEgressShaper(parent, shaper, back int, shaperMAC net.HardwareAddr) error {
	if parent <= 0 || shaper <= 0 || back <= 0 {
		return fmt.Errorf("bad ifindex: parent %d, shaper %d, return %d", parent, shaper, back)
	}
	if len(shaperMAC) != 6 {
		return fmt.Errorf("shaper MAC %q is not 6 bytes", shaperMAC)
	}
	ret := shaperShaperReturn{ParentIfindex: uint32(parent)}
	copy(ret.ShaperMac[:], shaperMAC)
	if err := s.objs.ShaperReturns.Put(uint32(back), &ret); err != nil {
		return fmt.Errorf("record the return of ifindex %d's egress shaper: %w", parent, err)
	}
	// The way back first: frames sent to the shaper before it was in
	// place would be dropped at its peer. A cls_bpf filter where the
	// kernel has clsact and cls_bpf: attaching through TCX waits for an
	// RCU grace period (7–15 ms here), paid on the first limited share of
	// every parent, and no program but this one ever runs on the device,
	// so TCX's ordering buys nothing there.
	if err := attachLegacy(back, s.objs.ReturnShaped, shaperProgReturnShaped, netlink.HANDLE_MIN_INGRESS); err != nil {
		if terr := s.attachAt(back, s.objs.ReturnShaped, shaperProgReturnShaped, ebpf.AttachTCXIngress); terr != nil {
			return errors.Join(err, terr)
		}
	}
	sh := shaperEgressShaper{ShaperIfindex: uint32(shaper), ReturnIfindex: uint32(back)}
	if err := s.objs.EgressShapers.Put(uint32(parent), &sh); err != nil {
		return fmt.Errorf("record the egress shaper of ifindex %d: %w", parent, err)
	}
	return nil
}

// DetachEgressShaper undoes AttachEgressShaper: parent's limited shares are
// no longer sent to a shaper, and back's program goes. Detaching what is not
// attached, or from a device that is gone, is not an error.
func (s *Shaper) DetachEgressShaper(parent, back int) error {
	if err := s.objs.EgressShapers.Delete(uint32(parent)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget the egress shaper of ifindex %d: %w", parent, err)
	}
	if err := detachLegacy(back, netlink.HANDLE_MIN_INGRESS); err != nil {
		return err
	}
	if err := s.detachTCX(back, shaperProgReturnShaped); err != nil {
		return err
	}
	if err := s.objs.ShaperReturns.Delete(uint32(back)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget the return of ifindex %d's egress shaper: %w", parent, err)
	}
	return nil
}

// EgressShaperLinks are the two ends of a parent's egress shaper, by
// ifindex: Shaper holds the share classes, frames come back from Return.
type EgressShaperLinks struct {
	Shaper, Return int
}

// EgressShapers returns the egress shaper classify_egress sends each
// parent's limited shares to, by the parent's ifindex.
func (s *Shaper) EgressShapers() (map[int]EgressShaperLinks, error) {
	return readEgressShapers(s.objs.EgressShapers)
}

func readEgressShapers(m *ebpf.Map) (map[int]EgressShaperLinks, error) {
	out := make(map[int]EgressShaperLinks)
	if m == nil {
		return out, nil
	}
	var k uint32
	var v shaperEgressShaper
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[int(k)] = EgressShaperLinks{Shaper: int(v.ShaperIfindex), Return: int(v.ReturnIfindex)}
	}
	return out, it.Err()
}
