package netdev

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

var rootHandle = netlink.MakeHandle(1, 0)

// htbBuffer sizes a class's burst from its rate: about 8 ms of traffic. With
// netlink's default (about 1.4 KB at 1 Gbit/s) a 1G share lost some 10% of
// its rate on this machine; 8 ms held 50M–1G to within 1% for TCP.
func htbBuffer(rateBits uint64) uint32 {
	return uint32(min(max(rateBits/8*8/1000, 16*1024), 1<<30))
}

// replaceableRoots are the root qdiscs carve may replace: the kernel's
// defaults. Anything else (cake, mqprio, prio, fq, tbf, another HTB...) is
// an operator's shaping, which carve refuses to overwrite.
var replaceableRoots = []string{"pfifo_fast", "mq", "noqueue", "fq_codel"}

// checkRootReplaceable fails unless link's root qdisc is one carve may
// replace: a kernel default, or mq whose children all are. A root of carve's
// own (its HTB, handle 1:) is reported as ours.
func checkRootReplaceable(h *netlink.Handle, link netlink.Link) (ours bool, err error) {
	qdiscs, err := h.QdiscList(link)
	if err != nil {
		return false, fmt.Errorf("list qdiscs of %s: %w", link.Attrs().Name, err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		if q.Type() == "htb" && q.Attrs().Handle == rootHandle {
			return true, nil
		}
		if !slices.Contains(replaceableRoots, q.Type()) {
			return false, fmt.Errorf("%s has a %s root qdisc that carve did not make and may not replace (only %v): remove it to share this NIC",
				link.Attrs().Name, q.Type(), replaceableRoots)
		}
		if q.Type() != "mq" {
			continue
		}
		for _, c := range qdiscs {
			major, _ := netlink.MajorMinor(c.Attrs().Parent)
			if c.Attrs().Parent != netlink.HANDLE_ROOT && major == uint16(q.Attrs().Handle>>16) && !slices.Contains(replaceableRoots, c.Type()) {
				return false, fmt.Errorf("%s has an mq root qdisc with a %s child that carve did not make and may not replace: remove it to share this NIC",
					link.Attrs().Name, c.Type())
			}
		}
	}
	return false, nil
}

// ensureHTB makes sure link has carve's HTB root qdisc. Traffic of no share
// is left unclassified and takes HTB's direct queue, unshaped: cheaper than
// a default class (measured: about 4–16% below no qdisc at 20+ Gbit/s on a
// veth, against 18% with a 100G default class). A root qdisc of another
// kind is replaced only if it is a kernel default (replaceableRoots): carve
// never silently removes an operator's shaping.
//
// A new HTB gets its link class (linkclass.go) of linkRate bits/s, the NIC's
// capacity in the device's direction, where that is known (not 0), and
// defcls as its default class (0: none; HTB cannot change it later). An
// HTB of carve's with no class at all (an agent that crashed between the
// two) gets its link class then.
func ensureHTB(h *netlink.Handle, link netlink.Link, linkRate uint64, defcls uint32) error {
	if ours, err := checkRootReplaceable(h, link); err != nil || ours {
		if err != nil || linkRate == 0 {
			return err
		}
		return repairLinkClass(h, link, linkRate)
	}
	q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: rootHandle, Parent: netlink.HANDLE_ROOT})
	q.Defcls = defcls // 0: unclassified traffic takes the direct queue, unshaped
	if err := h.QdiscReplace(q); err != nil {
		return fmt.Errorf("add HTB root qdisc to %s: %w", link.Attrs().Name, err)
	}
	if linkRate > 0 {
		return addLinkClass(h, link, linkRate)
	}
	return nil
}

// setClass creates the class minor to hold rate bits/s; where own is set (a
// retried prepare of the same share) an existing class is changed instead.
// A class that exists and is not the share's own is never taken over: with
// two agents on a node (a rolling update) that would make two shares one.
func setClass(h *netlink.Handle, link netlink.Link, parent uint32, minor uint16, rates classRates, own bool) error {
	class := shareClass(link, parent, minor, rates, 0)
	err := h.ClassAdd(class)
	if errors.Is(err, unix.EEXIST) && own {
		err = h.ClassChange(class)
	}
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("HTB class 1:%x on %s: %w", minor, link.Attrs().Name, errClassTaken)
	}
	if err != nil {
		return fmt.Errorf("set HTB class 1:%x on %s to %d bit/s (ceil %d): %w", minor, link.Attrs().Name, rates.floor, rates.ceil, err)
	}
	return nil
}

