package estimate

import (
	resourceapi "k8s.io/api/resource/v1"
)

// taken is what the pod's earlier requests take of one device's capacity
// (cap -1: the whole device).
type taken struct {
	d     *Device
	cap   int
	value int64
}

// nodePicks is what Picks found on one node.
type nodePicks struct {
	picks []Pick
	ok    bool
}

// Picks predicts the device each request gets on node, in request order. It
// reports false when some request finds no device with room there. The
// answer is kept, so ShareFit, Topology and Reserve see the same picks and
// pay for them once; callers must not modify it.
func (e *Estimate) Picks(node string) ([]Pick, bool) {
	if e == nil {
		return nil, false
	}
	if v, ok := e.picked.Load(node); ok {
		p := v.(*nodePicks)
		return p.picks, p.ok
	}
	picks, ok := e.pick(node)
	e.picked.Store(node, &nodePicks{picks: picks, ok: ok})
	return picks, ok
}

func (e *Estimate) pick(node string) ([]Pick, bool) {
	devices := e.nodes[node]
	var mine []taken
	picks := make([]Pick, 0, len(e.Requests))
	for i := range e.Requests {
		r := &e.Requests[i]
		found := false
		for _, d := range devices {
			if !r.sel.match(d) {
				continue
			}
			util, ok := e.fit(d, r, mine)
			if !ok {
				continue
			}
			if !d.Shareable {
				mine = append(mine, taken{d: d, cap: -1})
			}
			for ci, c := range d.caps {
				if d.Shareable {
					v, _ := consume(want(r, c.name), c.dc)
					mine = append(mine, taken{d: d, cap: ci, value: v})
				}
			}
			picks = append(picks, Pick{Request: r, Device: d, Utilization: util})
			found = true
			break
		}
		if !found {
			return picks, false
		}
	}
	return picks, true
}

// want is the request's amount of a capacity, nil when it names none.
func want(r *Request, n resourceapi.QualifiedName) *int64 {
	if v, ok := r.want[n]; ok {
		return &v
	}
	return nil
}

// fit says whether r fits on d beside what is allocated and what the pod
// already took, and the device's mean fill afterwards.
func (e *Estimate) fit(d *Device, r *Request, mine []taken) (float64, bool) {
	have := 0
	for _, c := range d.caps {
		if w, ok := r.want[c.name]; ok {
			if !d.Shareable && w > c.total {
				return 0, false // a whole device must have what is asked
			}
			have++
		}
	}
	if have != len(r.want) {
		return 0, false // the request names a capacity the device lacks
	}
	if !d.Shareable {
		if e.ledger.HeldAt(d.ID, e.at) {
			return 0, false
		}
		for _, t := range mine {
			if t.d == d {
				return 0, false
			}
		}
		return 1, true
	}
	if len(d.caps) == 0 {
		return 0, true // shared without limit
	}
	var sum float64
	for ci, c := range d.caps {
		v, ok := consume(want(r, c.name), c.dc)
		if !ok {
			return 0, false
		}
		used := v + e.ledger.UsedAt(d.ID, c.name, e.at)
		for _, t := range mine {
			if t.d == d && t.cap == ci {
				used += t.value
			}
		}
		if used > c.total {
			return 0, false
		}
		if c.total > 0 {
			sum += float64(used) / float64(c.total)
		} else {
			sum++
		}
	}
	return sum / float64(len(d.caps)), true
}
