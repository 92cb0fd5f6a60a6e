package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/sysfstest"
)

// buildCarve compiles this command once per test binary run.
func buildCarve(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "carve")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestDiscoverCommand(t *testing.T) {
	bin := buildCarve(t)
	tree := sysfstest.Typical(t.TempDir())
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	os.WriteFile(cfg, []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\ndriverName: test.carve.dev\n"), 0o644)

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
		// What cannot be offered is said, on stderr.
		if !strings.Contains(stderr.String(), "ens1f1np1") {
			t.Errorf("stderr does not report the down link ens1f1np1:\n%s", stderr.String())
		}
	}
}

func TestDiscoverCommandErrors(t *testing.T) {
	bin := buildCarve(t)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev: {inclde: [eth0]}\n"), 0o644)
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
// discover` on the large node to its slices printed and the process exited.
func BenchmarkProcessStartToSlices(b *testing.B) {
	bin := buildCarve(b)
	root := sysfstest.Large(b.TempDir()).Root
	b.ResetTimer()
	for b.Loop() {
		cmd := exec.Command(bin, "discover", "--root", root, "--node-name", "bench", "-o", "json")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		if !bytes.Contains(out.Bytes(), []byte("ens15f0v127")) {
			b.Fatal("output lacks the last VF")
		}
	}
}
