package netdev

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
)

// Parked class blocks. The kernel walks every class of an HTB each time a
// class is added or deleted (tc_bind_tclass, to rebind filters to it): on a
// parent holding 1,000 shares, ten classes a share and direction, one add or
// delete cost about 6 ms, and a share is 20 adds to prepare and 20 deletes to
// reap. Changing a class walks nothing. So the reaper does not delete an
// unprepared share's block of classes: it parks it, and the next share on
// that device takes it over by changes.
//
//   - A parked block keeps its classes and leaves; no frame reaches it, as
//     the share's classifier entries went at unprepare. Its share class's
//     ceil burst is set half again past its burst (a share's class has the
//     two equal; HTB keeps no priority for a class with children, so that
//     cannot mark it): the mark is in the kernel, so an agent that
//     restarts, or another agent, tells a parked block from a share's.
//   - HTB's per-class counters carry over. The drops a block had counted
//     when it was parked become the base of the share that takes it
//     (undoRecord.EgressDropBase, IngressDropBase), which the metrics and
//     carve shares subtract.
//   - A device whose shares are all gone is removed, its parked blocks with
//     it. At most maxParked blocks wait on a device; past that a block is
//     deleted, so the classes a burst of deletions leaves are bounded.

// maxParked bounds the parked blocks on one device.
const maxParked = 128

// parkedClass reports whether c carries the parked mark. The kernel keeps
// bursts in scheduler ticks, and netlink converts them back to bytes: a mark
// of half the burst (at least 8 KiB) survives the rounding at any rate.
func parkedClass(c *netlink.HtbClass) bool { return c.Cbuffer > c.Buffer }

// parkedOwner holds a parked block's minors in a device's minor set.
const parkedOwner = "\x00parked"

// parkedBlock is a block of classes waiting for a share.
type parkedBlock struct {
	base  uint16
	flows bool   // the share class has flow children
	drops uint64 // what HTB had counted on its classes when parked
}

// blockHandles are the classes of the block from base: the share class and,
// with flows, its children.
func blockHandles(base uint16, flows bool) []uint32 {
	out := []uint32{netlink.MakeHandle(1, base)}
	if flows {
		for i := range flowChildren {
			out = append(out, netlink.MakeHandle(1, base+bpf.FlowSparseChild+uint16(i)))
		}
	}
	return out
}

// retiredBlock is a block of classes a share no longer holds, retired in
// the kernel (parked, or deleted), not yet handed on in this agent's record
// (publishRetired): that waits until the share's removal records it on disk,
// so that a crash never has a share's removal act again on a block that
// another share took meanwhile.
type retiredBlock struct {
	device string
	key    string
	base   uint16
	parked bool
	block  parkedBlock
	// heldBy is the other share whose record names the block, where it
	// is contested, or parkedOwner where it is parked already: it stays
	// as it is.
	heldBy string
}

