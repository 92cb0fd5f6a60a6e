package discovery_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// The probe answers only for a root whose procfs is the running kernel's
// (same boot id); a fixture or a snapshot is described by its config, as is
// a running kernel whose probe failed.
func TestKernelProbeOnlyForTheRunningKernel(t *testing.T) {
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot id here: %v", err)
	}
	probed := discovery.KernelFeatures{BPF: true, TCX: true, HTB: true, FQ: true}
	calls := 0
	probe := func(context.Context) (discovery.KernelFeatures, error) { calls++; return probed, nil }
	failing := func(context.Context) (discovery.KernelFeatures, error) {
		calls++
		return discovery.KernelFeatures{}, errors.New("no netns")
	}

	other := sysfstest.Typical(t.TempDir())
	other.Write("proc/sys/kernel/random/boot_id", "00000000-0000-0000-0000-000000000000")
	running := sysfstest.Typical(t.TempDir())
	running.Write("proc/sys/kernel/random/boot_id", string(bootID))
	for _, tc := range []struct {
		name     string
		root     string
		probe    func(context.Context) (discovery.KernelFeatures, error)
		calls    int
		source   string
		wantFQ   bool
		canShare bool
	}{
		{"another kernel", other.Root, probe, 0, "config.gz", false, true},
		{"the running kernel", running.Root, probe, 1, discovery.ProbeSource, true, false},
		{"probe failed", running.Root, failing, 1, "config.gz", false, true},
		{"no probe", running.Root, nil, 0, "config.gz", false, true},
	} {
		calls = 0
		inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tc.root, KernelProbe: tc.probe})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		k := inv.Kernel
		if calls != tc.calls || !k.Known || k.FQ != tc.wantFQ || k.CanShareNIC() != tc.canShare || !hasSuffix(k.Source, tc.source) {
			t.Errorf("%s: %d probe calls (want %d), kernel %+v; want source *%s, fq %v, can share %v", tc.name, calls, tc.calls, k, tc.source, tc.wantFQ, tc.canShare)
		}
	}
}

// The configuration is parsed again when its file changes, not on every
// discovery.
func TestKernelConfigReadAgainWhenChanged(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	if inv := discover(t, tree.Root, discovery.NetFilter{}); !inv.Kernel.CanShareNIC() {
		t.Fatalf("kernel %+v cannot share", inv.Kernel)
	}
	tree.SetKernelConfig("BPF_SYSCALL", "NET_XGRESS", "NET_SCH_FQ")
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if inv.Kernel.CanShareNIC() || !inv.Kernel.FQ || inv.Kernel.HTB {
		t.Errorf("after the config changed: %+v", inv.Kernel)
	}
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}
