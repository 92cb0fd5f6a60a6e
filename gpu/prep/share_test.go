package prep_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/gputest"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/gpu/prep"
	cslices "github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

type cardNVML struct{ mode gpu.ComputeMode }

func (c *cardNVML) Memory(context.Context, string) (nvml.Memory, error) {
	return nvml.Memory{Total: 80 << 30, Free: 79 << 30}, nil
}
func (c *cardNVML) ComputeMode(context.Context, string) (gpu.ComputeMode, error) { return c.mode, nil }
func (c *cardNVML) SetComputeMode(_ context.Context, _ string, m gpu.ComputeMode) error {
	c.mode = m
	return nil
}

type idle struct{}

func (idle) Processes(context.Context, string) ([]gpu.Process, error) { return nil, nil }

func TestMemoryShareOfAWholeGPU(t *testing.T) {
	gputest.NeedRoot(t)
	f := newFixture(t, nvmltest.H100Node())
	_, ctx := ktesting.NewTestContext(t)
	bin, _ := filepath.Abs("../mps/testdata")
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	card := &cardNVML{mode: gpu.ComputeModeExclusiveProcess}
	dir := filepath.Join(gputest.TempDir(t), "gpushare")
	mgr := memslice.New(memslice.Options{NVML: card, Dir: dir, MPSControl: mps.Binary, Police: police.New(police.Options{Processes: idle{}})})
	p := prep.New(prep.Options{NVML: f.session, Root: f.root, DriverRoot: "/usr/local/nvidia", Shares: mgr, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	p.Devices = func() map[string]cslices.Entry { return f.res.Index }
	name := "gpu-0000-3b-00-0"
	e := f.res.Index[name]
	g := *e.GPU
	g.Memory = discovery.GPUMemory{Enforcement: "mps-policed"}
	e.GPU = &g
	f.res.Index[name] = e
	t.Cleanup(func() {
		d := mps.Daemon{Dir: memslice.DaemonDir(dir, "c1", nvmltest.H100UUID(1)), UUID: nvmltest.H100UUID(1)}
		if pid, alive := d.PID(); alive {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = mps.UnmountShm(memslice.ClaimShmDir(dir, "c1"))
	})

	sid := types.UID("s1")
	a := alloc("c1", name, names.KindGPU)
	a.ShareID = &sid
	a.Consumed = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}
	// The claim sizes its /dev/shm (GPUConfig).
	a.Config = json.RawMessage(`{"gpu":{"apiVersion":"carve.dev/v1alpha1","kind":"GPUConfig","sharedMemorySize":"256Mi"}}`)
	out, err := p.Prepare(ctx, a, e)
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(out.Edits.Env, " ")
	for _, want := range []string{"CARVE_GPU_GPU_UUID=" + nvmltest.H100UUID(1), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M", "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/" + nvmltest.H100UUID(1)} {
		if !strings.Contains(env, want) {
			t.Errorf("env %q lacks %s", env, want)
		}
	}
	found := false
	for _, n := range out.Edits.DeviceNodes {
		found = found || n.Path == "/dev/nvidia1"
	}
	if !found {
		t.Error("the share's container lacks the GPU's device node")
	}
	var rec memslice.Record
	if err := json.Unmarshal(out.Undo, &rec); err != nil || rec.Slice != 10<<30 || rec.UUID != nvmltest.H100UUID(1) || rec.ShmSize != 256<<20 {
		t.Fatalf("undo %s: %v", out.Undo, err)
	}
	// Default while shared: every claim's daemon runs an MPS server.
	if card.mode != gpu.ComputeModeDefault {
		t.Errorf("compute mode %d", card.mode)
	}
	// A crash before the record: Unprepare finds the GPU from the device.
	if err := p.Unprepare(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if card.mode != gpu.ComputeModeExclusiveProcess {
		t.Errorf("compute mode %d after unprepare, want the former one back", card.mode)
	}
	if _, err := os.Stat(memslice.ClaimDir(dir, "c1")); !os.IsNotExist(err) {
		t.Errorf("the claim's MPS directory is left: %v", err)
	}
	// A GPU whose slices cannot be enforced refuses shares.
	g.Memory = discovery.GPUMemory{Enforcement: "none", Reason: "no nvidia-cuda-mps-control below the driver root"}
	if _, err := p.Prepare(ctx, a, e); err == nil || !strings.Contains(err.Error(), "allocate it whole") {
		t.Errorf("share on a none GPU: %v", err)
	}
	a.Consumed = nil
	if _, err := p.Prepare(ctx, a, e); err == nil || !strings.Contains(err.Error(), "consumes no memory") {
		t.Errorf("share without memory: %v", err)
	}
}

// The checkpoint is lost: a restarted preparer (Restore with nothing)
// keeps the share it finds recorded on the node policed, and the kubelet's
// unprepare of its claim, which the driver hands to UnprepareClaim as it
// does not know the claim, takes it back.
func TestShareKeptWhenTheCheckpointIsLost(t *testing.T) {
	gputest.NeedRoot(t)
	f := newFixture(t, nvmltest.H100Node())
	_, ctx := ktesting.NewTestContext(t)
	bin, _ := filepath.Abs("../mps/testdata")
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	card := &cardNVML{mode: gpu.ComputeModeExclusiveProcess}
	dir := filepath.Join(gputest.TempDir(t), "gpushare")
	newPrep := func(pol *police.Police) *prep.Preparer {
		mgr := memslice.New(memslice.Options{NVML: card, Dir: dir, MPSControl: mps.Binary, Police: pol})
		p := prep.New(prep.Options{NVML: f.session, Root: f.root, DriverRoot: "/usr/local/nvidia", Shares: mgr, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
		p.Devices = func() map[string]cslices.Entry { return f.res.Index }
		return p
	}
	name := "gpu-0000-3b-00-0"
	e := f.res.Index[name]
	g := *e.GPU
	g.Memory = discovery.GPUMemory{Enforcement: "mps-policed"}
	e.GPU = &g
	f.res.Index[name] = e
	d := mps.Daemon{Dir: memslice.DaemonDir(dir, "c1", nvmltest.H100UUID(1)), UUID: nvmltest.H100UUID(1)}
	t.Cleanup(func() {
		if pid, alive := d.PID(); alive {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = mps.UnmountShm(memslice.ClaimShmDir(dir, "c1"))
	})
	sid := types.UID("s1")
	a := alloc("c1", name, names.KindGPU)
	a.ShareID = &sid
	a.Consumed = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}
	if _, err := newPrep(police.New(police.Options{Processes: idle{}})).Prepare(ctx, a, e); err != nil {
		t.Fatal(err)
	}
	pol := police.New(police.Options{Processes: idle{}})
	p := newPrep(pol)
	p.Restore(nil, nil)
	if s, ok := pol.Shares()[a.ShareKey()]; !ok || s.Slice != 10<<30 || s.UUID != nvmltest.H100UUID(1) {
		t.Fatalf("policed after a lost checkpoint: %+v", pol.Shares())
	}
	if _, alive := d.PID(); !alive || card.mode != gpu.ComputeModeDefault {
		t.Fatalf("daemon alive %v, mode %d after a lost checkpoint", alive, card.mode)
	}
	if err := p.UnprepareClaim(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, alive := d.PID(); alive || len(pol.Shares()) != 0 || card.mode != gpu.ComputeModeExclusiveProcess {
		t.Errorf("after the claim's unprepare: daemon alive %v, policed %v, mode %d", alive, pol.Shares(), card.mode)
	}
	if _, err := os.Stat(memslice.ClaimDir(dir, "c1")); !os.IsNotExist(err) {
		t.Errorf("the claim's directory is left: %v", err)
	}
}
