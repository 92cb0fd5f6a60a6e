package prep_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu/prep"
	"github.com/carve-dra/carve/prepare"
	cslices "github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// logLines keeps what a preparer logs, for tests that check it said so.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{})
}

func (l *logLines) has(all ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		found := true
		for _, s := range all {
			found = found && strings.Contains(line, s)
		}
		if found {
			return true
		}
	}
	return false
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// run runs fn on a goroutine of its own and reports whether it returned
// (false: it crashed at the fault point).
func run(fn func()) bool {
	done := make(chan bool, 1)
	go func() {
		defer func() {
			select {
			case done <- false:
			default:
			}
		}()
		fn()
		done <- true
	}()
	return <-done
}

// On the real H100's replay (profile Ids are not indices), the checkpoint
// is lost while two claims hold MIG instances: the restarted agent adopts
// both from their node records (not reported as unowned, placements kept)
// beside an instance made by hand, which stays unowned. The kubelet's
// unprepare of a lost claim destroys its instance and removes its record,
// and only its; again, it is a no-op.
func TestLostCheckpointMIGInstancesAdoptedThenDestroyed(t *testing.T) {
	inv := loadRealH100(t)
	f := newFixture(t, inv)
	_, ctx := ktesting.NewTestContext(t)
	uuid := inv.Devices[0].UUID
	gone := alloc("gone", migDevice(t, f, "3g.40gb", 4), names.KindMIG)
	kept := alloc("kept", migDevice(t, f, "1g.10gb", 0), names.KindMIG)
	for _, a := range []prepare.Allocation{gone, kept} {
		if _, err := f.prep.Prepare(ctx, a, f.res.Index[a.Device]); err != nil {
			t.Fatal(err)
		}
		if !exists(t, prep.RecordPath(f.prep, a.ClaimUID, a.Device)) {
			t.Fatalf("%s: no node record after prepare", a.Device)
		}
	}
	// Someone makes a 1g.20gb by hand at 2.
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 2}); ret != nvml.SUCCESS {
		t.Fatalf("create by hand: %v", ret)
	}
	byHand := strconv.Itoa(int(info.Id)) + "@2"

	var logs logLines
	p := f.newPreparerLogging(t, logs.logger())
	p.Restore(nil, nil) // the checkpoint was lost
	if u := p.Unowned(); len(u) != 1 || !strings.HasSuffix(u[0], "/profile-"+strconv.Itoa(int(info.Id))+"/placement-2") {
		t.Errorf("unowned %v, want only the hand-made instance", u)
	}
	if !p.OwnsInstance(uuid, 9, 4) || !p.OwnsInstance(uuid, 19, 0) {
		t.Error("a recorded instance of a lost claim is not owned: its placement would leave the pool")
	}
	for _, claim := range []string{"gone", "kept"} {
		if !logs.has("Adopting a MIG instance recorded on the node", `"claimUID"="`+claim+`"`) {
			t.Errorf("no adoption of claim %s logged: %q", claim, logs.lines)
		}
	}
	for i := 0; i < 2; i++ {
		if err := p.UnprepareClaim(ctx, gone.ClaimUID); err != nil {
			t.Fatalf("unprepare of the lost claim, %d: %v", i, err)
		}
	}
	want := []string{"19@0", byHand}
	slices.Sort(want)
	if got := gpuInstances(f); !slices.Equal(got, want) {
		t.Fatalf("instances %v, want %v: the lost claim's 3g.40gb (Id 9) destroyed, the others kept", got, want)
	}
	if path := prep.RecordPath(p, gone.ClaimUID, gone.Device); exists(t, path) || exists(t, filepath.Dir(path)) {
		t.Errorf("the destroyed instance's record or its claim's directory is left: %s", path)
	}
	if p.OwnsInstance(uuid, 9, 4) {
		t.Error("the destroyed instance's placement is still taken")
	}
	if err := p.UnprepareClaim(ctx, kept.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if got := gpuInstances(f); !slices.Equal(got, []string{byHand}) {
		t.Fatalf("instances %v, want only the hand-made one", got)
	}
	if left, _ := filepath.Glob(filepath.Join(f.state, "mig", "*")); len(left) != 0 {
		t.Errorf("records left: %v", left)
	}
}