// shareClass is the share class 1:minor on link, under parent (the link
// class, or the HTB on a device an older carve made), assured its floor and
// held to its ceiling; where parked is not 0, parked (park.go), with the
// parked mark and, in its rate, parked, which names the agent that parked
// it (NICPreparer.parkMark, parkedRate). Its two bursts are equal, about 8 ms at
// the ceiling: a share's class is told from a parked one by them.
func shareClass(link netlink.Link, parent uint32, minor uint16, rates classRates, parked uint32) *netlink.HtbClass {
	attrs := netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: parent, Handle: netlink.MakeHandle(1, minor)}
	buf, cbuf := htbBuffer(rates.ceil), htbBuffer(rates.ceil)
	q := rates.quantum()
	if parked != 0 {
		cbuf += buf / 2
		r := parkedRate(rates.ceil, parked)
		rates = classRates{floor: r, ceil: r}
	}
	return netlink.NewHtbClass(attrs, netlink.HtbClassAttrs{Rate: rates.floor, Ceil: rates.ceil, Buffer: buf, Cbuffer: cbuf, Quantum: q})
}

// quantum is the class's DRR quantum: proportional to its floor where it
// borrows (HTB lends the excess a quantum at a time, ceiling.go), else
// quantum(floor).
func (r classRates) quantum() uint32 {
	if !r.borrows() {
		return quantum(r.floor)
	}
	return borrowQuantum(r.floor)
}

// borrowQuantum is 10 ms of the floor, in bytes. HTB lets a class whose turn
// it is send one packet, then adds its quantum and passes the turn on once
// its deficit is spent: a quantum smaller than the packets makes every turn
// one packet, and the split even whatever the quanta. GSO and GRO
// super-packets run to 64 KiB, so the quanta are proportional to the floors
// from about 50M up (100M: 125 KB; a 10G floor's 12.5 MB are capped at 16 MiB).
// HTB takes any quantum it is given; it only clamps, and warns about, one
// it derives from the rate itself.
func borrowQuantum(floorBits uint64) uint32 {
	return uint32(min(max(floorBits/8/100, 1514), 1<<24))
}

// errClassTaken is a class number that another share holds.
var errClassTaken = errors.New("the class belongs to another share")

// quantum keeps HTB's DRR quantum within the kernel's preferred bounds, so
// it does not warn and share out bursts unfairly.
func quantum(rateBits uint64) uint32 {
	return uint32(min(max(rateBits/8/10, 1514), 200_000)) // r2q 10
}

// deleteClass removes the class; a missing one is already gone.
func deleteClass(h *netlink.Handle, link netlink.Link, minor uint16) error {
	class := &netlink.HtbClass{ClassAttrs: netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: rootHandle, Handle: netlink.MakeHandle(1, minor)}}
	if err := h.ClassDel(class); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete HTB class 1:%x on %s: %w", minor, link.Attrs().Name, err)
	}
	return nil
}

// shareClasses lists the minors of carve's share classes on link, with
// their rates; parked ones (park.go) only where withParked says so.
func shareClasses(h *netlink.Handle, link netlink.Link, withParked bool) (map[uint16]uint64, error) {
	classes, err := h.ClassList(link, rootHandle)
	if err != nil {
		return nil, fmt.Errorf("list classes of %s: %w", link.Attrs().Name, err)
	}
	out := map[uint16]uint64{}
	for _, c := range classes {
		htb, ok := c.(*netlink.HtbClass)
		if !ok {
			continue
		}
		major, minor := netlink.MajorMinor(c.Attrs().Handle)
		// Shares' classes only, not their flow children: those are
		// in the same block of minors.
		if major == 1 && minor >= minMinor && topLevel(c) && (withParked || !parkedClass(htb)) {
			out[minor] = htb.Rate * 8
		}
	}
	return out, nil
}

// topLevel reports whether c hangs from its HTB itself or its link class,
// as a share class does, not from a share class, as a flow child does.
func topLevel(c netlink.Class) bool {
	pmajor, pminor := netlink.MajorMinor(c.Attrs().Parent)
	return pmajor != 1 || pminor == 0 || pminor == linkMinor
}

// removeHTBIfIdle removes carve's root qdisc once no share class is left.
func removeHTBIfIdle(h *netlink.Handle, link netlink.Link) (removed bool, err error) {
	left, err := shareClasses(h, link, false)
	if err != nil || len(left) > 0 {
		return false, err
	}
	q := &netlink.Htb{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: rootHandle, Parent: netlink.HANDLE_ROOT}}
	if err := h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return false, fmt.Errorf("remove HTB root qdisc of %s: %w", link.Attrs().Name, err)
	}
	return true, nil
}

