package slices

import (
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func sortDevices(devices []resourceapi.Device) {
	sort.Slice(devices, func(i, j int) bool { return devices[i].Name < devices[j].Name })
}

// split cuts the pool into slices the API accepts. In resource.k8s.io/v1 a
// slice holds either counter sets (at most 8) or devices, never both; it
// holds at most 128 devices, or 64 where one of them consumes counters. A
// pool with nothing still gets one empty slice, so that a node with nothing
// to offer says so rather than leaving stale slices behind.
func split(devices []resourceapi.Device, counterSets []resourceapi.CounterSet) []resourceslice.Slice {
	var out []resourceslice.Slice
	for len(counterSets) > 0 {
		n := min(resourceapi.ResourceSliceMaxCounterSets, len(counterSets))
		out = append(out, resourceslice.Slice{SharedCounters: counterSets[:n:n]})
		counterSets = counterSets[n:]
	}
	var cur []resourceapi.Device
	advanced := false
	for _, d := range devices {
		limit := resourceapi.ResourceSliceMaxDevices
		if advanced || len(d.ConsumesCounters) > 0 {
			limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
		if len(cur) >= limit {
			out = append(out, resourceslice.Slice{Devices: cur})
			cur, advanced = nil, false
		}
		cur = append(cur, d)
		advanced = advanced || len(d.ConsumesCounters) > 0
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, resourceslice.Slice{Devices: cur})
	}
	return out
}