// A record that does not belong where it is found (copied into another
// claim's directory) is refused, and one that names an instance the
// checkpoint gives another claim is left alone: neither makes the agent
// destroy the victim's instance. Two lost claims' records that name one
// instance leave it to neither.
func TestPlantedMIGRecordIsNotActedOn(t *testing.T) {
	inv := loadRealH100(t)
	f := newFixture(t, inv)
	_, ctx := ktesting.NewTestContext(t)
	victim := alloc("victim", migDevice(t, f, "2g.20gb", 0), names.KindMIG)
	out, err := f.prep.Prepare(ctx, victim, f.res.Index[victim.Device])
	if err != nil {
		t.Fatal(err)
	}
	want := gpuInstances(f)
	raw, err := os.ReadFile(prep.RecordPath(f.prep, victim.ClaimUID, victim.Device))
	if err != nil {
		t.Fatal(err)
	}
	plant := func(path string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The victim's record, copied as it is into another claim's directory.
	plant(prep.RecordPath(f.prep, "copier", victim.Device), raw)
	// A record at its own claim's path that names the victim's instance.
	var forged map[string]any
	if err := json.Unmarshal(raw, &forged); err != nil {
		t.Fatal(err)
	}
	other := migDevice(t, f, "1g.10gb", 6)
	forged["claimUID"], forged["device"] = "forger", other
	data, _ := json.Marshal(forged)
	plant(prep.RecordPath(f.prep, "forger", other), data)

	unprepareOthers := func(p *prep.Preparer) {
		t.Helper()
		for _, claim := range []types.UID{"copier", "forger"} {
			if err := p.UnprepareClaim(ctx, claim); err != nil {
				t.Errorf("unprepare %s: %v", claim, err)
			}
			if got := gpuInstances(f); !slices.Equal(got, want) {
				t.Fatalf("instances %v after unprepare of %s, want the victim's %v kept", got, claim, want)
			}
		}
	}
	// The checkpoint holds the victim.
	p := f.newPreparer(t)
	p.Restore([]prepare.Allocation{victim}, []json.RawMessage{out.Undo})
	unprepareOthers(p)
	if u := p.Unowned(); len(u) != 0 {
		t.Errorf("unowned %v", u)
	}
	// The checkpoint is lost: the victim's and the forger's records
	// contest the instance, which stays, its placement taken.
	var logs logLines
	p = f.newPreparerLogging(t, logs.logger())
	p.Restore(nil, nil)
	if !logs.has("is not this file's") {
		t.Errorf("the copied record was not refused: %q", logs.lines)
	}
	unprepareOthers(p)
	if err := p.UnprepareClaim(ctx, victim.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if got := gpuInstances(f); !slices.Equal(got, want) {
		t.Fatalf("instances %v, want the contested one kept", got)
	}
	if u := p.Unowned(); len(u) != 0 || !p.OwnsInstance(inv.Devices[0].UUID, 14, 0) {
		t.Errorf("unowned %v: the contested instance's placement must stay taken", u)
	}
}

// The crash matrix of a MIG instance whose claim the checkpoint loses with
// the crash (go-nvml's mock profiles): killed after its record and before
// the instance, after the instance and before its ids are recorded, or
// after its destroy and before its record goes, the restarted agent and the
// kubelet's unprepare leave no instance, no record and a free placement.
func TestMIGCrashWithLostCheckpointConverges(t *testing.T) {
	for _, point := range []string{"mig-recorded", "mig-created", "mig-destroyed"} {
		t.Run(point, func(t *testing.T) {
			f := newFixture(t, nvmltest.A100Node())
			_, ctx := ktesting.NewTestContext(t)
			uuid := nvmltest.A100Node().Devices[0].UUID
			a := alloc("c1", migDevice(t, f, "3g.20gb", 4), names.KindMIG)
			disarm := prep.CrashAt(t, point)
			crashed := !run(func() { _, _ = f.prep.Prepare(ctx, a, f.res.Index[a.Device]) })
			p := f.newPreparer(t)
			if point == "mig-destroyed" {
				if crashed {
					t.Fatal("prepare crashed at an unprepare's fault point")
				}
				p.Restore(nil, nil)
				if run(func() { _ = p.UnprepareClaim(ctx, a.ClaimUID) }) {
					t.Fatal("the fault point was never reached")
				}
				p = f.newPreparer(t)
			} else if !crashed {
				t.Fatal("the fault point was never reached")
			}
			disarm()
			p.Restore(nil, nil)
			if err := p.UnprepareClaim(ctx, a.ClaimUID); err != nil {
				t.Fatal(err)
			}
			if got := instances(t, f); len(got) != 0 {
				t.Errorf("instances %v left", got)
			}
			if exists(t, prep.RecordPath(p, a.ClaimUID, a.Device)) {
				t.Error("the record is left")
			}
			if p.OwnsInstance(uuid, 2, 4) || len(p.Unowned()) != 0 {
				t.Errorf("the placement is still taken (unowned %v)", p.Unowned())
			}
			if _, err := p.Prepare(ctx, alloc("c2", a.Device, names.KindMIG), f.res.Index[a.Device]); err != nil {
				t.Errorf("the placement does not prepare again: %v", err)
			}
		})
	}
}

// A lost claim's instance destroyed by hand, and another made by hand at
// its placement: the claim's unprepare tells them apart by the GPU
// instance id its record holds, leaves the new one, and removes the record.
func TestLostClaimSparesAnotherInstanceAtItsPlacement(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	a := alloc("c1", migDevice(t, f, "3g.20gb", 4), names.KindMIG)
	if _, err := f.prep.Prepare(ctx, a, f.res.Index[a.Device]); err != nil {
		t.Fatal(err)
	}
	replaceByHand(t, f)
	p := f.newPreparer(t)
	p.Restore(nil, nil)
	if err := p.UnprepareClaim(ctx, a.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); !slices.Equal(got, []string{"2@4"}) {
		t.Errorf("instances %v, want the one made by hand kept", got)
	}
	if exists(t, prep.RecordPath(p, a.ClaimUID, a.Device)) {
		t.Error("the record of the instance that is gone is left")
	}
}

// Killed once the instance was made and before the checkpoint held its
// undo record, with its device no longer published when the agent comes
// back (the inventory changed): the driver's rollback finds the instance
// from the node's record.
func TestMIGRollbackFromTheNodeRecord(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	a := alloc("c1", migDevice(t, f, "3g.20gb", 4), names.KindMIG)
	disarm := prep.CrashAt(t, "mig-created")
	if run(func() { _, _ = f.prep.Prepare(ctx, a, f.res.Index[a.Device]) }) {
		t.Fatal("the fault point was never reached")
	}
	disarm()
	p := f.newPreparer(t)
	p.Devices = func() map[string]cslices.Entry { return nil }
	p.Restore([]prepare.Allocation{a}, []json.RawMessage{nil})
	if err := p.Unprepare(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); len(got) != 0 {
		t.Errorf("instances %v left", got)
	}
	if exists(t, prep.RecordPath(p, a.ClaimUID, a.Device)) {
		t.Error("the record is left")
	}
}

// replaceByHand destroys the claim's 3-slice instance on GPU 0 and makes
// another at its placement (4), as an admin or a reset would.
func replaceByHand(t *testing.T, f *fixture) {
	t.Helper()
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	gis, _ := dev.GetGpuInstances(&info)
	if len(gis) != 1 {
		t.Fatalf("%d 3-slice instances, want the claim's", len(gis))
	}
	if ret := gis[0].Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 4}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}
