package health_test

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/carve-dra/carve/prepare/health"
)

func down(dev string) health.Condition {
	return health.Condition{Device: dev, Source: "link", Severity: health.Degraded, Reason: "LinkDown", Message: "carrier lost"}
}

func up(dev string) health.Condition { return health.Condition{Device: dev, Source: "link"} }

// settle lets Run notice what the fake clock did.
func settle(t *testing.T, _ *health.Tracker, clk *clocktesting.FakeClock) {
	t.Helper()
	for i := 0; i < 50 && !clk.HasWaiters(); i++ {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
}

func TestTaintClearsAfterHoldDown(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tr := health.NewTracker(30*time.Second, 4*time.Minute, clk)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Run(ctx)

	tr.Observe(down("nic-a"))
	s := tr.Status("nic-a")
	if !s.Tainted || s.Reason != "LinkDown" || s.Severity != health.Degraded || s.Changes != 1 {
		t.Fatalf("after link down: %+v, want tainted LinkDown", s)
	}
	if other := tr.Status("nic-b"); other.Tainted {
		t.Fatalf("nic-b tainted too: %+v", other)
	}
	tr.Observe(up("nic-a"))
	if s := tr.Status("nic-a"); !s.Tainted || !s.Recovering {
		t.Fatalf("just after link up: %+v, want still tainted, recovering", s)
	}
	settle(t, tr, clk)
	clk.Step(29 * time.Second)
	settle(t, tr, clk)
	if s := tr.Status("nic-a"); !s.Tainted {
		t.Fatalf("29 s after link up: %+v, want still tainted", s)
	}
	clk.Step(2 * time.Second)
	settle(t, tr, clk)
	if s := tr.Status("nic-a"); s.Tainted || s.Changes != 2 {
		t.Fatalf("31 s after link up: %+v, want cleared after two changes", s)
	}
}

// A link flapping every second for 30 s makes one taint, held until the link
// is steady for the hold-down grown by the flaps (capped).
func TestFlappingMakesOneTaint(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tr := health.NewTracker(30*time.Second, 4*time.Minute, clk)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Run(ctx)
	taints := 0
	wasTainted := false
	for i := 0; i < 30; i++ {
		tr.Observe(down("nic-a"))
		clk.Step(500 * time.Millisecond)
		tr.Observe(up("nic-a"))
		settle(t, tr, clk)
		clk.Step(500 * time.Millisecond)
		settle(t, tr, clk)
		s := tr.Status("nic-a")
		if s.Tainted && !wasTainted {
			taints++
		}
		wasTainted = s.Tainted
	}
	s := tr.Status("nic-a")
	if taints != 1 || !s.Tainted || s.Changes != 1 {
		t.Fatalf("after 30 flaps: %d taints, status %+v; want one taint, still held", taints, s)
	}
	if s.HoldDown != 4*time.Minute || s.Flaps != 29 {
		t.Errorf("hold-down %v after %d flaps, want the 4m cap after 29", s.HoldDown, s.Flaps)
	}
	clk.Step(4*time.Minute - time.Second)
	settle(t, tr, clk)
	if !tr.Status("nic-a").Tainted {
		t.Fatal("cleared before the grown hold-down")
	}
	clk.Step(2 * time.Second)
	settle(t, tr, clk)
	if s := tr.Status("nic-a"); s.Tainted {
		t.Fatalf("still tainted after the grown hold-down: %+v", s)
	}
	// Failing again right after the clear is a flap too.
	tr.Observe(down("nic-a"))
	if s := tr.Status("nic-a"); !s.Tainted || s.HoldDown != 4*time.Minute {
		t.Errorf("failing right after the clear: %+v, want tainted with the capped hold-down", s)
	}
}

// A worse condition replaces the taint's reason; the device is healthy only
// once every source says so.
func TestWorstSourceWins(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tr := health.NewTracker(time.Second, time.Second, clk)
	tr.Observe(down("nic-a"))
	tr.Observe(health.Condition{Device: "nic-a", Source: "pci", Severity: health.Lost, Reason: "DeviceGone"})
	if s := tr.Status("nic-a"); s.Reason != "DeviceGone" || s.Severity != health.Lost || s.Changes != 2 {
		t.Fatalf("%+v, want lost DeviceGone", s)
	}
	tr.Observe(up("nic-a"))
	if s := tr.Status("nic-a"); s.Recovering {
		t.Fatalf("recovering while the pci source says lost: %+v", s)
	}
	tr.Observe(health.Condition{Device: "nic-a", Source: "pci"})
	if s := tr.Status("nic-a"); !s.Recovering || s.Reason != "DeviceGone" {
		t.Fatalf("%+v, want recovering, reason kept", s)
	}
}

func TestFakeSource(t *testing.T) {
	tr := health.NewTracker(time.Second, time.Second, nil)
	f := health.NewFakeSource()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.Run(ctx, tr) }()
	f.Set(down("gpu-0"))
	select {
	case <-tr.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no change")
	}
	if !tr.Status("gpu-0").Tainted {
		t.Fatal("not tainted")
	}
}
