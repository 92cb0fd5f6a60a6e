package netdev_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

type conditions map[string]health.Condition

func (c conditions) Observe(x health.Condition) { c[x.Device+"/"+x.Source] = x }

func writeCounter(t *testing.T, root, ifName, name string, v uint64) {
	t.Helper()
	dir := filepath.Join(root, "sys/class/net", ifName, "statistics")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.FormatUint(v, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestNICHealthLinksAndErrors(t *testing.T) {
	root := t.TempDir()
	devices := map[string]slices.Entry{
		"nic-a": {Kind: names.KindNIC, NIC: &discovery.NIC{Name: "a", Carrier: true, OperState: "up"}},
		"nic-b": {Kind: names.KindNIC, NIC: &discovery.NIC{Name: "b", Carrier: false, OperState: "down"}},
	}
	for _, n := range []string{"a", "b"} {
		for _, f := range []string{"rx_errors", "tx_errors", "rx_dropped", "tx_dropped"} {
			writeCounter(t, root, n, f, 10)
		}
	}
	h := &netdev.NICHealth{Root: root, ErrorsPerSecond: 100}
	got := conditions{}
	h.Links(devices, got)
	if c := got["nic-a/link"]; c.Severity != health.Healthy {
		t.Errorf("nic-a link up: %+v", c)
	}
	if c := got["nic-b/link"]; c.Severity != health.Degraded || c.Reason != netdev.ReasonLinkDown {
		t.Errorf("nic-b link down: %+v", c)
	}
	now := time.Now()
	h.CheckCounters(context.Background(), now, got)
	writeCounter(t, root, "a", "rx_dropped", 10+500) // 500/s over 1 s
	writeCounter(t, root, "b", "tx_errors", 10+50)   // 50/s: under the limit
	h.CheckCounters(context.Background(), now.Add(time.Second), got)
	if c := got["nic-a/errors"]; c.Severity != health.Degraded || c.Reason != netdev.ReasonErrorRate {
		t.Errorf("nic-a dropping 500/s: %+v", c)
	}
	if c := got["nic-b/errors"]; c.Severity != health.Healthy {
		t.Errorf("nic-b 50 errors/s: %+v", c)
	}
	h.CheckCounters(context.Background(), now.Add(2*time.Second), got)
	if c := got["nic-a/errors"]; c.Severity != health.Healthy {
		t.Errorf("nic-a steady again: %+v", c)
	}
}

func TestNICGone(t *testing.T) {
	root := t.TempDir()
	bound := filepath.Join(root, "sys/bus/pci/devices/0000:17:00.0")
	unbound := filepath.Join(root, "sys/bus/pci/devices/0000:17:00.1")
	for _, d := range []string{bound, unbound} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../bus/pci/drivers/mlx5_core", filepath.Join(bound, "driver")); err != nil {
		t.Fatal(err)
	}
	h := &netdev.NICHealth{Root: root}
	for _, tc := range []struct {
		nic  discovery.NIC
		want string
	}{
		{discovery.NIC{Name: "veth0", Virtual: true}, netdev.ReasonDeviceGone},
		{discovery.NIC{Name: "ens1", PCI: &discovery.PCIFunction{Address: "0000:17:00.0"}}, netdev.ReasonDeviceGone},
		{discovery.NIC{Name: "ens2", PCI: &discovery.PCIFunction{Address: "0000:17:00.1"}}, netdev.ReasonDriverUnbound},
		{discovery.NIC{Name: "ens3", PCI: &discovery.PCIFunction{Address: "0000:18:00.0"}}, netdev.ReasonPCIFunctionGone},
	} {
		c := h.Gone("nic-"+tc.nic.Name, tc.nic)
		if c.Severity != health.Lost || c.Reason != tc.want {
			t.Errorf("%s gone: %+v, want lost %s", tc.nic.Name, c, tc.want)
		}
	}
}
