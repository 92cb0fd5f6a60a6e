package netdev

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

// The excess, assured in proportion to the floors (issue 42). HTB lends
// what the link class has over its assured classes round-robin, a quantum at
// a time, to the classes that have frames queued when their turn comes.
// A TCP sender on the node keeps only about a millisecond of its rate below
// its socket (TCP small queues, which holds a frame until the NIC has sent
// it, across the egress shaper, the IFB and namespaces alike), and its GSO
// super-packets are about a millisecond of its pacing rate: a class has at
// its turn about what it sent at the last, whatever its quantum, and the
// split of the excess drifts with the senders, not the floors. Measured
// here with floors of 100M and 300M on a 1G link, one TCP flow each: the
// excess split 0.18–0.30 (the floors' 0.333), with one flow each or four,
// BBR or CUBIC, quanta of 10 ms of the floor; 1 ms quanta gave 1.0 (every
// turn one super-packet), 100 ms 0.17–0.46.
//
// So the agent assures each borrowing share, besides its floor, its part
// of the device's unassured capacity in proportion to its floor: its class's
// HTB rate is floor + E·floor/Σ(borrowers' floors), never past its
// ceiling (what a ceiling leaves goes to the others, in the same
// proportion), where E is the link class's rate less the unshared class's
// and every share's floor on the device, hard caps included, and less the
// rate of any share class the agent does not know (another agent's during a
// rolling update, read from the kernel each time). The rates sum
// to the link: HTB gives each its part by its rate, queue or not, and what
// a share leaves idle is still lent round-robin to those that want it.
// Measured with the same two shares at 250M and 750M: 0.333 in each
// direction, every run.
//
// The rates change whenever the device's shares do: at prepare, under the
// parent's lock and before the answer (a new floor must hold from the
// share's first frame, so the borrowers' rates come down first of all); at
// unprepare, after the share's classes are parked (the others may take its
// part up). The class of the node's own traffic (unsharedFloorPercent) has a
// floor and the link as ceiling, and takes its part as a borrower does. A
// device with no borrowing share and no such class is never touched, so
// hard caps alone cost nothing. The rates are not recorded: the kernel
// keeps them across an agent's restart, and the next change on the device
// sets them all from the agent's own shares, taken back at Restore (and
// the unshared class's from its rate as the kernel has it).

// excessShare is one share's class on a device, as the excess is assured.
type excessShare struct {
	minor   uint16
	rates   classRates
	assured uint64 // the rate the kernel has, bits/s; 0: not known (restored)
}

// excessDevice is a device's share classes (an egress shaper, an IFB).
type excessDevice struct {
	name     string
	linkRate uint64 // the link class's rate, bits/s; 0: not known yet
	shares   map[string]*excessShare
}

// noteExcessShare records key's class minor of rates on dev, whose link
// class is of linkRate (0: not known), after the class is made. The caller
// holds the parent's lock.
func (p *NICPreparer) noteExcessShare(dev netlink.Link, key string, minor uint16, rates classRates, linkRate uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.excessDevice(dev.Attrs().Index, dev.Attrs().Name)
	if linkRate > 0 {
		d.linkRate = linkRate
	}
	d.shares[key] = &excessShare{minor: minor, rates: rates, assured: rates.floor}
}

// excessDevice is the record of the device of ifindex, made where there is
// none. The caller holds p.mu.
func (p *NICPreparer) excessDevice(ifindex int, name string) *excessDevice {
	if p.excess == nil {
		p.excess = map[int]*excessDevice{}
	}
	d := p.excess[ifindex]
	if d == nil || d.name != name {
		d = &excessDevice{name: name, shares: map[string]*excessShare{}}
		p.excess[ifindex] = d
	}
	return d
}

// restoreExcess records, at Restore, the classes of the share key of
// allocation a with record u: its floors are its allocation's, its ceilings
// its record's (none: a hard cap).
func (p *NICPreparer) restoreExcess(key string, a prepare.Allocation, u undoRecord) {
	parent, err := p.h.LinkByName(u.Parent)
	if err != nil {
		return
	}
	rates := func(floor, ceil uint64) classRates {
		if ceil <= floor {
			return hardCap(floor)
		}
		return classRates{floor: floor, ceil: ceil}
	}
	p.restoreExcessShare(egressShaperName(parent.Attrs().Index), key, u.EgressMinor,
		rates(bandwidth(a, names.CapEgressBandwidth), u.EgressCeiling))
	p.restoreExcessShare(ifbName(parent), key, u.IngressMinor,
		rates(bandwidth(a, names.CapIngressBandwidth), u.IngressCeiling))
}

