package memslice

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/gpu/mps"
)

// Two claims on one GPU get a daemon each, with a pipe directory and a
// tmpfs each, each daemon its claim's ceiling; a container is given its
// claim's, the pipe directory read-only; unpreparing one claim removes its
// own and nothing of the other's.
func TestClaimsOnOneGPUAreIsolated(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.opts.DaemonEnv = append(e.opts.DaemonEnv, "FAKE_MPS_TAG_PIPE=1")
	m := New(e.opts)
	// Claim a has two shares of the GPU (two requests): one daemon whose
	// ceiling is the claim's memory there. Claim b has one.
	a1, a2, b := share("a", 10*gib, TierMPSPoliced), share("a2", 5*gib, TierMPSPoliced), share("b", 20*gib, TierMPSPoliced)
	a2.ClaimUID = a1.ClaimUID
	edits := map[string][]string{}
	for _, r := range []Request{a1, a2, b} {
		e, _, err := m.Prepare(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, mnt := range e.Mounts {
			edits[r.Key] = append(edits[r.Key], mnt.ContainerPath+"="+mnt.HostPath+" "+strings.Join(mnt.Options, ","))
		}
	}
	da, db := m.daemon(a1.ClaimUID, "GPU-1", TierMPSPoliced), m.daemon(b.ClaimUID, "GPU-1", TierMPSPoliced)
	if da.PipeDir() == db.PipeDir() || da.ShmDir == db.ShmDir {
		t.Fatalf("claims share a pipe directory or tmpfs: %s %s", da.Dir, db.Dir)
	}
	var devs []uint64
	for _, d := range []mps.Daemon{da, db} {
		if _, alive := d.PID(); !alive {
			t.Errorf("daemon %s not running", d.Dir)
		}
		if ok, err := mps.IsShm(d.ShmDir); !ok || err != nil {
			t.Errorf("%s is not a tmpfs mount: %v", d.ShmDir, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(d.ShmDir, &st); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, st.Dev)
		// Each daemon's /dev/shm is its claim's tmpfs (the fake leaves
		// its mark there).
		if _, err := os.Stat(filepath.Join(d.ShmDir, e.mark)); err != nil {
			t.Errorf("daemon %s: its /dev/shm is not %s: %v", d.Dir, d.ShmDir, err)
		}
	}
	if devs[0] == devs[1] {
		t.Error("the two claims' tmpfs are one file system")
	}
	for key, want := range map[string][]string{
		"a":  {"/run/nvidia-mps/GPU-1=" + da.PipeDir() + " rbind,ro,nosuid,nodev,noexec", "/dev/shm=" + da.ShmDir + " rbind,rw,nosuid,nodev,noexec"},
		"a2": {"/run/nvidia-mps/GPU-1=" + da.PipeDir() + " rbind,ro,nosuid,nodev,noexec", "/dev/shm=" + da.ShmDir + " rbind,rw,nosuid,nodev,noexec"},
		"b":  {"/run/nvidia-mps/GPU-1=" + db.PipeDir() + " rbind,ro,nosuid,nodev,noexec", "/dev/shm=" + db.ShmDir + " rbind,rw,nosuid,nodev,noexec"},
	} {
		if !slices.Equal(edits[key], want) {
			t.Errorf("share %s mounts %q, want %q", key, edits[key], want)
		}
	}
	ceilings := func() map[string][]string {
		out := map[string][]string{}
		for _, l := range strings.Split(e.commands(t), "\n") {
			if pipe, cmd, ok := strings.Cut(l, ": "); ok && strings.HasPrefix(cmd, "set_default_device_pinned_mem_limit") {
				out[pipe] = append(out[pipe], strings.TrimPrefix(cmd, "set_default_device_pinned_mem_limit 0 "))
			}
		}
		return out
	}
	got := ceilings()
	if !slices.Equal(got[da.PipeDir()], []string{"10240M", "15360M"}) || !slices.Equal(got[db.PipeDir()], []string{"20480M"}) {
		t.Errorf("ceilings sent %v; want a's 10240M then 15360M (its two shares), b's 20480M", got)
	}

	// One of a's shares goes: a's ceiling comes down, its daemon stays.
	if err := m.Unprepare(ctx, a2.Key, ""); err != nil {
		t.Fatal(err)
	}
	if got := ceilings()[da.PipeDir()]; got[len(got)-1] != "10240M" {
		t.Errorf("a's ceilings %v, want 10240M last", got)
	}
	// b goes: its daemon, tmpfs and directory go; a's stay, untouched.
	keep := filepath.Join(da.ShmDir, "tenant-a")
	if err := os.WriteFile(keep, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Unprepare(ctx, b.Key, ""); err != nil {
		t.Fatal(err)
	}
	if _, alive := db.PID(); alive {
		t.Error("b's daemon outlived b")
	}
	if _, err := os.Stat(ClaimDir(e.dir, b.ClaimUID)); !os.IsNotExist(err) {
		t.Errorf("b's directory is left: %v", err)
	}
	if _, alive := da.PID(); !alive {
		t.Error("a's daemon went with b")
	}
	if ok, _ := mps.IsShm(da.ShmDir); !ok {
		t.Error("a's tmpfs went with b")
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a's file went with b: %v", err)
	}
	if err := m.Unprepare(ctx, a1.Key, ""); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, e)
}

// assertNothingLeft: no daemon runs, no tmpfs is mounted, no directory is
// left below the shares' Dir.
func assertNothingLeft(t *testing.T, e *env) {
	t.Helper()
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mountinfo), e.dir) {
		t.Errorf("a mount below %s is left", e.dir)
	}
	left, _ := filepath.Glob(filepath.Join(e.dir, "*"))
	if len(left) != 0 {
		t.Errorf("left below %s: %v", e.dir, left)
	}
	if pipes, _ := filepath.Glob(filepath.Join(e.dir, daemonsDir, "*", "*", "pipe")); len(pipes) != 0 {
		t.Errorf("daemon directories left: %v", pipes)
	}
}

