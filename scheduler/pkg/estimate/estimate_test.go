package estimate_test

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

const ns = "default"

func compute(t *testing.T, dra *fixture.DRA, claims ...string) *estimate.Estimate {
	t.Helper()
	l := dra.Ledger()
	e, err := estimate.Compute(context.Background(), dra, l, fixture.Pod(ns, "p", claims...), fixture.Driver, l.Mark())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The first device with room, in slice order, is picked, and its fill counts
// what other claims hold, the request after the policy, and the default the
// policy charges for the capacity the request leaves out.
func TestPicksFirstFitAfterAllocated(t *testing.T) {
	held := fixture.NICShare(ns, "held", "95G")
	fixture.Allocate(held, "n1", "nic-0000-19-00-0")
	want := fixture.NICShare(ns, "want", "9.5G") // rounds up to the 1M step: 9.5G exactly
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{held, want},
		Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi")},
	}
	e := compute(t, dra, "want")
	picks, ok := e.Picks("n1")
	if !ok || len(picks) != 1 {
		t.Fatalf("picks %v, %v", picks, ok)
	}
	// 95G held + 9.5G does not fit the first NIC: the second one is taken.
	if got := picks[0].Device.ID.Device.String(); got != "nic-0000-87-00-0" {
		t.Errorf("picked %s, want the second NIC", got)
	}
	// egress 9.5/100, ingress the policy default 1G/100G: mean 5.25%.
	if u := picks[0].Utilization; u < 0.0524 || u > 0.0526 {
		t.Errorf("utilization %v, want 0.0525", u)
	}
	if picks[0].Device.PCIeRoot != "pci0000:85" || picks[0].Device.NUMANode != "1" {
		t.Errorf("topology %q %q", picks[0].Device.PCIeRoot, picks[0].Device.NUMANode)
	}
}

// A pod's requests accumulate on a device; a request that fits nowhere makes
// the node a miss.
func TestPicksAccumulateAndMiss(t *testing.T) {
	a, b := fixture.GPUShare(ns, "a", "50Gi"), fixture.GPUShare(ns, "b", "50Gi")
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{a, b},
		Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi"), fixture.Slice("n2", fixture.GPU("g", "r", 0, "80Gi"))},
	}
	e := compute(t, dra, "a", "b")
	if e.Claims != 2 || len(e.Requests) != 2 {
		t.Fatalf("claims %d requests %d", e.Claims, len(e.Requests))
	}
	picks, ok := e.Picks("n1")
	if !ok || picks[0].Device == picks[1].Device {
		t.Errorf("n1: both 50Gi shares on one 80Gi GPU: %v %v", picks, ok)
	}
	if _, ok := e.Picks("n2"); ok {
		t.Error("n2 has one 80Gi GPU for 100Gi of shares but fits")
	}
	if _, ok := e.Picks("n3"); ok {
		t.Error("a node without slices fits")
	}
}

// Claims already allocated give no estimate; a request without capacity is
// followed, but is no share.
func TestAllocatedAndWhole(t *testing.T) {
	done := fixture.NICShare(ns, "done", "1G")
	fixture.Allocate(done, "n1", "nic-0000-19-00-0")
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{wholeGPU("whole"), done}, Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi")}}
	if e := compute(t, dra, "done"); e != nil {
		t.Errorf("estimate %+v for a pod whose claims are allocated", e)
	}
	e := compute(t, dra, "whole", "done")
	if e == nil || e.Claims != 1 || e.Shares != 0 || len(e.Requests) != 1 || e.Requests[0].Share() {
		t.Errorf("whole-device request: %+v", e)
	}
	if _, err := estimate.Compute(context.Background(), dra, dra.Ledger(), fixture.Pod(ns, "p", "missing"), fixture.Driver, 0); err == nil {
		t.Error("a missing claim is no error")
	}
	missing := fixture.Claim(ns, "noclass", fixture.ShareSpec("fpga", map[resourceapi.QualifiedName]string{fixture.Memory: "1Gi"}))
	dra.Claims = append(dra.Claims, missing)
	if _, err := estimate.Compute(context.Background(), dra, dra.Ledger(), fixture.Pod(ns, "p", "noclass"), fixture.Driver, 0); err == nil {
		t.Error("a missing device class is no error")
	}
}

