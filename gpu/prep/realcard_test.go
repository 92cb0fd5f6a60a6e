package prep_test

import (
	"encoding/json"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

// realH100 is the real H100's NVML answers with MIG on. The card was
// recorded with MIG disabled (gpu/acceptance/results: the lent machine's
// MIG mode must never be changed); migEnabled was set true by hand in the
// file, since NVML answers the profile questions alike either way and carve
// publishes and prepares placements only where MIG is on. See
// testdata/README.md.
const realH100 = "testdata/h100-580-mig-on.json"

func loadRealH100(t *testing.T) *nvmlinfo.Inventory {
	t.Helper()
	f, err := os.Open(realH100)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inv, err := nvmlinfo.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// gpuInstances lists the GPU instances the replayed card holds, as
// "<profile Id>@<placement start>".
func gpuInstances(f *fixture) []string {
	d := f.replay.Server.Devices[0].(*server.Device)
	d.RLock()
	defer d.RUnlock()
	var out []string
	for gi := range d.GpuInstances {
		out = append(out, strconv.Itoa(int(gi.Info.ProfileId))+"@"+strconv.Itoa(int(gi.Info.Placement.Start)))
	}
	sort.Strings(out)
	return out
}

// The replay answers NVML's profile index with the card's profile Id, which
// differs from it for most profiles: a confusion of the two fails here.
func TestRealH100ReplayAnswersIdsByIndex(t *testing.T) {
	inv := loadRealH100(t)
	r, err := nvmlreplay.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings for a file with indices and engines: %v", r.Warnings)
	}
	dev, _ := r.Server.DeviceGetHandleByIndex(0)
	differ := 0
	for _, p := range inv.Devices[0].MIGProfiles {
		info, ret := dev.GetGpuInstanceProfileInfo(p.ProfileIndex)
		if ret != nvml.SUCCESS || int(info.Id) != p.ProfileID {
			t.Errorf("index %d answers Id %d (%v), want %d", p.ProfileIndex, info.Id, ret, p.ProfileID)
		}
		if p.ProfileIndex != p.ProfileID {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("every Id equals its index: the replay cannot tell them apart")
	}
}

// Read on the card: each profile's index and Id as NVML gives them, and
// names built as nvidia-smi builds them where the driver gives none (as the
// driver does with MIG disabled): 1g.10gb+me is not 1g.10gb.
func TestRealH100ReadNamesAndIndices(t *testing.T) {
	want := loadRealH100(t)
	r, err := nvmlreplay.New(want)
	if err != nil {
		t.Fatal(err)
	}
	for name, lib := range map[string]gpu.Library{"names from the file": r.Library(), "no driver names": {Interface: r.Server}} {
		got, err := gpu.Read(lib)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Devices[0].MIGProfiles) != len(want.Devices[0].MIGProfiles) {
			t.Fatalf("%s: %d profiles, want %d", name, len(got.Devices[0].MIGProfiles), len(want.Devices[0].MIGProfiles))
		}
		for i, p := range got.Devices[0].MIGProfiles {
			w := want.Devices[0].MIGProfiles[i]
			if p.Name != w.Name || p.ProfileIndex != w.ProfileIndex || p.ProfileID != w.ProfileID || len(p.Placements) != len(w.Placements) ||
				p.Engines == nil || *p.Engines != *w.Engines {
				t.Errorf("%s: read %q index %d Id %d, %d placements, engines %+v; want %q index %d Id %d, %d placements, engines %+v",
					name, p.Name, p.ProfileIndex, p.ProfileID, len(p.Placements), p.Engines, w.Name, w.ProfileIndex, w.ProfileID, len(w.Placements), w.Engines)
			}
		}
	}
}

// Every placement of the card is published with its profile's name, and
// each is prepared through the GPU preparer, making the instance of the
// right profile Id at its placement, and unprepared, leaving none.
func TestRealH100EveryPlacementPreparesAndUnprepares(t *testing.T) {
	inv := loadRealH100(t)
	f := newFixture(t, inv)
	_, ctx := ktesting.NewTestContext(t)
	placements := map[string]nvmlinfo.MIGProfile{}
	total := 0
	for _, p := range inv.Devices[0].MIGProfiles {
		total += len(p.Placements)
		for _, pl := range p.Placements {
			placements[p.Name+"@"+strconv.Itoa(pl.Start)] = p
		}
	}
	var published []string
	for name, e := range f.res.Index {
		if e.Kind != names.KindMIG {
			continue
		}
		published = append(published, name)
		key := e.GPU.MIG.Profile.Name + "@" + strconv.Itoa(e.GPU.MIG.Placement.Start)
		if _, ok := placements[key]; !ok {
			t.Errorf("published %s (%s) is not a placement of the card", name, key)
		}
		delete(placements, key)
		if got := e.Device.Attributes[names.AttrProfile].StringValue; got == nil || *got != e.GPU.MIG.Profile.Name {
			t.Errorf("%s: profile attribute %v, want %s", name, got, e.GPU.MIG.Profile.Name)
		}
	}
	if len(published) != total || len(placements) != 0 {
		t.Fatalf("%d MIG devices published, want the card's %d placements; unpublished: %v", len(published), total, placements)
	}
	t.Logf("%d placements published", len(published))
	sort.Strings(published)
	for i, name := range published {
		e := f.res.Index[name]
		p, pl := e.GPU.MIG.Profile, e.GPU.MIG.Placement
		a := alloc("c"+strconv.Itoa(i), name, names.KindMIG)
		out, err := f.prep.Prepare(ctx, a, e)
		if err != nil {
			t.Errorf("prepare %s: %v", name, err)
			continue
		}
		want := strconv.Itoa(p.ProfileID) + "@" + strconv.Itoa(pl.Start)
		if got := gpuInstances(f); len(got) != 1 || got[0] != want {
			t.Errorf("%s: instances %v, want %s (profile Id @ placement)", name, got, want)
		}
		if env := strings.Join(out.Edits.Env, " "); !strings.Contains(env, "MIG_PROFILE="+p.Name+" ") {
			t.Errorf("%s: env %q lacks its profile %s", name, env, p.Name)
		}
		if env := strings.Join(out.Edits.Env, " "); !strings.Contains(env, "MIG_UUID=MIG-") {
			t.Errorf("%s: env %q lacks its MIG device's UUID", name, env)
		}
		var rec struct {
			ProfileID    int  `json:"profileId"`
			ProfileIndex *int `json:"profileIndex"`
		}
		if err := json.Unmarshal(out.Undo, &rec); err != nil || rec.ProfileID != p.ProfileID || rec.ProfileIndex == nil || *rec.ProfileIndex != p.ProfileIndex {
			t.Errorf("%s: undo record %s, want Id %d and index %d", name, out.Undo, p.ProfileID, p.ProfileIndex)
		}
		if err := f.prep.Unprepare(ctx, a, out.Undo); err != nil {
			t.Errorf("unprepare %s: %v", name, err)
		}
		if got := gpuInstances(f); len(got) != 0 {
			t.Fatalf("%s: instances %v left after unprepare", name, got)
		}
	}
}

// The card has one media-extension set: a second 1g.10gb+me is refused by
// the driver (the replay) once one exists. A record written before carve
// kept the index is destroyed by its Id, and an instance made by hand is
// reported by its profile's Id.
func TestRealH100MediaExtensionAndRecords(t *testing.T) {
	inv := loadRealH100(t)
	f := newFixture(t, inv)
	_, ctx := ktesting.NewTestContext(t)
	first, second := migDevice(t, f, "1g.10gb+me", 0), migDevice(t, f, "1g.10gb+me", 3)
	a := alloc("c1", first, names.KindMIG)
	out, err := f.prep.Prepare(ctx, a, f.res.Index[first])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.prep.Prepare(ctx, alloc("c2", second, names.KindMIG), f.res.Index[second]); err == nil {
		t.Error("a second 1g.10gb+me was made beside the first")
	}
	// Someone makes a 1g.20gb (index 9) by hand at 4.
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 2}); ret != nvml.SUCCESS {
		t.Fatalf("create by hand: %v", ret)
	}
	var old map[string]any
	if err := json.Unmarshal(out.Undo, &old); err != nil {
		t.Fatal(err)
	}
	delete(old, "profileIndex")
	oldUndo, _ := json.Marshal(old)
	restarted := f.newPreparer(t)
	restarted.Restore([]prepare.Allocation{a}, []json.RawMessage{oldUndo})
	if u := restarted.Unowned(); len(u) != 1 || !strings.HasSuffix(u[0], "/profile-"+strconv.Itoa(int(info.Id))+"/placement-4") {
		t.Errorf("unowned %v, want the hand-made 1g.20gb (Id %d) at 4 only", u, info.Id)
	}
	if err := restarted.Unprepare(ctx, a, oldUndo); err != nil {
		t.Fatal(err)
	}
	if got, want := gpuInstances(f), strconv.Itoa(int(info.Id))+"@4"; len(got) != 1 || got[0] != want {
		t.Fatalf("instances %v, want only the hand-made %s", got, want)
	}
}
