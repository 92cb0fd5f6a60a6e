package netdev

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

// egressShaperName is the veth end whose egress HTB holds the egress shares
// of the parent with ifindex parentIndex; egressReturnName is its peer,
// from which their frames go back out of the parent. Both fit IFNAMSIZ for
// any ifindex.
func egressShaperName(parentIndex int) string { return "cveg" + strconv.Itoa(parentIndex) }

func egressReturnName(parentIndex int) string { return egressShaperName(parentIndex) + "r" }

// EgressShaperName is the device that carries the egress share classes of
// the parent with ifindex parentIndex; EgressReturnName is its peer, whose
// ingress sends their frames back out of the parent.
func EgressShaperName(parentIndex int) string { return egressShaperName(parentIndex) }

// EgressReturnName is the egress shaper's peer: see EgressShaperName.
func EgressReturnName(parentIndex int) string { return egressReturnName(parentIndex) }

// egressShaperMTU is the shaper pair's MTU: the largest a veth takes, so
// that no frame of the parent's (whatever its MTU, now or later) is
// dropped on its way through.
const egressShaperMTU = 65535

// in6AddrGenModeNone is IN6_ADDR_GEN_MODE_NONE (linux/if_link.h): no IPv6
// link-local address when the link goes up.
const in6AddrGenModeNone = 1

// ensureEgressShaper makes parent's egress shaper, a veth pair beside it,
// with carve's HTB on the first end, and has the classifier send the frames
// of parent's limited shares through it: the parent's root qdisc stays the
// kernel's (noqueue, mq), so traffic of no limited share takes no lock of
// carve's. A veth rather than an IFB: an IFB drops what a BPF program
// redirects to it on egress from a local socket (its skb_iif is 0), and
// sends the rest back to where it came from. The pair has no addresses and
// does no ARP; what the node sends from it anyway is dropped on its way
// back (return_shaped).
//
// A new shaper's HTB gets a link class of linkRate bits/s (linkclass.go).
func (p *NICPreparer) ensureEgressShaper(parent netlink.Link, linkRate uint64) (netlink.Link, error) {
	if shaper, ok := p.setUp.companion(companionEgressShaper, parent.Attrs().Index); ok {
		return shaper, nil
	}
	shaper, err := p.makeEgressShaper(parent, linkRate)
	if err == nil {
		p.setUp.setCompanion(companionEgressShaper, parent.Attrs().Index, shaper)
	}
	return shaper, err
}

func (p *NICPreparer) makeEgressShaper(parent netlink.Link, linkRate uint64) (netlink.Link, error) {
	h := p.h
	name, back := egressShaperName(parent.Attrs().Index), egressReturnName(parent.Attrs().Index)
	shaper, err := h.LinkByName(name)
	made := err != nil
	if made {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU, la.TxQLen = name, egressShaperMTU, 1000
		veth := &netlink.Veth{LinkAttrs: la, PeerName: back}
		if err := h.LinkAdd(veth); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create egress shaper %s for %s: %w", name, parent.Attrs().Name, err)
		}
		if shaper, err = h.LinkByName(name); err != nil {
			return nil, fmt.Errorf("egress shaper %s: %w", name, err)
		}
	}
	peer, err := h.LinkByName(back)
	if err != nil {
		return nil, fmt.Errorf("egress shaper %s's peer %s: %w", name, back, err)
	}
	for _, l := range []netlink.Link{shaper, peer} {
		if err := p.quietLink(l); err != nil {
			return nil, err
		}
	}
	if err := ensureHTB(h, shaper, linkRate, 0); err != nil {
		return nil, err
	}
	if made {
		if err := p.adoptParentClasses(parent, shaper); err != nil {
			return nil, err
		}
	}
	if err := hook.InNetns(p.opts.HostNS, func() error {
		return p.opts.Shaper.AttachEgressShaper(parent.Attrs().Index, shaper.Attrs().Index, peer.Attrs().Index, shaper.Attrs().HardwareAddr)
	}); err != nil {
		return nil, fmt.Errorf("send %s's limited shares through %s: %w", parent.Attrs().Name, name, err)
	}
	// Every time, not only on a new shaper: a prepare that failed here
	// is retried on the shaper it made (addUnsharedClass is idempotent).
	if err := p.addUnsharedClass(parent, shaper, linkRate, bpf.Egress); err != nil {
		return nil, err
	}
	return shaper, nil
}

// adoptParentClasses copies the share classes an older carve made on an
// HTB at the parent's root to the new shaper: once the classifier sends the
// parent's limited shares there, their frames find their classes, and the
// shares stay held until they are unprepared (retireEgressClass).
func (p *NICPreparer) adoptParentClasses(parent, shaper netlink.Link) error {
	if ours, err := checkRootReplaceable(p.h, parent); err != nil || !ours {
		return nil
	}
	classes, err := shareClasses(p.h, parent, false)
	if err != nil {
		return err
	}
	under, err := p.shareParent(shaper)
	if err != nil {
		return err
	}
	for minor, rate := range classes {
		if err := setClass(p.h, shaper, under, minor, hardCap(rate), true); err != nil {
			return err
		}
		if err := p.setLeaf(shaper, minor, rate); err != nil {
			return err
		}
	}
	return nil
}

