package acceptance

import (
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// DiscoveryRows holds carve's GPU inventory against nvidia-smi's list: one
// row a GPU, by UUID, passed where the bus id and memory are the same and
// neither lists a GPU the other lacks.
func DiscoveryRows(smi []SMIGPU, inv *nvmlinfo.Inventory) []Row {
	byUUID := map[string]nvmlinfo.Device{}
	for _, d := range inv.Devices {
		byUUID[d.UUID] = d
	}
	var rows []Row
	for _, g := range smi {
		name := fmt.Sprintf("discovery: GPU %d %s", g.Index, g.UUID)
		d, ok := byUUID[g.UUID]
		if !ok {
			rows = append(rows, Row{Attack: name, Outcome: "NOT FOUND by carve"})
			continue
		}
		delete(byUUID, g.UUID)
		var diffs []string
		if !strings.EqualFold(d.PCIBusID, g.BusID) {
			diffs = append(diffs, fmt.Sprintf("bus id %s, nvidia-smi %s", d.PCIBusID, g.BusID))
		}
		if d.MemoryTotalBytes>>20 != g.MemoryMiB {
			diffs = append(diffs, fmt.Sprintf("memory %d MiB, nvidia-smi %d MiB", d.MemoryTotalBytes>>20, g.MemoryMiB))
		}
		if d.Index != g.Index {
			diffs = append(diffs, fmt.Sprintf("index %d, nvidia-smi %d", d.Index, g.Index))
		}
		r := Row{Attack: name, Outcome: fmt.Sprintf("same: bus %s, %d MiB", g.BusID, g.MemoryMiB), Passed: len(diffs) == 0}
		if len(diffs) > 0 {
			r.Outcome = "DIFFERENT: " + strings.Join(diffs, "; ")
		}
		rows = append(rows, r)
	}
	left := make([]string, 0, len(byUUID))
	for uuid := range byUUID {
		left = append(left, uuid)
	}
	sort.Strings(left)
	for _, uuid := range left {
		rows = append(rows, Row{Attack: "discovery: GPU " + uuid, Outcome: "found by carve, NOT LISTED by nvidia-smi"})
	}
	return rows
}

// migKey names a placement by what NVML and nvidia-smi agree on.
func migKey(profileID, start, size int) string {
	return fmt.Sprintf("profile Id %d at %d+%d", profileID, start, size)
}

// MIGDevices are the MIG devices published for the GPU uuid, by name.
func MIGDevices(res slices.Result, uuid string) map[string]slices.Entry {
	out := map[string]slices.Entry{}
	for name, e := range res.Index {
		if e.Kind == names.KindMIG && e.GPU != nil && e.GPU.Device.UUID == uuid {
			out[name] = e
		}
	}
	return out
}

// PlacementRow holds the MIG devices carve publishes for one GPU against
// `nvidia-smi mig -lgipp` (smi, that GPU's lines) and `-lgip` (profile
// names by Id): passed where each placement listed is published once, with
// the driver's name, and nothing else is.
func PlacementRow(smi []SMIPlacement, profileNames map[int]string, published map[string]slices.Entry) Row {
	want := map[string]string{} // key -> the driver's name
	for _, p := range smi {
		want[migKey(p.ProfileID, p.Start, p.Size)] = profileNames[p.ProfileID]
	}
	var problems []string
	got := map[string]bool{}
	for name, e := range published {
		m := e.GPU.MIG
		k := migKey(m.Profile.ProfileID, m.Placement.Start, m.Placement.Size)
		driverName, listed := want[k]
		switch {
		case !listed:
			problems = append(problems, fmt.Sprintf("%s (%s) is not listed by nvidia-smi", name, k))
		case got[k]:
			problems = append(problems, fmt.Sprintf("%s published twice", k))
		case driverName == "":
			problems = append(problems, fmt.Sprintf("%s: nvidia-smi mig -lgip names no profile Id %d", k, m.Profile.ProfileID))
		case driverName != m.Profile.Name:
			problems = append(problems, fmt.Sprintf("%s published as %s, the driver's name is %s", k, m.Profile.Name, driverName))
		}
		got[k] = true
	}
	for k := range want {
		if !got[k] {
			problems = append(problems, k+" is NOT PUBLISHED")
		}
	}
	sort.Strings(problems)
	r := Row{Attack: "MIG: every placement nvidia-smi lists, with its name",
		Outcome: fmt.Sprintf("%d listed, %d published, the same, names the driver's", len(want), len(published)), Passed: len(problems) == 0}
	if len(problems) > 0 {
		r.Outcome = fmt.Sprintf("%d listed, %d published: %s", len(want), len(published), strings.Join(problems, "; "))
	}
	return r
}

// CounterSets are the shared counter sets of every slice Build made, by
// name.
func CounterSets(res slices.Result) map[string]resourceapi.CounterSet {
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

// CountersAllow reports whether the published counters let a scheduler
// allocate the devices a and b together: what they consume of each
// counter, added up, within the counter's value. Two different devices
// only (a device is never allocated twice).
func CountersAllow(sets map[string]resourceapi.CounterSet, a, b resourceapi.Device) (bool, error) {
	used := map[string]map[string]int64{}
	for _, d := range []resourceapi.Device{a, b} {
		for _, c := range d.ConsumesCounters {
			if _, ok := sets[c.CounterSet]; !ok {
				return false, fmt.Errorf("device %s consumes from counter set %s, which no slice publishes", d.Name, c.CounterSet)
			}
			if used[c.CounterSet] == nil {
				used[c.CounterSet] = map[string]int64{}
			}
			for name, v := range c.Counters {
				used[c.CounterSet][name] += v.Value.Value()
			}
		}
	}
	for set, counters := range used {
		for name, v := range counters {
			have, ok := sets[set].Counters[name]
			if !ok {
				return false, fmt.Errorf("counter %s of set %s is consumed but not published", name, set)
			}
			if v > have.Value.Value() {
				return false, nil
			}
		}
	}
	return true, nil
}

// Pair is one pair of MIG devices: whether carve's counters allow them
// together, and whether the driver made both instances at once.
type Pair struct {
	A, B           string
	Counters       bool
	Driver         bool
	DriverRefusal  string // the driver's answer to the second, where refused
	CounterProblem error
}

// PairsRow sums up the pairs: passed where the counters allow exactly the
// pairs the driver accepts.
func PairsRow(pairs []Pair) Row {
	var both, neither int
	var wrong []string
	for _, p := range pairs {
		switch {
		case p.CounterProblem != nil:
			wrong = append(wrong, fmt.Sprintf("%s + %s: %v", p.A, p.B, p.CounterProblem))
		case p.Counters && p.Driver:
			both++
		case !p.Counters && !p.Driver:
			neither++
		case p.Counters:
			wrong = append(wrong, fmt.Sprintf("%s + %s: counters allow, driver refused (%s)", p.A, p.B, p.DriverRefusal))
		default:
			wrong = append(wrong, fmt.Sprintf("%s + %s: counters refuse, driver accepted", p.A, p.B))
		}
	}
	r := Row{Attack: "MIG: every pair of placements, counters against the driver",
		Outcome: fmt.Sprintf("%d pairs: %d allowed by both, %d refused by both", len(pairs), both, neither), Passed: len(wrong) == 0 && len(pairs) > 0}
	if len(wrong) > 0 {
		r.Outcome += fmt.Sprintf("; %d DIFFER: %s", len(wrong), strings.Join(wrong, "; "))
	}
	return r
}
