package netdev

import (
	"fmt"

	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// The shares a parent holds are counted here, by the parent's name, from a
// prepare's start to its unprepare (and taken back from the checkpoint at
// Restore): a parent takes no share past its limit, the "shares" capacity
// it is published with. The scheduler keeps to that capacity already; this
// holds where the scheduler did not (a claim allocated by hand, a capacity
// that shrank as NICs were added), before anything of the share is made.
// They are this agent's count: the other agent of a rolling update keeps its
// own.

// shareLimit is how many shares dev may hold: the "shares" capacity it was
// published with, never more than the node config's netdev.maxSharesPerNIC.
func (p *NICPreparer) shareLimit(dev slices.Entry) int64 {
	limit := p.opts.Config.SharesPerNIC()
	if c, ok := dev.Device.Capacity[names.CapShares]; ok {
		limit = min(limit, c.Value.Value())
	}
	return limit
}

// holdShare counts key among parent's shares, unless parent holds limit
// already, and says whether it was not counted before (a share prepared
// again is not counted twice).
func (p *NICPreparer) holdShare(parent, key string, limit int64) (added bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.held[parent]
	if set[key] {
		return false, nil
	}
	if int64(len(set)) >= limit {
		return false, fmt.Errorf("NIC %s already holds %d shares, its limit of %d (its %q capacity, at most the node config's netdev.maxSharesPerNIC): this share is refused, and nothing of it was made",
			parent, len(set), limit, names.CapShares)
	}
	if set == nil {
		set = map[string]bool{}
		p.held[parent] = set
	}
	set[key] = true
	return true, nil
}

// releaseShare stops counting key, on whichever parent it was.
func (p *NICPreparer) releaseShare(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for parent, set := range p.held {
		delete(set, key)
		if len(set) == 0 {
			delete(p.held, parent)
		}
	}
}
