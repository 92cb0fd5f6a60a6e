package memslice

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/carve-dra/carve/gpu/gputest"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/prepare/cdi"
)

// container is the OCI spec a runtime gives a container that holds the
// given edits, one CDI device each, as the kubelet hands them over: carve's
// CDI writer writes the claim's spec, and the CDI library injects it.
func container(t *testing.T, edits ...cdispec.ContainerEdits) *oci.Spec {
	t.Helper()
	dir := gputest.TempDir(t)
	w, err := cdi.NewWriter(dir, "carve.dev")
	if err != nil {
		t.Fatal(err)
	}
	var devs []cdispec.Device
	var ids []string
	for i, e := range edits {
		name := "share" + string(rune('a'+i))
		devs = append(devs, cdispec.Device{Name: name, ContainerEdits: e})
		ids = append(ids, w.DeviceID(name))
	}
	if err := w.Write("claim-uid", devs); err != nil {
		t.Fatal(err)
	}
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dir), cdilib.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}, Mounts: []oci.Mount{{Destination: "/dev/shm", Type: "tmpfs", Source: "shm"}}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatal(err)
	}
	return spec
}

func envOf(spec *oci.Spec) map[string]string {
	out := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

func mountsOf(spec *oci.Spec) map[string]string {
	out := map[string]string{}
	for _, m := range spec.Mounts {
		out[m.Destination] = m.Source
	}
	return out
}

// One container holds a share of each of two GPUs (two requests of one
// claim). The claim's daemon of each GPU stays reachable at its own path
// with its own slice, the container's /dev/shm is the claim's one tmpfs
// both daemons see, and the default variables are one share's pair, never
// a mix.
func TestSharesOfTwoGPUsInOneContainer(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	m := New(e.opts)
	a, b := share("a", 10*gib, TierMPSPoliced), share("b", 20*gib, TierMPSPoliced)
	a.EnvPrefix, b.UUID, b.EnvPrefix, b.ClaimUID = "CARVE_SMALL_", "GPU-2", "CARVE_LARGE_", a.ClaimUID
	ea, _, err := m.Prepare(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, err := m.Prepare(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	spec := container(t, ea, eb)
	env, mounts := envOf(spec), mountsOf(spec)
	for path, host := range map[string]string{
		"/run/nvidia-mps/GPU-1": filepath.Join(DaemonDir(e.dir, a.ClaimUID, "GPU-1"), "pipe"),
		"/run/nvidia-mps/GPU-2": filepath.Join(DaemonDir(e.dir, a.ClaimUID, "GPU-2"), "pipe"),
		"/dev/shm":              ClaimShmDir(e.dir, a.ClaimUID),
	} {
		if mounts[path] != host {
			t.Errorf("%s mounted from %q, want %s (mounts %v)", path, mounts[path], host, mounts)
		}
	}
	for k, v := range map[string]string{
		"CARVE_SMALL_MPS_PIPE_DIRECTORY": "/run/nvidia-mps/GPU-1", "CARVE_SMALL_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
		"CARVE_LARGE_MPS_PIPE_DIRECTORY": "/run/nvidia-mps/GPU-2", "CARVE_LARGE_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
	} {
		if env[k] != v {
			t.Errorf("%s=%q, want %s", k, env[k], v)
		}
	}
	pair := env["CUDA_MPS_PIPE_DIRECTORY"] + " " + env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]
	if pair != "/run/nvidia-mps/GPU-1 0=10240M" && pair != "/run/nvidia-mps/GPU-2 0=20480M" {
		t.Errorf("default pipe and limit %q are not one share's", pair)
	}
	// Both daemons see the tmpfs the container has as /dev/shm.
	for _, uuid := range []string{"GPU-1", "GPU-2"} {
		if d := m.daemon(a.ClaimUID, uuid, TierMPSPoliced); d.ShmDir != ClaimShmDir(e.dir, a.ClaimUID) {
			t.Errorf("daemon of %s: /dev/shm %q", uuid, d.ShmDir)
		}
	}
	// The first GPU given back leaves the tmpfs to the second.
	if err := m.Unprepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if ok, _ := mps.IsShm(ClaimShmDir(e.dir, a.ClaimUID)); !ok {
		t.Error("the tmpfs went with the first GPU while the second still uses it")
	}
	if err := m.Unprepare(ctx, "b", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ClaimDir(e.dir, a.ClaimUID)); !os.IsNotExist(err) {
		t.Errorf("the claim's directory is left after its last share: %v", err)
	}
}

// dmem shares of two GPUs in one container: each share's hook survives
// CDI's merge and limits its own GPU's region.
func TestDMEMSharesOfTwoGPUsInOneContainer(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	m := New(e.opts)
	a, b := share("a", 10*gib, TierDMEM), share("b", 20*gib, TierDMEM)
	b.UUID, b.Choice.Region = "GPU-2", "nvidia/0000:1a:00.0/vidmem"
	ea, _, err := m.Prepare(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, err := m.Prepare(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	spec := container(t, ea, eb)
	if spec.Hooks == nil || len(spec.Hooks.CreateRuntime) != 2 {
		t.Fatalf("hooks %+v, want both shares' createRuntime hooks", spec.Hooks)
	}
	var limits []string
	for _, h := range spec.Hooks.CreateRuntime {
		i := slices.Index(h.Args, "--region")
		limits = append(limits, h.Args[i+1]+" "+h.Args[i+3])
	}
	slices.Sort(limits)
	if strings.Join(limits, ", ") != "nvidia/0000:19:00.0/vidmem 10737418240, nvidia/0000:1a:00.0/vidmem 21474836480" {
		t.Errorf("limits %v", limits)
	}
	for _, k := range []string{"a", "b"} {
		uuid := map[string]string{"a": "GPU-1", "b": "GPU-2"}[k]
		rec := RecordDir(e.dir, uuid, k)
		if err := os.MkdirAll(rec, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := m.Unprepare(ctx, k, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(rec); !os.IsNotExist(err) {
			t.Errorf("share %s: its hook's record is left: %v", k, err)
		}
	}
}

// Containers mount the host's view of the tmpfs. Where the agent's mount
// does not reach the host (the state directory's mount does not propagate),
// a share is refused saying so, and the GPU is left as it was.
func TestSharedMemoryTheHostDoesNotSeeIsRefused(t *testing.T) {
	e := newEnv(t)
	e.opts.HostRoot = gputest.TempDir(t)
	_, _, err := New(e.opts).Prepare(context.Background(), share("a", 10*gib, TierMPSPoliced))
	if err == nil || !strings.Contains(err.Error(), "stateDirPropagation") {
		t.Fatalf("Prepare = %v, want a refusal naming the propagation", err)
	}
	if len(e.nv.modes) != 0 || e.commands(t) != "" {
		t.Errorf("a refused share changed the GPU: modes %v, commands %q", e.nv.modes, e.commands(t))
	}
	for _, dir := range []string{ClaimDir(e.dir, "uid-a"), filepath.Join(e.dir, "GPU-1")} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s of a refused share is left: %v", dir, err)
		}
	}
	// The probe at start says so too, and leaves nothing mounted.
	if err := New(e.opts).CheckShm(); err == nil || !strings.Contains(err.Error(), "stateDirPropagation") {
		t.Errorf("CheckShm = %v", err)
	}
	if _, err := os.Stat(e.opts.ShmDir); !os.IsNotExist(err) {
		t.Errorf("the probe tmpfs is left: %v", err)
	}
}
