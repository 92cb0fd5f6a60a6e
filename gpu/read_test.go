package gpu_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
)

// A replay of the real H100's inventory reads back as the file says: what
// NVML reports, not the mock's built-in table.
func TestReadReplayRoundTrip(t *testing.T) {
	want := nvmltest.H100Node(2, 5)
	r, err := nvmlreplay.New(want)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gpu.Open(context.Background(), r.Library(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	got, err := s.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, want)
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings for a file with migProfiles: %v", r.Warnings)
	}
}

// Without migProfiles the mock's table is used, with a warning, and names
// are derived as NVIDIA names them.
func TestReadReplayMockTable(t *testing.T) {
	r, err := nvmlreplay.New(nvmltest.A100Node())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "mock table") {
		t.Fatalf("warnings = %v", r.Warnings)
	}
	inv, err := gpu.Read(r.Library())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, p := range inv.Devices[0].MIGProfiles {
		names[p.Name] = len(p.Placements)
	}
	for name, n := range map[string]int{"1g.5gb": 7, "1g.5gb+me": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1} {
		if names[name] != n {
			t.Errorf("profile %s: %d placements, want %d (all: %v)", name, names[name], n, names)
		}
	}
}

// go-nvml's own DGX H100 mock reads without error; its bus IDs are empty.
func TestReadDGXH100Mock(t *testing.T) {
	inv, err := gpu.Read(gpu.Library{Interface: newDGXH100()})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Devices) != 8 || inv.Devices[0].Architecture != "hopper" || inv.Devices[0].ComputeCapability != "9.0" {
		t.Fatalf("inventory %+v", inv.Devices[0])
	}
	if n := len(inv.Devices[0].MIGProfiles); n != 7 {
		t.Errorf("%d profiles, want the mock's 7", n)
	}
}

// A library that is not there: Init says so and nothing crashes.
func TestOpenNoLibrary(t *testing.T) {
	_, err := gpu.Open(context.Background(), gpu.RealLibrary(t.TempDir()), time.Second)
	if err == nil {
		t.Skip("this host has an NVML library")
	}
	if !errors.Is(err, gpu.ErrNoNVML) {
		t.Fatalf("error %v, want ErrNoNVML", err)
	}
}

// A driver that hangs: Open returns within its bound, and the session stays
// wedged rather than queueing behind the stuck call.
func TestOpenHang(t *testing.T) {
	s := newDGXH100()
	release := make(chan struct{})
	defer close(release)
	s.InitFunc = func() nvml.Return { <-release; return nvml.SUCCESS }
	start := time.Now()
	_, err := gpu.Open(context.Background(), gpu.Library{Interface: s}, 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not return within") {
		t.Fatalf("error %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Open took %s", d)
	}
}

// An inventory call that hangs wedges the session: later calls fail fast.
func TestInventoryHangWedges(t *testing.T) {
	s := newDGXH100()
	release := make(chan struct{})
	defer close(release)
	sess, err := gpu.Open(context.Background(), gpu.Library{Interface: s}, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	s.DeviceGetCountFunc = func() (int, nvml.Return) { calls.Add(1); <-release; return 0, nvml.SUCCESS }
	_, first := sess.Inventory(context.Background())
	if first == nil {
		t.Fatal("no error from a hung inventory")
	}
	// Fast means not waiting its turn behind the hung call: the second
	// call gets the wedge's error without reaching the driver (a check of
	// the path, not of a clock a busy host can stretch).
	if _, err := sess.Inventory(context.Background()); err == nil || err.Error() != first.Error() || !strings.Contains(err.Error(), "did not return within") {
		t.Fatalf("second call: %v, want the wedge's error %q", err, first)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the driver was called %d times, want once: a wedged session must not queue calls behind the hung one", n)
	}
}

// A failing init and a panicking call are errors, not crashes.
func TestInitFailsAndPanics(t *testing.T) {
	s := newDGXH100()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	if _, err := gpu.Open(context.Background(), gpu.Library{Interface: s}, time.Second); err == nil || !strings.Contains(err.Error(), "init") {
		t.Fatalf("error %v", err)
	}
	s = newDGXH100()
	s.Devices[0].(*server.Device).GetArchitectureFunc = nil // the mock panics
	sess, err := gpu.Open(context.Background(), gpu.Library{Interface: s}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Inventory(context.Background()); err == nil || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("error %v, want the panic reported", err)
	}
}

// One GPU that cannot be read leaves the others read: a lost one (XID 79,
// held in reset) is left out and said, and a MIG profile NVML refuses
// (a sandboxed driver's NO_PERMISSION) is left out of its GPU alone. One
// bad GPU failed the whole read, and the node published no GPU at all.
func TestReadLeavesOutWhatNVMLCannotAnswer(t *testing.T) {
	r, err := nvmlreplay.New(nvmltest.H100Node(2))
	if err != nil {
		t.Fatal(err)
	}
	r.Inject(nvmlinfo.Event{UUID: nvmltest.H100UUID(5), Type: nvmlinfo.EventGPULost})
	refused := r.Server.Devices[2].(*server.Device)
	answer := refused.GetGpuInstanceProfileInfoFunc
	refused.GetGpuInstanceProfileInfoFunc = func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if index == 9 { // 1g.20gb
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NO_PERMISSION
		}
		return answer(index)
	}
	s, err := gpu.Open(context.Background(), r.Library(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	inv, err := s.Inventory(context.Background())
	if err != nil {
		t.Fatalf("one lost GPU failed the read: %v", err)
	}
	if len(inv.Devices) != 7 {
		t.Fatalf("%d GPUs read, want the 7 not lost", len(inv.Devices))
	}
	for _, d := range inv.Devices {
		if d.UUID == nvmltest.H100UUID(5) {
			t.Fatal("the lost GPU 5 was read")
		}
		want := len(nvmltest.H100Profiles())
		if d.Index == 2 {
			want--
		}
		if len(d.MIGProfiles) != want {
			t.Errorf("GPU %d: %d MIG profiles, want %d", d.Index, len(d.MIGProfiles), want)
		}
	}
	got := strings.Join(inv.Unread, "\n")
	if len(inv.Unread) != 2 || !strings.Contains(got, "device 5 ("+nvmltest.H100UUID(5)+")") || !strings.Contains(got, "GPU_IS_LOST") ||
		!strings.Contains(got, nvmltest.H100UUID(2)) || !strings.Contains(got, "profile index 9") {
		t.Fatalf("unread:\n%s\nwant GPU 5 lost and GPU 2's profile index 9", got)
	}
	t.Logf("unread:\n%s", got)
}

// newDGXH100 is go-nvml's DGX H100 mock with what it lacks and a card
// answers: persistence mode, on, as a DGX runs nvidia-persistenced.
func newDGXH100() *server.Server {
	s := dgxh100.New()
	for _, d := range s.Devices {
		d.(*server.Device).GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	}
	return s
}

// Persistence mode is read where NVML answers it, and left unknown where it
// does not (a replay file that does not say), without leaving the GPU out.
func TestReadPersistenceMode(t *testing.T) {
	on := true
	inv := nvmltest.H100Node()
	inv.Devices[4].PersistenceMode = &on
	r, err := nvmlreplay.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpu.Read(r.Library())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Devices) != 8 {
		t.Fatalf("%d GPUs read, want 8", len(got.Devices))
	}
	for _, d := range got.Devices {
		if want := d.Index == 4; (d.PersistenceMode != nil) != want || (want && !*d.PersistenceMode) {
			t.Errorf("GPU %d: persistence mode %v", d.Index, d.PersistenceMode)
		}
	}
}
