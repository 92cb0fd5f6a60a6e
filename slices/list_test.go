package slices

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// TestEncodeJSONAsMarshalIndent holds the items marshaled apart and joined
// to what json.MarshalIndent makes of the whole List, byte for byte: no
// items, one, and the large node's 17 slices (taints, counters, capacity,
// every attribute type), with the goroutines' work done in any order.
func TestEncodeJSONAsMarshalIndent(t *testing.T) {
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: sysfstest.Large(t.TempDir()).Root})
	if err != nil {
		t.Fatal(err)
	}
	large := Objects("carve.dev", "node-a", Build(inv, nodeconfig.Default(), "node-a").Resources)
	if len(large) < 2 {
		t.Fatalf("large node: %d slices, want several", len(large))
	}
	for name, items := range map[string][]resourceapi.ResourceSlice{
		"none": {}, "nil": nil, "one": large[:1], "two": large[:2], "large": large,
	} {
		got, err := Encode(items, "json")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if items == nil {
			items = []resourceapi.ResourceSlice{}
		}
		want, err := json.MarshalIndent(list{APIVersion: "v1", Kind: "List", Items: items}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, '\n')
		if !bytes.Equal(got, want) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			t.Errorf("%s: differs from json.MarshalIndent at byte %d: got %q, want %q", name, i,
				got[max(0, i-40):min(len(got), i+40)], want[max(0, i-40):min(len(want), i+40)])
		}
	}
}