// A state directory too long for the daemon's sockets is refused before
// anything is changed, saying how to fix it.
func TestLongPipeDirectoryIsRefused(t *testing.T) {
	e := newEnv(t)
	e.opts.Dir = filepath.Join(e.dir, strings.Repeat("x", mps.MaxPipeDir))
	_, _, err := New(e.opts).Prepare(context.Background(), share("a", gib, TierMPSPoliced))
	if err == nil || !strings.Contains(err.Error(), "--state-dir") || !strings.Contains(err.Error(), "bytes long") {
		t.Fatalf("Prepare = %v, want the pipe directory's length refused", err)
	}
	if e.commands(t) != "" || len(e.nv.modes) != 0 {
		t.Errorf("a refused share changed the GPU: %q, %v", e.commands(t), e.nv.modes)
	}
	if _, err := os.Stat(e.opts.Dir); !os.IsNotExist(err) {
		t.Errorf("a directory was made for a refused share: %v", err)
	}
}

// crashAt makes the named fault point end the goroutine that reaches it,
// as SIGKILL ends the agent: nothing after it runs, no error path either.
func crashAt(t *testing.T, point string) {
	t.Helper()
	old := crashPoint
	crashPoint = func(name string) {
		if name == point {
			runtime.Goexit()
		}
	}
	t.Cleanup(func() { crashPoint = old })
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

// A claim's tmpfs is the size its config asks (GPUConfig.sharedMemorySize),
// the largest of its shares' where they differ, grown and never shrunk;
// a claim that asks none gets Options.ShmSize.
func TestClaimSizedSharedMemory(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.opts.ShmSize = 32 << 20
	m := New(e.opts)
	size := func(claim types.UID) uint64 {
		var fs unix.Statfs_t
		if err := unix.Statfs(ClaimShmDir(e.dir, claim), &fs); err != nil {
			t.Fatal(err)
		}
		return uint64(fs.Blocks) * uint64(fs.Bsize)
	}
	a := share("a", 10*gib, TierMPSPoliced)
	a.ShmSize, a.ShmMax = 64<<20, 256<<20 // its DeviceClass allows 256Mi
	// Over the bound: no class bound and over the agent's 32Mi, or over
	// the class's. Refused, nothing set up.
	free := share("free", 10*gib, TierMPSPoliced)
	free.ShmSize = 64 << 20
	greedy := share("greedy", 10*gib, TierMPSPoliced)
	greedy.ShmSize, greedy.ShmMax = 512<<20, 256<<20
	for _, r := range []Request{free, greedy} {
		if _, _, err := m.Prepare(ctx, r); err == nil || !strings.Contains(err.Error(), "a claim may ask") {
			t.Errorf("%s: sharedMemorySize %d MiB, bound %d MiB: %v", r.Key, r.ShmSize>>20, r.ShmMax>>20, err)
		}
		if _, err := os.Stat(ClaimDir(e.dir, r.ClaimUID)); !os.IsNotExist(err) {
			t.Errorf("%s: refused, its claim's directory is there (%v)", r.Key, err)
		}
	}
	a2 := a
	a2.Key, a2.ShareID, a2.UUID, a2.ShmSize = "a2", "s-a2", "GPU-2", 128<<20
	a3 := a
	a3.Key, a3.ShareID, a3.ShmSize = "a3", "s-a3", 0
	b := share("b", 10*gib, TierMPSPoliced)
	_, rec, err := m.Prepare(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if got := size(a.ClaimUID); got != 64<<20 || rec.ShmSize != 64<<20 {
		t.Errorf("claim a's tmpfs %d bytes, record %d; want 64Mi", got, rec.ShmSize)
	}
	for _, r := range []Request{a2, a3, b} {
		if _, _, err := m.Prepare(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if got := size(a.ClaimUID); got != 128<<20 {
		t.Errorf("claim a's tmpfs %d bytes after a share asking 128Mi", got)
	}
	if got := size(b.ClaimUID); got != 32<<20 {
		t.Errorf("claim b's tmpfs %d bytes, want the agent's 32Mi", got)
	}
	for _, k := range []string{"a", "a2", "a3", "b"} {
		if err := m.Unprepare(ctx, k, ""); err != nil {
			t.Fatal(err)
		}
	}
	assertNothingLeft(t, e)
}
