package estimate

import (
	resourceapi "k8s.io/api/resource/v1"
)

// taken is what the pod's earlier requests take of one device's capacity.
type taken struct {
	d     *Device
	cap   int
	value int64
}

// Picks predicts the device each request gets on node, in request order. It
// reports false when some request finds no device with room there.
func (e *Estimate) Picks(node string) ([]Pick, bool) {
	if e == nil {
		return nil, false
	}
	devices := e.nodes[node]
	var mine []taken
	picks := make([]Pick, 0, len(e.Requests))
	for i := range e.Requests {
		r := &e.Requests[i]
		found := false
		for _, d := range devices {
			util, ok := e.fit(d, r, mine)
			if !ok {
				continue
			}
			for ci, c := range d.caps {
				v, _ := consume(want(r, c.name), c.dc)
				mine = append(mine, taken{d: d, cap: ci, value: v})
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
		if _, ok := r.want[c.name]; ok {
			have++
		}
	}
	if have != len(r.want) || len(d.caps) == 0 {
		return 0, false // the request names a capacity the device lacks
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
