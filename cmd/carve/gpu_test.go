package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/discovery/nvmlinfo/nvmltest"
	"github.com/carve-dra/carve/discovery/sysfstest"
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
	inv := nvmltest.H100Node(1)
	var addrs []string
	for _, b := range nvmltest.H100BusIDs {
		a, _ := nvmlinfo.NormalizeBusID(b)
		addrs = append(addrs, a)
	}
	tree := sysfstest.GPUNode(t.TempDir(), addrs, func(i int) int { return i / 4 })
	replay := writeInventory(t, inv)
	direct, _ := run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", replay, "--node-name", "n1", "-o", "json")
	for _, want := range []string{`"gpu-0000-19-00-0"`, `"mig-0000-3b-00-0-3g-40gb-4"`, `"sharedCounters"`, `"memory-slice-7"`, `"pci0000:19"`, nvmltest.H100UUID(0)} {
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
	out, stderr := run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", writeInventory(t, nvmltest.A100Node()), "-o", "json")
	if !strings.Contains(stderr, "mock table") || !strings.Contains(out, `"mig-0000-07-00-0-7g-40gb-0"`) {
		t.Errorf("stderr %s\nstdout lacks the A100's 7g.40gb", stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"driverVersion": "1", "cudaDriverVersion": 1, "devices": [], "gpus": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Command(bin, "discover", "--root", tree.Root, "--nvml-replay", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(res), `unknown field "gpus"`) {
		t.Errorf("unknown key: err %v, output %s", err, res)
	}
	inv := nvmltest.H100Node()
	inv.Devices = inv.Devices[:1]
	out, stderr = run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", writeInventory(t, inv), "-o", "json")
	if !strings.Contains(out, `"gpu-0000-19-00-0"`) || !strings.Contains(stderr, "not among the PCI functions") {
		t.Errorf("a GPU absent from PCI: stdout has it %t, stderr %s", strings.Contains(out, `"gpu-0000-19-00-0"`), stderr)
	}
}

// enforcement is each published device's memoryEnforcement, and whether it
// may be allocated several times, from discover's JSON List.
func enforcement(t *testing.T, out string) map[string]string {
	t.Helper()
	var list struct {
		Items []struct {
			Spec struct {
				Devices []struct {
					Name                     string
					AllowMultipleAllocations *bool
					Attributes               map[string]struct{ String *string }
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, it := range list.Items {
		for _, d := range it.Spec.Devices {
			if a, ok := d.Attributes["memoryEnforcement"]; ok && a.String != nil {
				got[d.Name] = *a.String
				if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
					got[d.Name] += " shared"
				}
			}
		}
	}
	return got
}

// discover publishes each GPU's memoryEnforcement as the agent chooses it
// (memslice.Tiers): none without nvidia-cuda-mps-control below the driver
// root; mps-policed on driver 580 with it, where the process sees the
// host's PIDs (/proc/1's namespace); dmem on r615 with CUDA 13.4 and the
// GPU's region in dmem.capacity. (A GPU with MIG on publishes its MIG
// placements, never sliced.)
func TestDiscoverMemoryEnforcement(t *testing.T) {
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Skip(err)
	}
	bin := buildCarve(t)
	var addrs []string
	for _, b := range nvmltest.H100BusIDs[:2] {
		a, _ := nvmlinfo.NormalizeBusID(b)
		addrs = append(addrs, a)
	}
	tree := sysfstest.GPUNode(t.TempDir(), addrs, func(int) int { return 0 })
	inv := nvmltest.H100Node(1)
	inv.Devices = inv.Devices[:2]
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nrequestPolicies:\n  gpu:\n    memory: {default: 10Gi, step: 5Gi}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	discover := func(inv *nvmlinfo.Inventory) map[string]string {
		out, _ := run(t, bin, "discover", "--root", tree.Root, "--nvml-replay", writeInventory(t, inv), "--config", cfg, "--node-name", "n1", "-o", "json")
		return enforcement(t, out)
	}
	whole := "gpu-0000-19-00-0"
	if got := discover(inv); got[whole] != "none" || len(got) != 1 {
		t.Errorf("no MPS binary: %v", got)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(tree.Root, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(tree.Root, "usr/bin/nvidia-cuda-mps-control"), []byte("#!/bin/sh\n"), 0o755))
	must(os.MkdirAll(filepath.Join(tree.Root, "proc/1/ns"), 0o755))
	must(os.Symlink(own, filepath.Join(tree.Root, "proc/1/ns/pid")))
	if got := discover(inv); got[whole] != "mps-policed shared" || len(got) != 1 {
		t.Errorf("driver 580 with MPS: %v", got)
	}
	must(os.MkdirAll(filepath.Join(tree.Root, "sys/fs/cgroup"), 0o755))
	must(os.WriteFile(filepath.Join(tree.Root, "sys/fs/cgroup/dmem.capacity"), []byte("nvidia/0000:19:00.0/vidmem 85520809984\n"), 0o644))
	inv.DriverVersion, inv.CUDADriverVersion = "615.10", 13040
	if got := discover(inv); got[whole] != "dmem shared" || len(got) != 1 {
		t.Errorf("r615 with dmem: %v", got)
	}
}