// Request policies round as the allocator does.
func TestPolicy(t *testing.T) {
	// 100M steps from a 100M minimum, at most 10G.
	slice := fixture.Slice("n1", fixture.NIC("nic", "r", 0, "10G"))
	c := slice.Spec.Devices[0].Capacity[fixture.Egress]
	c.RequestPolicy.ValidRange.Min = ptrQ("100M")
	c.RequestPolicy.ValidRange.Step = ptrQ("100M")
	c.RequestPolicy.ValidRange.Max = ptrQ("2G")
	slice.Spec.Devices[0].Capacity[fixture.Egress] = c
	for _, tc := range []struct {
		ask      string
		wantUtil float64 // egress fill; ingress takes its 100M default (1%)
		fits     bool
	}{
		{"50M", 0.01, true},  // below the minimum: the minimum
		{"150M", 0.02, true}, // up to the next step
		{"1G", 0.10, true},   // on a step
		{"2.05G", 0, false},  // rounds past the maximum
	} {
		claim := fixture.NICShare(ns, "c", tc.ask)
		dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{claim}, Slices: []*resourceapi.ResourceSlice{slice}}
		picks, ok := compute(t, dra, "c").Picks("n1")
		if ok != tc.fits {
			t.Errorf("%s: fits %v, want %v", tc.ask, ok, tc.fits)
			continue
		}
		if ok {
			want := (tc.wantUtil + 0.01) / 2
			if u := picks[0].Utilization; u < want-1e-9 || u > want+1e-9 {
				t.Errorf("%s: utilization %v, want %v", tc.ask, u, want)
			}
		}
	}
}

// The ledger follows claims: an allocation replaces the claim's previous
// one, a claim without allocation or deleted consumes nothing, and results
// of other drivers or without a share do not count.
func TestLedger(t *testing.T) {
	l := estimate.NewLedger(fixture.Driver)
	id := structured.MakeDeviceID(fixture.Driver, "n1", "nic-0000-19-00-0")
	a, b := fixture.NICShare(ns, "a", "10G"), fixture.NICShare(ns, "b", "5G")
	fixture.Allocate(a, "n1", "nic-0000-19-00-0")
	fixture.Allocate(b, "n1", "nic-0000-19-00-0")
	l.Record(a)
	l.Record(b)
	l.Record(a) // again: no double count
	if got := l.Used(id, fixture.Egress); got != 15e9 {
		t.Errorf("used %d, want 15G", got)
	}
	a2 := a.DeepCopy()
	a2.Status.Allocation.Devices.Results[0].ConsumedCapacity[fixture.Egress] = resource.MustParse("20G")
	l.Record(a2)
	if got := l.Used(id, fixture.Egress); got != 25e9 {
		t.Errorf("after a grew: used %d, want 25G", got)
	}
	b2 := b.DeepCopy()
	b2.Status.Allocation = nil
	l.Record(b2)
	l.Forget(a.UID)
	if got := l.Used(id, fixture.Egress); got != 0 {
		t.Errorf("after both went: used %d, want 0", got)
	}
	other := fixture.NICShare(ns, "other", "1G")
	fixture.Allocate(other, "n1", "nic-0000-19-00-0")
	other.Status.Allocation.Devices.Results[0].Driver = "other.example.com"
	whole := fixture.NICShare(ns, "whole", "1G")
	fixture.Allocate(whole, "n1", "nic-0000-19-00-0")
	whole.Status.Allocation.Devices.Results[0].ShareID = nil
	l.Record(other)
	l.Record(whole)
	if got := l.Used(id, fixture.Egress); got != 0 {
		t.Errorf("other driver or no share counted: %d", got)
	}
}

