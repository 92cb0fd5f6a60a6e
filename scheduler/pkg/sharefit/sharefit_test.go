package sharefit

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
)

const ns = "default"

// scores runs PreScore and Score for pod on each node as the framework does.
func scores(t *testing.T, pl *ShareFit, claims []string, nodes ...string) (map[string]int64, *fwk.Status) {
	t.Helper()
	ctx := context.Background()
	state := framework.NewCycleState()
	pod := fixture.Pod(ns, "p", claims...)
	if st := pl.PreScore(ctx, state, pod, nil); !st.IsSuccess() {
		return nil, st
	}
	out := map[string]int64{}
	for _, n := range nodes {
		ni := framework.NewNodeInfo()
		ni.SetNode(fixture.Node(n))
		s, st := pl.Score(ctx, state, pod, ni)
		if !st.IsSuccess() {
			t.Fatalf("Score %s: %v", n, st)
		}
		out[n] = s
	}
	return out, nil
}

// MostAllocated ranks the node where the share lands on the fullest device
// first; LeastAllocated the emptiest; a node without room scores 0.
func TestStrategies(t *testing.T) {
	busy, full, want := fixture.NICShare(ns, "busy", "60G"), fixture.NICShare(ns, "full", "100G"), fixture.NICShare(ns, "want", "19G")
	fixture.Allocate(busy, "busy", "nic-0000-19-00-0")
	fixture.Allocate(full, "tiny", "nic")
	dra := &fixture.DRA{
		Claims: []*resourceapi.ResourceClaim{busy, full, want},
		Slices: []*resourceapi.ResourceSlice{
			fixture.Server("busy", "100G", "80Gi"),
			fixture.Server("idle", "100G", "80Gi"),
			fixture.Slice("tiny", fixture.NIC("nic", "r", 0, "100G")),
		},
	}
	for _, tc := range []struct {
		strategy Strategy
		best     string
	}{{MostAllocated, "busy"}, {LeastAllocated, "idle"}} {
		pl := newShareFit(dra.Base(Name), tc.strategy)
		got, st := scores(t, pl, []string{"want"}, "busy", "idle", "tiny")
		if st != nil {
			t.Fatalf("%s: PreScore %v", tc.strategy, st)
		}
		if got["tiny"] != 0 {
			t.Errorf("%s: node without room scores %d", tc.strategy, got["tiny"])
		}
		other := map[string]string{"busy": "idle", "idle": "busy"}[tc.best]
		if got[tc.best] <= got[other] {
			t.Errorf("%s: scores %v, want %s first", tc.strategy, got, tc.best)
		}
	}
	// Exact values: busy egress 79/100 and ingress the 1G default: mean
	// 40% (the held 60G consumed no ingress in the fixture); idle 10%.
	pl := newShareFit(dra.Base(Name), MostAllocated)
	got, _ := scores(t, pl, []string{"want"}, "busy", "idle")
	if got["busy"] != 40 || got["idle"] != 10 {
		t.Errorf("scores %v, want busy 40, idle 10", got)
	}
}

// Pods without claims, or whose claims ask for no capacity, are skipped.
func TestSkip(t *testing.T) {
	whole := fixture.Claim(ns, "whole", resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.carve.dev"},
	}}}})
	pl := newShareFit((&fixture.DRA{Claims: []*resourceapi.ResourceClaim{whole}}).Base(Name), MostAllocated)
	for _, claims := range [][]string{nil, {"whole"}} {
		if _, st := scores(t, pl, claims, "n"); st == nil || st.Code() != fwk.Skip {
			t.Errorf("claims %v: status %v, want Skip", claims, st)
		}
	}
}

func TestArgs(t *testing.T) {
	a, err := DecodeArgs(nil)
	if err != nil || a.Strategy != MostAllocated || a.DriverName != "carve.dev" {
		t.Errorf("defaults %+v, %v", a, err)
	}
	a, err = DecodeArgs(&runtime.Unknown{Raw: []byte("strategy: LeastAllocated\ndriverName: x.example.com\n"), ContentType: runtime.ContentTypeYAML})
	if err != nil || a.Strategy != LeastAllocated || a.DriverName != "x.example.com" {
		t.Errorf("yaml %+v, %v", a, err)
	}
	for raw, field := range map[string]string{
		`{"strategy":"Random"}`:       "strategy",
		`{"driverName":"Not_A_Name"}`: "driverName",
		`{"weight":3}`:                "weight",
	} {
		_, err := DecodeArgs(&runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON})
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want one naming %s", raw, err, field)
		}
	}
}

// Reserve records what DynamicResources just allocated, so the next pod's
// estimate sees it; Unreserve takes it back.
func TestReserveRecordsShares(t *testing.T) {
	want := fixture.NICShare(ns, "want", "30G")
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{want}, Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi")}}
	pl := newShareFit(dra.Base(Name), MostAllocated)
	ctx := context.Background()
	state := framework.NewCycleState()
	pod := fixture.Pod(ns, "p", "want")
	if st := pl.PreScore(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatal(st)
	}
	fixture.Allocate(want, "n1", "nic-0000-19-00-0") // what DynamicResources' Reserve does
	id := structured.MakeDeviceID(fixture.Driver, "n1", "nic-0000-19-00-0")
	if st := pl.Reserve(ctx, state, pod, "n1"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if got := pl.Ledger.Used(id, fixture.Egress); got != 30e9 {
		t.Errorf("after Reserve: %d used, want 30G", got)
	}
	pl.Unreserve(ctx, state, pod, "n1")
	if got := pl.Ledger.Used(id, fixture.Egress); got != 0 {
		t.Errorf("after Unreserve: %d used, want 0", got)
	}
}

// Whole-device requests do not count toward the fill: a pod with only them
// is skipped, and beside a share only the share's device is scored.
func TestWholeDevicesDoNotCount(t *testing.T) {
	whole := fixture.Claim(ns, "whole", resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.carve.dev"},
	}}}})
	slice := fixture.Server("n1", "100G", "80Gi")
	slice.Spec.Devices[0].AllowMultipleAllocations = nil
	dra := &fixture.DRA{Claims: []*resourceapi.ResourceClaim{whole, fixture.NICShare(ns, "s", "50G")}, Slices: []*resourceapi.ResourceSlice{slice}}
	pl := newShareFit(dra.Base(Name), MostAllocated)
	if _, st := scores(t, pl, []string{"whole"}, "n1"); st.Code() != fwk.Skip {
		t.Errorf("whole device only: %v, want Skip", st)
	}
	got, st := scores(t, pl, []string{"whole", "s"}, "n1")
	// egress 50/100, ingress the 1G default: 25.5% -> 26, the whole GPU left out.
	if st != nil || got["n1"] != 26 {
		t.Errorf("score %v (%v), want 26", got, st)
	}
}

// ShareFit never rejects a pod, so it asks for no cluster events: the
// framework would otherwise requeue unschedulable pods on every event.
func TestNoEvents(t *testing.T) {
	events, err := (&ShareFit{}).EventsToRegister(context.Background())
	if err != nil || len(events) != 0 {
		t.Errorf("events %v, %v; want none", events, err)
	}
}
