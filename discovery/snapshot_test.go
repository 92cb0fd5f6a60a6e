package discovery_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jaypipes/ghw/pkg/snapshot"

	"github.com/carve-dra/carve/discovery"
)

// ghwSnapshots returns the real machine snapshots that ship in ghw's module.
func ghwSnapshots(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/jaypipes/ghw").Output()
	if err != nil {
		t.Fatalf("locate ghw module: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "testdata/snapshots/linux-amd64*.tar.gz"))
	if len(files) == 0 {
		t.Fatalf("no snapshots in ghw's module")
	}
	return files
}

// Every real machine snapshot is discovered without error, and what each
// is known to hold is found.
func TestGHWSnapshots(t *testing.T) {
	for _, file := range ghwSnapshots(t) {
		name := strings.TrimSuffix(filepath.Base(file), ".tar.gz")
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := snapshot.UnpackInto(file, root); err != nil {
				t.Fatalf("unpack: %v", err)
			}
			inv := discover(t, root, discovery.NetFilter{})
			l3, _ := filepath.Glob(filepath.Join(root, "sys/devices/system/cpu/cpu*/cache/index3"))
			if len(l3) > 0 && len(inv.LLCs) == 0 {
				t.Errorf("snapshot has %d index3 entries but no LLC found", len(l3))
			}
			for _, l := range inv.LLCs {
				if l.SizeBytes <= 0 || l.CPUs == "" {
					t.Errorf("LLC %+v lacks size or CPUs", l)
				}
			}
			switch name {
			case "linux-amd64-accel-nvidia":
				if len(inv.GPUs) == 0 {
					t.Errorf("no NVIDIA GPU in the NVIDIA snapshot")
				}
			case "linux-amd64-61797caf7c0b6bca1725ad7975ed4773":
				if len(inv.NICs) != 4 {
					t.Errorf("NICs = %d, want the snapshot's 4 PCI netdevs", len(inv.NICs))
				}
				for _, n := range inv.NICs {
					if n.PCI == nil {
						t.Errorf("NIC %s has no PCI address", n.Name)
					}
				}
			}
			t.Logf("%d NICs, %d LLCs, %d FPGAs, %d GPUs", len(inv.NICs), len(inv.LLCs), len(inv.FPGAs), len(inv.GPUs))
		})
	}
}
