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

// A NIC's link state and its hardware errors degrade it; its drops never
// do, however fast they grow: a tenant drives them.
func TestNICHealthLinksAndErrors(t *testing.T) {
	root := t.TempDir()
	nics := []string{"a", "b", "c", "d", "e"}
	devices := map[string]slices.Entry{}
	for _, n := range nics {
		devices["nic-"+n] = slices.Entry{Kind: names.KindNIC, NIC: &discovery.NIC{Name: n, Carrier: n != "b", OperState: map[bool]string{true: "up", false: "down"}[n != "b"]}}
		for _, f := range []string{"rx_errors", "tx_errors", "rx_missed_errors", "rx_dropped", "tx_dropped", "rx_nohandler", "rx_crc_errors"} {
			writeCounter(t, root, n, f, 10)
		}
		writeCounter(t, root, n, "rx_packets", 1000)
		writeCounter(t, root, n, "tx_packets", 1000)
	}
	h := &netdev.NICHealth{Root: root, ErrorsPerSecond: 10, ErrorsPerMillion: 10000}
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
	// a: a flood the stack drops (an unknown ethertype, a full queue).
	writeCounter(t, root, "a", "rx_dropped", 10+5_000_000)
	writeCounter(t, root, "a", "tx_dropped", 10+5_000_000)
	writeCounter(t, root, "a", "rx_nohandler", 10+5_000_000)
	writeCounter(t, root, "a", "rx_packets", 1000+5_000_000)
	// b: CRC errors, 5% of what it received.
	writeCounter(t, root, "b", "rx_errors", 10+500)
	writeCounter(t, root, "b", "rx_crc_errors", 10+500)
	writeCounter(t, root, "b", "rx_packets", 1000+10_000)
	// c: frames the NIC had no buffer for, 2% of its packets.
	writeCounter(t, root, "c", "rx_missed_errors", 10+200)
	writeCounter(t, root, "c", "rx_packets", 1000+10_000)
	// d: a few errors, under the floor, though a large part of little.
	writeCounter(t, root, "d", "tx_errors", 10+5)
	writeCounter(t, root, "d", "tx_packets", 1000+5)
	// e: errors over the floor, but a tiny part of a busy NIC's packets.
	writeCounter(t, root, "e", "rx_errors", 10+100)
	writeCounter(t, root, "e", "rx_packets", 1000+10_000_000)
	h.CheckCounters(context.Background(), now.Add(time.Second), got)
	for dev, want := range map[string]health.Severity{"a": health.Healthy, "b": health.Degraded, "c": health.Degraded, "d": health.Healthy, "e": health.Healthy} {
		c := got["nic-"+dev+"/errors"]
		if c.Severity != want || (want == health.Degraded) != (c.Reason == netdev.ReasonErrorRate) {
			t.Errorf("nic-%s: %+v, want %v", dev, c, want)
		}
	}
	if m := got["nic-b/errors"].Message; m != "b: 500 hardware errors in 1 s (500/s, 4.76% of 10000 packets; limits 10/s and 1.00%): rx_errors +500" {
		t.Errorf("nic-b's message: %q", m)
	}
	h.CheckCounters(context.Background(), now.Add(2*time.Second), got)
	if c := got["nic-b/errors"]; c.Severity != health.Healthy {
		t.Errorf("nic-b steady again: %+v", c)
	}
	// A counter the driver reset is no error.
	writeCounter(t, root, "b", "rx_errors", 0)
	writeCounter(t, root, "b", "rx_missed_errors", 10+1000)
	h.CheckCounters(context.Background(), now.Add(3*time.Second), got)
	if c := got["nic-b/errors"]; c.Severity != health.Healthy {
		t.Errorf("nic-b after a reset: %+v", c)
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
