package slices

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// TaintKey is the key of the taint carve puts on a device it finds
// unhealthy: "<driver name>/unhealthy", carve.dev/unhealthy by default. Its
// value is the reason (LinkDown, XID79, DeviceGone).
func TaintKey(driverName string) string { return driverName + "/unhealthy" }

// WithTaints returns the resources with each device's taints added
// (taints by device name) and the devices of ghosts, devices no longer
// found but still published so that their taint reaches the claims on them,
// in a slice of their own. res is not changed.
func WithTaints(res resourceslice.DriverResources, taints map[string][]resourceapi.DeviceTaint, ghosts []resourceapi.Device) resourceslice.DriverResources {
	if len(taints) == 0 && len(ghosts) == 0 {
		return res
	}
	out := resourceslice.DriverResources{Pools: make(map[string]resourceslice.Pool, len(res.Pools))}
	for name, pool := range res.Pools {
		p := pool
		p.Slices = make([]resourceslice.Slice, len(pool.Slices))
		for i, s := range pool.Slices {
			p.Slices[i] = s
			if len(taints) == 0 {
				continue
			}
			p.Slices[i].Devices = make([]resourceapi.Device, len(s.Devices))
			for j, d := range s.Devices {
				if t, ok := taints[d.Name]; ok {
					d.Taints = append(append([]resourceapi.DeviceTaint(nil), d.Taints...), t...)
				}
				p.Slices[i].Devices[j] = d
			}
		}
		if len(ghosts) > 0 {
			g := make([]resourceapi.Device, 0, len(ghosts))
			for _, d := range ghosts {
				// Counters name counter sets that may be gone with it.
				d.ConsumesCounters = nil
				d.Taints = append(append([]resourceapi.DeviceTaint(nil), d.Taints...), taints[d.Name]...)
				g = append(g, d)
			}
			sortDevices(g)
			for len(g) > 0 {
				n := min(resourceapi.ResourceSliceMaxDevices, len(g))
				p.Slices = append(p.Slices, resourceslice.Slice{Devices: g[:n:n]})
				g = g[n:]
			}
		}
		out.Pools[name] = p
	}
	return out
}
