package estimate

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Picks predicts the device each request gets on node, in request order. It
// reports false when some request finds no device with room there.
func (e *Estimate) Picks(node string) ([]Pick, bool) {
	if e == nil {
		return nil, false
	}
	devices := e.nodes[node]
	// What this pod's earlier requests take, per device and capacity.
	var mine map[*Device]map[resourceapi.QualifiedName]int64
	picks := make([]Pick, 0, len(e.Requests))
	for i := range e.Requests {
		r := &e.Requests[i]
		found := false
		for _, d := range devices {
			take, util, ok := e.fit(d, r, mine[d])
			if !ok {
				continue
			}
			if mine == nil {
				mine = map[*Device]map[resourceapi.QualifiedName]int64{}
			}
			if mine[d] == nil {
				mine[d] = map[resourceapi.QualifiedName]int64{}
			}
			for n, v := range take {
				mine[d][n] += v
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

// fit says whether r fits on d beside what is allocated and what the pod
// already took (taken), what it would consume, and the device's mean fill
// afterwards.
func (e *Estimate) fit(d *Device, r *Request, taken map[resourceapi.QualifiedName]int64) (map[resourceapi.QualifiedName]int64, float64, bool) {
	for n := range r.Capacity {
		if _, ok := d.Capacity[n]; !ok {
			return nil, 0, false
		}
	}
	take := make(map[resourceapi.QualifiedName]int64, len(d.Capacity))
	var sum float64
	allocated := e.consumed[d.ID]
	for n, c := range d.Capacity {
		var want *resource.Quantity
		if q, ok := r.Capacity[n]; ok {
			want = &q
		}
		v, ok := consume(want, c)
		if !ok {
			return nil, 0, false
		}
		total := c.Value.Value()
		used := v + taken[n]
		if q := allocated[n]; q != nil {
			used += q.Value()
		}
		if used > total {
			return nil, 0, false
		}
		take[n] = v
		if total > 0 {
			sum += float64(used) / float64(total)
		} else {
			sum++
		}
	}
	util := 1.0
	if len(d.Capacity) > 0 {
		util = sum / float64(len(d.Capacity))
	}
	return take, util, true
}
