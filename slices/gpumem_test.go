package slices_test

import (
	"context"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func TestGPUMemorySlices(t *testing.T) {
	nvml := nvmltest.H100Node()
	tree := sysfstest.GPUNode(t.TempDir(), []string{"0000:19:00.0", "0000:3b:00.0"}, func(int) int { return 0 })
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root,
		NVML: func(context.Context) (*nvmlinfo.Inventory, error) { return nvml, nil }})
	if err != nil {
		t.Fatal(err)
	}
	inv.GPUMemory = map[string]discovery.GPUMemory{
		nvmltest.H100UUID(0): {Enforcement: "mps-policed", Reason: "no kernel limit: driver 580.159.04 is older than r615"},
		nvmltest.H100UUID(1): {Enforcement: "none", Reason: "no nvidia-cuda-mps-control below the driver root"},
	}
	cfg, err := nodeconfig.Decode([]byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nrequestPolicies:\n  gpu:\n    memory: {default: 10Gi, min: 5Gi, step: 5Gi, max: 40Gi}\n"))
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(inv, cfg, "node-a")
	devs := devices(res)
	shared, whole := devs["gpu-0000-19-00-0"], devs["gpu-0000-3b-00-0"]
	if str(shared, "memoryEnforcement") != "mps-policed" || str(whole, "memoryEnforcement") != "none" {
		t.Fatalf("memoryEnforcement %q, %q", str(shared, "memoryEnforcement"), str(whole, "memoryEnforcement"))
	}
	if shared.AllowMultipleAllocations == nil || !*shared.AllowMultipleAllocations {
		t.Error("the mps-policed GPU does not allow multiple allocations")
	}
	rp := shared.Capacity["memory"].RequestPolicy
	if rp == nil || rp.Default.String() != "10Gi" || rp.ValidRange.Step.String() != "5Gi" || rp.ValidRange.Max.String() != "40Gi" {
		t.Errorf("request policy %+v", rp)
	}
	if whole.AllowMultipleAllocations != nil || whole.Capacity["memory"].RequestPolicy != nil {
		t.Error("a GPU whose slices cannot be enforced is offered in slices")
	}
	notes := strings.Join(res.Notices, "\n")
	if !strings.Contains(notes, "gpu-0000-3b-00-0") || !strings.Contains(notes, "no nvidia-cuda-mps-control") {
		t.Errorf("the reason is not given:\n%s", notes)
	}
	// Without a policy in the node config, nothing is sliced.
	res = slices.Build(inv, nodeconfig.Default(), "node-a")
	if d := devices(res)["gpu-0000-19-00-0"]; d.AllowMultipleAllocations != nil {
		t.Error("sliced without requestPolicies.gpu.memory")
	}
	if !strings.Contains(strings.Join(res.Notices, "\n"), "no requestPolicies.gpu.memory") {
		t.Errorf("notices %q", res.Notices)
	}
}
