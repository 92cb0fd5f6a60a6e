package police

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-dra/carve/gpu"
)

// blockingOwners answers the first ask of each claim, then blocks every
// later one until the test ends: an API server gone slow.
type blockingOwners struct {
	staticOwners
	mu       sync.Mutex
	answered map[string]bool
	blocked  atomic.Int32
}

func (o *blockingOwners) ReservedPods(ctx context.Context, ns, name string) ([]PodRef, error) {
	o.mu.Lock()
	first := !o.answered[ns+"/"+name]
	o.answered[ns+"/"+name] = true
	o.mu.Unlock()
	if first {
		return o.staticOwners.ReservedPods(ctx, ns, name)
	}
	o.blocked.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// The loop kills over-limit processes while a prepare holds the NVML
// session's turn and while the API server does not answer: its process
// query goes through a lane of the session, and pod lookups are beside it.
// What is asserted is order, not time: the kill happens before the
// prepare lets go (it holds for 15 s unless released; were the loop
// behind it, the kill would come after).
func TestKillWhileAPrepareHoldsNVML(t *testing.T) {
	parent := cgroupParent(t)
	over := podProcess(t, parent, podA)
	stranger := podProcess(t, parent, "cccccccc-0000-0000-0000-000000000003")
	var listed atomic.Value
	listed.Store([]nvml.ProcessInfo{{Pid: uint32(stranger.pid), UsedGpuMemory: gib}})
	dev := &mock.Device{
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return listed.Load().([]nvml.ProcessInfo), nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
	}
	lib := gpu.Library{Interface: &mock.Interface{
		InitFunc:                  func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:              func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(string) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := gpu.Open(ctx, lib, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	owners := &blockingOwners{staticOwners: staticOwners{"ns/small": {{Namespace: "ns", Name: "pod-a", UID: podA}}}, answered: map[string]bool{}}
	p := New(Options{Processes: s.Lane(), Owners: owners, ProcRoot: "/proc"})
	p.Add(Share{Key: "ca/gpu/s1", ClaimUID: "ca", Namespace: "ns", Name: "small", ShareID: "s1", UUID: "GPU-1", Slice: 10 * gib})
	p.RefreshOwners(ctx)

	held, release := make(chan struct{}), make(chan struct{})
	var prepareDone atomic.Bool
	go func() {
		_ = s.Do(ctx, "create MIG instance", func(gpu.Library) error {
			close(held)
			select {
			case <-release:
			case <-time.After(15 * time.Second):
			}
			prepareDone.Store(true)
			return nil
		})
	}()
	<-held
	stopped := make(chan struct{})
	go func() { p.Run(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	// The stranger pod wakes the owners loop, whose next ask blocks.
	for owners.blocked.Load() == 0 {
		select {
		case <-stopped:
			t.Fatal("loop stopped")
		case <-time.After(5 * time.Millisecond):
		}
		for _, st := range p.shares {
			p.mu.Lock()
			st.asked = time.Time{}
			p.mu.Unlock()
		}
		p.wantOwners()
	}
	listed.Store([]nvml.ProcessInfo{{Pid: uint32(stranger.pid), UsedGpuMemory: gib}, {Pid: uint32(over.pid), UsedGpuMemory: 12 * gib}})
	excess := time.Now()
	killed := over.killedBySIGKILL(t)
	latency := time.Since(excess)
	if prepareDone.Load() {
		t.Fatal("the kill came only after the prepare let go of NVML")
	}
	if !killed {
		t.Fatalf("ended with %v, want SIGKILL", over.status)
	}
	t.Logf("killed %s after the excess, with NVML's session held by a prepare and the API server not answering", latency)
	close(release)
	if !stranger.survives(t) {
		t.Errorf("the stranger pod's process ended with %v", stranger.status)
	}
}

// Kills are always counted; their log lines and events come at most once
// per share per ReportEvery, the next naming the kills in between.
func TestKillReportsAreRateLimited(t *testing.T) {
	n := newFakeNode(t)
	p, _ := newPolice(t, n)
	p.opts.ReportEvery = time.Hour
	n.run(t, 10, podA, 12*gib, 1)
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	n.run(t, 11, podA, 12*gib, 2)
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(n.killed) != 2 || len(n.events) != 1 {
		t.Fatalf("killed %v, events %q: want two kills and one event", n.killed, n.events)
	}
	if got := testutil.ToFloat64(p.metrics.kills.WithLabelValues("ca", "s1")); got != 2 {
		t.Errorf("kills metric %v", got)
	}
	if got := testutil.ToFloat64(p.metrics.suppressed.WithLabelValues("ca", "s1")); got != 1 {
		t.Errorf("suppressed metric %v", got)
	}
	// Past the interval the next kill is reported with the one between.
	for _, st := range p.shares {
		st.reported = time.Now().Add(-2 * time.Hour)
	}
	n.run(t, 12, podA, 12*gib, 3)
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(n.events) != 2 || !strings.Contains(n.events[1], "1 more kills of this share since the last event") {
		t.Errorf("events %q", n.events)
	}
}
