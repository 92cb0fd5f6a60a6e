package netdev

import (
	"fmt"
	"maps"
)

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

// pickMinor returns key's class minor on a device: its own if it has one
// (own is then true: its class may exist already), else the first of a free
// block of classBlock minors from its preferred one on. The whole block is
// key's: its class's children (flows.go) are the next minors.
func (p *NICPreparer) pickMinor(device, key string, taken map[uint16]uint64) (minor uint16, own bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(device)
	first, mine := uint16(0), false
	for m, k := range set {
		if k == key && (!mine || m < first) {
			first, mine = m, true
		}
	}
	if mine {
		return first, true, nil
	}
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
		return base, false, nil
	}
	return 0, false, fmt.Errorf("no free HTB class on %s", device)
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

// reserveBlock marks the block from minor as key's (a share's classes known
// from its record); a share of an older carve, with one class, keeps just
// its minor. The caller holds mu.
func reserveBlock(set map[uint16]string, key string, minor uint16, flows bool) {
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
	for _, set := range p.minors {
		maps.DeleteFunc(set, func(_ uint16, k string) bool { return k == key })
	}
}

// unpickMinor gives back the block that pickMinor handed key from minor
// but that the kernel says is taken.
func (p *NICPreparer) unpickMinor(device string, minor uint16, key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(device)
	for m := minor; m < minor+classBlock && m >= minor; m++ {
		if set[m] == key {
			delete(set, m)
		}
	}
}
