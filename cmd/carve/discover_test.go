package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/discovery/sysfstest"
)

func TestDiscoverCommand(t *testing.T) {
	bin := buildCarve(t)
	tree := sysfstest.Typical(t.TempDir())
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\ndriverName: test.carve.dev\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, format := range []string{"yaml", "json"} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, "discover", "--root", tree.Root, "--node-name", "node-a", "--config", cfg, "-o", format)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("carve discover -o %s: %v\n%s", format, err, stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{"List", "ResourceSlice", "test.carve.dev", "nic-0000-17-00-0", "fpga-0000-3b-00-0", "llc-1", "egressBandwidth"} {
			if !strings.Contains(out, want) {
				t.Errorf("-o %s output lacks %q", format, want)
			}
		}
		// The down link is published tainted, as the agent would.
		if strings.Count(out, "test.carve.dev/unhealthy") != 1 || !strings.Contains(out, "LinkDown") || !strings.Contains(out, "NoSchedule") {
			t.Errorf("-o %s: want one taint test.carve.dev/unhealthy=LinkDown:NoSchedule (ens1f1np1's link is down):\n%s", format, out)
		}
		// What cannot be offered is said, on stderr.
		if !strings.Contains(stderr.String(), "ens1f1np1") {
			t.Errorf("stderr does not report the down link ens1f1np1:\n%s", stderr.String())
		}
	}
}

func TestDiscoverCommandErrors(t *testing.T) {
	bin := buildCarve(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev: {inclde: [eth0]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"discover", "--config", bad}, "netdev.inclde"},
		{[]string{"discover", "-o", "xml"}, "xml"},
		{[]string{"discover", "--config", "/nonexistent.yaml"}, "/nonexistent.yaml"},
		{[]string{"frobnicate"}, "usage"},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("carve %v: err %v, output %q; want failure mentioning %q", tc.args, err, out, tc.want)
		}
	}
}

// BenchmarkProcessStartToSlices is the wall time from exec of `carve
// discover` on the large node to its slices printed and the process exited
// (discover), against the same binary's `carve --help` (help: the process
// start alone, Go's runtime and package initialization, in the same run).
// Each row has the CPU time the process used (cpu-ns/op: user and system,
// all its threads), which other engineers' load on this machine inflates
// less than wall time, and the process's memory high-water mark (hwm-MiB:
// VmHWM, from its rusage). discover also has its wall and CPU time over
// help's (x-help, cpu-x-help), and its resident memory when it writes the
// slices, from /proc/<pid>/status: file-backed (rss-file-MiB, the
// binary's pages, counted as RssShmem where it is on tmpfs) and anonymous
// (rss-anon-MiB, the heap and stacks).
func BenchmarkProcessStartToSlices(b *testing.B) {
	bin := buildCarve(b)
	root := sysfstest.Large(b.TempDir()).Root
	var help procRuns
	b.Run("help", func(b *testing.B) {
		help = procRuns{}
		for b.Loop() {
			cmd := exec.Command(bin, "--help")
			cmd.Stdout = io.Discard
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			help.add(cmd.ProcessState)
		}
		help.report(b)
	})
	b.Run("discover", func(b *testing.B) {
		args := []string{"discover", "--root", root, "--node-name", "bench", "-o", "json"}
		rss, err := residentAtOutput(exec.Command(bin, args...))
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		var runs procRuns
		for b.Loop() {
			cmd := exec.Command(bin, args...)
			var out bytes.Buffer
			cmd.Stdout = &out
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			runs.add(cmd.ProcessState)
			if !bytes.Contains(out.Bytes(), []byte("ens15f0v127")) {
				b.Fatal("output lacks the last VF")
			}
		}
		runs.report(b)
		if help.n > 0 {
			b.ReportMetric(runs.wallPerRun(b)/help.wall, "x-help")
			b.ReportMetric(runs.cpuPerRun()/help.cpuPerRun(), "cpu-x-help")
		}
		b.ReportMetric(float64(rss.anonKiB)/1024, "rss-anon-MiB")
		b.ReportMetric(float64(rss.fileKiB)/1024, "rss-file-MiB")
	})
}

// procRuns adds up what the processes of a benchmark used.
type procRuns struct {
	n      int
	cpu    time.Duration
	maxKiB int64
	// wall is help's wall time per run, kept for discover's ratio.
	wall float64
}

