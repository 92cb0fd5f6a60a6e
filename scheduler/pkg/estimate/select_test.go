package estimate_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

// wholeGPU asks for one GPU, whole.
func wholeGPU(name string) *resourceapi.ResourceClaim {
	return fixture.Claim(ns, name, resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.carve.dev"},
	}}}})
}

// exclusive is d without multiple allocations: it goes whole.
func exclusive(d resourceapi.Device) resourceapi.Device {
	d.AllowMultipleAllocations = nil
	return d
}

func picked(t *testing.T, e *estimate.Estimate, node string) []string {
	t.Helper()
	picks, ok := e.Picks(node)
	if !ok {
		t.Fatalf("%s: no fit", node)
	}
	var out []string
	for _, p := range picks {
		out = append(out, p.Device.ID.Device.String())
	}
	return out
}

// The class's and the request's CEL selectors decide which devices a
// request may get, as they do for the allocator: a memory share never lands
// on a device of another kind that has memory, and a request's own selector
// skips the first GPU.
func TestSelectors(t *testing.T) {
	accel := fixture.GPU("accel-0", "pci0000:17", 0, "80Gi")
	accel.Attributes["kind"] = resourceapi.DeviceAttribute{StringValue: ptr.To("accel")}
	second := fixture.Claim(ns, "second", fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "8Gi"}))
	second.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:85"`,
	}}}
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{fixture.GPUShare(ns, "any", "8Gi"), second},
		Slices: []*resourceapi.ResourceSlice{fixture.Slice("n1", accel, fixture.GPU("gpu-a", "pci0000:17", 0, "80Gi"), fixture.GPU("gpu-b", "pci0000:85", 1, "80Gi"))},
	}
	if got := picked(t, compute(t, dra, "any"), "n1"); got[0] != "gpu-a" {
		t.Errorf("a GPU share got %v, want gpu-a (accel-0 is no GPU)", got)
	}
	if got := picked(t, compute(t, dra, "second"), "n1"); got[0] != "gpu-b" {
		t.Errorf("a share selecting root 85 got %v, want gpu-b", got)
	}
}

// A device that does not allow multiple allocations goes whole: to the
// first request that fits it, never to a second one of the pod nor while an
// allocation holds it; a whole-device request may also take a share of a
// shareable device at its defaults.
func TestWholeDevices(t *testing.T) {
	held := wholeGPU("held")
	fixture.Allocate(held, "n1", "gpu-0")
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{held, wholeGPU("a"), wholeGPU("b"), wholeGPU("c")},
		Slices: []*resourceapi.ResourceSlice{
			fixture.Slice("n1", exclusive(fixture.GPU("gpu-0", "r0", 0, "80Gi")), exclusive(fixture.GPU("gpu-1", "r0", 0, "80Gi")), exclusive(fixture.GPU("gpu-2", "r1", 1, "80Gi"))),
			fixture.Slice("n2", fixture.GPU("shared", "r0", 0, "80Gi")),
		},
	}
	held.Status.Allocation.Devices.Results[0].ShareID = nil
	if got := picked(t, compute(t, dra, "a", "b"), "n1"); got[0] != "gpu-1" || got[1] != "gpu-2" {
		t.Errorf("two whole GPUs beside a held one: %v, want gpu-1 gpu-2", got)
	}
	if _, ok := compute(t, dra, "a", "b", "c").Picks("n1"); ok {
		t.Error("three whole GPUs fit where two are free")
	}
	picks, ok := compute(t, dra, "a", "b").Picks("n2")
	if !ok || picks[1].Device != picks[0].Device {
		t.Errorf("whole-device requests on one shareable GPU: %v %v", picks, ok)
	}
	// 1Gi each by the policy's default.
	if u := picks[1].Utilization; u < 2.0/80-1e-9 || u > 2.0/80+1e-9 {
		t.Errorf("fill %v, want 2/80", u)
	}
}

// The allocator walks a node's pools by name and a pool's slices by name,
// whatever order the lister gives them in.
func TestSliceOrder(t *testing.T) {
	late := fixture.Slice("n1", fixture.GPU("gpu-z", "r1", 1, "80Gi"))
	late.Name, late.Spec.Pool.Name = "b-slice", "n1-b"
	early := fixture.Slice("n1", fixture.GPU("gpu-y", "r0", 0, "80Gi"))
	early.Name, early.Spec.Pool.Name = "z-slice", "n1-a"
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{fixture.GPUShare(ns, "g", "1Gi")}, Slices: []*resourceapi.ResourceSlice{late, early}}
	if got := picked(t, compute(t, dra, "g"), "n1"); got[0] != "gpu-y" {
		t.Errorf("picked %v, want gpu-y from pool n1-a", got)
	}
}

// An estimate reads the ledger as of its mark: what changed after it does
// not count, so that the scores see what the allocator's snapshot saw.
func TestReadsAsOfMark(t *testing.T) {
	a, b := fixture.GPUShare(ns, "a", "40Gi"), fixture.GPUShare(ns, "b", "40Gi")
	fixture.Allocate(a, "n1", "gpu-0000-18-00-0")
	want := fixture.GPUShare(ns, "want", "8Gi")
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{a, want}, Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi")}}
	l := dra.Ledger()
	at := l.Mark()
	fixture.Allocate(b, "n1", "gpu-0000-18-00-0")
	l.Record(b) // after the mark: 80Gi used now
	id := structured.MakeDeviceID(fixture.Driver, "n1", "gpu-0000-18-00-0")
	if now, then := l.Used(id, fixture.Memory), l.UsedAt(id, fixture.Memory, at); now != 80<<30 || then != 40<<30 {
		t.Errorf("used now %d, at the mark %d", now, then)
	}
	e, err := estimate.Compute(t.Context(), dra, l, fixture.Pod(ns, "p", "want"), fixture.Driver, at)
	if err != nil {
		t.Fatal(err)
	}
	if got := picked(t, e, "n1"); got[0] != "gpu-0000-18-00-0" {
		t.Errorf("as of the mark the first GPU has room, got %v", got)
	}
}
