package police

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
)

// A process query that hangs in the driver for one GPU leaves the other
// GPUs policed: each GPU's queries go through a lane of its own, and each
// GPU is looked at on its own. With one lane for all, the hung call wedged
// it and no GPU was policed again until the agent restarted. The wedged
// lane is reported, and a fresh one tried after Retry.
func TestHungGPULeavesTheOthersPoliced(t *testing.T) {
	r, err := nvmlreplay.New(nvmltest.H100Node())
	if err != nil {
		t.Fatal(err)
	}
	hung, healthy := nvmltest.H100UUID(0), nvmltest.H100UUID(1)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	r.Server.Devices[0].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		<-release // the driver never answers
		return nil, nvml.SUCCESS
	}
	n := newFakeNode(t)
	r.Server.Devices[1].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		n.mu.Lock()
		defer n.mu.Unlock()
		var out []nvml.ProcessInfo
		for _, p := range n.list {
			out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.UsedBytes})
		}
		return out, nvml.SUCCESS
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := gpu.Open(ctx, r.Library(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	lanes := s.GPULanes()
	lanes.Retry = time.Second
	p := New(Options{Processes: lanes, Owners: n, ProcRoot: n.proc, Kill: n.kill, Interval: 10 * time.Millisecond})
	p.Add(Share{Key: "ca/gpu/s1", ClaimUID: "ca", Namespace: "ns", Name: "small", ShareID: "s1", UUID: healthy, Slice: 10 * gib})
	p.Add(Share{Key: "cb/gpu/s2", ClaimUID: "cb", Namespace: "ns", Name: "large", ShareID: "s2", UUID: hung, Slice: 20 * gib})
	n.owners["ns/small"] = []PodRef{{Namespace: "ns", Name: "pod-a", UID: podA}}
	n.owners["ns/large"] = []PodRef{{Namespace: "ns", Name: "pod-b", UID: podB}}
	p.RefreshOwners(ctx)
	go p.Run(ctx)

	// GPU 0's first query hangs; past the session's bound its lane is
	// wedged. GPU 1 is policed throughout: a process put over its slice
	// then, and again after the wedge, is killed each time.
	start := time.Now()
	n.run(t, 101, podA, 16*gib, 2000)
	waitKilled(t, n, 101, 2*time.Second)
	t.Logf("GPU 1's process over its slice killed %v after it started, GPU 0's query hung", time.Since(start).Round(time.Millisecond))
	deadline := time.Now().Add(2 * time.Second)
	for lanes.Wedged(hung) == nil {
		if time.Now().After(deadline) {
			t.Fatal("GPU 0's lane not reported wedged 2 s after its query hung")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("GPU 0: %v", lanes.Wedged(hung))
	if err := lanes.Wedged(healthy); err != nil {
		t.Fatalf("GPU 1's lane: %v", err)
	}
	n.run(t, 102, podA, 16*gib, 3000)
	waitKilled(t, n, 102, 2*time.Second)
}

func waitKilled(t *testing.T, n *fakeNode, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n.mu.Lock()
		killed := append([]int(nil), n.killed...)
		n.mu.Unlock()
		for _, k := range killed {
			if k == pid {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not killed within %v (killed %v)", pid, within, killed)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
