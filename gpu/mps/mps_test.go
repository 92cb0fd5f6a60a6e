package mps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/carve-dra/carve/gpu/gputest"
	"github.com/carve-dra/carve/prepare/hostmount"
)

// fakeDaemon puts the fake control binary on PATH and returns a daemon
// in a fresh directory and the file its commands are recorded in.
func fakeDaemon(t *testing.T) (Daemon, string) {
	t.Helper()
	bin, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	log := filepath.Join(gputest.TempDir(t), "commands")
	// The fake learns where to log from its environment: the daemon's
	// is built, not inherited, so it is given in Env.
	d := Daemon{Dir: filepath.Join(gputest.TempDir(t), "mps", "GPU-1"), UUID: "GPU-1", Env: []string{"FAKE_MPS_LOG=" + log}}
	t.Cleanup(func() {
		if pid, alive := d.PID(); alive {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return d, log
}

func commands(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestStartCeilingStop(t *testing.T) {
	ctx := context.Background()
	d, log := fakeDaemon(t)
	started, err := d.Ensure(ctx)
	if err != nil || !started {
		t.Fatalf("Ensure = %v, %v", started, err)
	}
	if err := os.WriteFile(filepath.Join(d.PipeDir(), "servers"), []byte("777\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.SetCeiling(ctx, 20<<30+123); err != nil {
		t.Fatal(err)
	}
	// A second Ensure adopts the running daemon.
	if started, err := d.Ensure(ctx); err != nil || started {
		t.Fatalf("second Ensure = %v, %v; want the daemon adopted", started, err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("daemon directory left: %v", err)
	}
	want := []string{
		"start -d visible=GPU-1 pipe=" + d.PipeDir() + " log=" + d.LogDir(),
		"get_server_list",
		"set_default_device_pinned_mem_limit 0 20480M",
		"get_server_list",
		"set_device_pinned_mem_limit 777 0 20480M",
		"get_server_list",
		"quit",
	}
	if got := commands(t, log); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := d.Stop(ctx); err != nil {
		t.Errorf("stopping no daemon: %v", err)
	}
}

func TestStalePIDFileAndV3(t *testing.T) {
	ctx := context.Background()
	d, log := fakeDaemon(t)
	d.Protocol = 3
	if err := os.MkdirAll(d.PipeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	// PID 1 is alive but is not this daemon: never adopted, never killed.
	if err := os.WriteFile(filepath.Join(d.PipeDir(), pidFile), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, alive := d.PID(); alive {
		t.Fatal("a foreign process was taken for the daemon")
	}
	if started, err := d.Ensure(ctx); err != nil || !started {
		t.Fatalf("Ensure = %v, %v", started, err)
	}
	if got := commands(t, log)[0]; !strings.HasPrefix(got, "start -d -p 3 ") {
		t.Errorf("start = %q, want -d -p 3", got)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartFailure(t *testing.T) {
	d, _ := fakeDaemon(t)
	d.Env = append(d.Env, "FAKE_MPS_FAIL_START=1")
	if _, err := d.Ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "fake start failure") {
		t.Errorf("Ensure = %v, want the daemon's own error", err)
	}
	if ClientLimit(10<<30) != "0=10240M" {
		t.Errorf("ClientLimit = %q", ClientLimit(10<<30))
	}
}

// A pipe directory too long for the daemon's sockets is refused before
// anything starts, with the reason (a real daemon exits 1 and says nothing).
func TestPipeDirTooLong(t *testing.T) {
	d, log := fakeDaemon(t)
	d.Dir = "/" + strings.Repeat("d", MaxPipeDir-len("/pipe"))
	if _, err := d.Ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "bytes long") {
		t.Fatalf("Ensure = %v, want the pipe directory's length refused", err)
	}
	if _, err := os.Stat(log); err == nil {
		t.Error("the control binary ran for a pipe directory it cannot use")
	}
	if _, err := os.Stat(d.Dir); err == nil {
		t.Error("a directory was made for a pipe directory it cannot use")
	}
}

// The daemon sees the shared memory tmpfs as its /dev/shm, in a mount
// namespace of its own: the file it leaves in /dev/shm is in the tmpfs, and
// not in the /dev/shm of the process that started it. The tmpfs is a mount
// point until UnmountShm, which leaves nothing behind.
func TestDaemonSeesTheSharedMemoryTmpfs(t *testing.T) {
	gputest.NeedRoot(t)
	ctx := context.Background()
	d, _ := fakeDaemon(t)
	d.ShmDir = filepath.Join(gputest.TempDir(t), "shm")
	if err := MountShm(d.ShmDir, 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountShm(d.ShmDir) })
	if err := MountShm(d.ShmDir, 8<<20); err != nil {
		t.Fatalf("mounting again: %v", err)
	}
	if ok, err := IsShm(d.ShmDir); !ok || err != nil {
		t.Fatalf("IsShm = %v, %v after MountShm", ok, err)
	}
	if ok, _ := IsShm(filepath.Dir(d.ShmDir)); ok {
		t.Error("a plain directory taken for the tmpfs")
	}
	mark := fmt.Sprintf("carve-mps-test-%d", os.Getpid())
	d.Env = append(d.Env, "FAKE_MPS_SHM_MARK="+mark)
	t.Cleanup(func() { _ = os.Remove(filepath.Join("/dev/shm", mark)) })
	if _, err := d.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.ShmDir, mark)); err != nil {
		t.Errorf("the daemon's /dev/shm is not the tmpfs: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", mark)); err == nil {
		t.Error("the daemon wrote into the starting process's /dev/shm")
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := UnmountShm(d.ShmDir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.ShmDir); !os.IsNotExist(err) {
		t.Errorf("tmpfs directory left: %v", err)
	}
}

// A daemon started from another mount namespace (here this process's own,
// entered by its path, as the agent enters the runtime's) is started by its
// path on that side of the host root, and sees its tmpfs as /dev/shm there.
func TestStartInNamespace(t *testing.T) {
	gputest.NeedRoot(t)
	ctx := context.Background()
	d, log := fakeDaemon(t)
	bin, err := filepath.Abs(filepath.Join("testdata", Binary))
	if err != nil {
		t.Fatal(err)
	}
	// The host root as the agent sees it: the binary is below it (a link
	// here), and is started by its path on the host, bin.
	root := gputest.TempDir(t)
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(bin)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(root, bin)); err != nil {
		t.Fatal(err)
	}
	d.Path = filepath.Join(root, bin)
	d.Start = StartInNamespace("/proc/self/ns/mnt", root)
	d.ShmDir = filepath.Join(gputest.TempDir(t), "shm")
	if err := MountShm(d.ShmDir, 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = UnmountShm(d.ShmDir) })
	mark := fmt.Sprintf("carve-mps-ns-test-%d", os.Getpid())
	d.Env = append(d.Env, "FAKE_MPS_SHM_MARK="+mark)
	d.Env = append(d.Env, "FAKE_MPS_LOG_ARGV0=1")
	t.Cleanup(func() { _ = os.Remove(filepath.Join("/dev/shm", mark)) })
	if _, err := d.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if got := commands(t, log)[0]; !strings.HasSuffix(got, " argv0="+bin) {
		t.Errorf("start %q, want it started by its host path %s", got, bin)
	}
	if _, err := os.Stat(filepath.Join(d.ShmDir, mark)); err != nil {
		t.Errorf("the daemon's /dev/shm is not its tmpfs: %v", err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// A binary outside the host root cannot be named on the host.
	d.Path = bin
	if _, err := d.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "not below the host root") {
		t.Errorf("Ensure = %v, want the binary refused", err)
	}
}

// A link planted where the daemon writes its pid file is never followed.
func TestPIDFileLinkIsNotFollowed(t *testing.T) {
	d, _ := fakeDaemon(t)
	if err := os.MkdirAll(d.PipeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(gputest.TempDir(t), "pid")
	if err := os.WriteFile(target, []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(d.PipeDir(), pidFile)); err != nil {
		t.Fatal(err)
	}
	if pid, _ := d.PID(); pid != 0 {
		t.Errorf("PID = %d, read through a link", pid)
	}
}

// A FIFO planted where the daemon writes its pid file neither blocks PID
// (an open for reading waits for a writer) nor passes for a daemon.
// (Found by FuzzPID: testdata/fuzz/FuzzPID/205083c189404cc4.)
func TestPIDFileFIFODoesNotBlock(t *testing.T) {
	d := Daemon{Dir: filepath.Join(t.TempDir(), "mps"), UUID: "GPU-1"}
	if err := os.MkdirAll(d.PipeDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(d.PipeDir(), pidFile), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() {
		pid, alive := d.PID()
		done <- pid == 0 && !alive
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Error("a FIFO in place of the pid file gave a pid")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PID blocked on a FIFO in place of the pid file")
	}
}

// A share's container has its daemon's pipe directory read-only: it can
// still connect to the daemon's socket there (connect(2) is no write to the
// file system), and can neither create nor remove anything in it.
func TestSocketOnAReadOnlyBindTakesConnections(t *testing.T) {
	gputest.NeedRoot(t)
	dir := gputest.TempDir(t)
	sock := filepath.Join(dir, "control")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	err = hostmount.OnOwnThread(func() error {
		if err := newSlaveNS("test"); err != nil {
			return err
		}
		if err := bindReadOnly(dir); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "planted"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("creating a file: %v, want EROFS", err)
		}
		if err := os.Remove(sock); !errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("removing the socket: %v, want EROFS", err)
		}
		c, err := net.Dial("unix", sock)
		if err != nil {
			return fmt.Errorf("connect on the read-only bind: %w", err)
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "ok" {
			return fmt.Errorf("answer %q, %v", b, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the socket is gone outside the namespace: %v", err)
	}
}

// The daemon's environment is built, not inherited: PATH leads with the
// control binary's directory (the server beside it is started by name),
// LD_LIBRARY_PATH is the driver's library directories, the three CUDA_*
// variables, and nothing of the agent's. Started from the host's mount
// namespace, the paths are the host's. The agent image's environment left
// the server off PATH and libcuda unloadable where the driver is not at /.
func TestDaemonEnvironmentIsBuilt(t *testing.T) {
	gputest.NeedRoot(t)
	ctx := context.Background()
	d, _ := fakeDaemon(t)
	t.Setenv("CARVE_AGENT_ONLY", "leaks")
	t.Setenv("LD_LIBRARY_PATH", "/agent/image/lib")
	// The host root as the agent sees it, with the driver below it: a
	// copy of the fake in its bin, and, for the start from the host's
	// namespace, the fake's own path on the host linked below it (as
	// TestStartInNamespace).
	root := gputest.TempDir(t)
	bin := filepath.Join(root, "usr/local/nvidia/bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	fake, err := filepath.Abs(filepath.Join("testdata", Binary))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(fake)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, Binary), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(fake)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, filepath.Join(root, fake)); err != nil {
		t.Fatal(err)
	}
	d.LibDirs = []string{filepath.Join(root, "usr/local/nvidia/lib64")}
	for _, c := range []struct {
		name          string
		path          string
		starter       Starter
		wantPath, lib string
	}{
		{"this namespace", filepath.Join(bin, Binary), nil, bin, filepath.Join(root, "usr/local/nvidia/lib64")},
		{"the host's namespace", filepath.Join(root, fake), StartInNamespace("/proc/self/ns/mnt", root), filepath.Dir(fake), "/usr/local/nvidia/lib64"},
	} {
		d.Path, d.Start = c.path, c.starter
		if _, err := d.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		pid, _ := d.PID()
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, kv := range strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00") {
			k, v, _ := strings.Cut(kv, "=")
			got[k] = v
		}
		want := map[string]string{
			"PATH":                    c.wantPath + ":" + systemPath,
			"LD_LIBRARY_PATH":         c.lib,
			"CUDA_VISIBLE_DEVICES":    "GPU-1",
			"CUDA_MPS_PIPE_DIRECTORY": d.PipeDir(),
			"CUDA_MPS_LOG_DIRECTORY":  d.LogDir(),
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: the daemon's %s = %q, want %q", c.name, k, got[k], v)
			}
		}
		for k := range got {
			// The shell the fake is adds its own (PWD, SHLVL, _);
			// the fake is told where to log in d.Env.
			if _, ok := want[k]; !ok && k != "FAKE_MPS_LOG" && k != "PWD" && k != "SHLVL" && k != "_" && k != "OLDPWD" {
				t.Errorf("%s: the daemon has %s=%q, which it was not given", c.name, k, got[k])
			}
		}
		if err := d.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
