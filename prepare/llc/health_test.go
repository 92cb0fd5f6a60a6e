package llc_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

type sink map[string]health.Condition

func (s sink) Observe(c health.Condition) { s[c.Device] = c }

func TestLLCHealth(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "resctrl")
	group := llc.GroupName("claim-a/share")
	for _, d := range []string{"info/L3", group} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	devices := map[string]slices.Entry{
		"llc-0": {Kind: names.KindLLC, LLC: &discovery.LLC{ID: 0, Resctrl: &discovery.Resctrl{CBMMask: 0xfff}}},
		"llc-1": {Kind: names.KindLLC, LLC: &discovery.LLC{ID: 1, Resctrl: &discovery.Resctrl{CBMMask: 0xfff}}},
	}
	share := types.UID("share-1")
	undo, _ := json.Marshal(map[string]any{"group": group, "domain": 0, "mask": 3})
	records := map[types.UID]prepare.ClaimRecord{"claim-a": {UID: "claim-a", State: prepare.ClaimCompleted,
		Allocations: []prepare.Allocation{{Device: "llc-0", Kind: names.KindLLC, ShareID: &share}}, Undo: []json.RawMessage{undo}}}
	src := &llc.HealthSource{Dir: dir, Devices: func() map[string]slices.Entry { return devices },
		Records: func() (map[types.UID]prepare.ClaimRecord, error) { return records, nil }}
	s := sink{}
	src.Check(s)
	if len(s) != 2 || s["llc-0"].Severity != health.Healthy || s["llc-1"].Severity != health.Healthy {
		t.Fatalf("resctrl mounted, group there: %+v", s)
	}
	if err := os.Remove(filepath.Join(dir, group)); err != nil {
		t.Fatal(err)
	}
	s = sink{}
	src.Check(s)
	if s["llc-0"].Reason != llc.ReasonResctrlGroupGone || s["llc-0"].Severity != health.Degraded || s["llc-1"].Severity != health.Healthy {
		t.Fatalf("group gone: %+v", s)
	}
	// Unmounted; rediscovery then finds the caches without resctrl.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	devices = map[string]slices.Entry{
		"llc-0": {Kind: names.KindLLC, LLC: &discovery.LLC{ID: 0}},
		"llc-1": {Kind: names.KindLLC, LLC: &discovery.LLC{ID: 1}},
	}
	s = sink{}
	src.Check(s)
	for _, n := range []string{"llc-0", "llc-1"} {
		if s[n].Reason != llc.ReasonResctrlUnmounted || s[n].Severity != health.Degraded {
			t.Errorf("%s with resctrl unmounted: %+v", n, s[n])
		}
	}
}
