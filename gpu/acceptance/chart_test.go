//go:build acceptance

package acceptance

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/gpu/prep"
	"github.com/carve-dra/carve/prepare/atomicfile"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/prepare/hostmount"
	"github.com/carve-dra/carve/slices"
)

var driverRoot = flag.String("driver-root", "/", "where the host's NVIDIA driver files are (the chart's nvidiaDriverRoot), e.g. /usr/local/nvidia")

// agentChildEnv, set, makes TestAgentAsChart the agent's side: its value is
// the state directory.
const agentChildEnv = "CARVE_ACCEPTANCE_AGENT_STATE"

// chartShare is what the agent's side hands the host's: the share's
// environment, as in the acceptance's pods.
type chartShare struct {
	Env   []string `json:"env"`
	Shm   string   `json:"shm"`
	Pipe  string   `json:"pipe"`
	Claim string   `json:"claim"`
	UUID  string   `json:"uuid"`
	Err   string   `json:"err,omitempty"`
}

// TestAgentAsChart prepares a GPU memory share from a root shaped like the
// agent's image (this binary and its libraries, nothing of the driver's),
// chrooted, with the host at /host, the host's /proc, /dev and /sys, and
// the state directory at its host path, as the chart runs the agent: the
// MPS daemon it starts must serve a client on the host with a real MPS
// server, the host's binary, and teardown must leave nothing.
func TestAgentAsChart(t *testing.T) {
	if state := os.Getenv(agentChildEnv); state != "" {
		agentSide(t, state)
		return
	}
	if *dryRun {
		return
	}
	state, err := os.MkdirTemp("/tmp", "cvc-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	// Shared, as the chart's init container makes it: the claim's tmpfs
	// the agent mounts in its container must show on the host.
	unshare, err := ShareMount(state)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unshare() }()
	root, err := os.MkdirTemp("/tmp", "cvr-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// With what libnvidia-ml needs beside libc, as deploy/demo.sh's image.
	if err := BuildRoot(root, exe, "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"); err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run", "^TestAgentAsChart$", "-test.v", "-driver-root", *driverRoot}
	if *keepMode {
		args = append(args, "-keep-compute-mode")
	}
	agent := exec.Command(exe, args...)
	agent.Env = append(os.Environ(), agentChildEnv+"="+state)
	var log strings.Builder
	agent.Stdout, agent.Stderr = &log, &log
	start := time.Now()
	if err := StartChrooted(agent, root, []Bind{{Source: "/", Target: "/host"}, {Source: "/proc", Target: "/proc"}, {Source: "/dev", Target: "/dev"}, {Source: "/sys", Target: "/sys"},
		{Source: state, Target: state, Shared: true}}); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	defer func() {
		if agent.ProcessState == nil {
			_ = agent.Process.Kill()
		}
		t.Logf("the agent's side:\n%s", log.String())
	}()
	var share chartShare
	handed := func() bool {
		raw, err := os.ReadFile(filepath.Join(state, "share.json"))
		return err == nil && json.Unmarshal(raw, &share) == nil
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !handed() {
		select {
		case err := <-exited:
			exited <- err
			if handed() { // its last word, written just before it ended
				break
			}
			t.Fatalf("the agent's side exited before preparing: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent's side prepared nothing in 2 minutes")
		}
	}
	var rows []Row
	if share.Err != "" {
		rows = append(rows, Row{Attack: "the agent as the chart runs it: prepare 10 GiB", Outcome: "FAILED: " + share.Err})
	} else {
		rows = append(rows, Row{Attack: "the agent as the chart runs it: prepare 10 GiB", Outcome: fmt.Sprintf("prepared in %s", time.Since(start).Round(time.Millisecond)), Passed: true})
		rows = append(rows, chartClientRow(t, state, share))
	}
	if err := os.WriteFile(filepath.Join(state, "unprepare"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var aerr error
	select {
	case aerr = <-exited:
	case <-time.After(2 * time.Minute):
		aerr = errors.New("did not exit in 2 minutes")
	}
	var left []string
	dir := filepath.Join(state, "gpushare")
	if _, alive := (mps.Daemon{Dir: memslice.DaemonDir(dir, types.UID(share.Claim), share.UUID), UUID: share.UUID}).PID(); alive {
		left = append(left, "the claim's daemon")
	}
	if ok, _ := mps.IsShm(memslice.ClaimShmDir(dir, types.UID(share.Claim))); ok {
		left = append(left, "the claim's tmpfs")
	}
	rows = append(rows, Row{Attack: "the agent as the chart runs it: teardown", Outcome: fmt.Sprintf("agent exit %v, left %v", aerr, left), Passed: aerr == nil && len(left) == 0})
	printRows(t, "The agent as the chart runs it", rows)
}

// chartClientRow runs a client of the share on the host and checks that
// the daemon the chrooted agent started serves it with a real MPS server
// whose binary is the host's.
func chartClientRow(t *testing.T, state string, share chartShare) Row {
	r := Row{Attack: "the agent as the chart runs it: a client's 4 GiB through its MPS server"}
	file := filepath.Join(t.TempDir(), "report.json")
	c := exec.Command(*python, *client, "--report", file, "--alloc-gib", "4", "--hold", "3")
	c.Env = append(os.Environ(), share.Env...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := mps.StartClient(c, share.Shm, share.Pipe); err != nil {
		r.Outcome = "FAILED: client: " + err.Error()
		return r
	}
	p := &proc{cmd: c, file: file, done: make(chan error, 1)}
	go func() { p.done <- c.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for st := p.report(t)["state"]; st != "allocated" && st != "done"; st = p.report(t)["state"] {
		if st == "refused" || time.Now().After(deadline) {
			p.stop()
			r.Outcome = fmt.Sprintf("FAILED: client %v", p.report(t))
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
	d := mps.Daemon{Path: gpu.FindFile(*driverRoot, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary),
		Dir: memslice.DaemonDir(filepath.Join(state, "gpushare"), types.UID(share.Claim), share.UUID), UUID: share.UUID}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	servers, err := d.Servers(ctx)
	var exes []string
	for _, pid := range servers {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		exes = append(exes, exe)
	}
	werr := <-p.done
	switch {
	case err != nil:
		r.Outcome = "FAILED: the daemon's server list: " + err.Error()
	case len(servers) == 0:
		r.Outcome = "FAILED: the daemon started no MPS server"
	case werr != nil || p.report(t)["state"] != "done":
		r.Outcome = fmt.Sprintf("FAILED: client %v, %v", p.report(t), werr)
	default:
		r.Outcome, r.Passed = fmt.Sprintf("allocated; MPS server %v, %v", servers, exes), true
		for _, exe := range exes {
			if _, err := os.Stat(exe); err != nil || !strings.HasSuffix(exe, "nvidia-cuda-mps-server") {
				r.Outcome, r.Passed = fmt.Sprintf("FAILED: MPS server %s is not the host's binary", exe), false
			}
		}
	}
	return r
}

// agentSide is the chrooted agent: it prepares a 10 GiB share of GPU 0 as
// the chart's agent does (host root /host, the host's driver below it, the
// daemons started from the host's mount namespace), hands the share to the
// host's side, and unprepares it when told.
func agentSide(t *testing.T, state string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const root = "/host"
	hand := func(s chartShare) {
		raw, _ := json.Marshal(s)
		if err := atomicfile.Write(filepath.Join(state, "share.json"), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	driver := filepath.Join(root, *driverRoot)
	s, err := gpu.Open(ctx, gpu.RealLibrary(driver), 10*time.Second)
	if err != nil {
		hand(chartShare{Err: "NVML from " + driver + ": " + err.Error()})
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	inv, err := s.Inventory(ctx)
	if err != nil || len(inv.Devices) == 0 {
		hand(chartShare{Err: fmt.Sprintf("no GPU: %v", err)})
		t.Fatal(err)
	}
	dev0 := inv.Devices[0]
	choice := memslice.Detect(inv, memslice.EnvBelow(root, *driverRoot))[dev0.UUID]
	ns, err := hostmount.RuntimeNamespace()
	if err != nil {
		hand(chartShare{Err: err.Error()})
		t.Fatal(err)
	}
	hostRoot, err := hostmount.RuntimeRoot()
	if err != nil {
		hostRoot = root
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	pol := police.New(police.Options{Processes: s.Lane(), ProcRoot: "/proc", Logger: logger, Owners: owners{}})
	go pol.Run(ctx)
	mgr := memslice.New(memslice.Options{NVML: s, Dir: filepath.Join(state, "gpushare"), ShmDir: filepath.Join(state, "mps-shm"),
		MPSControl: gpu.FindFile(driver, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary), CgroupRoot: hook.DefaultCgroupRoot,
		HostRoot: hostRoot, Start: mps.StartInNamespace(ns, root), Police: pol, KeepComputeMode: *keepMode, DaemonCapabilities: agentDaemonCapabilities(t), ContextReserve: memslice.DefaultContextReserve, Logger: logger})
	res, entry := gpu0Slices(inv, choice)
	p := prep.New(prep.Options{NVML: s, Root: root, DriverRoot: *driverRoot, Shares: mgr, StateDir: state, Logger: logger})
	p.Devices = func() map[string]slices.Entry { return res.Index }
	a := share(entry, "chart", "10Gi")
	out, err := p.Prepare(ctx, a, entry)
	if err != nil {
		hand(chartShare{Err: "prepare: " + err.Error()})
		t.Fatal(err)
	}
	env, shm, pipe := shareEnv(out)
	hand(chartShare{Env: env, Shm: shm, Pipe: pipe, Claim: string(a.ClaimUID), UUID: dev0.UUID})
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if _, err := os.Stat(filepath.Join(state, "unprepare")); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.Unprepare(ctx, a, out.Undo); err != nil {
		t.Fatalf("unprepare: %v", err)
	}
}
