package estimate

import (
	"context"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// selectors are the CEL selectors a request's devices must match: its
// class's, then its own. A set is interned by its expressions, so that a
// device's answer for it is computed once (slices are immutable, so is the
// answer) and looked up by a small number afterwards.
type selectors struct {
	id    uint32
	progs []cel.CompilationResult
}

// maxSelectorSets bounds the interned sets; past it the table starts anew
// (numbers are never reused, so devices' answers stay right).
const maxSelectorSets = 4096

var (
	celCache    = cel.NewCache(256, cel.Features{EnableConsumableCapacity: true})
	selectorsMu sync.Mutex
	selectorIDs uint32
	selectorSet = map[string]*selectors{}
)

// selectorsFor interns the selectors of class and request. An expression
// that does not compile matches no device, as the allocator fails on it.
func selectorsFor(class *resourceapi.DeviceClass, request []resourceapi.DeviceSelector) *selectors {
	var exprs []string
	for _, list := range [][]resourceapi.DeviceSelector{class.Spec.Selectors, request} {
		for _, s := range list {
			if s.CEL != nil {
				exprs = append(exprs, s.CEL.Expression)
			}
		}
	}
	key := strings.Join(exprs, "\x00")
	selectorsMu.Lock()
	defer selectorsMu.Unlock()
	if s, ok := selectorSet[key]; ok {
		return s
	}
	if len(selectorSet) >= maxSelectorSets {
		selectorSet = map[string]*selectors{}
	}
	selectorIDs++
	s := &selectors{id: selectorIDs}
	for _, x := range exprs {
		s.progs = append(s.progs, celCache.GetOrCompile(x))
	}
	selectorSet[key] = s
	return s
}

// match says whether device d passes every selector.
func (s *selectors) match(d *Device) bool {
	if s == nil || len(s.progs) == 0 {
		return true
	}
	if known := d.matches.Load(); known != nil {
		for _, m := range *known {
			if m.id == s.id {
				return m.ok
			}
		}
	}
	in := cel.Device{Driver: d.ID.Driver.String(), AllowMultipleAllocations: d.raw.AllowMultipleAllocations, Attributes: d.raw.Attributes, Capacity: d.raw.Capacity}
	ok := true
	for _, p := range s.progs {
		if p.Error != nil {
			ok = false
			break
		}
		matched, _, err := p.DeviceMatches(context.Background(), in)
		if err != nil || !matched {
			ok = false
			break
		}
	}
	for {
		old := d.matches.Load()
		var next []selectorMatch
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, selectorMatch{id: s.id, ok: ok})
		if d.matches.CompareAndSwap(old, &next) {
			return ok
		}
	}
}

// selectorMatch is a device's answer for one set of selectors. A device
// meets few sets (one per class and request selectors in use), so a short
// list read without locks is the fastest lookup.
type selectorMatch struct {
	id uint32
	ok bool
}
