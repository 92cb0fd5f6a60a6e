package memslice

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/gputest"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
)

const gib = uint64(1) << 30

// fakeNVML is one 80 GiB GPU's memory and compute mode.
type fakeNVML struct {
	mu    sync.Mutex
	free  uint64
	mode  gpu.ComputeMode
	modes []gpu.ComputeMode
}

func (f *fakeNVML) Memory(_ context.Context, uuid string) (nvml.Memory, error) {
	if uuid != "GPU-1" && uuid != "GPU-2" {
		return nvml.Memory{}, fmt.Errorf("no GPU %s", uuid)
	}
	return nvml.Memory{Total: 80 * gib, Free: f.free, Used: 80*gib - f.free}, nil
}

func (f *fakeNVML) ComputeMode(context.Context, string) (gpu.ComputeMode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode, nil
}

func (f *fakeNVML) SetComputeMode(_ context.Context, _ string, m gpu.ComputeMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode = m
	f.modes = append(f.modes, m)
	return nil
}

type noProcs struct{}

func (noProcs) Processes(context.Context, string) ([]gpu.Process, error) { return nil, nil }

type env struct {
	nv   *fakeNVML
	dir  string
	log  string
	mark string
	pol  *police.Police
	opts Options
}

// newEnv puts the fake nvidia-cuda-mps-control on PATH (it records every
// command in a log) and makes a manager's options over a fake NVML. The
// shared memory tmpfs is real: the tests run as root.
func newEnv(t *testing.T) *env {
	t.Helper()
	gputest.NeedRoot(t)
	bin, err := filepath.Abs("../mps/testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	e := &env{nv: &fakeNVML{free: 79 * gib}, dir: filepath.Join(gputest.TempDir(t), "gpushare"), log: filepath.Join(gputest.TempDir(t), "commands")}
	e.mark = fmt.Sprintf("carve-memslice-test-%d", os.Getpid())
	e.pol = police.New(police.Options{Processes: noProcs{}})
	e.opts = Options{NVML: e.nv, Dir: e.dir, MPSControl: mps.Binary, HookPath: "/var/lib/carve/bin/carve",
		HookArgs: []string{"carve", "hook", "dmem-limit"}, CgroupRoot: "/sys/fs/cgroup", Police: e.pol,
		ShmDir: filepath.Join(filepath.Dir(e.dir), "mps-shm"), ShmSize: 8 << 20,
		// The fake daemon learns where to log from its environment,
		// which is built, not inherited.
		DaemonEnv: []string{"FAKE_MPS_LOG=" + e.log, "FAKE_MPS_SHM_MARK=" + e.mark}}
	t.Cleanup(func() { e.killAll() })
	return e
}

// killAll ends every daemon the tests left and unmounts every claim's
// tmpfs.
func (e *env) killAll() {
	pipes, _ := filepath.Glob(filepath.Join(e.dir, daemonsDir, "*", "*", "pipe"))
	for _, p := range pipes {
		if pid, alive := (mps.Daemon{Dir: filepath.Dir(p)}).PID(); alive {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	shms, _ := filepath.Glob(filepath.Join(e.dir, daemonsDir, "*", shmName))
	for _, s := range append(shms, e.opts.ShmDir) {
		_ = mps.UnmountShm(s)
	}
}

// daemonOf is the daemon of share key's claim (share's) on GPU-1.
func (e *env) daemonOf(key string) mps.Daemon {
	return New(e.opts).daemon(share(key, 0, TierMPSPoliced).ClaimUID, "GPU-1", TierMPSPoliced)
}

func (e *env) commands(t *testing.T) string {
	b, err := os.ReadFile(e.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "get_server_list" && l != "" {
			out = append(out, strings.SplitN(l, " visible=", 2)[0])
		}
	}
	return strings.Join(out, "\n")
}

func share(key string, slice uint64, tier Tier) Request {
	return Request{Key: key, ClaimUID: types.UID("uid-" + key), Namespace: "ns", Name: "claim-" + key, ShareID: "s-" + key,
		UUID: "GPU-1", Slice: slice, Choice: Choice{Tier: tier, Region: "nvidia/0000:19:00.0/vidmem"}, EnvPrefix: "CARVE_GPU_"}
}

func TestMPSPolicedLifecycle(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.nv.mode = gpu.ComputeModeExclusiveProcess
	m := New(e.opts)
	edits, rec, err := m.Prepare(ctx, share("a", 10*gib, TierMPSPoliced))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Tier != TierMPSPoliced || rec.Slice != 10*gib || rec.UUID != "GPU-1" {
		t.Errorf("record %+v", rec)
	}
	envs := strings.Join(edits.Env, " ")
	for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M", "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps/GPU-1", "CARVE_GPU_GPU_MEMORY_ENFORCEMENT=mps-policed",
		"CARVE_GPU_MPS_PIPE_DIRECTORY=/run/nvidia-mps/GPU-1", "CARVE_GPU_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"} {
		if !strings.Contains(envs, want) {
			t.Errorf("env %q lacks %s", envs, want)
		}
	}
	// The container gets its claim's daemon's pipe directory, read-only,
	// and its claim's tmpfs as its /dev/shm, which is the daemon's too.
	d := e.daemonOf("a")
	if len(edits.Mounts) != 2 || edits.Mounts[0].HostPath != d.PipeDir() || edits.Mounts[0].ContainerPath != "/run/nvidia-mps/GPU-1" ||
		!slices.Contains(edits.Mounts[0].Options, "ro") || slices.Contains(edits.Mounts[0].Options, "rw") ||
		edits.Mounts[1].HostPath != ClaimShmDir(e.dir, "uid-a") || edits.Mounts[1].ContainerPath != "/dev/shm" {
		t.Errorf("mounts %+v", edits.Mounts)
	}
	if ok, err := mps.IsShm(d.ShmDir); !ok || err != nil {
		t.Errorf("the claim's tmpfs is not mounted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.ShmDir, e.mark)); err != nil {
		t.Errorf("the daemon's /dev/shm is not the tmpfs its clients mount: %v", err)
	}
	if _, _, err := m.Prepare(ctx, share("b", 20*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	// Prepare is idempotent: the same share again changes nothing.
	if _, _, err := m.Prepare(ctx, share("b", 20*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	// Default while the GPU is shared, set once for its first share.
	if e.nv.mode != gpu.ComputeModeDefault || len(e.nv.modes) != 1 {
		t.Errorf("compute modes set %v", e.nv.modes)
	}
	if len(e.pol.Usage()) != 2 {
		t.Errorf("policed shares %v", e.pol.Usage())
	}
	if err := m.Unprepare(ctx, "b", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := m.Unprepare(ctx, "a", "GPU-1"); err != nil {
		t.Errorf("unprepare again: %v", err)
	}
	want := strings.Join([]string{
		"start -d", // a's daemon
		"set_default_device_pinned_mem_limit 0 10240M",
		"start -d", // b's own
		"set_default_device_pinned_mem_limit 0 20480M",
		"set_default_device_pinned_mem_limit 0 20480M",
		"quit", // b's
		"quit", // a's
	}, "\n")
	if got := e.commands(t); got != want {
		t.Errorf("daemon commands:\n%s\nwant:\n%s", got, want)
	}
	if e.nv.mode != gpu.ComputeModeExclusiveProcess {
		t.Errorf("compute mode %d after the last share, want EXCLUSIVE_PROCESS back", e.nv.mode)
	}
	for _, dir := range []string{filepath.Join(e.dir, "GPU-1"), filepath.Join(e.dir, daemonsDir, filepath.Base(ClaimDir(e.dir, "uid-a")))} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", dir, err)
		}
	}
	if len(e.pol.Usage()) != 0 {
		t.Errorf("still policed: %v", e.pol.Usage())
	}
}

func TestSliceLargerThanWhatIsLeftIsRefused(t *testing.T) {
	ctx := context.Background()
	for _, tier := range []Tier{TierMPSPoliced, TierDMEM} {
		e := newEnv(t)
		m := New(e.opts)
		if _, _, err := m.Prepare(ctx, share("a", 60*gib, tier)); err != nil {
			t.Fatal(err)
		}
		_, _, err := m.Prepare(ctx, share("b", 25*gib, tier))
		if err == nil || !strings.Contains(err.Error(), "more than the 20480 MiB left") {
			t.Errorf("%s: 25 GiB beside 60 GiB of 80: %v", tier, err)
		}
		e.nv.free = 5 * gib // something outside carve holds the card
		if _, _, err := m.Prepare(ctx, share("c", 10*gib, tier)); err == nil || !strings.Contains(err.Error(), "5120 MiB free") {
			t.Errorf("%s: 10 GiB with 5 GiB free: %v", tier, err)
		}
		if err := m.Unprepare(ctx, "a", ""); err != nil {
			t.Fatal(err)
		}
	}
	// Refused on a GPU with no share: nothing was set up.
	e := newEnv(t)
	e.nv.free = 4 * gib
	if _, _, err := New(e.opts).Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err == nil {
		t.Fatal("10 GiB with 4 GiB free was prepared")
	}
	if e.commands(t) != "" || len(e.nv.modes) != 0 {
		t.Errorf("a refused share changed the GPU: %q, modes %v", e.commands(t), e.nv.modes)
	}
}

func TestDMEMAndNone(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	m := New(e.opts)
	edits, rec, err := m.Prepare(ctx, share("a", 10*gib, TierDMEM))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Region != "nvidia/0000:19:00.0/vidmem" || len(edits.Hooks) != 1 {
		t.Fatalf("record %+v, hooks %+v", rec, edits.Hooks)
	}
	h := edits.Hooks[0]
	record := filepath.Join(e.dir, "GPU-1", "dmem", "a")
	if h.HookName != "createRuntime" || strings.Join(h.Args, " ") != "carve hook dmem-limit --cgroup-root /sys/fs/cgroup --region nvidia/0000:19:00.0/vidmem --max 10737418240 --min 10737418240 --record "+record {
		t.Errorf("hook %+v", h)
	}
	if strings.Contains(strings.Join(edits.Env, " "), "PINNED_DEVICE_MEM_LIMIT") {
		t.Errorf("dmem share carries the MPS v2 limit: %v", edits.Env)
	}
	if got := e.commands(t); got != "start -d -p 3" {
		t.Errorf("commands %q, want an MPS v3 daemon", got)
	}
	if len(e.pol.Usage()) != 0 {
		t.Error("a dmem share is policed")
	}
	if err := m.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	none := share("n", gib, TierNone)
	none.Choice.Reason = "no nvidia-cuda-mps-control below the driver root"
	if _, _, err := m.Prepare(ctx, none); err == nil || !strings.Contains(err.Error(), none.Choice.Reason) {
		t.Errorf("none tier: %v", err)
	}
	e.opts.Police = nil
	if _, _, err := New(e.opts).Prepare(ctx, share("p", gib, TierMPSPoliced)); err == nil {
		t.Error("an mps-policed share was prepared without policing")
	}
}

// A GPU whose policing cannot read NVML (its lane wedged: a query hung in
// the driver) takes no new mps-policed share, and nothing is set up for
// it; once it answers again, the share is prepared. A share already held
// is prepared again (a kubelet retry) either way.
func TestShareOfAGPUThePolicingCannotReadIsRefused(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var hung error
	e.opts.Policing = func(string) error { return hung }
	m := New(e.opts)
	if _, _, err := m.Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	hung = fmt.Errorf("GPU GPU-1: NVML processes of GPU-1 did not return within 10s")
	commands := e.commands(t)
	_, _, err := m.Prepare(ctx, share("b", 10*gib, TierMPSPoliced))
	if err == nil || !strings.Contains(err.Error(), "policing cannot read NVML") || !strings.Contains(err.Error(), "did not return") {
		t.Fatalf("a share of a GPU its policing cannot read: %v", err)
	}
	if e.commands(t) != commands {
		t.Errorf("the refused share ran MPS commands: %q", strings.TrimPrefix(e.commands(t), commands))
	}
	if _, _, err := m.Prepare(ctx, share("a", 10*gib, TierMPSPoliced)); err != nil {
		t.Errorf("the share already held, prepared again: %v", err)
	}
	hung = nil
	if _, _, err := m.Prepare(ctx, share("b", 10*gib, TierMPSPoliced)); err != nil {
		t.Fatalf("after the GPU answers again: %v", err)
	}
	for _, k := range []string{"a", "b"} {
		if err := m.Unprepare(ctx, k, ""); err != nil {
			t.Fatal(err)
		}
	}
}

// A context's reserve comes off the MPS ceiling, the daemon's and the
// container's: NVML's figure of a process counts its context beside what
// MPS lets it allocate (an H100 read 8802 MiB for an 8 GiB allocation), and
// policing holds that figure to the slice. A slice no larger than the
// reserve is refused with the reason; the record keeps the slice.
func TestContextReserveComesOffTheCeiling(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.opts.ContextReserve = 640 << 20
	m := New(e.opts)
	if _, _, err := m.Prepare(ctx, share("small", 640<<20, TierMPSPoliced)); err == nil || !strings.Contains(err.Error(), "--mps-context-reserve") {
		t.Fatalf("a slice of the reserve's size: %v, want refused naming --mps-context-reserve", err)
	}
	edits, rec, err := m.Prepare(ctx, share("a", 10*gib, TierMPSPoliced))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Slice != 10*gib {
		t.Errorf("record slice %d, want the claim's 10 GiB", rec.Slice)
	}
	if envs := strings.Join(edits.Env, " "); !strings.Contains(envs, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=9600M") || !strings.Contains(envs, "GPU_MEMORY_SLICE=10737418240") {
		t.Errorf("env %q, want the ceiling 9600M and the slice 10 GiB", envs)
	}
	if _, _, err := m.Prepare(ctx, share("a2", 2*gib, TierMPSPoliced)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a2", "a"} {
		if err := m.Unprepare(ctx, k, ""); err != nil {
			t.Fatal(err)
		}
	}
	want := "start -d\nset_default_device_pinned_mem_limit 0 9600M\nstart -d\nset_default_device_pinned_mem_limit 0 1408M\nquit\nquit"
	if got := e.commands(t); got != want {
		t.Errorf("daemon commands:\n%s\nwant:\n%s", got, want)
	}
}