// restoreExcessShare records a share taken back at Restore: its rates from
// its allocation and record, the rate its class has not known.
func (p *NICPreparer) restoreExcessShare(devName, key string, minor uint16, rates classRates) {
	if minor == 0 || rates.floor == 0 {
		return
	}
	dev, err := p.h.LinkByName(devName)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.excessDevice(dev.Attrs().Index, dev.Attrs().Name).shares[key] = &excessShare{minor: minor, rates: rates}
}

// forgetExcessShare drops key from every device and returns the devices
// (by ifindex) that have a borrowing share left, or an unshared class,
// whose rates are to be set again.
func (p *NICPreparer) forgetExcessShare(key string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var again []int
	for idx, d := range p.excess {
		if _, ok := d.shares[key]; !ok {
			continue
		}
		delete(d.shares, key)
		if len(d.shares) == 0 {
			delete(p.excess, idx)
			continue
		}
		if d.borrowers() > 0 || p.unsharedPercent() > 0 {
			again = append(again, idx)
		}
	}
	return again
}

func (d *excessDevice) borrowers() int {
	n := 0
	for _, s := range d.shares {
		if s.rates.borrows() {
			n++
		}
	}
	return n
}

// assuredRates is each borrowing share's rate on a device whose link class
// is of linkRate, reserved of it assured elsewhere (to traffic of no share,
// to share classes this agent does not know): floor plus its part of the
// excess, by key. Shares not borrowing are left out (their rate is their
// floor).
func assuredRates(shares map[string]*excessShare, linkRate, reserved uint64) map[string]uint64 {
	var floors uint64
	var open []string
	for key, s := range shares {
		floors += s.rates.floor
		if s.rates.borrows() {
			open = append(open, key)
		}
	}
	out := make(map[string]uint64, len(open))
	for _, key := range open {
		out[key] = shares[key].rates.floor
	}
	if linkRate <= reserved+floors || len(open) == 0 {
		return out // nothing over the floors to assure
	}
	excess := float64(linkRate - reserved - floors)
	sort.Strings(open) // the same rounding every time
	// Water-filling: a share whose part would pass its ceiling gets its
	// ceiling, and what it leaves is shared again among the rest.
	for len(open) > 0 {
		var weight float64
		for _, key := range open {
			weight += float64(shares[key].rates.floor)
		}
		var rest []string
		left := excess
		for _, key := range open {
			s := shares[key]
			if float64(s.rates.floor)+excess*float64(s.rates.floor)/weight >= float64(s.rates.ceil) {
				out[key] = s.rates.ceil
				left -= float64(s.rates.ceil - s.rates.floor)
				continue
			}
			rest = append(rest, key)
		}
		if len(rest) == len(open) {
			for _, key := range open {
				s := shares[key]
				out[key] = s.rates.floor + uint64(math.Floor(excess*float64(s.rates.floor)/weight))
			}
			break
		}
		open, excess = rest, left
	}
	return out
}