func (p *procRuns) add(st *os.ProcessState) {
	p.n++
	p.cpu += st.UserTime() + st.SystemTime()
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		p.maxKiB = max(p.maxKiB, ru.Maxrss) // KiB on Linux
	}
}

func (p *procRuns) cpuPerRun() float64 { return float64(p.cpu.Nanoseconds()) / float64(p.n) }

func (p *procRuns) wallPerRun(b *testing.B) float64 {
	return float64(b.Elapsed().Nanoseconds()) / float64(p.n)
}

func (p *procRuns) report(b *testing.B) {
	if p.n == 0 {
		return
	}
	p.wall = p.wallPerRun(b)
	b.ReportMetric(p.cpuPerRun(), "cpu-ns/op")
	b.ReportMetric(float64(p.maxKiB)/1024, "hwm-MiB")
}

// resident is a process's resident memory, from /proc/<pid>/status: its
// anonymous pages and those of files it maps, tmpfs files included.
type resident struct{ anonKiB, fileKiB int64 }

// residentAtOutput runs cmd and reads its resident memory once it has
// filled its stdout pipe, where it waits for the reader: a command that
// writes its output at the end (discover) is then at its largest, all its
// work done. The output is drained after and must be more than the pipe
// holds.
func residentAtOutput(cmd *exec.Cmd) (resident, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return resident{}, err
	}
	defer r.Close()
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		return resident{}, err
	}
	defer func() { _ = cmd.Wait() }()
	fd := int(r.Fd())
	capacity, err := unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return resident{}, fmt.Errorf("pipe size: %w", err)
	}
	var rss resident
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return resident{}, fmt.Errorf("%s did not fill its stdout in a minute", cmd)
		}
		if n, err := unix.IoctlGetInt(fd, unix.TIOCINQ); err != nil { // FIONREAD: bytes waiting
			return resident{}, fmt.Errorf("pipe fill: %w", err)
		} else if n < capacity {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			return resident{}, err
		}
		for line := range strings.Lines(string(status)) {
			var kib int64
			if _, err := fmt.Sscanf(line, "RssAnon: %d kB", &kib); err == nil {
				rss.anonKiB = kib
			} else if _, err := fmt.Sscanf(line, "RssFile: %d kB", &kib); err == nil {
				rss.fileKiB += kib
			} else if _, err := fmt.Sscanf(line, "RssShmem: %d kB", &kib); err == nil {
				// A binary on tmpfs ($TMPDIR=/dev/shm, as make
				// bench has it) is mapped as shared memory.
				rss.fileKiB += kib
			}
		}
		break
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return resident{}, err
	}
	if rss.anonKiB == 0 || rss.fileKiB == 0 {
		return resident{}, fmt.Errorf("no RssAnon or RssFile in /proc/%d/status", cmd.Process.Pid)
	}
	return rss, nil
}

// TestDiscoverJSONLogs checks --logging-format and -v: with json, every line
// on stderr is a JSON log entry, including those at V(2); stdout keeps the
// slices alone, under any spelling of -o.
func TestDiscoverJSONLogs(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	for _, output := range []string{"-o", "--o", "--output"} {
		stdout, stderr, code := runCarve(t, "", "discover", "--logging-format=json", "-v=2", "--root", tree.Root, "--node-name", "node-a", output, "json")
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
		var list struct{ Kind string }
		if err := json.Unmarshal([]byte(stdout), &list); err != nil || list.Kind != "List" {
			t.Errorf("%s json: stdout is not a JSON List (%v):\n%s", output, err, stdout)
		}
		var sawV2, sawNotice bool
		for line := range strings.Lines(stderr) {
			var entry struct {
				Msg string `json:"msg"`
				V   *int   `json:"v"`
			}
			if err := json.Unmarshal([]byte(line), &entry); err != nil || entry.Msg == "" {
				t.Errorf("stderr line is not a JSON log entry (%v): %q", err, line)
				continue
			}
			sawV2 = sawV2 || entry.Msg == "Discovered hardware" && entry.V != nil && *entry.V == 2
			sawNotice = sawNotice || strings.Contains(line, "ens1f1np1")
		}
		if !sawV2 || !sawNotice {
			t.Errorf("stderr lacks the V(2) entry (%v) or the notice about ens1f1np1 (%v):\n%s", sawV2, sawNotice, stderr)
		}
	}
}
