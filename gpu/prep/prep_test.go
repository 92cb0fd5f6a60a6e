package prep_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/nvmlreplay"
	"github.com/carve-dra/carve/gpu/prep"
	"github.com/carve-dra/carve/prepare"
	cslices "github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// hostRoot builds a host whose driver is installed as on the lent H100
// machine, /usr/local/nvidia/{bin,lib64}, with real character device nodes
// and the MIG capabilities the driver lists in /proc.
func hostRoot(t *testing.T, gpus int, driverVersion string) string {
	t.Helper()
	root := t.TempDir()
	file := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	node := func(rel string, major, minor uint32) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
			t.Skipf("cannot make device nodes here (%v); the edits need real ones", err)
		}
	}
	lib := "usr/local/nvidia/lib64/"
	for _, l := range []string{"libcuda.so.", "libnvidia-ml.so.", "libnvidia-ptxjitcompiler.so."} {
		file(lib+l+driverVersion, "")
		if err := os.Symlink(l+driverVersion, filepath.Join(root, lib+l+"1")); err != nil {
			t.Fatal(err)
		}
	}
	file("usr/local/nvidia/bin/nvidia-smi", "")
	for i := 0; i < gpus; i++ {
		node(fmt.Sprintf("dev/nvidia%d", i), 195, uint32(i))
	}
	node("dev/nvidiactl", 195, 255)
	node("dev/nvidia-uvm", 510, 0)
	node("dev/nvidia-uvm-tools", 510, 1)
	// The driver lists the capabilities but makes no /dev/nvidia-caps
	// node: the preparer makes them. go-nvml's mock never reuses a GPU
	// instance id: 32 are enough for a test that makes every placement of
	// a card in turn.
	file("proc/devices", "Character devices:\n195 nvidia\n237 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n")
	for gi := 0; gi < 32; gi++ {
		file(fmt.Sprintf("proc/driver/nvidia/capabilities/gpu0/mig/gi%d/access", gi), fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 10+2*gi))
		file(fmt.Sprintf("proc/driver/nvidia/capabilities/gpu0/mig/gi%d/ci0/access", gi), fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 11+2*gi))
	}
	return root
}

type fixture struct {
	replay  *nvmlreplay.Replay
	session *gpu.Session
	res     cslices.Result
	prep    *prep.Preparer
	root    string
	// state is the agent's state directory, which outlives a restart.
	state string
}

