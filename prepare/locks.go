package prepare

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// claimLocks holds one mutex per claim UID in use, so that calls for
// different claims never wait on each other (striped locks made a hundred
// concurrent claims queue behind unrelated ones sharing a stripe).
type claimLocks struct {
	mu    sync.Mutex
	locks map[types.UID]*claimLock
}

type claimLock struct {
	sync.Mutex
	refs int
}

// lock takes the locks of all uids in sorted order, so that two calls
// sharing claims cannot deadlock, and returns the unlock.
func (l *claimLocks) lock(uids []types.UID) func() {
	sorted := slices.Clone(uids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	held := make([]*claimLock, len(sorted))
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[types.UID]*claimLock{}
	}
	for i, u := range sorted {
		c, ok := l.locks[u]
		if !ok {
			c = &claimLock{}
			l.locks[u] = c
		}
		c.refs++
		held[i] = c
	}
	l.mu.Unlock()
	for _, c := range held {
		c.Lock()
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
		l.mu.Lock()
		for i, u := range sorted {
			if held[i].refs--; held[i].refs == 0 {
				delete(l.locks, u)
			}
		}
		l.mu.Unlock()
	}
}
