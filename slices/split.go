package slices

import (
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func sortDevices(devices []resourceapi.Device) {
	sort.Slice(devices, func(i, j int) bool { return devices[i].Name < devices[j].Name })
}

// split cuts the pool's devices into slices of at most max devices. A pool
// with no devices still gets one empty slice, so that a node with nothing to
// offer says so rather than leaving stale slices behind.
func split(devices []resourceapi.Device, max int) []resourceslice.Slice {
	if len(devices) == 0 {
		return []resourceslice.Slice{{}}
	}
	var out []resourceslice.Slice
	for len(devices) > 0 {
		n := min(max, len(devices))
		out = append(out, resourceslice.Slice{Devices: devices[:n:n]})
		devices = devices[n:]
	}
	return out
}