func newFixture(t *testing.T, inv *nvmlinfo.Inventory) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	r, err := nvmlreplay.New(inv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gpu.Open(ctx, r.Library(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{replay: r, session: s, root: hostRoot(t, len(inv.Devices), inv.DriverVersion), state: t.TempDir()}
	f.res = cslices.Build(&discovery.Inventory{NVML: read}, nodeconfig.Default(), "node-a")
	f.prep = f.newPreparer(t)
	return f
}

func (f *fixture) newPreparer(t *testing.T) *prep.Preparer {
	return f.newPreparerLogging(t, ktesting.NewLogger(t, ktesting.NewConfig()))
}

func (f *fixture) newPreparerLogging(t *testing.T, logger logr.Logger) *prep.Preparer {
	t.Helper()
	p := prep.New(prep.Options{NVML: f.session, Root: f.root, DriverRoot: "/usr/local/nvidia", StateDir: f.state, Logger: logger})
	p.Devices = func() map[string]cslices.Entry { return f.res.Index }
	return p
}

func alloc(claim, device, kind string) prepare.Allocation {
	return prepare.Allocation{ClaimUID: types.UID(claim), Request: "gpu", Device: device, Kind: kind, Pool: "node-a"}
}

func TestWholeGPUEdits(t *testing.T) {
	f := newFixture(t, nvmltest.H100Node())
	_, ctx := ktesting.NewTestContext(t)
	driverVersion := nvmltest.H100Node().DriverVersion
	name := "gpu-0000-3b-00-0"
	out, err := f.prep.Prepare(ctx, alloc("c1", name, names.KindGPU), f.res.Index[name])
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range out.Edits.DeviceNodes {
		nodes = append(nodes, n.Path)
		if n.HostPath != n.Path {
			t.Errorf("device node %s has host path %s; want the host's own path, not the agent's view", n.Path, n.HostPath)
		}
	}
	for _, want := range []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if !slices.Contains(nodes, want) {
			t.Errorf("device nodes %v lack %s", nodes, want)
		}
	}
	if slices.Contains(nodes, "/dev/nvidia0") {
		t.Errorf("device nodes %v include another GPU", nodes)
	}
	mounts := map[string]string{}
	for _, m := range out.Edits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	// The driver's libraries under their sonames beside them and in the
	// loader's default directories of Debian's and Red Hat's images, so
	// that the image's LD_LIBRARY_PATH is left as it is.
	for cpath, host := range map[string]string{
		"/lib64/libcuda.so." + driverVersion:          "/usr/local/nvidia/lib64/libcuda.so." + driverVersion,
		"/lib64/libcuda.so.1":                         "/usr/local/nvidia/lib64/libcuda.so." + driverVersion,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1":      "/usr/local/nvidia/lib64/libcuda.so." + driverVersion,
		"/usr/lib64/libcuda.so.1":                     "/usr/local/nvidia/lib64/libcuda.so." + driverVersion,
		"/lib64/libnvidia-ml.so.1":                    "/usr/local/nvidia/lib64/libnvidia-ml.so." + driverVersion,
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "/usr/local/nvidia/lib64/libnvidia-ml.so." + driverVersion,
		"/bin/nvidia-smi":                             "/usr/local/nvidia/bin/nvidia-smi",
	} {
		if mounts[cpath] != host {
			t.Errorf("mount %s <- %q, want %s (all: %v)", cpath, mounts[cpath], host, mounts)
		}
	}
	env := strings.Join(out.Edits.Env, " ")
	if !strings.Contains(env, "CARVE_GPU_GPU_UUID="+nvmltest.H100UUID(1)) {
		t.Errorf("env %q lacks CARVE_GPU_GPU_UUID", env)
	}
	if strings.Contains(env, "LD_LIBRARY_PATH") {
		t.Errorf("env %q sets LD_LIBRARY_PATH, which replaces the image's", env)
	}
	seen := map[string]bool{}
	for _, m := range out.Edits.Mounts {
		if seen[m.ContainerPath] {
			t.Errorf("two mounts at %s", m.ContainerPath)
		}
		seen[m.ContainerPath] = true
	}
}

func migDevice(t *testing.T, f *fixture, profile string, start int) string {
	t.Helper()
	for name, e := range f.res.Index {
		if e.GPU != nil && e.GPU.MIG != nil && e.GPU.MIG.Profile.Name == profile && e.GPU.MIG.Placement.Start == start {
			return name
		}
	}
	t.Fatalf("no MIG device %s at %d", profile, start)
	return ""
}

// instances lists the GPU instances NVML holds on the first GPU.
func instances(t *testing.T, f *fixture) []string {
	t.Helper()
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	var out []string
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, _ := dev.GetGpuInstances(&info)
		for _, gi := range gis {
			i, _ := gi.GetInfo()
			out = append(out, fmt.Sprintf("%d@%d", id, i.Placement.Start))
		}
	}
	slices.Sort(out)
	return out
}

