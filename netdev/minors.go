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
// (own is then true: its class may exist already), else its preferred one
// or the next free.
func (p *NICPreparer) pickMinor(device, key string, taken map[uint16]uint64) (minor uint16, own bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.minorSet(device)
	for m, k := range set {
		if k == key {
			return m, true, nil
		}
	}
	start := preferredMinor(key)
	for i := 0; i < int(maxMinor-minMinor); i++ {
		m := minMinor + uint16((int(start-minMinor)+i)%int(maxMinor-minMinor))
		if _, used := set[m]; used {
			continue
		}
		if _, exists := taken[m]; exists {
			continue
		}
		set[m] = key
		return m, false, nil
	}
	return 0, false, fmt.Errorf("no free HTB class on %s", device)
}

// freeMinors gives back every class minor key holds.
func (p *NICPreparer) freeMinors(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, set := range p.minors {
		maps.DeleteFunc(set, func(_ uint16, k string) bool { return k == key })
	}
}

// unpickMinor gives back a minor that pickMinor handed key but that the
// kernel says is taken.
func (p *NICPreparer) unpickMinor(device string, minor uint16, key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.minorSet(device)[minor] == key {
		delete(p.minorSet(device), minor)
	}
}
