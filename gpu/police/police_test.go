package police

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
)

const (
	gib  = uint64(1) << 30
	podA = types.UID("aaaaaaaa-0000-0000-0000-000000000001")
	podB = types.UID("bbbbbbbb-0000-0000-0000-000000000002")
)

// fakeNode is a /proc with pod processes, NVML's process list of one GPU,
// and the claims' reserved pods.
type fakeNode struct {
	mu     sync.Mutex
	proc   string
	list   []gpu.Process
	owners map[string][]PodRef
	asked  int
	killed []int
	events []string
}

func newFakeNode(t *testing.T) *fakeNode {
	return &fakeNode{proc: t.TempDir(), owners: map[string][]PodRef{}}
}

// run starts a process in a pod (systemd cgroup v1 names, as this
// project's cluster has) holding used bytes; start orders processes.
func (n *fakeNode) run(t *testing.T, pid int, pod types.UID, used uint64, start int) {
	t.Helper()
	dir := filepath.Join(n.proc, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := "0::/init.scope\n"
	if pod != "" {
		cg = fmt.Sprintf("12:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/cri-containerd-1.scope\n0::/\n", strings.ReplaceAll(string(pod), "-", "_"))
	}
	stat := fmt.Sprintf("%d (python3 (x)) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, start)
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.list = append(n.list, gpu.Process{PID: uint32(pid), UsedBytes: used})
	n.mu.Unlock()
}

func (n *fakeNode) Processes(_ context.Context, uuid string) ([]gpu.Process, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if uuid != "GPU-1" {
		return nil, fmt.Errorf("no GPU %s", uuid)
	}
	return append([]gpu.Process(nil), n.list...), nil
}

func (n *fakeNode) ReservedPods(_ context.Context, ns, name string) ([]PodRef, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.asked++
	return n.owners[ns+"/"+name], nil
}

func (n *fakeNode) PodEvent(pod PodRef, reason, msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, pod.Name+" "+reason+": "+msg)
}

// kill ends the process: its memory and its /proc entry go.
func (n *fakeNode) kill(t Target) error {
	pid := t.PID
	n.mu.Lock()
	defer n.mu.Unlock()
	n.killed = append(n.killed, pid)
	for i, p := range n.list {
		if int(p.PID) == pid {
			n.list = append(n.list[:i], n.list[i+1:]...)
			break
		}
	}
	return os.RemoveAll(filepath.Join(n.proc, fmt.Sprint(pid)))
}

func newPolice(t *testing.T, n *fakeNode) (*Police, string) {
	state := filepath.Join(t.TempDir(), "usage.json")
	p := New(Options{Processes: n, Owners: n, Recorder: n, ProcRoot: n.proc, Kill: n.kill, StateFile: state, Interval: 10 * time.Millisecond})
	p.Add(Share{Key: "ca/gpu/s1", ClaimUID: "ca", Namespace: "ns", Name: "small", ShareID: "s1", UUID: "GPU-1", Slice: 10 * gib})
	p.Add(Share{Key: "cb/gpu/s2", ClaimUID: "cb", Namespace: "ns", Name: "large", ShareID: "s2", UUID: "GPU-1", Slice: 20 * gib})
	n.owners["ns/small"] = []PodRef{{Namespace: "ns", Name: "pod-a", UID: podA}}
	n.owners["ns/large"] = []PodRef{{Namespace: "ns", Name: "pod-b", UID: podB}}
	p.RefreshOwners(context.Background())
	return p, state
}

func TestNewestProcessOfTheShareOverItsSliceIsKilled(t *testing.T) {
	n := newFakeNode(t)
	p, state := newPolice(t, n)
	n.run(t, 100, podA, 8*gib, 1000)  // fits alone
	n.run(t, 101, podA, 8*gib, 2000)  // the newest: 16 GiB > 10 GiB
	n.run(t, 99, podA, 0, 500)        // oldest, holds nothing yet
	n.run(t, 200, podB, 20*gib, 1500) // the other share at its slice
	n.run(t, 300, "", 500<<20, 1)     // the MPS server: no pod
	// NVML still lists a client whose /proc entry (and cgroup) is gone.
	n.list = append(n.list, gpu.Process{PID: 400, UsedBytes: 30 * gib})

	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(n.killed) != "[101]" {
		t.Fatalf("killed %v, want [101] (the newest process of the share over its slice)", n.killed)
	}
	if len(n.events) != 1 || !strings.HasPrefix(n.events[0], "pod-a GPUMemorySliceExceeded: process 101 killed") {
		t.Errorf("events %q", n.events)
	}
	if got := testutil.ToFloat64(p.metrics.kills.WithLabelValues("ca", "s1")); got != 1 {
		t.Errorf("kills metric = %v", got)
	}
	if got := testutil.ToFloat64(p.metrics.slice.WithLabelValues("ca", "s1")); got != float64(10*gib) {
		t.Errorf("slice metric = %v, want 10 GiB", got)
	}
	u := p.Usage()
	if u["ca/gpu/s1"].UsedBytes != 8*gib || u["ca/gpu/s1"].Kills != 1 || u["cb/gpu/s2"].UsedBytes != 20*gib || u["cb/gpu/s2"].Kills != 0 {
		t.Errorf("usage %+v", u)
	}
	// Kills outlive the agent: a new loop reads them back.
	saved, err := ReadUsage(state)
	if err != nil || saved["ca/gpu/s1"].Kills != 1 {
		t.Fatalf("saved usage %+v, %v", saved, err)
	}
	q := New(Options{Processes: n, StateFile: state, ProcRoot: n.proc})
	q.Add(Share{Key: "ca/gpu/s1", ClaimUID: "ca", ShareID: "s1", UUID: "GPU-1", Slice: 10 * gib})
	if got := q.Usage()["ca/gpu/s1"].Kills; got != 1 {
		t.Errorf("kills after restart = %d", got)
	}
	// Fitting again, nothing more is killed.
	if err := p.Tick(context.Background()); err != nil || len(n.killed) != 1 {
		t.Errorf("second tick: %v, killed %v", err, n.killed)
	}
}

func TestSeveralKillsUntilTheShareFits(t *testing.T) {
	n := newFakeNode(t)
	p, _ := newPolice(t, n)
	n.run(t, 10, podA, 6*gib, 1)
	n.run(t, 11, podA, 6*gib, 3)
	n.run(t, 12, podA, 6*gib, 2)
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(n.killed) != "[11 12]" {
		t.Errorf("killed %v, want [11 12]: newest first until 6 GiB is left", n.killed)
	}
}

// A tick never asks the API server: a pod it cannot place wakes the owners
// loop, which asks each claim at most once a second; the pod is policed
// from the first tick after the answer.
func TestUnknownPodWakesTheOwnersLoop(t *testing.T) {
	n := newFakeNode(t)
	p, _ := newPolice(t, n)
	asked := n.asked
	<-p.ownersDue // Add's wake, answered by newPolice's RefreshOwners
	stranger := types.UID("cccccccc-0000-0000-0000-000000000003")
	n.run(t, 50, stranger, 40*gib, 1) // a pod of no share: not ours to kill
	for i := 0; i < 5; i++ {
		if err := p.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(n.killed) != 0 {
		t.Errorf("killed %v", n.killed)
	}
	if n.asked != asked {
		t.Errorf("ticks asked the API server %d times, want none", n.asked-asked)
	}
	select {
	case <-p.ownersDue:
	default:
		t.Fatal("the unknown pod did not wake the owners loop")
	}
	p.RefreshOwners(context.Background())
	if n.asked != asked {
		t.Errorf("claims asked again within a second: %d asks", n.asked-asked)
	}
	// A pod that joins a share later is found on the next ask.
	n.owners["ns/small"] = append(n.owners["ns/small"], PodRef{Namespace: "ns", Name: "pod-c", UID: stranger})
	for _, st := range p.shares {
		st.asked = time.Time{}
	}
	p.RefreshOwners(context.Background())
	if n.asked != asked+2 {
		t.Errorf("asks %d, want one per share", n.asked-asked)
	}
	if err := p.Tick(context.Background()); err != nil || fmt.Sprint(n.killed) != "[50]" {
		t.Errorf("after the pod joined: %v, killed %v", err, n.killed)
	}
}

// On the default interval, a process over its slice is killed; how soon
// is measured, not asserted (a loaded machine would make a bound flaky):
// the real H100's figures are in gpu/acceptance/results.
func TestKillOnTheDefaultInterval(t *testing.T) {
	n := newFakeNode(t)
	p, _ := newPolice(t, n)
	p.opts.Interval = DefaultInterval
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	defer func() { cancel(); <-stopped }()
	go func() { p.Run(ctx); close(stopped) }()
	time.Sleep(30 * time.Millisecond)
	n.run(t, 70, podA, 12*gib, 1)
	over := time.Now()
	for {
		n.mu.Lock()
		done := len(n.killed) > 0
		n.mu.Unlock()
		if done {
			break
		}
		if time.Since(over) > 2*time.Second {
			t.Fatal("no kill within 2 s")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("killed %s after the excess (interval %s)", time.Since(over).Round(time.Millisecond), DefaultInterval)
}

func TestPodOf(t *testing.T) {
	n := newFakeNode(t)
	for i, cg := range []string{
		"0::/kubepods/burstable/podaaaaaaaa-0000-0000-0000-000000000001/abc\n",
		"0::/kubepods.slice/kubepods-podaaaaaaaa_0000_0000_0000_000000000001.slice/cri-containerd-x.scope\n",
	} {
		dir := filepath.Join(n.proc, fmt.Sprint(i+1))
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644)
		if got, err := PodOf(n.proc, i+1); err != nil || got != podA {
			t.Errorf("%q: %q, %v", cg, got, err)
		}
	}
	if _, err := PodOf(n.proc, 12345); err == nil {
		t.Error("a gone process was mapped")
	}
	if StartTime(n.proc, 12345) != 0 {
		t.Error("a gone process has a start time")
	}
}
