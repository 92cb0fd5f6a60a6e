package prepare

import (
	"hash/fnv"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// claimLocks is a set of striped mutexes keyed by claim UID.
type claimLocks struct {
	stripes [64]sync.Mutex
}

// lock takes the stripes of all uids in a fixed order, so that two calls
// sharing claims cannot deadlock, and returns the unlock.
func (l *claimLocks) lock(uids []types.UID) func() {
	var idx []int
	seen := map[int]bool{}
	for _, u := range uids {
		h := fnv.New32a()
		h.Write([]byte(u))
		i := int(h.Sum32() % uint32(len(l.stripes)))
		if !seen[i] {
			seen[i] = true
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		l.stripes[i].Lock()
	}
	return func() {
		for j := len(idx) - 1; j >= 0; j-- {
			l.stripes[idx[j]].Unlock()
		}
	}
}
