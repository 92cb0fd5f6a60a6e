package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// discover` on the large node to its slices printed and the process exited,
// with the CPU time the process used (cpu-ns/op: user and system, all its
// threads), which other engineers' load on this machine inflates less.
func BenchmarkProcessStartToSlices(b *testing.B) {
	bin := buildCarve(b)
	root := sysfstest.Large(b.TempDir()).Root
	b.ResetTimer()
	var cpu time.Duration
	runs := 0
	for b.Loop() {
		runs++
		cmd := exec.Command(bin, "discover", "--root", root, "--node-name", "bench", "-o", "json")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		if !bytes.Contains(out.Bytes(), []byte("ens15f0v127")) {
			b.Fatal("output lacks the last VF")
		}
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(runs), "cpu-ns/op")
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
