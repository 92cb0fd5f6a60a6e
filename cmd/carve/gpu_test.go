package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/gpu/gputest"
	"github.com/carve-dra/carve/gpu/nvmlinfo"
)

func writeInventory(t *testing.T, inv *nvmlinfo.Inventory) string {
	t.Helper()
	var buf bytes.Buffer
	if err := nvmlinfo.Encode(&buf, inv); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "nvml.json")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, bin string, args ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("carve %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String(), stderr.String()
}

// discover --nvml-replay publishes the replayed GPUs joined to the tree's
// PCI functions; snapshot captures the node with its NVML inventory, and
// discover --from reproduces it on this machine, which has no GPU.
func TestDiscoverReplayAndSnapshot(t *testing.T) {
	bin := buildCarve(t)
	inv := gputest.H100Node(1)
	var addrs []string
	for _, b := range gputest.H100BusIDs {
		a, _ := nvmlinfo.NormalizeBusID(b)
		addrs = append(addrs, a)
	}
	tree := sysfstest.GPUNode(t.TempDir(), addrs, func(i int) int { return i / 4 })
	replay := writeInventory(t, inv)
	direct, _ := run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", replay, "--node-name", "n1", "-o", "json")
	for _, want := range []string{`"gpu-0000-19-00-0"`, `"mig-0000-3b-00-0-3g-40gb-4"`, `"sharedCounters"`, `"memory-slice-7"`, `"pci0000:19"`, gputest.H100UUID(0)} {
		if !strings.Contains(direct, want) {
			t.Errorf("discover --nvml-replay output lacks %s", want)
		}
	}
	snap := filepath.Join(t.TempDir(), "node.tar.gz")
	run(t, bin, "snapshot", "--root", tree.Root, "--nvml-replay", replay, "-o", snap)
	from, _ := run(t, bin, "discover", "--from", snap, "--node-name", "n1", "-o", "json")
	if from != direct {
		t.Errorf("discover --from differs from the node it captured:\n%s\nwant\n%s", from, direct)
	}
}

// Without migProfiles the mock's table is used, with a warning that says so;
// an unknown key is an error naming it.
func TestDiscoverReplayWarningsAndErrors(t *testing.T) {
	bin := buildCarve(t)
	tree := sysfstest.GPUNode(t.TempDir(), []string{"0000:07:00.0"}, func(int) int { return 0 })
	out, stderr := run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", writeInventory(t, gputest.A100Node()), "-o", "json")
	if !strings.Contains(stderr, "mock table") || !strings.Contains(out, `"mig-0000-07-00-0-7g-40gb-0"`) {
		t.Errorf("stderr %s\nstdout lacks the A100's 7g.40gb", stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"driverVersion": "1", "cudaDriverVersion": 1, "devices": [], "gpus": []}`), 0o644)
	res, err := exec.Command(bin, "discover", "--root", tree.Root, "--nvml-replay", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(res), `unknown field "gpus"`) {
		t.Errorf("unknown key: err %v, output %s", err, res)
	}
	inv := gputest.H100Node()
	inv.Devices = inv.Devices[:1]
	out, stderr = run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", writeInventory(t, inv), "-o", "json")
	if !strings.Contains(out, `"gpu-0000-19-00-0"`) || !strings.Contains(stderr, "not among the PCI functions") {
		t.Errorf("a GPU absent from PCI: stdout has it %t, stderr %s", strings.Contains(out, `"gpu-0000-19-00-0"`), stderr)
	}
}
