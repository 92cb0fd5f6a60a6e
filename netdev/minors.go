package netdev

import (
	"fmt"
	"slices"
)

// The HTB class minors in use are kept twice, under mu: by device, each
// minor with the key of the share that holds it (minors), for finding a free
// block; and by device and share, the first minor of each block the share
// holds there (blocks), so that a share's own blocks are found, and freed,
// without going through every minor of the device: a parent holding 1,000
// shares has 16,000 minors in use on each of its two devices.

// minorSet is the HTB class minors in use on a parent device, each with
// the key of the share that holds it; the caller holds mu.
func (p *NICPreparer) minorSet(parent string) map[uint16]string {
	s, ok := p.minors[parent]
	if !ok {
		s = map[uint16]string{}
		p.minors[parent] = s
	}
	return s
}

// noteBlock records that key holds the block from base on device; the
// caller holds mu.
func (p *NICPreparer) noteBlock(device, key string, base uint16) {
	byKey, ok := p.blocks[device]
	if !ok {
		byKey = map[string][]uint16{}
		p.blocks[device] = byKey
	}
	if !slices.Contains(byKey[key], base) {
		byKey[key] = append(byKey[key], base)
	}
}

// minorPick is the block of class minors a share gets on a device.
type minorPick struct {
	minor uint16
	// own: the block is the share's already, or was parked (park.go):
	// its classes may exist, and are changed rather than added.
	own bool
	// parked: the block was parked, its classes made for another share;
	// flows, it has flow children; drops is what HTB had counted on them.
	parked, flows bool
	drops         uint64
	// parkedHere: the kernel says this agent parked the block (its
	// rate carries this agent's parkMark).
	parkedHere bool
}

// pickMinor returns key's class minor on a device: its own if it has one,
// else a parked block's, else the first of a free block of classBlock minors
// from its preferred one on. The whole block is key's: its class's children
// (flows.go) are the next minors. taken is set where the kernel said a pick
// was another's: then no parked block is handed out either.
func (p *NICPreparer) pickMinor(device, key string, taken map[uint16]uint64) (minorPick, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if bases := p.blocks[device][key]; len(bases) > 0 {
		return minorPick{minor: slices.Min(bases), own: true}, nil
	}
	if taken == nil {
		if pb, ok := p.takeParked(device, key); ok {
			return minorPick{minor: pb.base, own: true, parked: true, flows: pb.flows, drops: pb.drops}, nil
		}
	}
	set := p.minorSet(device)
	blocks := int(maxMinor-minMinor) / classBlock
	start := int(preferredMinor(key)-minMinor) / classBlock
	for i := range blocks {
		base := minMinor + uint16(((start+i)%blocks)*classBlock)
		if !blockFree(base, set, taken) {
			continue
		}
		for m := base; m < base+classBlock; m++ {
			set[m] = key
		}
		p.noteBlock(device, key, base)
		return minorPick{minor: base}, nil
	}
	return minorPick{}, fmt.Errorf("no free HTB class on %s", device)
}

// blockFree reports whether no minor of the block from base is in use.
func blockFree(base uint16, set map[uint16]string, taken map[uint16]uint64) bool {
	for m := base; m < base+classBlock; m++ {
		if _, used := set[m]; used {
			return false
		}
		if _, exists := taken[m]; exists {
			return false
		}
	}
	return true
}

// reserveBlock marks the block from minor on device as key's (a share's
// classes known from its record); a share of an older carve, with one
// class, keeps just its minor. The caller holds mu.
func (p *NICPreparer) reserveBlock(device, key string, minor uint16, flows bool) {
	set := p.minorSet(device)
	p.noteBlock(device, key, minor)
	if !flows {
		set[minor] = key
		return
	}
	for m := minor; m < minor+classBlock && m >= minor; m++ {
		set[m] = key
	}
}

// freeMinors gives back every class minor key holds.
func (p *NICPreparer) freeMinors(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for device, byKey := range p.blocks {
		for _, base := range byKey[key] {
			p.releaseBlock(device, key, base)
		}
		delete(byKey, key)
		if len(byKey) == 0 {
			delete(p.blocks, device)
		}
	}
}

// unpickMinor gives back the block that pickMinor handed key from minor
// but that the kernel says is taken.
func (p *NICPreparer) unpickMinor(device string, minor uint16, key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseBlock(device, key, minor)
	if byKey := p.blocks[device]; byKey != nil {
		byKey[key] = slices.DeleteFunc(byKey[key], func(b uint16) bool { return b == minor })
		if len(byKey[key]) == 0 {
			delete(byKey, key)
		}
	}
}

// releaseBlock frees the minors of the block from base on device that key
// holds; the caller holds mu and updates blocks.
func (p *NICPreparer) releaseBlock(device, key string, base uint16) {
	set := p.minors[device]
	for m := base; m < base+classBlock && m >= base; m++ {
		if set[m] == key {
			delete(set, m)
		}
	}
	if len(set) == 0 {
		delete(p.minors, device)
	}
}

// othersHoldClasses reports whether, by this agent's own record, a share
// other than those in keys holds classes on device (queued for the reaper
// or not): then the device is not idle, and the reaper need not ask the
// kernel, dumping every class of the device under the parent's lock.
func (p *NICPreparer) othersHoldClasses(device string, keys map[string]bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key := range p.blocks[device] {
		if !keys[key] {
			return true
		}
	}
	return false
}