// On the A100 node (MIG enabled, profiles from go-nvml's mock table), MIG
// prepare creates the instance at the allocated placement; an overlapping
// placement is refused by the driver; unprepare destroys it, twice safely.
func TestMIGPrepareUnprepare(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	name := migDevice(t, f, "3g.20gb", 4)
	a := alloc("c1", name, names.KindMIG)
	out, err := f.prep.Prepare(ctx, a, f.res.Index[name])
	if err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); !slices.Equal(got, []string{"2@4"}) {
		t.Fatalf("instances %v, want the 3-slice profile at 4", got)
	}
	var nodes []string
	for _, n := range out.Edits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	for _, want := range []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap10", "/dev/nvidia-caps/nvidia-cap11"} {
		if !slices.Contains(nodes, want) {
			t.Errorf("device nodes %v lack %s", nodes, want)
		}
	}
	// The capability nodes were made from the driver's description.
	for minor := uint32(10); minor <= 11; minor++ {
		var st unix.Stat_t
		path := filepath.Join(f.root, fmt.Sprintf("dev/nvidia-caps/nvidia-cap%d", minor))
		if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(237, minor) || st.Mode&0o777 != 0o444 {
			t.Errorf("%s: %v, mode %#o, rdev %d:%d", path, err, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}
	var rec map[string]any
	if err := json.Unmarshal(out.Undo, &rec); err != nil || rec["placementStart"] != 4.0 {
		t.Errorf("undo %s", out.Undo)
	}
	// The MIG device's UUID is the one NVML answers for the instances
	// made: found among the GPU's MIG devices by their ids.
	wantUUID := ""
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	for i := 0; i < 7; i++ {
		m, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		gi, _ := m.GetGpuInstanceId()
		ci, _ := m.GetComputeInstanceId()
		if fmt.Sprint(gi) == fmt.Sprint(rec["gpuInstanceId"]) && fmt.Sprint(ci) == fmt.Sprint(rec["computeInstanceId"]) {
			wantUUID, _ = m.GetUUID()
		}
	}
	if !strings.HasPrefix(wantUUID, "MIG-") || !slices.Contains(out.Edits.Env, "CARVE_GPU_MIG_UUID="+wantUUID) {
		t.Errorf("env %q, want CARVE_GPU_MIG_UUID=%s (NVML's for GPU instance %v, compute instance %v)", out.Edits.Env, wantUUID, rec["gpuInstanceId"], rec["computeInstanceId"])
	}
	over := migDevice(t, f, "7g.40gb", 0)
	if _, err := f.prep.Prepare(ctx, alloc("c2", over, names.KindMIG), f.res.Index[over]); err == nil {
		t.Error("an overlapping placement was created")
	}
	disjoint := migDevice(t, f, "2g.10gb", 0)
	if _, err := f.prep.Prepare(ctx, alloc("c3", disjoint, names.KindMIG), f.res.Index[disjoint]); err != nil {
		t.Errorf("disjoint placement: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := f.prep.Unprepare(ctx, a, out.Undo); err != nil {
			t.Fatalf("unprepare %d: %v", i, err)
		}
	}
	if got := instances(t, f); !slices.Equal(got, []string{"1@0"}) {
		t.Fatalf("instances after unprepare %v, want only the 2g at 0", got)
	}
}

// A crash after the instance was made but before the checkpoint held its
// undo record: a new agent finds it from the allocation alone and rolls it
// back. An instance no claim owns is reported at start and left in place.
func TestMIGCrashRecovery(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	name := migDevice(t, f, "1g.5gb", 3)
	a := alloc("c1", name, names.KindMIG)
	if _, err := f.prep.Prepare(ctx, a, f.res.Index[name]); err != nil {
		t.Fatal(err)
	}
	// Someone makes an instance by hand.
	dev, _ := f.replay.Server.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 2}); ret != nvml.SUCCESS {
		t.Fatalf("create by hand: %v", ret)
	}
	restarted := f.newPreparer(t)
	restarted.Restore([]prepare.Allocation{a}, []json.RawMessage{nil})
	unowned := restarted.Unowned()
	if len(unowned) != 1 || !strings.HasSuffix(unowned[0], "/profile-1/placement-4") {
		t.Fatalf("unowned %v, want the hand-made 2g at 4 only", unowned)
	}
	if err := restarted.Unprepare(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); !slices.Equal(got, []string{"1@4"}) {
		t.Fatalf("instances %v, want only the hand-made one left", got)
	}
	if _, err := os.Lstat(prep.RecordPath(restarted, a.ClaimUID, a.Device)); !os.IsNotExist(err) {
		t.Errorf("the rolled-back instance's node record: %v, want it removed", err)
	}
	// A placement held by an instance the claim did not make is refused,
	// and that instance is left alone.
	held := migDevice(t, f, "2g.10gb", 4)
	if _, err := restarted.Prepare(ctx, alloc("c2", held, names.KindMIG), f.res.Index[held]); err == nil || !strings.Contains(err.Error(), "not made for this claim") {
		t.Fatalf("error %v", err)
	}
	if got := instances(t, f); !slices.Equal(got, []string{"1@4"}) {
		t.Fatalf("instances %v after the refused prepare", got)
	}
}

