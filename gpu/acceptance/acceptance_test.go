//go:build acceptance

package acceptance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	"github.com/carve-dra/carve/gpu/prep"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

var (
	keepMode = flag.Bool("keep-compute-mode", false, "never change the GPU's compute mode (lent machines)")
	dryRun   = flag.Bool("dry-run", false, "print the plan and touch nothing")
	client   = flag.String("client", "cudaclient.py", "the client program: cudaclient.py (ctypes, libcuda.so.1 only) or client.py (PyTorch)")
	python   = flag.String("python", "python3", "the python that runs the client")
	tenant   = flag.Uint("tenant-uid", 1001, "the uid the 20 GiB share's process runs as: another tenant than the 10 GiB share's (root)")
)

type owners map[string][]police.PodRef

func (o owners) ReservedPods(_ context.Context, ns, name string) ([]police.PodRef, error) {
	return o[ns+"/"+name], nil
}

type logEvents struct{ t *testing.T }

func (l logEvents) PodEvent(p police.PodRef, reason, msg string) {
	l.t.Logf("event on %s: %s: %s", p.Name, reason, msg)
}

// pod is one share's stand-in pod: a cgroup named as the kubelet names
// pods, and the share's environment from its CDI edits.
type pod struct {
	// uid is the uid its processes run as; 0 is root.
	uid   uint32
	v2    bool
	pod   types.UID
	dir   string
	env   []string
	slice uint64
	// shm is what the share's container has as /dev/shm: the tmpfs its
	// claim's daemon sees as its own.
	shm string
	// pipe is the host path of its claim's daemon's pipe directory, which
	// its container has read-only.
	pipe string
}

