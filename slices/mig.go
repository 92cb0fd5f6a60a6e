package slices

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/slices/names"
)

// SliceCounter names the counter of one memory slice of a GPU's placement
// space.
func SliceCounter(i int) string { return fmt.Sprintf("memory-slice-%d", i) }

// CounterMediaExtensions counts a GPU's media-extension sets, in NVML's
// optical-flow accelerators (OFA): an H100 has one, which its 1g.10gb+me
// and its 7g.80gb each hold, so two +me instances cannot exist at once
// though their memory slices are disjoint (the driver refuses the second).
const CounterMediaExtensions = "media-extensions"

// mediaExtensions is what an instance of the profile holds of the GPU's
// media extensions; 0 where NVML's engine counts are unknown.
func mediaExtensions(p nvmlinfo.MIGProfile) uint64 {
	if p.Engines == nil || p.Engines.OFAs < 0 {
		return 0
	}
	return uint64(p.Engines.OFAs)
}

func describeInstances(ins []nvmlinfo.MIGInstance) string {
	parts := make([]string, 0, len(ins))
	for _, in := range ins {
		parts = append(parts, fmt.Sprintf("profile Id %d at %d+%d", in.ProfileID, in.Start, in.Size))
	}
	return strings.Join(parts, ", ")
}

// migs publishes every placement NVML reports for a MIG-enabled GPU, and the
// GPU's counter set: one counter per memory slice (capacity 1), plus memory,
// multiprocessors and, where a profile holds some, media extensions. Each
// MIG device consumes the slices its placement spans, so overlapping
// placements can never be allocated together and disjoint ones can unless
// they want more media extensions than the GPU has. Placements that overlap
// an existing GPU instance the agent did not make (MIGOwned) are left out. The capacity of media
// extensions is the most one profile holds: the whole-GPU profile holds
// every engine of the card.
func (b *builder) migs(gpuName string, g GPU, inv *nvmlinfo.Inventory) ([]Entry, *resourceapi.CounterSet) {
	d := g.Device
	n := d.MemorySlices()
	switch {
	case n == 0:
		b.notef("GPU %d (%s): MIG is enabled but NVML reports no GPU-instance placements; nothing published", d.Index, d.UUID)
		return nil, nil
	case n > nvmlinfo.MaxMemorySlices:
		b.notef("GPU %d (%s): %d memory slices exceed a counter set's %d counters; MIG devices not published", d.Index, d.UUID, n, nvmlinfo.MaxMemorySlices)
		return nil, nil
	}
	memory := func(p nvmlinfo.MIGProfile) uint64 { return p.MemorySizeMB << 20 }
	mps := func(p nvmlinfo.MIGProfile) uint64 { return uint64(p.MultiprocessorCount) }
	set := &resourceapi.CounterSet{Name: gpuName, Counters: map[string]resourceapi.Counter{
		names.CapMemory:          {Value: bytesQuantity(max(d.MemoryTotalBytes, d.MaxDisjoint(memory)))},
		names.CapMultiprocessors: {Value: *resource.NewQuantity(int64(max(maxOf(d, mps), d.MaxDisjoint(mps))), resource.DecimalSI)},
	}}
	for i := 0; i < n; i++ {
		set.Counters[SliceCounter(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	if me := maxOf(d, mediaExtensions); me > 0 {
		set.Counters[CounterMediaExtensions] = resourceapi.Counter{Value: *resource.NewQuantity(int64(me), resource.DecimalSI)}
	}
	var others []nvmlinfo.MIGInstance
	for _, in := range d.Instances {
		if b.migOwned == nil || !b.migOwned(d.UUID, in.ProfileID, in.Start) {
			others = append(others, in)
		}
	}
	if len(others) > 0 {
		b.notef("GPU %d (%s): %d GPU instance(s) that carve did not make hold memory slices (%s); the placements they overlap are not published",
			d.Index, d.UUID, len(others), describeInstances(others))
	}
	var entries []Entry
	seen := map[string]bool{}
	for _, p := range d.MIGProfiles {
	placements:
		for _, pl := range p.Placements {
			for _, in := range others {
				if in.Overlaps(pl) {
					continue placements
				}
			}
			name := fmt.Sprintf("%s-%s-%d", strings.Replace(gpuName, names.KindGPU+"-", names.KindMIG+"-", 1), sanitize(p.Name), pl.Start)
			if seen[name] {
				name = fmt.Sprintf("%s-p%d", name, p.ProfileID)
			}
			seen[name] = true
			mg := g
			mg.MIG = &MIG{Profile: p, Placement: pl}
			mg.CounterSet = set.Name
			entries = append(entries, Entry{Kind: names.KindMIG, Device: migDevice(name, mg, inv), GPU: &mg})
		}
	}
	return entries, set
}

func migDevice(name string, g GPU, inv *nvmlinfo.Inventory) resourceapi.Device {
	p, pl := g.MIG.Profile, g.MIG.Placement
	d := newDevice(names.KindMIG, name)
	setGPUAttributes(d, g, inv)
	setString(d, names.AttrProfile, p.Name)
	setInt(d, names.AttrPlacementStart, int64(pl.Start))
	setInt(d, names.AttrPlacementSize, int64(pl.Size))
	setString(d, names.AttrParentUUID, g.Device.UUID)
	mem := bytesQuantity(p.MemorySizeMB << 20)
	mps := *resource.NewQuantity(int64(p.MultiprocessorCount), resource.DecimalSI)
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{names.CapMemory: {Value: mem}, names.CapMultiprocessors: {Value: mps}}
	consumed := map[string]resourceapi.Counter{names.CapMemory: {Value: mem}, names.CapMultiprocessors: {Value: mps}}
	for i := pl.Start; i < pl.End(); i++ {
		consumed[SliceCounter(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	if me := mediaExtensions(p); me > 0 {
		consumed[CounterMediaExtensions] = resourceapi.Counter{Value: *resource.NewQuantity(int64(me), resource.DecimalSI)}
	}
	d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: g.CounterSet, Counters: consumed}}
	return *d
}

func bytesQuantity(b uint64) resource.Quantity {
	return *resource.NewQuantity(int64(b), resource.BinarySI)
}

func maxOf(d nvmlinfo.Device, value func(nvmlinfo.MIGProfile) uint64) uint64 {
	m := uint64(0)
	for _, p := range d.MIGProfiles {
		m = max(m, value(p))
	}
	return m
}
