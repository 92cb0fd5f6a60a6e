package fpga_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare/fpga"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

type sink map[string]health.Condition

func (s sink) Observe(c health.Condition) { s[c.Device] = c }

func TestFPGAHealth(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: tree.Root})
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(inv, nodeconfig.Default(), "node-a")
	src := &fpga.HealthSource{Root: tree.Root, Devices: func() map[string]slices.Entry { return res.Index }}
	var cards []slices.Entry
	names := map[string]string{}
	for name, e := range res.Index {
		if e.FPGA != nil {
			cards = append(cards, e)
			names[e.FPGA.Address] = name
		}
	}
	if len(cards) < 2 {
		t.Fatalf("%d FPGAs in the fixture, want 2", len(cards))
	}
	s := sink{}
	src.Check(s)
	for _, c := range s {
		if c.Severity != health.Healthy {
			t.Fatalf("fixture FPGA unhealthy: %+v", c)
		}
	}
	if len(s) != len(cards) {
		t.Fatalf("%d conditions for %d FPGAs", len(s), len(cards))
	}
	a, b := cards[0].FPGA, cards[1].FPGA
	if len(a.DevNodes) == 0 {
		t.Fatalf("card %s has no nodes", a.Address)
	}
	if err := os.Remove(filepath.Join(tree.Root, a.DevNodes[0])); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(tree.Root, "sys/bus/pci/devices", b.Functions[0])); err != nil {
		t.Fatal(err)
	}
	s = sink{}
	src.Check(s)
	if c := s[names[a.Address]]; c.Severity != health.Lost || c.Reason != fpga.ReasonDeviceNodeGone {
		t.Errorf("card %s without %s: %+v", a.Address, a.DevNodes[0], c)
	}
	if c := s[names[b.Address]]; c.Severity != health.Lost || c.Reason != fpga.ReasonPCIFunctionGone {
		t.Errorf("card %s without its function: %+v", b.Address, c)
	}
}