// retireBlock takes key's block from base off link (an egress shaper or an
// IFB) once its share is unprepared: parked while fewer than maxParked wait
// there, deleted otherwise. rate is the share's class rate; 0 (an item an
// older carve queued, or a block not aligned as this carve makes them) is
// deleted. A block another share's record also names (an unprepare retried
// after a restart, whose share's block went on to another) is left alone.
// The caller holds the parent's lock, or the block is still the share's
// alone (retireAtUnprepare).
func (p *NICPreparer) retireBlock(link netlink.Link, key string, base uint16, flows bool, rate uint64) (retiredBlock, error) {
	dev := link.Attrs().Name
	out := retiredBlock{device: dev, key: key, base: base}
	p.mu.Lock()
	room := len(p.parked[dev]) < maxParked
	out.heldBy = p.otherHolder(dev, key, base)
	if p.minors[dev][base] == parkedOwner {
		// Retired and handed on already (an unprepare retried): what
		// the block is now is not this share's to change.
		out.heldBy = parkedOwner
	}
	p.mu.Unlock()
	if out.heldBy != "" {
		return out, nil
	}
	if rate == 0 || !room || (base-minMinor)%classBlock != 0 {
		return out, deleteShareClass(p.h, link, base, flows)
	}
	under, err := p.shareParent(link)
	if err != nil {
		return out, err
	}
	p.mu.Lock()
	if set, ok := p.queuesSet[blockKey{device: dev, ifindex: link.Attrs().Index, base: base}]; ok && set.key != key {
		// Its children were last set for another share than this one,
		// which this agent did not prepare on them (another agent
		// did, or an earlier one): not known any more.
		delete(p.queuesSet, blockKey{device: dev, ifindex: link.Attrs().Index, base: base})
	}
	p.mu.Unlock()
	if err := p.h.ClassChange(shareClass(link, under, base, hardCap(rate), p.parkMark)); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return out, nil // gone, and its children with it
		}
		return out, fmt.Errorf("park HTB class 1:%x on %s: %w", base, dev, err)
	}
	// The children are asked for whatever the record says: an unprepare
	// with no record does not know whether the share had them.
	states, err := p.classStates(link.Attrs().Index, blockHandles(base, true))
	if err != nil {
		return out, err
	}
	var drops uint64
	for i, st := range states {
		drops += st.drops
		flows = flows || (i > 0 && st.exists)
	}
	// And what an fq_codel leaf dropped, which HTB's counts miss.
	leaves := p.fqCodelLeafDrops(link)
	for _, h := range blockHandles(base, flows) {
		drops += leaves[h]
	}
	out.parked, out.block = true, parkedBlock{base: base, flows: flows, drops: drops}
	return out, nil
}

// otherHolder is a share other than key that holds the block from base on
// device by this agent's record, or ""; the caller holds mu.
func (p *NICPreparer) otherHolder(device, key string, base uint16) string {
	for k, bases := range p.blocks[device] {
		if k != key && slices.Contains(bases, base) {
			return k
		}
	}
	return ""
}

// publishRetired hands on, in this agent's record, the blocks retired for
// their shares: a parked one waits for the next share on its device, a
// deleted one's minors are free. A contested block (retireBlock) stays the
// other share's.
func (p *NICPreparer) publishRetired(blocks []retiredBlock) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rb := range blocks {
		if byKey := p.blocks[rb.device]; byKey != nil {
			byKey[rb.key] = slices.DeleteFunc(byKey[rb.key], func(b uint16) bool { return b == rb.base })
			if len(byKey[rb.key]) == 0 {
				delete(byKey, rb.key)
			}
			if len(byKey) == 0 {
				delete(p.blocks, rb.device)
			}
		}
		set := p.minorSet(rb.device)
		for m := rb.base; m < rb.base+classBlock && m >= rb.base; m++ {
			switch owner, used := set[m]; {
			case used && owner != rb.key:
			case rb.heldBy != "":
				set[m] = rb.heldBy
			case rb.parked:
				set[m] = parkedOwner
			default:
				delete(set, m)
			}
		}
		if len(set) == 0 {
			delete(p.minors, rb.device)
		}
		if rb.parked {
			p.parked[rb.device] = append(p.parked[rb.device], rb.block)
		}
	}
}

// takeParked hands key a parked block of device, if one waits; the caller
// holds mu. Blocks are parked only within a boot, so every one has the shape
// this kernel's shares get: flow children where it has no fq_codel.
func (p *NICPreparer) takeParked(device, key string) (parkedBlock, bool) {
	list := p.parked[device]
	if len(list) == 0 {
		return parkedBlock{}, false
	}
	pb := list[len(list)-1]
	p.parked[device] = list[:len(list)-1]
	set := p.minorSet(device)
	for m := pb.base; m < pb.base+classBlock && m >= pb.base; m++ {
		set[m] = key
	}
	p.noteBlock(device, key, pb.base)
	return pb, true
}

// forgetParked drops what this agent knows of device's parked blocks: the
// device was removed, or a parked class was found gone.
func (p *NICPreparer) forgetParked(device string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for m, owner := range p.minors[device] {
		if owner == parkedOwner {
			delete(p.minors[device], m)
		}
	}
	if len(p.minors[device]) == 0 {
		delete(p.minors, device)
	}
	delete(p.parked, device)
	delete(p.scanned, device)
	for k := range p.queuesSet {
		if k.device == device {
			delete(p.queuesSet, k)
		}
	}
}

