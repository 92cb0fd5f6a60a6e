package estimate

import (
	"maps"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
)

// shares is what alloc takes of the driver's devices. Admin access takes
// nothing.
func (l *Ledger) shares(alloc *resourceapi.AllocationResult) []share {
	if alloc == nil {
		return nil
	}
	var out []share
	for _, r := range alloc.Devices.Results {
		if r.Driver != l.driver || (r.AdminAccess != nil && *r.AdminAccess) {
			continue
		}
		s := share{id: structured.MakeDeviceID(r.Driver, r.Pool, r.Device)}
		if r.ShareID == nil {
			s.whole = true
		} else {
			if len(r.ConsumedCapacity) == 0 {
				continue
			}
			s.consumed = make(map[resourceapi.QualifiedName]int64, len(r.ConsumedCapacity))
			for n, q := range r.ConsumedCapacity {
				s.consumed[n] = q.Value()
			}
		}
		out = append(out, s)
	}
	return out
}

// update changes the claim's entry with change and the totals with it.
func (l *Ledger) update(uid types.UID, change func(*entry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.claims[uid]
	if e == nil {
		e = &entry{version: -1}
	}
	observed, pending := e.observed, e.pending
	change(e)
	// Most informer events change nothing the ledger counts; they leave
	// the totals and the journal alone.
	if !equalShares(observed, e.observed) || !equalShares(pending, e.pending) {
		l.apply(observed, -1)
		l.apply(pending, -1)
		l.apply(e.observed, 1)
		l.apply(e.pending, 1)
	}
	if len(e.pending) > 0 {
		l.held[uid] = struct{}{}
	} else {
		delete(l.held, uid)
	}
	if len(e.observed) == 0 && len(e.pending) == 0 {
		delete(l.claims, uid)
	} else {
		l.claims[uid] = e
	}
}

func (l *Ledger) apply(shares []share, sign int64) {
	for _, s := range shares {
		if s.whole {
			if l.whole[s.id] += int(sign); l.whole[s.id] <= 0 {
				delete(l.whole, s.id)
			}
			l.log.add(s.id, "", sign)
			continue
		}
		m := l.used[s.id]
		if m == nil {
			m = map[resourceapi.QualifiedName]int64{}
			l.used[s.id] = m
		}
		for n, v := range s.consumed {
			m[n] += sign * v
			l.log.add(s.id, n, sign*v)
		}
		empty := true
		for _, v := range m {
			if v != 0 {
				empty = false
			}
		}
		if empty {
			delete(l.used, s.id)
		}
	}
}

// Mark is the ledger's present state, for UsedAt and HeldAt to read later.
func (l *Ledger) Mark() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.log.seq
}

// Used is how much of capacity name the shares of device id consume.
func (l *Ledger) Used(id structured.DeviceID, name resourceapi.QualifiedName) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.used[id][name]
}

// UsedAt is Used as it was at mark at (the present where the journal no
// longer reaches back that far).
func (l *Ledger) UsedAt(id structured.DeviceID, name resourceapi.QualifiedName, at uint64) int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	d, _ := l.log.since(at, id, name)
	return l.used[id][name] - d
}

// Held says whether an allocation holds device id whole.
func (l *Ledger) Held(id structured.DeviceID) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.whole[id] > 0
}

// HeldAt is Held as it was at mark at.
func (l *Ledger) HeldAt(id structured.DeviceID, at uint64) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	d, _ := l.log.since(at, id, "")
	return int64(l.whole[id])-d > 0
}

// equalShares says whether a and b take the same of the same devices.
func equalShares(a, b []share) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].id != b[i].id || a[i].whole != b[i].whole || !maps.Equal(a[i].consumed, b[i].consumed) {
			return false
		}
	}
	return true
}
