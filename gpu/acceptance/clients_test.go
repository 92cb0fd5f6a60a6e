//go:build acceptance

package acceptance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
)

// proc is one client process in a pod's cgroup.
type proc struct {
	cmd  *exec.Cmd
	file string
	done chan error
}

// run starts the client in the pod's cgroup with the share's environment
// and, as its container would have, the share's /dev/shm and its claim's
// pipe directory read-only; as uid where not 0 (another tenant), which
// needs cgroup v2 (the process is cloned into the pod's cgroup).
func run(t *testing.T, s *gpu.Session, uuid string, pd *pod, extra []string, gib, hold float64, compute bool) *proc {
	t.Helper()
	// A tenant's client writes its report there and reads its script
	// from there: t.TempDir's parents are 0700, and the script's own
	// directory (the pack's, below root's home on a lent machine) may be
	// too; another uid passes neither.
	dir := openTempDir(t, "cvp-", 0o777)
	file := filepath.Join(dir, "report.json")
	script := *client
	if pd.uid != 0 {
		script = readableCopy(t, *client)
	}
	args := []string{script, "--report", file, "--alloc-gib", fmt.Sprint(gib), "--hold", fmt.Sprint(hold)}
	if compute {
		args = append(args, "--compute")
	}
	var c *exec.Cmd
	if pd.v2 {
		cg, err := os.Open(pd.dir)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		c = exec.Command(*python, args...)
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		if pd.uid != 0 {
			c.SysProcAttr.Credential = &syscall.Credential{Uid: pd.uid, Gid: pd.uid}
		}
	} else {
		c = exec.Command("sh", append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, pd.dir, *python}, args...)...)
	}
	c.Env = append(append(os.Environ(), pd.env...), extra...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := mps.StartClient(c, pd.shm, pd.pipe); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: c, file: file, done: make(chan error, 1)}
	go func() { p.done <- c.Wait() }()
	return p
}

// shmRow checks that a file one claim's process makes in its /dev/shm is
// not in another claim's: each claim's tmpfs is its own.
func shmRow(a, b *pod) Row {
	r := Row{Attack: "no /dev/shm across claims: a file the 10 GiB share's process makes, seen from the 20 GiB share's"}
	sh := func(pd *pod, script string) error {
		c := exec.Command("sh", "-c", script)
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := mps.StartClient(c, pd.shm, pd.pipe); err != nil {
			return err
		}
		return c.Wait()
	}
	const f = "/dev/shm/carve-acceptance-tenant-file"
	switch {
	case sh(a, "echo secret > "+f) != nil:
		r.Outcome = "FAILED: the first claim's process could not write its /dev/shm"
	case sh(a, "test -e "+f) != nil:
		r.Outcome = "FAILED: the first claim's file is not in its own /dev/shm"
	case sh(b, "test ! -e "+f) != nil:
		r.Outcome = "NOT HELD: the other claim's process sees the file"
	default:
		r.Outcome, r.Passed = "held: not there", true
	}
	return r
}

func (p *proc) report(t *testing.T) map[string]any {
	b, err := os.ReadFile(p.file)
	if err != nil {
		return map[string]any{"state": "none"}
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func (p *proc) waitState(t *testing.T, state string, within time.Duration) {
	deadline := time.Now().Add(within)
	for p.report(t)["state"] != state {
		if time.Now().After(deadline) {
			t.Fatalf("client never reached %q: %v", state, p.report(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

// attack runs n clients of a pod, one after another once each allocated
// or failed, sampling what the pod holds on the GPU every 10 ms, and
// judges the outcome.
func attack(t *testing.T, s *gpu.Session, uuid string, pd *pod, name string, n int, gib float64, extra []string, allowed bool) Row {
	ctx, cancel := context.WithCancel(context.Background())
	var samples []Sample
	var mu sync.Mutex
	start := time.Now()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			held := podHeld(ctx, s, uuid, pd)
			mu.Lock()
			samples = append(samples, Sample{At: time.Since(start), Held: held})
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	// Several processes must hold their memory at once: each holds until
	// the last has allocated (or failed), then all are stopped. PyTorch's
	// import alone takes seconds, longer than a fixed hold.
	hold := 4.0
	if n > 1 {
		hold = 120
	}
	var procs []*proc
	for i := 0; i < n; i++ {
		p := run(t, s, uuid, pd, extra, gib, hold, false)
		procs = append(procs, p)
		deadline := time.Now().Add(60 * time.Second)
		for st := p.report(t)["state"]; st == "none" && time.Now().Before(deadline); st = p.report(t)["state"] {
			select {
			case err := <-p.done:
				p.done <- err
				deadline = time.Now()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if n > 1 {
		time.Sleep(time.Second) // a second for policing to see them together
		for _, p := range procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	refused, killed, allocated := false, false, true
	for _, p := range procs {
		err := <-p.done
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				killed = true
			}
		}
		if p.report(t)["state"] == "refused" {
			refused, allocated = true, false
		}
		if st := p.report(t)["state"]; st != "done" && st != "allocated" {
			allocated = false
		}
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-sampled
	if allowed {
		return Allowed(name, pd.slice, samples, allocated)
	}
	return Held(name, pd.slice, samples, refused, killed)
}

// podHeld is what the pod's processes hold on the GPU, as NVML reports.
func podHeld(ctx context.Context, s *gpu.Session, uuid string, pd *pod) uint64 {
	procs, err := s.Processes(ctx, uuid)
	if err != nil {
		return 0
	}
	var held uint64
	for _, p := range procs {
		if uid, err := police.PodOf("/proc", int(p.PID)); err == nil && uid == pd.pod {
			held += p.UsedBytes
		}
	}
	return held
}

// openTempDir is a directory under /tmp (1777) of the given mode, removed
// after the test: another uid reaches it, as it does not t.TempDir's.
func openTempDir(t *testing.T, prefix string, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readableCopy is a copy of the file that any uid may read.
func readableCopy(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(openTempDir(t, "cvs-", 0o755), filepath.Base(path))
	if err := os.WriteFile(out, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
