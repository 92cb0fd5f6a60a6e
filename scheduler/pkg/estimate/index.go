package estimate

import (
	"fmt"
	"sort"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// index turns the scheduler's ResourceSlices into each node's devices of
// one driver. Slices from the informer are immutable (a change is a new
// object), so the devices of a slice are built once, and the node map is
// rebuilt only when the set of slices changed (the lister lists them in
// another order every time).
type index struct {
	driver   string
	mu       sync.Mutex
	last     map[*resourceapi.ResourceSlice]struct{}
	perSlice map[*resourceapi.ResourceSlice][]*Device
	nodes    map[string][]*Device
}

var (
	indexesMu sync.Mutex
	indexes   = map[string]*index{}
)

// indexFor is the process-wide index of driver's devices, shared by every
// plugin that scores by estimates.
func indexFor(driver string) *index {
	indexesMu.Lock()
	defer indexesMu.Unlock()
	ix := indexes[driver]
	if ix == nil {
		ix = &index{driver: driver, perSlice: map[*resourceapi.ResourceSlice][]*Device{}}
		indexes[driver] = ix
	}
	return ix
}

// byNode returns the node map for slices. The map returned is never
// modified afterwards, so callers may read it without the lock.
func (ix *index) byNode(slices []*resourceapi.ResourceSlice) map[string][]*Device {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.nodes != nil && ix.same(slices) {
		return ix.nodes
	}
	perSlice := make(map[*resourceapi.ResourceSlice][]*Device, len(slices))
	byNode := map[string][]*resourceapi.ResourceSlice{}
	nodes := map[string][]*Device{}
	for _, s := range slices {
		if s.Spec.Driver != ix.driver || s.Spec.NodeName == nil {
			continue
		}
		devs, ok := ix.perSlice[s]
		if !ok {
			devs = sliceDevices(s)
		}
		perSlice[s] = devs
		byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s)
	}
	for node, list := range byNode {
		// The allocator walks pools by name, a pool's slices by name, and
		// a slice's devices in order.
		sort.Slice(list, func(i, j int) bool {
			a, b := list[i].Spec, list[j].Spec
			if a.Pool.Name != b.Pool.Name {
				return a.Pool.Name < b.Pool.Name
			}
			return list[i].Name < list[j].Name
		})
		for _, s := range list {
			nodes[node] = append(nodes[node], perSlice[s]...)
		}
	}
	ix.last = make(map[*resourceapi.ResourceSlice]struct{}, len(slices))
	for _, s := range slices {
		ix.last[s] = struct{}{}
	}
	ix.perSlice, ix.nodes = perSlice, nodes
	return nodes
}

// same says whether slices are the ones of the last build, in any order.
func (ix *index) same(slices []*resourceapi.ResourceSlice) bool {
	if len(slices) != len(ix.last) {
		return false
	}
	for _, s := range slices {
		if _, ok := ix.last[s]; !ok {
			return false
		}
	}
	return true
}

// sliceDevices are the devices of a slice, in its order (the order the
// allocator walks them).
func sliceDevices(s *resourceapi.ResourceSlice) []*Device {
	var out []*Device
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		dev := &Device{
			ID:        structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name),
			Shareable: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations,
			raw:       d,
			PCIeRoot:  attr(d, AttrPCIeRoot),
			NUMANode:  attr(d, AttrNUMANode, resourceapi.QualifiedName(s.Spec.Driver+"/"+string(AttrNUMANode)), AttrNUMANodeShared),
		}
		for n, c := range d.Capacity {
			dev.caps = append(dev.caps, deviceCap{name: n, total: c.Value.Value(), dc: c})
		}
		sort.Slice(dev.caps, func(i, j int) bool { return dev.caps[i].name < dev.caps[j].name })
		out = append(out, dev)
	}
	return out
}

// attr is the first of names the device has, as a string.
func attr(d *resourceapi.Device, names ...resourceapi.QualifiedName) string {
	for _, n := range names {
		a, ok := d.Attributes[n]
		if !ok {
			continue
		}
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return fmt.Sprint(*a.IntValue)
		case a.VersionValue != nil:
			return *a.VersionValue
		}
	}
	return ""
}
