package slices_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// fits reports whether the devices can all be allocated together as the
// scheduler decides it: for every counter, what they consume together is at
// most what the counter set holds.
func fits(t *testing.T, sets map[string]resourceapi.CounterSet, devs ...resourceapi.Device) bool {
	t.Helper()
	used := map[string]map[string]int64{}
	for _, d := range devs {
		for _, c := range d.ConsumesCounters {
			if _, ok := sets[c.CounterSet]; !ok {
				t.Fatalf("%s consumes from unknown counter set %s", d.Name, c.CounterSet)
			}
			if used[c.CounterSet] == nil {
				used[c.CounterSet] = map[string]int64{}
			}
			for name, q := range c.Counters {
				used[c.CounterSet][name] += q.Value.Value()
			}
		}
	}
	for set, counters := range used {
		for name, v := range counters {
			capacity, ok := sets[set].Counters[name]
			if !ok {
				t.Fatalf("counter %s/%s consumed but not published", set, name)
			}
			if v > capacity.Value.Value() {
				return false
			}
		}
	}
	return true
}

func counterSets(res slices.Result) map[string]resourceapi.CounterSet {
	out := map[string]resourceapi.CounterSet{}
	for _, pool := range res.Resources.Pools {
		for _, s := range pool.Slices {
			for _, cs := range s.SharedCounters {
				out[cs.Name] = cs
			}
		}
	}
	return out
}

// An 8 x H100 node with MIG on every GPU: every placement NVML reports is a
// device; counters live in their own slice; device slices hold at most 64.
func TestMIGSlices(t *testing.T) {
	res := gpuNode(t, nvmltest.H100Node(0, 1, 2, 3, 4, 5, 6, 7))
	perGPU := 0
	for _, p := range nvmltest.H100Profiles() {
		perGPU += len(p.Placements)
	}
	devs := devices(res)
	if len(devs) != 8*perGPU {
		t.Fatalf("%d devices, want %d placements on 8 GPUs", len(devs), 8*perGPU)
	}
	for _, s := range res.Resources.Pools["node-a"].Slices {
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Error("a slice holds both counters and devices")
		}
		if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets || len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice with %d counter sets and %d devices", len(s.SharedCounters), len(s.Devices))
		}
	}
	sets := counterSets(res)
	if len(sets) != 8 {
		t.Fatalf("%d counter sets, want 8", len(sets))
	}
	set := sets["gpu-0000-19-00-0"]
	if len(set.Counters) != 8+3 {
		t.Errorf("counters %v, want 8 memory slices, memory, multiprocessors and media extensions", set.Counters)
	}
	if q := set.Counters[slices.CounterMediaExtensions].Value; q.Value() != 1 {
		t.Errorf("media extensions %s, want the H100's one", q.String())
	}
	m := devs["mig-0000-19-00-0-3g-40gb-4"]
	if str(m, "kind") != "mig" || str(m, "profile") != "3g.40gb" || str(m, "parentUUID") != nvmltest.H100UUID(0) ||
		str(m, "resource.kubernetes.io/pcieRoot") != "pci0000:19" {
		t.Errorf("MIG attributes %v", m.Attributes)
	}
	if s, _ := intAttr(m, "placementStart"); s != 4 {
		t.Errorf("placementStart %d", s)
	}
	if n, _ := intAttr(m, "placementSize"); n != 4 {
		t.Errorf("placementSize %d, want NVML's span of 4", n)
	}
	if q := m.Capacity["memory"].Value; q.Value() != 40448<<20 {
		t.Errorf("memory %s", q.String())
	}
	if q := m.Capacity["multiprocessors"].Value; q.Value() != 60 {
		t.Errorf("multiprocessors %s", q.String())
	}
	if len(m.ConsumesCounters) != 1 || len(m.ConsumesCounters[0].Counters) != 4+2 {
		t.Errorf("consumes %v", m.ConsumesCounters)
	}
}

// Two placements that overlap can never both be allocated, nor two that
// each hold the H100's one media-extension set (its OFA, as NVML counts it),
// two others can, and a whole partitioning of the GPU fits at once.
func TestMIGCountersExclusive(t *testing.T) {
	res := gpuNode(t, nvmltest.H100Node(0))
	sets := counterSets(res)
	var migs []resourceapi.Device
	place := map[string]nvmlinfo.Placement{}
	ofas := map[string]int{}
	for _, e := range res.Index {
		if e.Kind == names.KindMIG {
			migs = append(migs, e.Device)
			place[e.Device.Name] = e.GPU.MIG.Placement
			ofas[e.Device.Name] = e.GPU.MIG.Profile.Engines.OFAs
		}
	}
	const cardOFAs = 1 // an H100 has one optical-flow accelerator
	pairs, refusedME := 0, 0
	for i, a := range migs {
		for _, b := range migs[i+1:] {
			overlap := place[a.Name].Overlaps(place[b.Name])
			tooMany := ofas[a.Name]+ofas[b.Name] > cardOFAs
			if got := fits(t, sets, a, b); got != (!overlap && !tooMany) {
				t.Errorf("%s and %s: fit %t with overlap %t, media extensions over the card's %t", a.Name, b.Name, got, overlap, tooMany)
			}
			if !overlap && tooMany {
				refusedME++
			}
			pairs++
		}
	}
	if refusedME != 21 {
		t.Errorf("%d disjoint pairs refused for media extensions, want the 21 pairs of 1g.10gb+me", refusedME)
	}
	if pairs < 300 {
		t.Fatalf("only %d pairs checked", pairs)
	}
	devs := devices(res)
	var sevenOnes, fourTwentys []resourceapi.Device
	for i := 0; i < 7; i++ {
		sevenOnes = append(sevenOnes, devs[mig("1g-10gb", i)])
	}
	for _, s := range []int{0, 2, 4, 6} {
		fourTwentys = append(fourTwentys, devs[mig("1g-20gb", s)])
	}
	for name, set := range map[string][]resourceapi.Device{
		"seven 1g.10gb": sevenOnes, "four 1g.20gb": fourTwentys,
		"4g.40gb beside 3g.40gb":        {devs[mig("4g-40gb", 0)], devs[mig("3g-40gb", 4)]},
		"1g.10gb+me beside six 1g.10gb": append([]resourceapi.Device{devs[mig("1g-10gb-me", 6)]}, sevenOnes[:6]...),
	} {
		if !fits(t, sets, set...) {
			t.Errorf("%s do not fit together", name)
		}
	}
	if fits(t, sets, append(sevenOnes, devs[mig("1g-20gb", 6)])...) {
		t.Error("an eighth instance fits beside seven 1g.10gb")
	}
}

func mig(profile string, start int) string {
	return "mig-0000-19-00-0-" + profile + "-" + string(rune('0'+start))
}
