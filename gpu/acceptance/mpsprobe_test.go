//go:build acceptance

package acceptance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
)

// probeSlice is the probe's share: the claim daemon's ceiling is set to it.
const probeSlice = 4 << 30

// probeClientWait bounds each client's start: a client whose MPS server
// cannot start (a tenant's server that cannot reach its pipe directory)
// waits in cuInit.
const probeClientWait = 20 * time.Second

// TestMPSProbe measures on GPU 0 what a memory slice's enforcement rests
// on, with carve's own claim daemon started as prepare starts it (carve's
// GPU preparer and memory-slice manager, a 4 GiB share, the state
// directory 0711 as the agent makes it) and clients as -tenant-uid
// through the pipe directory, read-only, as a pod's container has it:
// the largest allocation the daemon's ceiling allows (bisected to
// ProbeStep, each try a fresh client), NVML's figure for that process
// against the slice, and the claim's MPS server's own memory with a client
// and without. Policing is wired (the manager needs it for an mps-policed
// share) but never run: its kill would end the reading it would act on.
func TestMPSProbe(t *testing.T) {
	if *dryRun {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, inv := openGPU(ctx, t)
	dev0 := inv.Devices[0]
	choice := memslice.Detect(inv, memslice.EnvBelow("/", *driverRoot))[dev0.UUID]
	t.Logf("GPU 0 %s (%s, driver %s): tier %s %s", dev0.UUID, dev0.Name, inv.DriverVersion, choice.Tier, choice.Reason)
	switch choice.Tier {
	case memslice.TierMPSPoliced:
	case memslice.TierNone:
		t.Fatalf("GPU 0 cannot be sliced: %s", choice.Reason)
	default:
		t.Skipf("GPU 0's tier is %s: the probe measures the MPS ceiling of the mps-policed tier", choice.Tier)
	}
	formerMode, err := s.ComputeMode(ctx, dev0.UUID)
	if err != nil {
		t.Fatal(err)
	}
	state := stateDir(t, "cvq-")
	pd := newPod(t, "cccccccc-0000-4000-8000-000000000030", probeSlice, uint32(*tenant))
	if pd.uid != uint32(*tenant) {
		t.Logf("cgroup v1: the clients run as uid %d, not %d", pd.uid, *tenant)
	}
	pol := police.New(police.Options{Processes: s, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	// No context reserve: the ceiling at the slice, so that what it
	// counts is measured against NVML's figure (the reserve the agent
	// needs is what that figure exceeds the slice by).
	p, entry := sharePreparer(t, s, inv, choice, state, pol, 0)
	r := ProbeResult{GPU: fmt.Sprintf("%s (%s, driver %s)", dev0.UUID, dev0.Name, inv.DriverVersion), Slice: probeSlice, UID: pd.uid, Largest: -1}
	if n, err := readNVML(ctx, s, dev0.UUID); err == nil {
		r.Used[0] = n.used
	}

	a := share(entry, "probe", "4Gi")
	out, err := p.Prepare(ctx, a, entry)
	if err != nil {
		t.Fatalf("prepare %s: %v", a.ClaimName, err)
	}
	torndown := false
	defer func() {
		if !torndown {
			_ = p.Unprepare(context.Background(), a, out.Undo)
		}
	}()
	pd.env, pd.shm, pd.pipe = shareEnv(out)
	r.Path = modes(state, pd.pipe)
	d := mps.Daemon{Path: mpsControl(), Dir: memslice.DaemonDir(filepath.Join(state, memslice.SharesDir), a.ClaimUID, dev0.UUID), UUID: dev0.UUID}
	if servers, err := d.Servers(ctx); err != nil || len(servers) > 0 {
		t.Logf("before any client: MPS servers %v (%v)", servers, err)
	}
	if n, err := readNVML(ctx, s, dev0.UUID); err == nil {
		r.Used[1] = n.used
	}

	try := func(size uint64) (bool, error) {
		tr, used, err := probeTry(ctx, t, s, dev0.UUID, pd, d, size)
		r.Tries = append(r.Tries, tr)
		if tr.Allowed && (r.Largest < 0 || size > r.Tries[r.Largest].Alloc) {
			r.Largest, r.Used[2] = len(r.Tries)-1, used
		}
		return tr.Allowed, err
	}
	// The slice itself first: where MPS allows it, the ceiling counts less
	// than the allocation and the largest is looked for above it.
	allowed, perr := try(probeSlice)
	if perr == nil {
		if allowed {
			_, perr = Bisect(probeSlice, probeSlice+1<<30, ProbeStep, try)
		} else {
			_, perr = Bisect(0, probeSlice, ProbeStep, try)
		}
	}

	// No client now: the server, if it stayed, holds what it holds alone.
	time.Sleep(time.Second)
	if n, err := readNVML(ctx, s, dev0.UUID); err == nil {
		servers := serverPIDs(ctx, d, n)
		r.Server = describeServers(servers)
		r.ServerIdle = n.of(servers...)
		r.Used[3] = n.used
		t.Logf("NVML with no client: %s", n)
	} else {
		r.Server = "NVML: " + err.Error()
	}
	if r.Server == "" {
		r.Server = "none running with no client"
	}
	fmt.Printf("\nThe MPS probe: a %s share of GPU 0, its claim daemon started by carve's preparer\n\n", mib(probeSlice))
	r.Markdown(os.Stdout)
	fmt.Printf("\nRESULT: %s\n", r.Summary())

	terr := p.Unprepare(ctx, a, out.Undo)
	torndown = true
	left := leftOf(state, a, dev0.UUID)
	mode, merr := s.ComputeMode(ctx, dev0.UUID)
	t.Logf("teardown: left %v, compute mode %d (was %d), err %v", left, mode, formerMode, errors.Join(terr, merr))
	switch {
	case perr != nil:
		t.Fatalf("the probe stopped: %v", perr)
	case r.Largest < 0:
		t.Fatalf("no allocation was allowed in a %s slice", mib(probeSlice))
	case terr != nil || merr != nil || len(left) > 0 || mode != formerMode:
		t.Fatalf("teardown: left %v, compute mode %d (was %d), err %v", left, mode, formerMode, errors.Join(terr, merr))
	}
}

// probeTry runs one client of the probe's share allocating size bytes and
// reads NVML while it holds them: the client's figure and its server's,
// the most over a few readings, and the GPU's used memory. An error is a
// client that got no answer from MPS (not a refusal by the ceiling).
func probeTry(ctx context.Context, t *testing.T, s *gpu.Session, uuid string, pd *pod, d mps.Daemon, size uint64) (ProbeTry, uint64, error) {
	tr := ProbeTry{Alloc: size}
	c := run(t, s, uuid, pd, nil, float64(size)/(1<<30), 60, false)
	defer c.stop()
	deadline := time.Now().Add(probeClientWait)
	state := func() any { return c.report(t)["state"] }
	for st := state(); st != "allocated" && st != "refused"; st = state() {
		select {
		case err := <-c.done:
			c.done <- err
			if st := state(); st == "allocated" || st == "refused" {
				continue
			}
			return tr, 0, fmt.Errorf("a client of %s exited without a word: %v%s", mib(size), err, mpsLogs(d))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return tr, 0, fmt.Errorf("a client of %s, as uid %d, neither allocated nor was refused in %s (an MPS server that cannot start?)%s", mib(size), pd.uid, probeClientWait, mpsLogs(d))
		}
	}
	if state() == "refused" {
		msg, _ := c.report(t)["error"].(string)
		tr.Err = msg
		// Refused by the ceiling: the allocation failed. Anything before
		// it (cuInit, the context) is a client MPS did not serve.
		if !strings.HasPrefix(msg, "cuMemAlloc") && !strings.HasPrefix(msg, "cuMemset") {
			return tr, 0, fmt.Errorf("a client of %s got no CUDA context: %s%s", mib(size), msg, mpsLogs(d))
		}
		return tr, 0, nil
	}
	tr.Allowed = true
	pid := uint32(c.cmd.Process.Pid)
	var used uint64
	for i := 0; i < 5; i++ {
		n, err := readNVML(ctx, s, uuid)
		if err != nil {
			return tr, 0, err
		}
		tr.Client = most(tr.Client, n.of(pid))
		tr.Server = most(tr.Server, n.of(serverPIDs(ctx, d, n)...))
		used = max(used, n.used)
		if i == 0 {
			t.Logf("NVML with a client of %s (pid %d): %s", mib(size), pid, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return tr, used, nil
}

func most(a, b Reading) Reading {
	if !b.Seen || (a.Seen && a.Bytes >= b.Bytes) {
		return a
	}
	return b
}

// nvmlSnapshot is what NVML lists on a GPU at one moment: each PID's used
// memory as a compute process and as an MPS client, apart, and the GPU's
// used memory.
type nvmlSnapshot struct {
	compute, clients map[uint32]uint64
	used             uint64
}

// of is the most NVML lists for any of pids, in either list.
func (n nvmlSnapshot) of(pids ...uint32) Reading {
	var r Reading
	for _, pid := range pids {
		for _, m := range []map[uint32]uint64{n.compute, n.clients} {
			if b, ok := m[pid]; ok && b != gpu.NotAvailable {
				r = most(r, Reading{Bytes: b, Seen: true})
			}
		}
	}
	return r
}

func (n nvmlSnapshot) String() string {
	list := func(m map[uint32]uint64) string {
		var out []string
		for pid, b := range m {
			v := mib(b)
			if b == gpu.NotAvailable {
				v = "n/a"
			}
			out = append(out, fmt.Sprintf("%d %s %s", pid, comm(pid), v))
		}
		sort.Strings(out)
		return "[" + strings.Join(out, ", ") + "]"
	}
	return fmt.Sprintf("compute processes %s, MPS clients %s, GPU used %s", list(n.compute), list(n.clients), mib(n.used))
}

// readNVML reads the GPU's compute processes and MPS clients apart
// (Session.Processes merges them) and its used memory.
func readNVML(ctx context.Context, s *gpu.Session, uuid string) (nvmlSnapshot, error) {
	n := nvmlSnapshot{compute: map[uint32]uint64{}, clients: map[uint32]uint64{}}
	err := s.Do(ctx, "the MPS probe's reading of "+uuid, func(l gpu.Library) error {
		dev, ret := l.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML device %s: %v", uuid, ret)
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML compute processes of %s: %v", uuid, ret)
		}
		for _, p := range procs {
			n.compute[p.Pid] = p.UsedGpuMemory
		}
		// Not every driver lists MPS clients apart.
		if procs, ret := dev.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
			for _, p := range procs {
				n.clients[p.Pid] = p.UsedGpuMemory
			}
		}
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML memory of %s: %v", uuid, ret)
		}
		n.used = mem.Used
		return nil
	})
	return n, err
}

// serverPIDs are the claim daemon's MPS servers: those it lists, and any
// process NVML lists whose name is the server's.
func serverPIDs(ctx context.Context, d mps.Daemon, n nvmlSnapshot) []uint32 {
	seen := map[uint32]bool{}
	if list, err := d.Servers(ctx); err == nil {
		for _, pid := range list {
			seen[uint32(pid)] = true
		}
	}
	for _, m := range []map[uint32]uint64{n.compute, n.clients} {
		for pid := range m {
			// /proc/<pid>/comm keeps 15 bytes of nvidia-cuda-mps-server.
			if strings.HasPrefix(comm(pid), "nvidia-cuda-mps") {
				seen[pid] = true
			}
		}
	}
	var out []uint32
	for pid := range seen {
		out = append(out, pid)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func comm(pid uint32) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// describeServers names each server: its pid, uid and executable.
func describeServers(pids []uint32) string {
	var out []string
	for _, pid := range pids {
		uid := "?"
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
					uid = f[1]
				}
			}
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		out = append(out, fmt.Sprintf("pid %d, uid %s, %s", pid, uid, exe))
	}
	return strings.Join(out, "; ")
}

// modes is the pipe directory's path from the state directory down, each
// directory with its mode: what a tenant's MPS server passes through.
func modes(state, pipe string) string {
	rel, err := filepath.Rel(state, pipe)
	if err != nil || strings.HasPrefix(rel, "..") {
		return pipe
	}
	var out []string
	dir := state
	for i, part := range append([]string{""}, strings.Split(rel, string(filepath.Separator))...) {
		dir = filepath.Join(dir, part)
		name := part
		if i == 0 {
			name = state
		}
		if st, err := os.Stat(dir); err == nil {
			name += fmt.Sprintf(" (%04o)", st.Mode().Perm())
		}
		out = append(out, name)
	}
	return strings.Join(out, " / ")
}

// mpsLogs is the end of the daemon's control and server logs, for an
// error.
func mpsLogs(d mps.Daemon) string {
	var out string
	for _, f := range []string{"control.log", "server.log"} {
		b, err := os.ReadFile(filepath.Join(d.LogDir(), f))
		if err != nil {
			continue
		}
		b = bytes.TrimSpace(b)
		if len(b) > 600 {
			b = b[len(b)-600:]
		}
		out += fmt.Sprintf("\n%s:\n%s", f, b)
	}
	return out
}
