package police

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
)

// Real processes in real pod cgroups: `sleep` children moved into cgroups
// named as the kubelet's systemd driver names pods', so that PodOf, the
// start time and the pidfd kill all act on the kernel's answers.

// cgroupParent makes a cgroup for the test's pods in a hierarchy this host
// lets it write: cgroup v2 (unified, as on hybrid hosts, or the only one),
// else v1's pids controller. The test skips where it is not root.
func cgroupParent(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups and kill through pidfds")
	}
	var errs []error
	for _, h := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids"} {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue
		}
		dir := filepath.Join(h, fmt.Sprintf("carve-police-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
		if err := os.Mkdir(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		t.Cleanup(func() { _ = os.Remove(dir) })
		return dir
	}
	t.Fatalf("no writable cgroup hierarchy: %v", errors.Join(errs...))
	return ""
}

// child is a sleep process in a pod's cgroup; exited is closed once it has
// been reaped, with its wait status.
type child struct {
	pid    int
	pod    types.UID
	cmd    *exec.Cmd
	exited chan struct{}
	status syscall.WaitStatus
}

// podProcess starts `sleep` and moves it into the pod's cgroup below
// parent. Starts are 20 ms apart, so that start times (10 ms clock ticks)
// order the processes as they were started.
func podProcess(t *testing.T, parent string, pod types.UID) *child {
	t.Helper()
	dir := filepath.Join(parent, "kubepods-besteffort-pod"+strings.ReplaceAll(string(pod), "-", "_")+".slice")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{pid: cmd.Process.Pid, pod: pod, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		c.status = cmd.ProcessState.Sys().(syscall.WaitStatus)
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
		_ = os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(c.pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := PodOf("/proc", c.pid); err != nil || got != pod {
		t.Fatalf("process %d in %s: pod %q, %v", c.pid, dir, got, err)
	}
	return c
}

// killedBySIGKILL waits for the child's end and says whether SIGKILL ended
// it. The wait is a guard against a hang, not a timing.
func (c *child) killedBySIGKILL(t *testing.T) bool {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("process %d did not end", c.pid)
	}
	return c.status.Signaled() && c.status.Signal() == syscall.SIGKILL
}

// survives ends the child with SIGTERM and says whether that is what ended
// it: a SIGKILL sent earlier would have ended it first, whatever came
// after (the kernel marks the group as exiting when SIGKILL is sent).
func (c *child) survives(t *testing.T) bool {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	<-c.exited
	return c.status.Signaled() && c.status.Signal() == syscall.SIGTERM
}

// nvmlList is NVML's process list of GPU-1 as the test sets it: real PIDs,
// memory chosen.
type nvmlList struct {
	mu   sync.Mutex
	list []gpu.Process
}

func (n *nvmlList) set(procs ...gpu.Process) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.list = procs
}

func (n *nvmlList) Processes(_ context.Context, uuid string) ([]gpu.Process, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if uuid != "GPU-1" {
		return nil, fmt.Errorf("no GPU %s", uuid)
	}
	return append([]gpu.Process(nil), n.list...), nil
}

// staticOwners answers each claim's pods from a map.
type staticOwners map[string][]PodRef

func (o staticOwners) ReservedPods(_ context.Context, ns, name string) ([]PodRef, error) {
	return o[ns+"/"+name], nil
}

func used(c *child, b uint64) gpu.Process { return gpu.Process{PID: uint32(c.pid), UsedBytes: b} }

// Pod A holds two shares of the GPU (4 and 6 GiB): its processes may hold
// 10 GiB together there. Pod B holds one 10 GiB share. Within the sum
// nothing is killed; over it, the pod's newest process is.
func TestPodsSharesAddUpPerGPU(t *testing.T) {
	parent := cgroupParent(t)
	a1, a2 := podProcess(t, parent, podA), podProcess(t, parent, podA)
	b1, b2 := podProcess(t, parent, podB), podProcess(t, parent, podB)
	nv := &nvmlList{}
	p := New(Options{Processes: nv, ProcRoot: "/proc", Owners: staticOwners{
		"ns/a-small": {{Namespace: "ns", Name: "pod-a", UID: podA}},
		"ns/a-large": {{Namespace: "ns", Name: "pod-a", UID: podA}},
		"ns/b":       {{Namespace: "ns", Name: "pod-b", UID: podB}},
	}})
	p.Add(Share{Key: "ca1/gpu/s1", ClaimUID: "ca1", Namespace: "ns", Name: "a-small", ShareID: "s1", UUID: "GPU-1", Slice: 4 * gib})
	p.Add(Share{Key: "ca2/gpu/s2", ClaimUID: "ca2", Namespace: "ns", Name: "a-large", ShareID: "s2", UUID: "GPU-1", Slice: 6 * gib})
	p.Add(Share{Key: "cb/gpu/s3", ClaimUID: "cb", Namespace: "ns", Name: "b", ShareID: "s3", UUID: "GPU-1", Slice: 10 * gib})
	p.RefreshOwners(context.Background())

	// A: 9 GiB in 4+6, over either share alone. B: 12 GiB in 10.
	nv.set(used(a1, 5*gib), used(a2, 4*gib), used(b1, 6*gib), used(b2, 6*gib))
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !b2.killedBySIGKILL(t) {
		t.Fatalf("pod B's newest process ended with %v, want SIGKILL", b2.status)
	}
	u := p.Usage()
	if u["ca1/gpu/s1"].UsedBytes != 9*gib || u["ca1/gpu/s1"].LimitBytes != 10*gib || u["cb/gpu/s3"].UsedBytes != 6*gib || u["cb/gpu/s3"].Kills != 1 {
		t.Errorf("usage %+v", u)
	}
	// A now holds 11 GiB: its newest goes.
	nv.set(used(a1, 5*gib), used(a2, 6*gib), used(b1, 6*gib))
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !a2.killedBySIGKILL(t) {
		t.Fatalf("pod A's newest process ended with %v, want SIGKILL", a2.status)
	}
	if u := p.Usage(); u["ca1/gpu/s1"].Kills+u["ca2/gpu/s2"].Kills != 1 {
		t.Errorf("pod A's kills %+v, want one", u)
	}
	for _, c := range []*child{a1, b1} {
		if !c.survives(t) {
			t.Errorf("process %d within its pod's limit ended with %v", c.pid, c.status)
		}
	}
}

// NVML's "not available", flagged or raw, is never a number of bytes.
func TestNotAvailableNeverKills(t *testing.T) {
	parent := cgroupParent(t)
	b1, b2, b3 := podProcess(t, parent, podB), podProcess(t, parent, podB), podProcess(t, parent, podB)
	nv := &nvmlList{}
	p := New(Options{Processes: nv, ProcRoot: "/proc", Owners: staticOwners{"ns/b": {{Namespace: "ns", Name: "pod-b", UID: podB}}}})
	p.Add(Share{Key: "cb/gpu/s3", ClaimUID: "cb", Namespace: "ns", Name: "b", ShareID: "s3", UUID: "GPU-1", Slice: 10 * gib})
	p.RefreshOwners(context.Background())
	nv.set(used(b1, 9*gib), gpu.Process{PID: uint32(b2.pid), UsedBytes: gpu.NotAvailable}, gpu.Process{PID: uint32(b3.pid), UsedUnknown: true})
	for i := 0; i < 3; i++ {
		if err := p.Tick(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if u := p.Usage()["cb/gpu/s3"]; u.UsedBytes != 9*gib || u.Processes != 3 || u.UnknownProcesses != 2 || u.Kills != 0 {
		t.Errorf("usage %+v", u)
	}
	for _, c := range []*child{b1, b2, b3} {
		if !c.survives(t) {
			t.Errorf("process %d ended with %v", c.pid, c.status)
		}
	}
}

// A PID that names another process than the one seen is never signalled:
// another start time, or another pod.
func TestReusedPIDIsNotSignalled(t *testing.T) {
	parent := cgroupParent(t)
	c := podProcess(t, parent, podA)
	start := StartTime("/proc", c.pid)
	if start == 0 {
		t.Fatal("no start time")
	}
	for _, tg := range []Target{{PID: c.pid, Pod: podA, Start: start + 1}, {PID: c.pid, Pod: podB, Start: start}} {
		if err := KillChecked("/proc", tg); !errors.Is(err, ErrNotSame) {
			t.Errorf("%+v: %v, want ErrNotSame", tg, err)
		}
	}
	// Through a tick: the process seen has (as far as the kill can tell)
	// ended since the listing and its PID names another.
	nv := &nvmlList{}
	reused := func(tg Target) error { tg.Start++; return KillChecked("/proc", tg) }
	p := New(Options{Processes: nv, ProcRoot: "/proc", Kill: reused, Owners: staticOwners{"ns/a": {{Namespace: "ns", Name: "pod-a", UID: podA}}}})
	p.Add(Share{Key: "ca/gpu/s1", ClaimUID: "ca", Namespace: "ns", Name: "a", ShareID: "s1", UUID: "GPU-1", Slice: gib})
	p.RefreshOwners(context.Background())
	nv.set(used(c, 2*gib))
	if err := p.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := p.Usage()["ca/gpu/s1"]; u.Kills != 0 {
		t.Errorf("kills %d of a reused PID", u.Kills)
	}
	if !c.survives(t) {
		t.Fatalf("process ended with %v: it was signalled", c.status)
	}
	// The right process is killed.
	d := podProcess(t, parent, podA)
	if err := KillChecked("/proc", Target{PID: d.pid, Pod: podA, Start: StartTime("/proc", d.pid)}); err != nil {
		t.Fatal(err)
	}
	if !d.killedBySIGKILL(t) {
		t.Fatalf("ended with %v", d.status)
	}
	if err := KillChecked("/proc", Target{PID: d.pid, Pod: podA, Start: 1}); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("a reaped process: %v, want ESRCH", err)
	}
}
