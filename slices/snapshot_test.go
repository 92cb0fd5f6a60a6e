package slices_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/discovery/snapshot"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func buildFromSnapshotRoot(t *testing.T, root string, nvml *nvmlinfo.Inventory) slices.Result {
	t.Helper()
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: root,
		NVML: func(context.Context) (*nvmlinfo.Inventory, error) { return nvml, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Build(inv, nodeconfig.Default(), "node-a")
}

// A snapshot of the typical node, unpacked elsewhere, publishes the same
// pool: NICs, LLCs with resctrl, FPGAs, the kernel's features, and the GPU
// from the NVML inventory it carries.
func TestSnapshotReproducesNode(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	nvml := nvmltest.H100Node()
	nvml.Devices = nvml.Devices[:1]
	nvml.Devices[0].PCIBusID = "00000000:C1:00.0"
	var buf bytes.Buffer
	cfg := []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\n")
	if err := snapshot.Capture(context.Background(), &buf, snapshot.Options{Root: tree.Root, NVML: nvml, NodeConfig: cfg}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "node.tar.gz")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := snapshot.Unpack(file, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if u.NVMLReplay == "" || u.NodeConfig == "" {
		t.Fatalf("unpacked %+v: NVML inventory or node config missing", u)
	}
	f, err := os.Open(u.NVMLReplay)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	replayed, err := nvmlinfo.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	want, got := buildFromSnapshotRoot(t, tree.Root, nvml), buildFromSnapshotRoot(t, u.Root, replayed)
	if !reflect.DeepEqual(want.Resources, got.Resources) {
		g, _ := json.MarshalIndent(got.Resources, "", " ")
		w, _ := json.MarshalIndent(want.Resources, "", " ")
		t.Errorf("the snapshot publishes something else:\n%s", lineDiff(string(w), string(g)))
	}
	if !reflect.DeepEqual(want.Notices, got.Notices) {
		t.Errorf("notices\n%v\nwant\n%v", got.Notices, want.Notices)
	}
	if len(devicesOf(got)) < 8 {
		t.Errorf("only %d devices", len(devicesOf(got)))
	}
}

func devicesOf(r slices.Result) []string {
	var out []string
	for name := range r.Index {
		out = append(out, name)
	}
	return out
}

// lineDiff lists the lines of want and got that differ, by line number.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < max(len(w), len(g)) && len(out) < 40; i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d: want %s, got %s", i+1, strings.TrimSpace(a), strings.TrimSpace(b)))
		}
	}
	return strings.Join(out, "\n")
}