// quietLink sets a shaper end up with no ARP and no IPv6 address of its
// own, so that the node sends from it as little as it can.
func (p *NICPreparer) quietLink(l netlink.Link) error {
	name := l.Attrs().Name
	if l.Attrs().RawFlags&unix.IFF_NOARP == 0 {
		if err := p.h.LinkSetARPOff(l); err != nil {
			return fmt.Errorf("turn ARP off on %s: %w", name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		// Before it goes up: no link-local address is made.
		if err := p.h.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone); err != nil && !errors.Is(err, unix.EAFNOSUPPORT) {
			return fmt.Errorf("turn IPv6 addresses off on %s: %w", name, err)
		}
		if err := p.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return nil
}

// removeEgressShaperIfIdle undoes ensureEgressShaper once no egress share
// class is left on parent's shaper: the redirect first, so that no frame is
// sent to a shaper that is going. Deleting one end deletes the pair. An
// HTB an older carve put at the parent's root goes once it holds no class.
func (p *NICPreparer) removeEgressShaperIfIdle(parent netlink.Link) error {
	h := p.h
	if ours, err := checkRootReplaceable(h, parent); err == nil && ours {
		removed, err := removeHTBIfIdle(h, parent)
		if removed || err != nil {
			p.setUp.forgetDevice(parent.Attrs().Index)
		}
		if err != nil {
			return err
		}
	}
	shaper, err := h.LinkByName(egressShaperName(parent.Attrs().Index))
	if err != nil {
		p.setUp.forgetCompanion(companionEgressShaper, parent.Attrs().Index)
		return nil
	}
	left, err := shareClasses(h, shaper, false)
	if err != nil || len(left) > 0 {
		return err
	}
	p.setUp.forgetCompanion(companionEgressShaper, parent.Attrs().Index)
	defer p.forgetParked(shaper.Attrs().Name)
	if err := p.forgetUnsharedClass(parent, bpf.Egress); err != nil {
		return err
	}
	if err := p.forgetEgressShaper(parent.Attrs().Index); err != nil {
		return err
	}
	if err := h.LinkDel(shaper); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove %s: %w", shaper.Attrs().Name, err)
	}
	return nil
}

// forgetEgressShaper stops the classifier sending parentIndex's frames to
// its shaper and detaches the way back.
func (p *NICPreparer) forgetEgressShaper(parentIndex int) error {
	if p.opts.Shaper == nil {
		return nil
	}
	back := 0
	if peer, err := p.h.LinkByName(egressReturnName(parentIndex)); err == nil {
		back = peer.Attrs().Index
	}
	if err := hook.InNetns(p.opts.HostNS, func() error { return p.opts.Shaper.DetachEgressShaper(parentIndex, back) }); err != nil {
		return fmt.Errorf("stop sending ifindex %d's limited shares to its egress shaper: %w", parentIndex, err)
	}
	return nil
}

// retireEgressClass takes an unprepared egress share's classes off the
// parent's egress shaper (parked or deleted, retireBlock), and, where rootHTB
// says the parent's root is the HTB an older carve put there
// (parentRootIsHTB), deletes its class there too;
// removeEgressShaperIfIdle follows.
func (p *NICPreparer) retireEgressClass(parent netlink.Link, key string, minor uint16, flows bool, rate uint64, rootHTB bool) ([]retiredBlock, error) {
	var errs []error
	var out []retiredBlock
	if shaper, err := p.h.LinkByName(egressShaperName(parent.Attrs().Index)); err == nil {
		rb, err := p.retireBlock(shaper, key, minor, flows, rate)
		if err == nil {
			out = append(out, rb)
		}
		errs = append(errs, err)
	}
	if rootHTB {
		errs = append(errs, deleteClass(p.h, parent, minor))
	}
	return out, errors.Join(errs...)
}

// parentRootIsHTB reports whether parent's root qdisc is carve's HTB (an
// older carve's way of holding egress shares). The kernel lists a device's
// qdiscs only in a dump of every qdisc of every device in the namespace,
// thousands with 1,000 shares' classes and leaves, which the reaper would
// pay under the parent's lock: it asks once per parent and batch, and a
// parent found without that HTB is not asked about again, as this carve
// never puts one there (only an older carve did, before this agent ran).
func (p *NICPreparer) parentRootIsHTB(parent netlink.Link) bool {
	idx := parent.Attrs().Index
	p.mu.Lock()
	plain := p.plainRoot[idx]
	p.mu.Unlock()
	if plain {
		return false
	}
	ours, err := checkRootReplaceable(p.h, parent)
	if err == nil && !ours {
		p.mu.Lock()
		p.plainRoot[idx] = true
		p.mu.Unlock()
	}
	return err == nil && ours
}
