package topology

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

const ns = "default"

// A GPU share and a NIC share: on an empty server both land under the first
// root; where the first GPU is full the GPU share moves to the second root
// while the NIC share stays on the first; where the first NIC is full too,
// both are under the second root again. A node whose NIC shares one NUMA node
// with its GPU but not a root scores in between.
func TestAlignment(t *testing.T) {
	g, n := fixture.GPUShare(ns, "g", "10Gi"), fixture.NICShare(ns, "n", "10G")
	gpuFull := fixture.GPUShare(ns, "gpufull", "80Gi")
	fixture.Allocate(gpuFull, "split", "gpu-0000-18-00-0")
	gpuFull2, nicFull2 := fixture.GPUShare(ns, "gpufull2", "80Gi"), fixture.NICShare(ns, "nicfull2", "100G")
	fixture.Allocate(gpuFull2, "moved", "gpu-0000-18-00-0")
	fixture.Allocate(nicFull2, "moved", "nic-0000-19-00-0")
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{g, n, gpuFull, gpuFull2, nicFull2},
		Slices: []*resourceapi.ResourceSlice{
			fixture.Server("empty", "100G", "80Gi"),
			fixture.Server("split", "100G", "80Gi"),
			fixture.Server("moved", "100G", "80Gi"),
			fixture.Slice("numa", fixture.GPU("g", "rootA", 0, "80Gi"), fixture.NIC("n", "rootB", 0, "100G")),
		},
	}
	pl := newTopology(dra.Base(Name))
	ctx := context.Background()
	state := framework.NewCycleState()
	pod := fixture.Pod(ns, "p", "g", "n")
	if st := pl.PreScore(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	for node, want := range map[string]int64{"empty": ScorePCIeRoot, "split": ScoreApart, "moved": ScorePCIeRoot, "numa": ScoreNUMA, "none": ScoreApart} {
		ni := framework.NewNodeInfo()
		ni.SetNode(fixture.Node(node))
		got, st := pl.Score(ctx, state, pod, ni)
		if !st.IsSuccess() || got != want {
			t.Errorf("%s: score %d (%v), want %d", node, got, st, want)
		}
	}
	// One claim alone is not Topology's business.
	if st := pl.PreScore(ctx, framework.NewCycleState(), fixture.Pod(ns, "q", "g"), nil); st.Code() != fwk.Skip {
		t.Errorf("one claim: %v, want Skip", st)
	}
}

func TestArgs(t *testing.T) {
	if a, err := DecodeArgs(nil); err != nil || a.DriverName != "carve.dev" {
		t.Errorf("defaults %+v %v", a, err)
	}
	if _, err := DecodeArgs(&runtime.Unknown{Raw: []byte(`{"driver":"x"}`)}); err == nil {
		t.Error("unknown field accepted")
	}
	if _, err := DecodeArgs(&runtime.Unknown{Raw: []byte(`{"driverName":"UPPER"}`)}); err == nil {
		t.Error("invalid driver name accepted")
	}
}

// A whole GPU and a NIC share are two claims too: Topology follows the whole
// device as the allocator gives it, the first free one, and ranks a node
// where the first GPU is held below one where it is free.
func TestWholeDevice(t *testing.T) {
	whole := fixture.Claim(ns, "whole", resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.carve.dev"},
	}}}})
	held := whole.DeepCopy()
	held.Name, held.UID = "held", "uid-held"
	fixture.Allocate(held, "busy", "gpu-0000-18-00-0")
	held.Status.Allocation.Devices.Results[0].ShareID = nil
	server := func(node string) *resourceapi.ResourceSlice {
		s := fixture.Server(node, "100G", "80Gi")
		for i := range s.Spec.Devices[:2] { // the GPUs go whole
			s.Spec.Devices[i].AllowMultipleAllocations = nil
		}
		return s
	}
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{whole, held, fixture.NICShare(ns, "n", "10G")}, Slices: []*resourceapi.ResourceSlice{server("free"), server("busy")}}
	pl := newTopology(dra.Base(Name))
	ctx := context.Background()
	state := framework.NewCycleState()
	pod := fixture.Pod(ns, "p", "whole", "n")
	if st := pl.PreScore(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreScore: %v", st)
	}
	for node, want := range map[string]int64{"free": ScorePCIeRoot, "busy": ScoreApart} {
		ni := framework.NewNodeInfo()
		ni.SetNode(fixture.Node(node))
		if got, st := pl.Score(ctx, state, pod, ni); !st.IsSuccess() || got != want {
			t.Errorf("%s: score %d (%v), want %d", node, got, st, want)
		}
	}
}

// Topology never rejects a pod, so it asks for no cluster events.
func TestNoEvents(t *testing.T) {
	events, err := (&Topology{}).EventsToRegister(context.Background())
	if err != nil || len(events) != 0 {
		t.Errorf("events %v, %v; want none", events, err)
	}
}
