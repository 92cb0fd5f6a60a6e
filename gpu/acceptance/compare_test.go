package acceptance

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// The real H100's answers, as carve's replay (MIG on) and as NVML gave
// them to ctypes on the card (nvmlrecord.py, no go-nvml): see
// gpu/prep/testdata/README.md and results/.
const (
	realReplay = "../prep/testdata/h100-580-mig-on.json"
	realRecord = "results/h100-580-nvmlrecord.json"
)

func buildReal(t *testing.T) (*nvmlinfo.Inventory, slices.Result) {
	t.Helper()
	f, err := os.Open(realReplay)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inv, err := nvmlinfo.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return inv, slices.Build(&discovery.Inventory{NVML: inv}, nodeconfig.Default(), "acceptance")
}

// recordedPlacements are the placements libnvidia-ml itself reported on
// the card, as `nvidia-smi mig -lgipp` lists them (it asks NVML the same).
func recordedPlacements(t *testing.T) []SMIPlacement {
	t.Helper()
	raw, err := os.ReadFile(realRecord)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Devices []struct {
			Index    int `json:"index"`
			Profiles []struct {
				ID         *int `json:"id"`
				Placements []struct {
					Start, Size int
				} `json:"placements"`
			} `json:"gpuInstanceProfiles"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	var out []SMIPlacement
	for _, d := range rec.Devices {
		for _, p := range d.Profiles {
			if p.ID == nil {
				continue // an index the card does not support
			}
			for _, pl := range p.Placements {
				out = append(out, SMIPlacement{GPU: d.Index, ProfileID: *p.ID, Start: pl.Start, Size: pl.Size})
			}
		}
	}
	return out
}

// The H100's profile names by Id (the table, from the card).
var h100Names = map[int]string{19: "1g.10gb", 20: "1g.10gb+me", 15: "1g.20gb", 14: "2g.20gb", 9: "3g.40gb", 5: "4g.40gb", 0: "7g.80gb"}

func TestPlacementRowAgainstTheRealCard(t *testing.T) {
	inv, res := buildReal(t)
	pls := recordedPlacements(t)
	if len(pls) != 25 {
		t.Fatalf("the record has %d placements, want the H100's 25", len(pls))
	}
	published := MIGDevices(res, inv.Devices[0].UUID)
	r := PlacementRow(pls, h100Names, published)
	if !r.Passed {
		t.Fatalf("carve's MIG devices differ from what the card reported: %s", r.Outcome)
	}
	t.Log(r.Outcome)

	// Each way it can be wrong is reported.
	wrongName := map[int]string{}
	for id, n := range h100Names {
		wrongName[id] = n
	}
	wrongName[9] = "3g.39gb"
	if r := PlacementRow(pls, wrongName, published); r.Passed || !strings.Contains(r.Outcome, "the driver's name is 3g.39gb") {
		t.Errorf("a name the driver does not give passed: %s", r.Outcome)
	}
	if r := PlacementRow(append(pls, SMIPlacement{ProfileID: 19, Start: 7, Size: 1}), h100Names, published); r.Passed || !strings.Contains(r.Outcome, "profile Id 19 at 7+1 is NOT PUBLISHED") {
		t.Errorf("a placement carve does not publish passed: %s", r.Outcome)
	}
	if r := PlacementRow(pls[1:], h100Names, published); r.Passed || !strings.Contains(r.Outcome, "is not listed by nvidia-smi") {
		t.Errorf("a published placement the driver does not list passed: %s", r.Outcome)
	}
}

func TestCountersAllowOnTheRealCard(t *testing.T) {
	inv, res := buildReal(t)
	sets := CounterSets(res)
	byKey := map[string]string{}
	for name, e := range MIGDevices(res, inv.Devices[0].UUID) {
		byKey[fmt.Sprintf("%s@%d", e.GPU.MIG.Profile.Name, e.GPU.MIG.Placement.Start)] = name
	}
	for _, c := range []struct {
		a, b  string
		allow bool
	}{
		{"1g.10gb@0", "1g.10gb@1", true},
		{"1g.10gb@0", "1g.20gb@0", false},       // slice 0 twice
		{"1g.10gb+me@0", "1g.10gb+me@3", false}, // one media-extension set
		{"1g.10gb+me@0", "1g.10gb@3", true},
		{"7g.80gb@0", "1g.10gb@6", false},
		{"4g.40gb@0", "3g.40gb@4", true},
		{"3g.40gb@0", "3g.40gb@4", true},
		{"2g.20gb@4", "1g.20gb@6", true},
	} {
		a, b := byKey[c.a], byKey[c.b]
		if a == "" || b == "" {
			t.Fatalf("%s or %s not published: %v", c.a, c.b, byKey)
		}
		got, err := CountersAllow(sets, res.Index[a].Device, res.Index[b].Device)
		if err != nil || got != c.allow {
			t.Errorf("%s + %s: counters allow %v (%v), want %v", c.a, c.b, got, err, c.allow)
		}
	}
}

func TestPairsRow(t *testing.T) {
	ok := []Pair{{A: "a", B: "b", Counters: true, Driver: true}, {A: "a", B: "c", Counters: false, Driver: false}}
	if r := PairsRow(ok); !r.Passed || r.Outcome != "2 pairs: 1 allowed by both, 1 refused by both" {
		t.Errorf("agreeing pairs: %+v", r)
	}
	if r := PairsRow(append(ok, Pair{A: "x", B: "y", Counters: true, Driver: false, DriverRefusal: "Insufficient Resources"})); r.Passed || !strings.Contains(r.Outcome, "x + y: counters allow, driver refused (Insufficient Resources)") {
		t.Errorf("counters allowing what the driver refuses passed: %+v", r)
	}
	if r := PairsRow(append(ok, Pair{A: "x", B: "y", Counters: false, Driver: true})); r.Passed {
		t.Errorf("counters refusing what the driver accepts passed: %+v", r)
	}
	if r := PairsRow(nil); r.Passed {
		t.Errorf("no pair at all passed: %+v", r)
	}
}

func TestDiscoveryRows(t *testing.T) {
	inv, _ := buildReal(t)
	smi, err := ParseSMIQuery("0, GPU-17c61085-39cb-bb7b-d8a8-9432ed8bec1b, 00000000:00:06.0, 81559\n")
	if err != nil {
		t.Fatal(err)
	}
	rows := DiscoveryRows(smi, inv)
	if len(rows) != 1 || !rows[0].Passed {
		t.Fatalf("the card as nvidia-smi lists it: %+v", rows)
	}
	smi[0].MemoryMiB = 81920
	smi = append(smi, SMIGPU{Index: 1, UUID: "GPU-other", BusID: "00000000:00:07.0", MemoryMiB: 1})
	rows = DiscoveryRows(smi, inv)
	if len(rows) != 2 || rows[0].Passed || !strings.Contains(rows[0].Outcome, "memory 81559 MiB, nvidia-smi 81920 MiB") || rows[1].Passed {
		t.Fatalf("differences passed: %+v", rows)
	}
	inv.Devices = append(inv.Devices, nvmlinfo.Device{UUID: "GPU-only-carve"})
	rows = DiscoveryRows(smi[:1], inv)
	if last := rows[len(rows)-1]; last.Passed || !strings.Contains(last.Outcome, "NOT LISTED") {
		t.Fatalf("a GPU nvidia-smi does not list passed: %+v", rows)
	}
}