// fakeTracker is the claim tracker's view: claims as its assume cache has
// them, and which are in flight.
type fakeTracker struct {
	fwk.ResourceClaimTracker
	claims   map[string]*resourceapi.ResourceClaim
	inFlight map[types.UID]*resourceapi.AllocationResult
}

func (f *fakeTracker) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	if c, ok := f.claims[namespace+"/"+name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("claim %s/%s not found", namespace, name)
}

func (f *fakeTracker) GetPendingAllocation(uid types.UID) *resourceapi.AllocationResult {
	return f.inFlight[uid]
}

// The ledger counts what the allocator counts, step by step through
// DynamicResources' Reserve and PreBind: the in-flight allocation from
// Reserve, through the finalizer update (an informer event without
// allocation); twice once the tracker's assume cache has the status update
// and the claim is still in flight; once after PreBind; and an informer
// event older than what the ledger has is ignored.
func TestLedgerFollowsTheAllocator(t *testing.T) {
	l := estimate.NewLedger(fixture.Driver)
	id := structured.MakeDeviceID(fixture.Driver, "n1", "nic-0000-19-00-0")
	version := func(c *resourceapi.ResourceClaim, rv string) *resourceapi.ResourceClaim {
		c = c.DeepCopy()
		c.ResourceVersion = rv
		return c
	}
	created := version(fixture.NICShare(ns, "c", "10G"), "10")
	finalizer := version(created, "11")
	finalizer.Finalizers = []string{"resource.kubernetes.io/delete-protection"}
	allocated := version(finalizer, "12")
	fixture.Allocate(allocated, "n1", "nic-0000-19-00-0")
	tr := &fakeTracker{claims: map[string]*resourceapi.ResourceClaim{ns + "/c": created}, inFlight: map[types.UID]*resourceapi.AllocationResult{}}
	used := func(when string, want int64) {
		t.Helper()
		if got := l.Used(id, fixture.Egress); got != want {
			t.Errorf("%s: used %d, want %d", when, got, want)
		}
	}

	l.Record(created)
	tr.inFlight[created.UID] = allocated.Status.Allocation // Reserve
	l.Hold(created, allocated.Status.Allocation)
	used("after Reserve", 10e9)
	tr.claims[ns+"/c"] = finalizer // PreBind's first update
	l.Record(finalizer)
	l.Settle(tr)
	used("after the finalizer update", 10e9)
	tr.claims[ns+"/c"] = allocated // the status update, assumed
	l.Settle(tr)
	used("status assumed, still in flight", 20e9)
	delete(tr.inFlight, created.UID) // PreBind done
	l.Settle(tr)
	used("after PreBind, before the informer", 10e9)
	l.Record(finalizer) // a late informer event
	used("after a stale informer event", 10e9)
	l.Record(allocated)
	used("after the informer caught up", 10e9)
	deallocated := version(created, "13")
	l.Record(deallocated)
	used("after deallocation", 0)

	// Held in flight, then released (Unreserve) before any status.
	l.Hold(created, allocated.Status.Allocation)
	l.Release(created.UID)
	used("after Hold and Release", 0)

	whole := fixture.NICShare(ns, "whole", "1G")
	fixture.Allocate(whole, "n1", "nic-0000-87-00-0")
	whole.Status.Allocation.Devices.Results[0].ShareID = nil
	wid := structured.MakeDeviceID(fixture.Driver, "n1", "nic-0000-87-00-0")
	l.Record(whole)
	if !l.Held(wid) || l.Held(id) {
		t.Errorf("held: whole device %v, shared device %v", l.Held(wid), l.Held(id))
	}
	l.Forget(whole.UID)
	if l.Held(wid) {
		t.Error("a forgotten claim still holds its device")
	}
}