func TestAcceptance(t *testing.T) {
	if *dryRun {
		for i, step := range Plan(*keepMode, *enableMIG, *tenant) {
			fmt.Printf("%d. %s\n", i+1, step)
		}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The driver's files where -driver-root says (/usr/local/nvidia on the
	// lent machines), as the agent finds them from the chart's nvidiaDriverRoot.
	s, err := gpu.Open(ctx, gpu.RealLibrary(*driverRoot), 10*time.Second)
	if err != nil {
		t.Fatalf("NVML from %s: %v", *driverRoot, err)
	}
	inv, err := s.Inventory(ctx)
	if err != nil || len(inv.Devices) == 0 {
		t.Fatalf("no GPU: %v", err)
	}
	dev0 := inv.Devices[0]
	choice := memslice.Detect(inv, memslice.EnvBelow("/", *driverRoot))[dev0.UUID]
	t.Logf("GPU 0 %s (%s, driver %s): tier %s %s", dev0.UUID, dev0.Name, inv.DriverVersion, choice.Tier, choice.Reason)
	if choice.Tier == memslice.TierNone {
		t.Fatalf("GPU 0 cannot be sliced: %s", choice.Reason)
	}
	formerMode, err := s.ComputeMode(ctx, dev0.UUID)
	if err != nil {
		t.Fatal(err)
	}
	state := stateDir(t, "cva-")
	small, large := newPod(t, "aaaaaaaa-0000-4000-8000-000000000010", 10<<30, 0), newPod(t, "bbbbbbbb-0000-4000-8000-000000000020", 20<<30, uint32(*tenant))
	pol := police.New(police.Options{Processes: s, Recorder: logEvents{t}, Logger: ktesting.NewLogger(t, ktesting.NewConfig()),
		Owners: owners{"acc/small": {{Namespace: "acc", Name: "small", UID: small.pod}}, "acc/large": {{Namespace: "acc", Name: "large", UID: large.pod}}}})
	go pol.Run(ctx)
	p, entry := sharePreparer(t, s, inv, choice, state, pol, memslice.DefaultContextReserve)

	var rows []Row
	start := time.Now()
	allocs := []prepare.Allocation{share(entry, "small", "10Gi"), share(entry, "large", "20Gi")}
	for i, pd := range []*pod{small, large} {
		out, err := p.Prepare(ctx, allocs[i], entry)
		if err != nil {
			t.Fatalf("prepare %s: %v", allocs[i].ClaimName, err)
		}
		pd.env, pd.shm, pd.pipe = shareEnv(out)
		if choice.Tier == memslice.TierDMEM { // what the createRuntime hook does
			if err := hook.ApplyDmem(hook.DefaultCgroupRoot, pd.dir, hook.DmemLimit{Region: choice.Region, Max: pd.slice, Min: pd.slice}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows = append(rows, Row{Attack: "prepare 10 GiB + 20 GiB", Outcome: fmt.Sprintf("prepared in %s", time.Since(start).Round(time.Millisecond)), Passed: true})
	torndown := false
	defer func() {
		if !torndown {
			for _, a := range allocs {
				_ = p.Unprepare(context.Background(), a, nil)
			}
		}
	}()

	rows = append(rows, shmRow(small, large))
	worker := run(t, s, dev0.UUID, large, nil, 18.5, 3600, true)
	worker.waitState(t, "computing", 60*time.Second)
	rows = append(rows, attack(t, s, dev0.UUID, small, "one process, 8 GiB in 10 GiB", 1, 8, nil, true))
	rows = append(rows, attack(t, s, dev0.UUID, small, "one process, 12 GiB in 10 GiB", 1, 12, nil, false))
	rows = append(rows, attack(t, s, dev0.UUID, small, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=70G, 12 GiB", 1, 12, []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=70G"}, false))
	rows = append(rows, attack(t, s, dev0.UUID, small, "two processes, 8 GiB each in 10 GiB", 2, 8, nil, false))
	skip := attack(t, s, dev0.UUID, small, "a process skips MPS, 12 GiB", 1, 12, []string{"CUDA_MPS_PIPE_DIRECTORY=/nonexistent-carve-mps"}, false)
	// Compute mode Default (carve's while a GPU is shared: one daemon per
	// claim) lets the process past MPS; what holds it, if anything, is
	// policing, and the row says what was measured.
	skip.Outcome += " (compute mode Default: MPS bypassed, policing alone)"
	rows = append(rows, skip)
	beats := worker.report(t)
	largeHeld := podHeld(ctx, s, dev0.UUID, large)
	worker.stop()
	rows = append(rows, Row{Attack: fmt.Sprintf("20 GiB share computes throughout, as uid %d beside the 10 GiB share's root", large.uid), Outcome: fmt.Sprintf("%s after %v rounds", beats["state"], beats["beats"]),
		Passed: beats["state"] == "computing" || beats["state"] == "done", Most: largeHeld})

	start = time.Now()
	var terr error
	for _, a := range allocs {
		terr = errors.Join(terr, p.Unprepare(ctx, a, nil))
	}
	torndown = true
	mode, merr := s.ComputeMode(ctx, dev0.UUID)
	// Every claim's own daemon, tmpfs and directory are gone.
	var left []string
	for _, a := range allocs {
		left = append(left, leftOf(state, a, dev0.UUID)...)
	}
	rows = append(rows, Row{Attack: "teardown", Outcome: fmt.Sprintf("%s: left %v, compute mode %d (was %d), err %v",
		time.Since(start).Round(time.Millisecond), left, mode, formerMode, errors.Join(terr, merr)), Passed: terr == nil && merr == nil && len(left) == 0 && mode == formerMode})
	fmt.Println()
	if !Table(os.Stdout, rows) {
		t.Error("an attack was not held; see the table")
	}
}

func share(e slices.Entry, name, size string) prepare.Allocation {
	sid := types.UID("share-" + name)
	return prepare.Allocation{ClaimUID: types.UID("acc-" + name), ClaimNamespace: "acc", ClaimName: name, Request: "gpu", Pool: "acceptance",
		Device: e.Device.Name, Kind: names.KindGPU, ShareID: &sid, Consumed: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(size)}}
}

// shareEnv is the share's MPS environment as a process on the host sees
// it: the pipe directory's host path; the host path of what the container
// has as /dev/shm; and the pipe directory's host path.
func shareEnv(out prepare.Prepared) (env []string, shm, pipe string) {
	for _, e := range out.Edits.Env {
		if strings.HasPrefix(e, "CUDA_MPS_") && !strings.HasPrefix(e, "CUDA_MPS_PIPE_DIRECTORY=") {
			env = append(env, e)
		}
	}
	for _, m := range out.Edits.Mounts {
		switch {
		case strings.HasPrefix(m.ContainerPath, memslice.ContainerPipeRoot+"/"):
			env, pipe = append(env, "CUDA_MPS_PIPE_DIRECTORY="+m.HostPath), m.HostPath
		case m.ContainerPath == "/dev/shm":
			shm = m.HostPath
		}
	}
	return env, shm, pipe
}

func newPod(t *testing.T, podUID string, slice uint64, uid uint32) *pod {
	base := hook.DefaultCgroupRoot
	_, err := os.Stat(filepath.Join(base, "cgroup.controllers"))
	v2 := err == nil
	if !v2 {
		base = filepath.Join(base, "pids") // cgroup v1: any hierarchy names the pod
		uid = 0                            // a client joins its pod's cgroup by a root shell
	}
	dir := filepath.Join(base, "carve-acceptance", "pod"+podUID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("pod cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir); _ = os.Remove(filepath.Dir(dir)) })
	return &pod{pod: types.UID(podUID), uid: uid, v2: v2, dir: dir, slice: slice}
}

// stateDir is a state directory for a test's shares, removed after it,
// made as the agent makes its own (prepare.EnsureStateDir: 0711, so that a
// tenant's MPS server, running as its uid, passes through it to its
// claim's pipe directory by path). Short and below /tmp: the daemon's pipe
// directory lies below it, and its sockets' paths must fit sun_path
// (mps.MaxPipeDir); t.TempDir's do not.
func stateDir(t *testing.T, prefix string) string {
	t.Helper()
	state, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	if err := prepare.EnsureStateDir(state); err != nil {
		t.Fatal(err)
	}
	return state
}

// sharePreparer is carve's GPU preparer over GPU 0's memory slices, wired
// as the agent wires it on a host (cmd/carve/app/gpumem.go): the shares
// below state/gpushare, the MPS control binary and the daemons' library
// directories from -driver-root, policing by pol; and GPU 0's published
// whole device, with the node config's 5 GiB memory steps.
// sharePreparer is carve's preparer of GPU 0's memory shares, as the
// agent's; reserve is the part of a slice left to a CUDA context
// (--mps-context-reserve).
func sharePreparer(t *testing.T, s *gpu.Session, inv *nvmlinfo.Inventory, choice memslice.Choice, state string, pol *police.Police, reserve uint64) (*prep.Preparer, slices.Entry) {
	t.Helper()
	mgr := memslice.New(memslice.Options{NVML: s, DriverLibDirs: gpu.LibraryDirs(*driverRoot), Dir: filepath.Join(state, memslice.SharesDir), Police: pol, KeepComputeMode: *keepMode,
		MPSControl: mpsControl(), CgroupRoot: hook.DefaultCgroupRoot, DaemonCapabilities: agentDaemonCapabilities(t), ContextReserve: reserve, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	res, entry := gpu0Slices(inv, choice)
	p := prep.New(prep.Options{NVML: s, Root: "/", DriverRoot: *driverRoot, Shares: mgr, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	p.Devices = func() map[string]slices.Entry { return res.Index }
	return p, entry
}

// mpsControl is the driver's nvidia-cuda-mps-control below -driver-root,
// as the agent finds it.
func mpsControl() string {
	return gpu.FindFile(*driverRoot, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary)
}

// leftOf lists what a claim's teardown left in the state directory: its
// daemon of GPU uuid, its tmpfs, its directory.
func leftOf(state string, a prepare.Allocation, uuid string) []string {
	dir := filepath.Join(state, memslice.SharesDir)
	var left []string
	if _, alive := (mps.Daemon{Dir: memslice.DaemonDir(dir, a.ClaimUID, uuid), UUID: uuid}).PID(); alive {
		left = append(left, a.ClaimName+"'s daemon")
	}
	if ok, _ := mps.IsShm(memslice.ClaimShmDir(dir, a.ClaimUID)); ok {
		left = append(left, a.ClaimName+"'s tmpfs")
	}
	if _, err := os.Stat(memslice.ClaimDir(dir, a.ClaimUID)); !errors.Is(err, os.ErrNotExist) {
		left = append(left, a.ClaimName+"'s directory")
	}
	return left
}

// agentDaemonCapabilities are the capabilities the agent's MPS daemons keep
// by default (--mps-capabilities): the card shows whether the real daemon
// and its servers work with them.
func agentDaemonCapabilities(t *testing.T) mps.Capabilities {
	t.Helper()
	c, err := mps.ParseCapabilities(mps.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gpu0Slices are the node's slices with GPU 0 shared in 5 GiB steps under
// choice, and GPU 0's whole-GPU entry.
func gpu0Slices(inv *nvmlinfo.Inventory, choice memslice.Choice) (slices.Result, slices.Entry) {
	dev0 := inv.Devices[0]
	cfg := nodeconfig.Default()
	cfg.RequestPolicies = map[string]map[string]nodeconfig.RequestPolicy{"gpu": {"memory": {Default: "5Gi", Step: "5Gi"}}}
	res := slices.Build(&discovery.Inventory{NVML: inv, GPUMemory: map[string]discovery.GPUMemory{dev0.UUID: {Enforcement: string(choice.Tier), Reason: choice.Reason, Region: choice.Region}}}, cfg, "acceptance")
	var entry slices.Entry
	for _, e := range res.Index {
		if e.GPU != nil && e.GPU.Device.UUID == dev0.UUID && e.GPU.MIG == nil {
			entry = e
		}
	}
	return res, entry
}