func TestNoNVML(t *testing.T) {
	inv := nvmltest.H100Node()
	res := cslices.Build(&discovery.Inventory{NVML: inv}, nodeconfig.Default(), "node-a")
	p := prep.New(prep.Options{Root: t.TempDir()})
	name := "gpu-0000-19-00-0"
	if _, err := p.Prepare(context.Background(), alloc("c", name, names.KindGPU), res.Index[name]); err == nil || !strings.Contains(err.Error(), "no working NVML") {
		t.Fatalf("error %v", err)
	}
}

// Where the driver gives no nvidia-caps major, a MIG prepare fails naming
// the file, makes no node, and hands back the undo record that destroys
// the instance it made.
func TestMIGPrepareWithoutCapsMajor(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	if err := os.WriteFile(filepath.Join(f.root, "proc/devices"), []byte("Character devices:\n195 nvidia\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := migDevice(t, f, "3g.20gb", 4)
	a := alloc("c1", name, names.KindMIG)
	out, err := f.prep.Prepare(ctx, a, f.res.Index[name])
	if err == nil || !strings.Contains(err.Error(), "proc/devices: no nvidia-caps character device") {
		t.Fatalf("error %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.root, "dev/nvidia-caps")); !os.IsNotExist(err) {
		t.Errorf("dev/nvidia-caps: %v, want nothing made", err)
	}
	if err := f.prep.Unprepare(ctx, a, out.Undo); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); len(got) != 0 {
		t.Errorf("instances %v after the rollback", got)
	}
}

// A GPU instance that no claim made (by hand, at 3g.40gb's placement 4+4)
// is read from NVML into the inventory, and the placements it overlaps are
// not published; an instance a claim made stays published (allocated to
// it), before and after the agent restarts; until the checkpoint is read
// every instance is taken as a claim's.
func TestInstancesCarveDidNotMakeLeaveThePool(t *testing.T) {
	inv := nvmltest.H100Node(0)
	inv.Devices[0].Instances = []nvmlinfo.MIGInstance{{ProfileID: 2, Start: 4, Size: 4}}
	f := newFixture(t, inv)
	_, ctx := ktesting.NewTestContext(t)
	uuid := inv.Devices[0].UUID
	read := func(owned func(string, int, int) bool) cslices.Result {
		t.Helper()
		got, err := f.session.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var opts []cslices.Option
		if owned != nil {
			opts = append(opts, cslices.MIGOwned(owned))
		}
		return cslices.Build(&discovery.Inventory{NVML: got}, nodeconfig.Default(), "node-a", opts...)
	}
	published := func(res cslices.Result, profile string, start int) bool {
		for _, e := range res.Index {
			if e.GPU != nil && e.GPU.MIG != nil && e.GPU.Device.UUID == uuid && e.GPU.MIG.Profile.Name == profile && e.GPU.MIG.Placement.Start == start {
				return true
			}
		}
		return false
	}
	got, err := f.session.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Devices[0].Instances, inv.Devices[0].Instances) {
		t.Fatalf("instances read %+v, want %+v", got.Devices[0].Instances, inv.Devices[0].Instances)
	}
	// Without an owner (carve discover): its placements are out.
	res := read(nil)
	for _, c := range []struct {
		profile string
		start   int
		want    bool
	}{{"1g.10gb", 0, true}, {"1g.10gb", 3, true}, {"1g.10gb", 4, false}, {"1g.10gb", 6, false}, {"3g.40gb", 4, false}, {"3g.40gb", 0, true}, {"7g.80gb", 0, false}, {"4g.40gb", 0, true}} {
		if got := published(res, c.profile, c.start); got != c.want {
			t.Errorf("%s at %d published %v, want %v", c.profile, c.start, got, c.want)
		}
	}
	if !strings.Contains(strings.Join(res.Notices, "\n"), "1 GPU instance(s) that carve did not make hold memory slices (profile Id 2 at 4+4)") {
		t.Errorf("notices %q", res.Notices)
	}
	// Before the checkpoint is read, every instance may be a claim's.
	if !f.prep.OwnsInstance(uuid, 2, 4) || !published(read(f.prep.OwnsInstance), "3g.40gb", 4) {
		t.Error("an instance was taken as another's before Restore")
	}
	f.prep.Restore(nil, nil)
	if f.prep.OwnsInstance(uuid, 2, 4) || published(read(f.prep.OwnsInstance), "3g.40gb", 4) {
		t.Error("the hand-made instance is taken as a claim's after Restore")
	}
	name := migDevice(t, f, "1g.10gb", 0)
	a := alloc("c1", name, names.KindMIG)
	out, err := f.prep.Prepare(ctx, a, f.res.Index[name])
	if err != nil {
		t.Fatal(err)
	}
	if !published(read(f.prep.OwnsInstance), "1g.10gb", 0) {
		t.Error("the claim's own instance left the pool")
	}
	if published(read(nil), "1g.10gb", 0) {
		t.Error("without an owner, the claim's instance is still published (the test reads no instance)")
	}
	// A restarted agent knows it from the checkpoint's record.
	p := f.newPreparer(t)
	p.Restore([]prepare.Allocation{a}, []json.RawMessage{out.Undo})
	if !published(read(p.OwnsInstance), "1g.10gb", 0) || published(read(p.OwnsInstance), "3g.40gb", 4) {
		t.Error("after a restart: the claim's instance out, or the hand-made one in")
	}
	if err := p.Unprepare(ctx, a, out.Undo); err != nil {
		t.Fatal(err)
	}
	if p.OwnsInstance(uuid, 0, 0) {
		t.Error("a destroyed instance is still owned")
	}
	if !published(read(p.OwnsInstance), "1g.10gb", 0) {
		t.Error("the placement is not back after its instance went")
	}
}

// Unprepare with the claim's undo record destroys the GPU instance it
// made, by its id, never another that sits at its placement now (the
// claim's destroyed by hand, another made there): that one is its owner's.
func TestMIGUnprepareSparesAnotherInstanceAtItsPlacement(t *testing.T) {
	f := newFixture(t, nvmltest.A100Node())
	_, ctx := ktesting.NewTestContext(t)
	a := alloc("c1", migDevice(t, f, "3g.20gb", 4), names.KindMIG)
	out, err := f.prep.Prepare(ctx, a, f.res.Index[a.Device])
	if err != nil {
		t.Fatal(err)
	}
	replaceByHand(t, f)
	if err := f.prep.Unprepare(ctx, a, out.Undo); err != nil {
		t.Fatal(err)
	}
	if got := instances(t, f); !slices.Equal(got, []string{"2@4"}) {
		t.Errorf("instances %v, want the one made by hand kept", got)
	}
}

// A host with the nvidia-uvm module loaded but no /dev/nvidia-uvm (nothing
// ran nvidia-modprobe yet) gets the nodes made, and the container gets
// them: the CDI library gives only the nodes it finds, and every CUDA
// process opens them.
func TestMissingUVMNodesAreMade(t *testing.T) {
	f := newFixture(t, nvmltest.H100Node())
	_, ctx := ktesting.NewTestContext(t)
	for _, n := range []string{"dev/nvidia-uvm", "dev/nvidia-uvm-tools"} {
		if err := os.Remove(filepath.Join(f.root, n)); err != nil {
			t.Fatal(err)
		}
	}
	name := "gpu-0000-3b-00-0"
	out, err := f.prep.Prepare(ctx, alloc("c1", name, names.KindGPU), f.res.Index[name])
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range out.Edits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	for minor, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
		var st unix.Stat_t
		path := filepath.Join(f.root, "dev", n)
		if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(510, uint32(minor)) || st.Mode&0o777 != 0o666 {
			t.Errorf("%s: %v, mode %#o, rdev %d:%d; want 510:%d, 0666", path, err, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), minor)
		}
		if !slices.Contains(nodes, "/dev/"+n) {
			t.Errorf("device nodes %v lack /dev/%s", nodes, n)
		}
	}
}