// assureExcess sets the rates of the borrowing shares' classes on the
// device of ifindex to their floors and their parts of the excess
// (assuredRates), each class changed only where its rate moves. The caller
// holds the lock of the device's parent. A device whose link rate is not
// known yet (restored, and no share prepared on it since) is left as the
// kernel has it.
func (p *NICPreparer) assureExcess(ctx context.Context, ifindex int) error {
	p.mu.Lock()
	d := p.excess[ifindex]
	if d == nil || d.linkRate == 0 || d.borrowers() == 0 && p.unsharedPercent() == 0 {
		p.mu.Unlock()
		return nil
	}
	ours := make(map[uint16]bool, len(d.shares))
	for _, s := range d.shares {
		ours[s.minor] = true
	}
	name, linkRate := d.name, d.linkRate
	p.mu.Unlock()
	foreign, unsharedNow, err := p.foreignFloors(ifindex, name, ours)
	if err != nil {
		return err
	}
	p.mu.Lock()
	shares := d.shares
	reserved := linkRate*p.unsharedPercent()/100 + foreign
	if unsharedNow > 0 {
		// The node's own traffic's class has a floor and the link as
		// ceiling: it takes its part of the excess as a borrower does.
		shares = make(map[string]*excessShare, len(d.shares)+1)
		maps.Copy(shares, d.shares)
		shares[unsharedKey] = &excessShare{minor: unsharedMinor, rates: classRates{floor: linkRate * p.unsharedPercent() / 100, ceil: linkRate}, assured: unsharedNow}
		reserved = foreign
	}
	want := assuredRates(shares, linkRate, reserved)
	type change struct {
		key   string
		minor uint16
		rates classRates
		rate  uint64
		down  bool // lowered, or from a rate not known
	}
	var changes []change
	for key, rate := range want {
		if s := shares[key]; s.assured != rate {
			changes = append(changes, change{key: key, minor: s.minor, rates: s.rates, rate: rate, down: s.assured == 0 || rate < s.assured})
		}
	}
	p.mu.Unlock()
	// Lowered first: the link's assured rates never sum past it.
	sort.SliceStable(changes, func(i, j int) bool { return changes[i].down && !changes[j].down })
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex, Name: name}}
	var errs []error
	for _, c := range changes {
		err := p.h.ClassChange(assuredClass(link, c.minor, c.rates, c.rate))
		if errors.Is(err, unix.ENOENT) {
			continue // the share's class is gone already (its unprepare)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("assure HTB class 1:%x on %s %d bit/s (floor %d, ceil %d): %w", c.minor, name, c.rate, c.rates.floor, c.rates.ceil, err))
			continue
		}
		p.mu.Lock()
		if s := d.shares[c.key]; s != nil && s.minor == c.minor && c.key != unsharedKey {
			s.assured = c.rate
		}
		p.mu.Unlock()
	}
	if len(changes) > 0 {
		klog.FromContext(ctx).V(4).Info("Assured the borrowing shares their parts of the excess", "device", name, "changed", len(changes))
	}
	return errors.Join(errs...)
}

// unsharedKey names the unshared class (linkclass.go) among a device's
// shares as the excess is assured: no share's key is empty.
const unsharedKey = ""

// foreignFloors is what the share classes on the device of ifindex that
// this agent does not know (not among ours, by minor) are assured, bits/s:
// another agent's during a rolling update, or one whose record was lost.
// Their rates count as floors, so that the excess handed out never takes
// what they are assured. Parked classes are left out: they send nothing.
// unshared is the rate of the device's unshared class, 0 where it has none.
func (p *NICPreparer) foreignFloors(ifindex int, name string, ours map[uint16]bool) (foreign, unshared uint64, err error) {
	link := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex, Name: name}}
	classes, err := p.h.ClassList(link, rootHandle)
	if err != nil {
		return 0, 0, fmt.Errorf("list classes of %s: %w", name, err)
	}
	for _, c := range classes {
		h, ok := c.(*netlink.HtbClass)
		if !ok || h.Attrs().Parent != linkHandle || parkedClass(h) {
			continue
		}
		_, minor := netlink.MajorMinor(h.Attrs().Handle)
		switch {
		case minor == unsharedMinor:
			unshared = h.Rate * 8
		case minor == linkMinor || ours[minor]:
		default:
			foreign += h.Rate * 8
		}
	}
	return foreign, unshared, nil
}

// assuredClass is the share class 1:minor on link, under the link class,
// assured rate bits/s (its floor and part of the excess) and held to its
// ceiling; bursts and quantum as shareClass makes them.
func assuredClass(link netlink.Link, minor uint16, rates classRates, rate uint64) *netlink.HtbClass {
	attrs := netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: linkHandle, Handle: netlink.MakeHandle(1, minor)}
	buf := htbBuffer(rates.ceil)
	return netlink.NewHtbClass(attrs, netlink.HtbClassAttrs{Rate: rate, Ceil: rates.ceil, Buffer: buf, Cbuffer: buf, Quantum: rates.quantum()})
}

// releaseExcess forgets key's classes and sets again the rates of the
// borrowers it leaves on each device, under its parent's lock: what its
// floor and part assured is theirs now. A failure is logged, not returned:
// the share is gone either way, and the others still have their floors.
func (p *NICPreparer) releaseExcess(ctx context.Context, key, parentName string) {
	again := p.forgetExcessShare(key)
	if len(again) == 0 {
		return
	}
	parent, err := p.h.LinkByName(parentName)
	if err != nil {
		return
	}
	unlock, err := p.lockParent(parent)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Setting borrowing shares' rates after an unprepare", "parent", parentName)
		return
	}
	defer unlock()
	for _, idx := range again {
		if err := p.assureExcess(ctx, idx); err != nil {
			klog.FromContext(ctx).Error(err, "Setting borrowing shares' rates after an unprepare; the link's excess is lent round-robin meanwhile", "parent", parentName)
		}
	}
}
