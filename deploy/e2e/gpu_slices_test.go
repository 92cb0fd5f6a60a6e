package e2e

import (
	"context"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// The API server accepts the GPU nodes' slices as carve builds them: an
// 8 x H100 node with MIG on every GPU (counter sets in their own slice,
// device slices of at most 64 consuming counters), the same node with MIG
// off, and an A100 with MIG on whose profiles come from go-nvml's mock,
// read through NVML's replay. Every field is kept, counters included.
func TestAPIServerAcceptsGPUSlices(t *testing.T) {
	cs := client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		inv  *nvmlinfo.Inventory
	}{
		{"h100-mig", nvmltest.H100Node(0, 1, 2, 3, 4, 5, 6, 7)},
		{"h100-whole", nvmltest.H100Node()},
		{"a100-mig", nvmltest.A100Node()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := nvmlreplay.New(tc.inv)
			if err != nil {
				t.Fatal(err)
			}
			read, err := gpu.Read(r.Library())
			if err != nil {
				t.Fatal(err)
			}
			var addrs []string
			for _, d := range read.Devices {
				a, _ := nvmlinfo.NormalizeBusID(d.PCIBusID)
				addrs = append(addrs, a)
			}
			tree := sysfstest.GPUNode(t.TempDir(), addrs, func(i int) int { return i / 4 })
			inv, err := discovery.Discover(ctx, discovery.Options{Root: tree.Root,
				NVML: func(context.Context) (*nvmlinfo.Inventory, error) { return read, nil }})
			if err != nil {
				t.Fatal(err)
			}
			node := "e2e-gpu-" + tc.name
			objs := slices.Objects("carve.dev", node, slices.Build(inv, nodeconfig.Default(), node).Resources)
			devices, sets := 0, 0
			for i := range objs {
				created, err := cs.ResourceV1().ResourceSlices().Create(ctx, &objs[i], metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("API server rejected slice %s (%d devices, %d counter sets): %v", objs[i].Name, len(objs[i].Spec.Devices), len(objs[i].Spec.SharedCounters), err)
				}
				name := created.Name
				t.Cleanup(func() {
					_ = cs.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
				})
				if !apiequality.Semantic.DeepEqual(created.Spec.Devices, objs[i].Spec.Devices) ||
					!apiequality.Semantic.DeepEqual(created.Spec.SharedCounters, objs[i].Spec.SharedCounters) {
					t.Errorf("slice %s: the server changed the devices or counters (DRAPartitionableDevices off?)", name)
				}
				devices += len(objs[i].Spec.Devices)
				sets += len(objs[i].Spec.SharedCounters)
			}
			if devices == 0 {
				t.Fatal("no device sent")
			}
			t.Logf("%d slice(s), %d device(s), %d counter set(s) accepted", len(objs), devices, sets)
		})
	}
}
