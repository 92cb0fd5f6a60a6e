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

// retireBlock takes key's block from base off link (an egress shaper or an
// IFB) once its share is unprepared: parked while fewer than maxParked wait
// there, deleted otherwise. rate is the share's class rate; 0 (an item an
// older carve queued, or a block not aligned as this carve makes them) is
// deleted.
func (p *NICPreparer) retireBlock(link netlink.Link, key string, base uint16, flows bool, rate uint64) error {
	dev := link.Attrs().Name
	p.mu.Lock()
	room := len(p.parked[dev]) < maxParked
	p.mu.Unlock()
	if rate == 0 || !room || (base-minMinor)%classBlock != 0 {
		return deleteShareClass(p.h, link, base, flows)
	}
	if err := p.h.ClassChange(shareClass(link, base, rate, true)); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone, and its children with it
		}
		return fmt.Errorf("park HTB class 1:%x on %s: %w", base, dev, err)
	}
	drops, err := p.classDropsOf(link.Attrs().Index, blockHandles(base, flows))
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(dev)
	for m := base; m < base+classBlock && m >= base; m++ {
		if owner, used := set[m]; !used || owner == key {
			set[m] = parkedOwner
		}
	}
	if byKey := p.blocks[dev]; byKey != nil {
		byKey[key] = slices.DeleteFunc(byKey[key], func(b uint16) bool { return b == base })
		if len(byKey[key]) == 0 {
			delete(byKey, key)
		}
	}
	p.parked[dev] = append(p.parked[dev], parkedBlock{base: base, flows: flows, drops: drops})
	return nil
}

// takeParked hands key a parked block of device, if one waits; the caller
// holds mu. Blocks are parked only within a boot, so every one has the shape
// this kernel's shares get: flow children where it has no fq_codel.
func (p *NICPreparer) takeParked(device, key string) (parkedBlock, bool) {
	list := p.parked[device]
	for i := len(list) - 1; i >= 0; i-- {
		pb := list[i]
		p.parked[device] = slices.Delete(list, i, i+1)
		set := p.minorSet(device)
		for m := pb.base; m < pb.base+classBlock && m >= pb.base; m++ {
			set[m] = key
		}
		p.noteBlock(device, key, pb.base)
		return pb, true
	}
	return parkedBlock{}, false
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
			pb.drops += uint64(c.Attrs().Statistics.Queue.Drops)
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
