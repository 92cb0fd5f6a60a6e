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

// shapedClass is a share's class on one device, made under the parent's
// lock (shapeClass), whose queues and classifier entries are still to be
// set (shapeQueues).
type shapedClass struct {
	classDev netlink.Link
	pick     minorPick
	rates    classRates
	dir      bpf.Direction
}

// shapeClass gives the share a class assured rates.floor bits/s and held to
// rates.ceil, under the parent's lock: for egress dev is the parent and
// the class is on its egress shaper; for ingress dev is the parent's IFB,
// which holds the class too. A new shaper or IFB gets a link class of
// linkRate (the NIC's capacity in dir), which the share classes borrow
// from. The class's block (its minor and the children's after it) is the
// share's from here on, so its queues need no lock (shapeQueues). The
// pick's drops are what HTB had counted on the block before the share
// took it (a parked block, park.go), to be subtracted from its drops.
func (p *NICPreparer) shapeClass(dev netlink.Link, key string, rates classRates, linkRate uint64, dir bpf.Direction) (shapedClass, error) {
	classDev := dev
	var err error
	if dir == bpf.Egress {
		// The parent's root qdisc stays the kernel's: the class goes on
		// its egress shaper.
		if classDev, err = p.ensureEgressShaper(dev, linkRate); err != nil {
			return shapedClass{}, err
		}
	} else if !p.setUp.has("htb", dev.Attrs().Index) {
		// The device's HTB is made once and then known (under the
		// parent's lock): a steady-state prepare makes no qdisc dump.
		if err := ensureHTB(p.h, dev, linkRate, p.ifbDefault(linkRate)); err != nil {
			return shapedClass{}, err
		}
		p.setUp.add("htb", dev.Attrs().Index)
	}
	under, err := p.shareParent(classDev)
	if err == nil && under != linkHandle && rates.borrows() {
		err = fmt.Errorf("share of %s, borrowing up to %d bit/s: %s %w", dev.Attrs().Name, rates.ceil, classDev.Attrs().Name, errNoLinkClass)
	}
	if err != nil {
		return shapedClass{}, err
	}
	pick, err := p.addClass(classDev, key, under, rates)
	if err != nil {
		if dir == bpf.Egress {
			p.setUp.forgetCompanion(companionEgressShaper, dev.Attrs().Index)
		} else {
			p.setUp.forget("htb", dev.Attrs().Index)
		}
		return shapedClass{}, err
	}
	sc := shapedClass{classDev: classDev, pick: pick, rates: rates, dir: dir}
	if under == linkHandle {
		p.noteExcessShare(classDev, key, pick.minor, rates, linkRate)
	}
	// Attached (and checked to be first on the hook) once per device
	// while it is set up, not by every share.
	if what := "classifier-" + dir.String(); !p.setUp.has(what, dev.Attrs().Index) {
		if err := hook.InNetns(p.opts.HostNS, func() error { return p.opts.Shaper.Attach(dev.Attrs().Index, dir) }); err != nil {
			// The class exists: returned with the error, so that the
			// undo removes it.
			return sc, fmt.Errorf("attach the classifier to %s: %w", dev.Attrs().Name, err)
		}
		p.setUp.add(what, dev.Attrs().Index)
	}
	return sc, nil
}

// shapeQueues gives the share's class made by shapeClass its queues (its
// flow children, unless a parked block of this agent's has them as they
// would be set), then points the classifier on the device at it. It runs
// outside the parent's lock: the block is the share's alone, and the
// device is not idle while the share holds its pick (reapClasses), so
// prepares on one parent make their children in parallel rather than in
// a queue (with a hundred new shares at once, 38 class and leaf requests
// each under the lock made a prepare wait seconds for the others').
// flows is set as soon as a child may exist, so that an undo removes the
// children before their parent.
func (p *NICPreparer) shapeQueues(sc shapedClass, key string, mac net.HardwareAddr) (flows bool, err error) {
	minor := sc.pick.minor
	if p.queuesKept(sc.classDev, key, sc.pick, sc.rates) {
		flows = true
	} else if flows, err = p.setQueues(sc.classDev, key, minor, sc.rates); err != nil {
		return flows, err
	}
	// The queue entry first: from the share entry on, its frames go to
	// its children.
	if flows {
		if err := p.opts.Shaper.SetShareQueue(sc.dir, mac, bpf.ShareQueue{BitsPerSec: sc.rates.floor, ClassIfindex: sc.classDev.Attrs().Index, Minor: minor}); err != nil {
			return flows, fmt.Errorf("classifier entry: %w", err)
		}
	}
	if err := p.opts.Shaper.SetShare(sc.dir, mac, uint32(netlink.MakeHandle(1, minor))); err != nil {
		return flows, fmt.Errorf("classifier entry: %w", err)
	}
	return flows, nil
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
