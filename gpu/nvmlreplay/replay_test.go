package nvmlreplay_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
)

const results = "../acceptance/results/"

// record is NVML's own answer on the real H100 (nvmlrecord.py): per profile
// index, the profile's Id.
func record(t *testing.T) map[int]int {
	t.Helper()
	data, err := os.ReadFile(results + "h100-580-nvmlrecord.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Devices []struct {
			Profiles []struct {
				Index int  `json:"index"`
				ID    *int `json:"id"`
			} `json:"gpuInstanceProfiles"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	indexByID := map[int]int{}
	for _, p := range rec.Devices[0].Profiles {
		if p.ID != nil {
			indexByID[*p.ID] = p.Index
		}
	}
	return indexByID
}

// The snapshot carve wrote on the card before it recorded indices (Ids
// only, Id 20 misnamed 1g.10gb) still loads: every profile gets the index
// NVML gave it, and the media-extension one its name.
func TestLoadSnapshotWithoutIndices(t *testing.T) {
	r, err := nvmlreplay.Load(results + "h100-580-carve-snapshot-nvml.json")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := gpu.Read(r.Library())
	if err != nil {
		t.Fatal(err)
	}
	want := record(t)
	if len(inv.Devices[0].MIGProfiles) != len(want) {
		t.Fatalf("%d profiles, want the record's %d", len(inv.Devices[0].MIGProfiles), len(want))
	}
	names := map[string]bool{}
	for _, p := range inv.Devices[0].MIGProfiles {
		index, ok := want[p.ProfileID]
		if !ok || p.ProfileIndex != index {
			t.Errorf("profile Id %d (%s): index %d, NVML's is %d", p.ProfileID, p.Name, p.ProfileIndex, index)
		}
		if names[p.Name] {
			t.Errorf("two profiles named %s", p.Name)
		}
		names[p.Name] = true
		if me := strings.HasSuffix(p.Name, "+me"); me != gpu.MediaExtensionIndex(p.ProfileIndex) {
			t.Errorf("profile Id %d index %d named %s", p.ProfileID, p.ProfileIndex, p.Name)
		}
	}
	joined := strings.Join(r.Warnings, "\n")
	if !strings.Contains(joined, "media-extension revision") || !strings.Contains(joined, "one OFA") {
		t.Errorf("warnings %q do not say what was guessed", joined)
	}
}
