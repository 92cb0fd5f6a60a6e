package netdev

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

// linkMinor is the link class of a device's HTB (ceiling.go): held to the
// NIC's capacity in its direction, every share class of the device hangs
// from it and borrows from it. Devices an older carve made have none, and
// their share classes hang from the HTB itself: their shares keep their
// hard caps, and a share that would borrow is refused there until the
// device's shares are all gone and it is made again.
const linkMinor = 1

var linkHandle = netlink.MakeHandle(1, linkMinor)

// addLinkClass gives link's new HTB its link class of rateBits.
func addLinkClass(h *netlink.Handle, link netlink.Link, rateBits uint64) error {
	buf := htbBuffer(rateBits)
	class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: rootHandle, Handle: linkHandle},
		netlink.HtbClassAttrs{Rate: rateBits, Ceil: rateBits, Buffer: buf, Cbuffer: buf, Quantum: quantum(rateBits)})
	err := h.ClassAdd(class)
	if errors.Is(err, unix.EEXIST) {
		err = h.ClassChange(class)
	}
	if err != nil {
		return fmt.Errorf("link class 1:%x of %d bit/s on %s: %w", linkMinor, rateBits, link.Attrs().Name, err)
	}
	return nil
}

// repairLinkClass gives link's HTB, which is carve's, its link class where
// it has no class at all: made by an agent that stopped before it added
// one. One that has classes keeps its layout: an older carve's hang from
// the HTB itself (shareParent).
func repairLinkClass(h *netlink.Handle, link netlink.Link, rateBits uint64) error {
	classes, err := h.ClassList(link, rootHandle)
	if err != nil {
		return fmt.Errorf("list classes of %s: %w", link.Attrs().Name, err)
	}
	if len(classes) > 0 {
		return nil
	}
	return addLinkClass(h, link, rateBits)
}

// htbDefault is the default class (minor) of link's root HTB, 0 for none.
func htbDefault(h *netlink.Handle, link netlink.Link) (uint32, error) {
	qdiscs, err := h.QdiscList(link)
	if err != nil {
		return 0, fmt.Errorf("list qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qdiscs {
		if htb, ok := q.(*netlink.Htb); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
			return htb.Defcls, nil
		}
	}
	return 0, nil
}

// shareParent is the class the share classes of dev hang from: its link
// class where it has one, else its HTB. The kernel is asked once per
// device while it is set up (one class, not a dump).
func (p *NICPreparer) shareParent(dev netlink.Link) (uint32, error) {
	idx := dev.Attrs().Index
	switch {
	case p.setUp.has("link-class", idx):
		return linkHandle, nil
	case p.setUp.has("no-link-class", idx):
		return rootHandle, nil
	}
	st, err := p.classStates(idx, []uint32{linkHandle})
	if err != nil {
		return 0, err
	}
	if st[0].exists {
		p.setUp.add("link-class", idx)
		return linkHandle, nil
	}
	p.setUp.add("no-link-class", idx)
	return rootHandle, nil
}

// errNoLinkClass refuses a borrowing share on a device an older carve made.
var errNoLinkClass = errors.New("its classes were made by an older carve, with no link class to borrow from: " +
	"a share may borrow there once the NIC's shares are all gone and carve makes its classes again")

// unsharedMinor is the class of a device's traffic of no limited share
// (the node's own, unshaped pods', unlimited shares'), where the node
// config reserves it a floor (netdev.unsharedFloorPercent): beside the
// share classes under the link class, assured its part of the link and
// borrowing up to all of it; beside borrowing shares it is assured its part
// of the excess by its floor, as they are (excess.go). It is HTB's default
// class on the IFB; the
// classifier sends the parent's unshared frames to it on both devices
// (bpf.Shaper.SetUnsharedClass).
const unsharedMinor = 2

var unsharedHandle = netlink.MakeHandle(1, unsharedMinor)

// unsharedPercent is the node config's netdev.unsharedFloorPercent.
func (p *NICPreparer) unsharedPercent() uint64 {
	if p.opts.Config == nil || p.opts.Config.Netdev.UnsharedFloorPercent <= 0 {
		return 0
	}
	return uint64(p.opts.Config.Netdev.UnsharedFloorPercent)
}

// addUnsharedClass gives link (parent's egress shaper, or its IFB), whose
// new HTB has a link class of linkRate, the unshared class and its leaf,
// and has the classifier send parent's unshared traffic in dir to it. On
// the IFB it is also HTB's default class (ifbDefault, set as the HTB is
// made): what the classifier leaves unclassified there, the node's own
// frames, goes to it.
func (p *NICPreparer) addUnsharedClass(parent, link netlink.Link, linkRate uint64, dir bpf.Direction) error {
	pct := p.unsharedPercent()
	if pct == 0 || linkRate == 0 || p.opts.Shaper == nil {
		return nil
	}
	if under, err := p.shareParent(link); err != nil || under != linkHandle {
		return err // an older carve's HTB: no link class to hang it from
	}
	if dir == bpf.Ingress {
		// On the IFB the node's own frames reach the class as HTB's
		// default, which is set only as the HTB is made: an IFB made
		// while the node config reserved nothing keeps none until it
		// is made again (its NIC's shares all gone).
		if def, err := htbDefault(p.h, link); err != nil || def != unsharedMinor {
			return err
		}
	}
	rates := classRates{floor: linkRate * pct / 100, ceil: linkRate}
	buf := htbBuffer(rates.ceil)
	class := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: linkHandle, Handle: unsharedHandle},
		netlink.HtbClassAttrs{Rate: rates.floor, Ceil: rates.ceil, Buffer: buf, Cbuffer: buf, Quantum: rates.quantum()})
	err := p.h.ClassAdd(class)
	if errors.Is(err, unix.EEXIST) {
		err = p.h.ClassChange(class)
	}
	if err != nil {
		return fmt.Errorf("unshared class 1:%x on %s: %w", unsharedMinor, link.Attrs().Name, err)
	}
	if err := p.setLeaf(link, unsharedMinor, rates.ceil); err != nil {
		return err
	}
	return hook.InNetns(p.opts.HostNS, func() error {
		return p.opts.Shaper.SetUnsharedClass(parent.Attrs().Index, dir, unsharedHandle)
	})
}

// forgetUnsharedClass stops the classifier sending parent's unshared
// traffic in dir to a shaper or IFB that is going.
func (p *NICPreparer) forgetUnsharedClass(parent netlink.Link, dir bpf.Direction) error {
	if p.opts.Shaper == nil {
		return nil
	}
	return hook.InNetns(p.opts.HostNS, func() error { return p.opts.Shaper.ForgetUnsharedClass(parent.Attrs().Index, dir) })
}

// ifbDefault is the default class of a new IFB's HTB: the unshared class
// where the node config gives one (and the link's capacity is known), else
// none.
func (p *NICPreparer) ifbDefault(linkRate uint64) uint32 {
	if p.unsharedPercent() == 0 || linkRate == 0 {
		return 0
	}
	return unsharedMinor
}
