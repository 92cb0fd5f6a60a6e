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
// prepared: the next agent finds no share in the checkpoint but the share's
// record on the node, and keeps it (daemon running, mode Default, policed)
// until the driver's rollback of the started claim takes it back, which
// restores the mode and leaves nothing.
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
	pol := police.New(police.Options{Processes: noProcs{}})
	e.opts.Police = pol
	next := New(e.opts)
	if err := next.Restore(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, alive := d.PID(); !alive {
		t.Error("the recorded share's daemon was stopped at Restore")
	}
	if u := pol.Shares(); len(u) != 1 || u["a"].Slice != 10*gib {
		t.Errorf("policed after Restore: %+v", u)
	}
	if err := next.Unprepare(ctx, "a", "GPU-1"); err != nil {
		t.Errorf("rollback: %v", err)
	}
	if _, alive := d.PID(); alive {
		t.Error("the rollback left the daemon running")
	}
	if e.nv.mode != nvml.COMPUTEMODE_PROHIBITED {
		t.Errorf("compute mode %d, want PROHIBITED back", e.nv.mode)
	}
	if len(pol.Shares()) != 0 {
		t.Errorf("still policed: %+v", pol.Shares())
	}
	assertNothingLeft(t, e)
	// And the claim is prepared again from scratch.
	if _, _, err := next.Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	if err := next.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
}

// The checkpoint is lost (corrupt, or the state directory restored from an
// old copy) while two claims' shares run: the next agent rebuilds both from
// the node's records, keeps their daemons and the GPU's mode, and polices
// them with their slices. The kubelet's unprepare of each claim, which the
// driver hands to UnprepareClaim as the checkpoint does not know it, then
// takes back that claim alone; the last gives the GPU back.
func TestCheckpointLostKeepsSharesEnforced(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.nv.mode = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	first := New(e.opts)
	a, b := share("a", 10*gib, TierMPSPoliced), share("b", 20*gib, TierMPSPoliced)
	a2 := a
	a2.Key, a2.ShareID, a2.Slice = "a2", "s-a2", 5*gib
	for _, r := range []Request{a, a2, b} {
		if _, _, err := first.Prepare(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	da, db := e.daemonOf("a"), e.daemonOf("b")
	pidA, _ := da.PID()
	pidB, _ := db.PID()
	before := e.commands(t)

	pol := police.New(police.Options{Processes: noProcs{}})
	e.opts.Police = pol
	next := New(e.opts)
	if err := next.Restore(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if p, alive := da.PID(); !alive || p != pidA {
		t.Errorf("claim a's daemon: pid %d alive %v, want %d adopted", p, alive, pidA)
	}
	if p, alive := db.PID(); !alive || p != pidB {
		t.Errorf("claim b's daemon: pid %d alive %v, want %d adopted", p, alive, pidB)
	}
	if e.nv.mode != gpu.ComputeModeDefault {
		t.Errorf("compute mode %d after Restore, want Default kept", e.nv.mode)
	}
	u := pol.Shares()
	if len(u) != 3 || u["a"].Slice != 10*gib || u["a2"].Slice != 5*gib || u["b"].Slice != 20*gib || u["a"].Name != "claim-a" || u["a"].Namespace != "ns" {
		t.Errorf("policed after Restore: %+v", u)
	}
	// The ceilings set again: a's daemon the sum of its two shares.
	got := strings.TrimPrefix(e.commands(t), before+"\n")
	if !strings.Contains(got, "set_default_device_pinned_mem_limit 0 15360M") || strings.Contains(got, "quit") || strings.Contains(got, "start") {
		t.Errorf("restore commands %q", got)
	}
	// A second prepare of a share it adopted is answered, not refused.
	if _, _, err := next.Prepare(ctx, b); err != nil {
		t.Errorf("prepare of an adopted share again: %v", err)
	}

	if err := next.UnprepareClaim(ctx, a.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if _, alive := da.PID(); alive {
		t.Error("claim a's daemon runs after its claim was unprepared")
	}
	if _, alive := db.PID(); !alive {
		t.Error("claim b's daemon was stopped with claim a")
	}
	if _, err := os.Stat(ClaimDir(e.dir, a.ClaimUID)); !os.IsNotExist(err) {
		t.Errorf("claim a's directory is left: %v", err)
	}
	if u := pol.Shares(); len(u) != 1 {
		t.Errorf("policed after claim a: %+v", u)
	}
	if e.nv.mode != gpu.ComputeModeDefault {
		t.Errorf("mode %d while claim b's share is on the GPU", e.nv.mode)
	}
	if err := next.UnprepareClaim(ctx, b.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if err := next.UnprepareClaim(ctx, b.ClaimUID); err != nil {
		t.Fatalf("again: %v", err)
	}
	assertNothingLeft(t, e)
	if e.nv.mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("mode %d after the last claim, want EXCLUSIVE_PROCESS back", e.nv.mode)
	}
}

// A daemon whose directory has no share record (an earlier agent's, which
// recorded none) and no checkpointed share is kept at Restore, and its
// GPU's mode with it; the claim's unprepare stops it. A record planted in
// another claim's directory is refused, never adopted.
func TestUnexplainedDaemonKeptUntilItsClaimGoes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.nv.mode = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	a, b := share("a", 10*gib, TierMPSPoliced), share("b", 10*gib, TierMPSPoliced)
	first := New(e.opts)
	for _, r := range []Request{a, b} {
		if _, _, err := first.Prepare(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	da, db := e.daemonOf("a"), e.daemonOf("b")
	if err := os.Remove(filepath.Join(da.Dir, shareFileName("a"))); err != nil {
		t.Fatal(err)
	}
	// b's record copied into a's directory.
	raw, err := os.ReadFile(filepath.Join(db.Dir, shareFileName("b")))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(da.Dir, shareFileName("b")), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	pol := police.New(police.Options{Processes: noProcs{}})
	e.opts.Police = pol
	next := New(e.opts)
	if err := next.Restore(ctx, nil); err == nil || !strings.Contains(err.Error(), "is not this directory's") {
		t.Errorf("restore with a planted record: %v", err)
	}
	if _, alive := da.PID(); !alive {
		t.Error("the unexplained daemon was stopped")
	}
	if u := pol.Shares(); len(u) != 1 || u["b"].Slice != 10*gib {
		t.Errorf("policed: %+v", u)
	}
	if err := next.UnprepareClaim(ctx, b.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if e.nv.mode != gpu.ComputeModeDefault {
		t.Errorf("mode %d given back while claim a's daemon runs", e.nv.mode)
	}
	if err := next.UnprepareClaim(ctx, a.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if _, alive := da.PID(); alive {
		t.Error("the unexplained daemon runs after its claim's unprepare")
	}
	assertNothingLeft(t, e)
	if e.nv.mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("mode %d after the last claim", e.nv.mode)
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
	e.opts.DaemonEnv = append(e.opts.DaemonEnv, "FAKE_MPS_TAG_PIPE=1")
	r := share("a", 10*gib, TierMPSPoliced)
	old := mps.Daemon{Path: mps.Binary, Dir: filepath.Join(e.dir, "GPU-1", "mps"), UUID: "GPU-1", Env: e.opts.DaemonEnv}
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
