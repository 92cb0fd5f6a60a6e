package netdev

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/prepare/hook"
)

// shape gives the share a class assured rates.floor bits/s and held to
// rates.ceil, and points the classifier on dev at it: for egress dev is the
// parent and the class is on its egress shaper; for ingress dev is the
// parent's IFB, which holds the class too. A new shaper or IFB gets a link
// class of linkRate (the NIC's capacity in dir), which the share classes
// borrow from. dropBase is what HTB had counted on the class's block before
// the share took it (a parked block, park.go), to be subtracted from its
// drops.
func (p *NICPreparer) shape(dev netlink.Link, key string, rates classRates, linkRate uint64, dir bpf.Direction, mac net.HardwareAddr) (minor uint16, flows bool, dropBase uint64, err error) {
	classDev := dev
	if dir == bpf.Egress {
		// The parent's root qdisc stays the kernel's: the class goes on
		// its egress shaper.
		if classDev, err = p.ensureEgressShaper(dev, linkRate); err != nil {
			return 0, false, 0, err
		}
	} else if !p.setUp.has("htb", dev.Attrs().Index) {
		// The device's HTB is made once and then known (under the
		// parent's lock): a steady-state prepare makes no qdisc dump.
		if err := ensureHTB(p.h, dev, linkRate, p.ifbDefault(linkRate)); err != nil {
			return 0, false, 0, err
		}
		p.setUp.add("htb", dev.Attrs().Index)
	}
	under, err := p.shareParent(classDev)
	if err == nil && under != linkHandle && rates.borrows() {
		err = fmt.Errorf("share of %s, borrowing up to %d bit/s: %s %w", dev.Attrs().Name, rates.ceil, classDev.Attrs().Name, errNoLinkClass)
	}
	if err != nil {
		return 0, false, 0, err
	}
	pick, err := p.addClass(classDev, key, under, rates)
	minor, dropBase = pick.minor, pick.drops
	if err != nil {
		if dir == bpf.Egress {
			p.setUp.forgetCompanion(companionEgressShaper, dev.Attrs().Index)
		} else {
			p.setUp.forget("htb", dev.Attrs().Index)
		}
		return 0, false, 0, err
	}
	// From here on the class exists: the minor is returned with any
	// error, so that the undo removes the class (and its children, with
	// flows). The classifier entry, the only other record of it, is
	// written last and may never be.
	if p.queuesKept(classDev, key, pick, rates) {
		flows = true
	} else if flows, err = p.setQueues(classDev, key, minor, rates); err != nil {
		return minor, flows, dropBase, err
	}
	// Attached (and checked to be first on the hook) once per device
	// while it is set up, not by every share.
	if what := "classifier-" + dir.String(); !p.setUp.has(what, dev.Attrs().Index) {
		if err := hook.InNetns(p.opts.HostNS, func() error { return p.opts.Shaper.Attach(dev.Attrs().Index, dir) }); err != nil {
			return minor, flows, dropBase, fmt.Errorf("attach the classifier to %s: %w", dev.Attrs().Name, err)
		}
		p.setUp.add(what, dev.Attrs().Index)
	}
	// The queue entry first: from the share entry on, its frames go to
	// its children.
	if flows {
		if err := p.opts.Shaper.SetShareQueue(dir, mac, bpf.ShareQueue{BitsPerSec: rates.floor, ClassIfindex: classDev.Attrs().Index, Minor: minor}); err != nil {
			return minor, flows, dropBase, fmt.Errorf("classifier entry: %w", err)
		}
	}
	if err := p.opts.Shaper.SetShare(dir, mac, uint32(netlink.MakeHandle(1, minor))); err != nil {
		return minor, flows, dropBase, fmt.Errorf("classifier entry: %w", err)
	}
	return minor, flows, dropBase, nil
}

// errNotParked is a block this agent had parked that the kernel says is
// not, or no longer.
var errNotParked = errors.New("the class is no longer parked")

// addClass gives key a class of rates on dev, under parent (shareParent), and
// returns its block.
// The minor is picked from this agent's own record of the device's classes:
// a parked block first (park.go), changed to the share's; only where the
// kernel says a pick is taken (another agent's, during a rolling update) are
// the device's classes listed and the pick made again.
func (p *NICPreparer) addClass(dev netlink.Link, key string, parent uint32, rates classRates) (minorPick, error) {
	if err := p.adoptParked(dev); err != nil {
		return minorPick{}, err
	}
	pick, err := p.pickMinor(dev.Attrs().Name, key, nil)
	if err != nil {
		return minorPick{}, err
	}
	if pick.parked {
		// Still parked, by the kernel's word: the parent's lock, held
		// by every agent that takes a block, makes this check and the
		// change one step.
		st, err := p.classStates(dev.Attrs().Index, []uint32{netlink.MakeHandle(1, pick.minor)})
		if err == nil && !st[0].parked {
			err = errNotParked
		}
		if err == nil {
			pick.parkedHere = parkedBy(st[0].rate, p.parkMark)
		}
		if err == nil {
			err = p.h.ClassChange(shareClass(dev, parent, pick.minor, rates, 0))
		}
		if err == nil {
			if pick.flows {
				// Made in this boot with flow children: this
				// kernel has no fq_codel (setQueues).
				p.mu.Lock()
				p.noFQCodel = true
				p.mu.Unlock()
			}
			return pick, nil
		}
		// What this agent knew of the device's parked blocks is
		// stale (the device was made again, or another agent took
		// the block): a fresh block.
		p.unpickMinor(dev.Attrs().Name, pick.minor, key)
		p.forgetParked(dev.Attrs().Name)
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, errNotParked) {
			return minorPick{}, fmt.Errorf("take parked HTB class 1:%x on %s: %w", pick.minor, dev.Attrs().Name, err)
		}
		if pick, err = p.pickMinor(dev.Attrs().Name, key, nil); err != nil {
			return minorPick{}, err
		}
	}
	err = setClass(p.h, dev, parent, pick.minor, rates, pick.own)
	if !errors.Is(err, errClassTaken) {
		return pick, err
	}
	p.unpickMinor(dev.Attrs().Name, pick.minor, key)
	taken, err := shareClasses(p.h, dev, true)
	if err != nil {
		return minorPick{}, err
	}
	if pick, err = p.pickMinor(dev.Attrs().Name, key, taken); err != nil {
		return minorPick{}, err
	}
	return pick, setClass(p.h, dev, parent, pick.minor, rates, pick.own)
}