// ifbName is the IFB device that shapes a parent's ingress.
func ifbName(parent netlink.Link) string { return "cvifb" + strconv.Itoa(parent.Attrs().Index) }

// ensureIngressIFB makes the IFB device whose egress HTB holds each share of
// parent to its ingress rate, and sends it the frames towards shares:
// shaping there (a queue) rather than policing (drops) lets TCP reach its
// rate without the huge bursts a policer needs. Only share traffic takes the
// IFB (the classifier's redirect_ingress on the parent picks it by
// destination MAC); the node's own traffic stays off its single queue. A new
// IFB's HTB gets a link class of linkRate bits/s (linkclass.go).
func (p *NICPreparer) ensureIngressIFB(parent netlink.Link, linkRate uint64) (netlink.Link, error) {
	if ifb, ok := p.setUp.companion(companionIFB, parent.Attrs().Index); ok {
		return ifb, nil
	}
	ifb, err := p.makeIngressIFB(parent, linkRate)
	if err == nil {
		p.setUp.setCompanion(companionIFB, parent.Attrs().Index, ifb)
	}
	return ifb, err
}

func (p *NICPreparer) makeIngressIFB(parent netlink.Link, linkRate uint64) (netlink.Link, error) {
	h := p.h
	name := ifbName(parent)
	ifb, err := h.LinkByName(name)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = name
		la.TxQLen = 1000
		if err := h.LinkAdd(&netlink.Ifb{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create IFB %s for %s: %w", name, parent.Attrs().Name, err)
		}
		if ifb, err = h.LinkByName(name); err != nil {
			return nil, fmt.Errorf("IFB %s: %w", name, err)
		}
	}
	if err := h.LinkSetUp(ifb); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	if err := ensureHTB(h, ifb, linkRate, p.ifbDefault(linkRate)); err != nil {
		return nil, err
	}
	if err := hook.InNetns(p.opts.HostNS, func() error {
		return p.opts.Shaper.AttachRedirect(parent.Attrs().Index, ifb.Attrs().Index)
	}); err != nil {
		return nil, fmt.Errorf("redirect %s's share traffic to %s: %w", parent.Attrs().Name, name, err)
	}
	if err := p.addUnsharedClass(parent, ifb, linkRate, bpf.Ingress); err != nil {
		return nil, err
	}
	// An older carve redirected all of the parent's ingress with u32.
	if err := removeMirred(h, parent); err != nil {
		return nil, err
	}
	return ifb, nil
}

// mirredPriority marks the redirect filter older carves put among a
// parent's ingress filters (u32 matching every frame, with mirred).
const mirredPriority = 0xca4

// removeMirred deletes that filter; clsact stays (others may use it).
func removeMirred(h *netlink.Handle, parent netlink.Link) error {
	filters, err := h.FilterList(parent, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // no clsact: nothing of ours there
		}
		return fmt.Errorf("list ingress filters of %s: %w", parent.Attrs().Name, err)
	}
	for _, f := range filters {
		if f.Attrs().Priority == mirredPriority && f.Type() == "u32" {
			if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove the ingress redirect of %s: %w", parent.Attrs().Name, err)
			}
		}
	}
	return nil
}

// removeIngressIFBIfIdle undoes ensureIngressIFB once no ingress share is
// left on the parent: the redirect first, so that no frame is sent to an
// IFB that is going.
func (p *NICPreparer) removeIngressIFBIfIdle(parent netlink.Link) error {
	h := p.h
	ifb, err := h.LinkByName(ifbName(parent))
	if err != nil {
		p.setUp.forgetCompanion(companionIFB, parent.Attrs().Index)
		return nil
	}
	left, err := shareClasses(h, ifb, false)
	if err != nil || len(left) > 0 {
		return err
	}
	p.setUp.forgetCompanion(companionIFB, parent.Attrs().Index)
	defer p.forgetParked(ifb.Attrs().Name)
	if err := p.forgetUnsharedClass(parent, bpf.Ingress); err != nil {
		return err
	}
	if p.opts.Shaper != nil {
		if err := hook.InNetns(p.opts.HostNS, func() error { return p.opts.Shaper.DetachRedirect(parent.Attrs().Index) }); err != nil {
			return fmt.Errorf("remove the ingress redirect of %s: %w", parent.Attrs().Name, err)
		}
	}
	if err := removeMirred(h, parent); err != nil {
		return err
	}
	if err := h.LinkDel(ifb); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove %s: %w", ifb.Attrs().Name, err)
	}
	return nil
}
