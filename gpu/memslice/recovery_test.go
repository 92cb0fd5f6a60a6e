package memslice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
)

// A crash after the daemon started and before the claim was recorded as
// prepared: the next agent finds no share in the checkpoint, gives the GPU
// back at Restore (daemon stopped, mode restored), and the driver's
// rollback of the started claim then finds nothing left to do.
func TestCrashAfterDaemonBeforeCheckpoint(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.nv.mode = nvml.COMPUTEMODE_PROHIBITED
	if _, _, err := New(e.opts).Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	// The agent dies here; the daemon and mode Default remain.
	d := e.daemonOf("a")
	if _, alive := d.PID(); !alive || e.nv.mode != gpu.ComputeModeDefault {
		t.Fatal("set-up did not happen")
	}
	next := New(e.opts)
	if err := next.Restore(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, alive := d.PID(); alive {
		t.Error("the daemon no share owns was left running")
	}
	if e.nv.mode != nvml.COMPUTEMODE_PROHIBITED {
		t.Errorf("compute mode %d, want PROHIBITED back", e.nv.mode)
	}
	if _, err := os.Stat(ClaimDir(e.dir, "uid-a")); !os.IsNotExist(err) {
		t.Errorf("the claim's directory no share owns is left: %v", err)
	}
	if err := next.Unprepare(ctx, "a", "GPU-1"); err != nil {
		t.Errorf("rollback: %v", err)
	}
	// And the claim is prepared again from scratch.
	if _, _, err := next.Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	if err := next.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
}

// The reverse: the checkpoint holds the share, but the daemon is gone (it
// died with the node agent's container, or was killed) and the GPU's mode
// was reset. Restore starts it again with the ceiling, sets the mode and
// polices the share; a daemon still running is adopted, not restarted.
func TestCheckpointWithoutDaemon(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := share("a", 10*gib, TierMPSPoliced)
	if _, _, err := New(e.opts).Prepare(ctx, r); err != nil {
		t.Fatal(err)
	}
	d := e.daemonOf("a")
	pid, _ := d.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, alive := d.PID(); alive; _, alive = d.PID() {
		time.Sleep(time.Millisecond)
	}
	e.nv.mode = gpu.ComputeModeExclusiveProcess
	before := e.commands(t)
	pol := police.New(police.Options{Processes: noProcs{}})
	e.opts.Police = pol
	m := New(e.opts)
	if err := m.Restore(ctx, []Request{r}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimPrefix(e.commands(t), before+"\n"); got != "start -d\nset_default_device_pinned_mem_limit 0 10240M" {
		t.Errorf("restore commands %q", got)
	}
	if e.nv.mode != gpu.ComputeModeDefault || len(pol.Usage()) != 1 {
		t.Errorf("mode %d, policed %v", e.nv.mode, pol.Usage())
	}
	// Restarted again with the daemon up: adopted.
	before = e.commands(t)
	if err := New(e.opts).Restore(ctx, []Request{r}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimPrefix(e.commands(t), before+"\n"); strings.Contains(got, "start") {
		t.Errorf("a running daemon was restarted: %q", got)
	}
	if err := m.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	// The former mode recorded by the first agent (Default) is the one
	// restored, not the one found at Restore.
	if e.nv.mode != gpu.ComputeModeDefault {
		t.Errorf("mode %d after the last share", e.nv.mode)
	}
}

func TestChoose(t *testing.T) {
	capacity := map[string]uint64{"nvidia/0000:19:00.0/vidmem": 80 * gib}
	for _, c := range []struct {
		name string
		f    Facts
		tier Tier
		why  string
	}{
		{"r615 with dmem", Facts{DriverVersion: "615.10", CUDADriverVersion: 13040, PCIAddress: "0000:19:00.0", Dmem: capacity, MPSControl: "/usr/bin/x"}, TierDMEM, ""},
		{"the lent H100", Facts{DriverVersion: "580.159.04", CUDADriverVersion: 13000, PCIAddress: "0000:19:00.0", DmemErr: errors.New("absent"), MPSControl: "/usr/bin/x"}, TierMPSPoliced, "driver 580.159.04 is older than r615; CUDA 13.0 is older than 13.4; no dmem cgroup controller"},
		{"r615 without the region", Facts{DriverVersion: "615.10", CUDADriverVersion: 13040, PCIAddress: "0000:1a:00.0", Dmem: capacity, MPSControl: "/usr/bin/x"}, TierMPSPoliced, "no nvidia/0000:1a:00.0/vidmem region"},
		{"no MPS", Facts{DriverVersion: "615.10", CUDADriverVersion: 13040, PCIAddress: "0000:19:00.0", Dmem: capacity}, TierNone, "no nvidia-cuda-mps-control"},
		{"MIG", Facts{MIGEnabled: true, MPSControl: "/usr/bin/x"}, TierNone, "MIG is on"},
	} {
		got := Choose(c.f)
		if got.Tier != c.tier || !strings.Contains(got.Reason, c.why) {
			t.Errorf("%s: %+v, want %s with %q", c.name, got, c.tier, c.why)
		}
	}
}

// An earlier agent ran one daemon per GPU (<gpu dir>/mps); after an
// upgrade, the GPU's last share going stops it too.
func TestGPUWideDaemonOfAnEarlierAgentIsStopped(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	t.Setenv("FAKE_MPS_TAG_PIPE", "1")
	r := share("a", 10*gib, TierMPSPoliced)
	old := mps.Daemon{Path: mps.Binary, Dir: filepath.Join(e.dir, "GPU-1", "mps"), UUID: "GPU-1"}
	if _, err := old.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pid, alive := old.PID(); alive {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	m := New(e.opts)
	if err := m.Restore(ctx, []Request{r}); err != nil {
		t.Fatal(err)
	}
	if _, alive := old.PID(); !alive {
		t.Fatal("the earlier daemon was stopped while its GPU still has a share")
	}
	if err := m.Unprepare(ctx, r.Key, ""); err != nil {
		t.Fatal(err)
	}
	if _, alive := old.PID(); alive || !strings.Contains(e.commands(t), old.PipeDir()+": quit") {
		t.Errorf("the earlier agent's GPU-wide daemon was not quit with the GPU's last share: %s", e.commands(t))
	}
	assertNothingLeft(t, e)
}