// adoptParked learns, once per device in this agent's life, the blocks parked
// there before it started (by an agent that restarted, or by the one before
// a rolling update): one dump of the device's classes, under the parent's
// lock, at the first share this agent puts on it.
func (p *NICPreparer) adoptParked(link netlink.Link) error {
	dev := link.Attrs().Name
	p.mu.Lock()
	done := p.scanned[dev]
	p.mu.Unlock()
	if done {
		return nil
	}
	classes, err := p.h.ClassList(link, rootHandle)
	if err != nil {
		return fmt.Errorf("list classes of %s: %w", dev, err)
	}
	found := map[uint16]*parkedBlock{}
	for _, c := range classes {
		htb, ok := c.(*netlink.HtbClass)
		_, minor := netlink.MajorMinor(c.Attrs().Handle)
		if ok && topLevel(c) && parkedClass(htb) && minor >= minMinor && (minor-minMinor)%classBlock == 0 {
			found[minor] = &parkedBlock{base: minor}
		}
	}
	leaves := leafDrops(p.h, link)
	for _, c := range classes {
		_, minor := netlink.MajorMinor(c.Attrs().Handle)
		pb := found[minor]
		if pb == nil {
			if _, pminor := netlink.MajorMinor(c.Attrs().Parent); found[pminor] != nil {
				pb = found[pminor]
				pb.flows = true
			}
		}
		if pb != nil && c.Attrs().Statistics != nil && c.Attrs().Statistics.Queue != nil {
			pb.drops += uint64(c.Attrs().Statistics.Queue.Drops) + leaves[c.Attrs().Handle]
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scanned[dev] = true
	set := p.minorSet(dev)
	known := map[uint16]bool{}
	for _, pb := range p.parked[dev] {
		known[pb.base] = true
	}
next:
	for base, pb := range found {
		if known[base] {
			continue
		}
		for m := base; m < base+classBlock && m >= base; m++ {
			if _, used := set[m]; used {
				// A queued share's, being reaped: the reaper
				// parks it again and knows it then.
				continue next
			}
		}
		for m := base; m < base+classBlock && m >= base; m++ {
			set[m] = parkedOwner
		}
		p.parked[dev] = append(p.parked[dev], *pb)
	}
	return nil
}

// retireAtUnprepare retires the unprepared share's blocks at once, so that
// the next share on the device can take them: the reaper's batches wait a
// moment to gather, and a pod started meanwhile would pay for adding
// classes. It zeroes in u the minors it retired, and reports whether it did
// any: the reaper then checks only whether the parent's shaper and IFB are
// idle. What it cannot do here (the parent or a device gone, an older
// carve's HTB at the parent's root, an error) stays the reaper's. The
// blocks are handed on (publishRetired) once the reaper's queue holds the
// share.
//
// It takes no parent's lock: until publishRetired the blocks are the
// share's alone in this agent's record (no pick hands out their minors,
// adoptParked passes them over, and the devices are not idle while they
// are held), and another agent takes a parked block only after checking,
// under the lock, that the kernel shows it parked, which a park changes
// in one request. A hundred unprepares at once queued on the lock for
// some twenty requests each (issue 44).
func (p *NICPreparer) retireAtUnprepare(key string, u *undoRecord, egressRate, ingressRate uint64) ([]retiredBlock, bool) {
	if u.Parent == "" || (u.EgressMinor == 0 && u.IngressMinor == 0) {
		return nil, false
	}
	parent, err := p.linkRef(u.Parent)
	if err != nil {
		return nil, false
	}
	var out []retiredBlock
	retire := func(dev string, minor *uint16, rate uint64) {
		link, err := p.linkRef(dev)
		if err != nil {
			return
		}
		rb, err := p.retireBlock(link, key, *minor, u.FlowClasses, rate)
		if err != nil {
			return
		}
		out = append(out, rb)
		*minor = 0
	}
	if u.EgressMinor != 0 && !p.parentRootIsHTB(parent) {
		retire(egressShaperName(parent.Attrs().Index), &u.EgressMinor, egressRate)
	}
	if u.IngressMinor != 0 {
		retire(ifbName(parent), &u.IngressMinor, ingressRate)
	}
	return out, len(out) > 0
}
