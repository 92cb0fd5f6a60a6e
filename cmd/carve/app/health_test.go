package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/health"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

func nicEntry(name string, up bool) slices.Entry {
	oper := "up"
	if !up {
		oper = "lowerlayerdown"
	}
	return slices.Entry{Kind: names.KindNIC, Device: resourceapi.Device{Name: "nic-" + name},
		NIC: &discovery.NIC{Name: name, Virtual: true, Carrier: up, OperState: oper}}
}

func resourcesOf(devs map[string]slices.Entry) resourceslice.DriverResources {
	var ds []resourceapi.Device
	for _, e := range devs {
		ds = append(ds, e.Device)
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node-a": {Slices: []resourceslice.Slice{{Devices: ds}}}}}
}

func taintsOf(res resourceslice.DriverResources) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	for _, s := range res.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			out[d.Name] = d.Taints
		}
	}
	return out
}

func TestDeviceHealthTaintsAndReports(t *testing.T) {
	cfg, err := nodeconfig.Decode([]byte(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
driverName: net.example.com
health: {holdDown: 200ms, reasons: {LinkDown: NoExecute}}
`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := newDeviceHealth(cfg, "node-a", dir, dir, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.tracker.Run(ctx)

	healthy := map[string]slices.Entry{"nic-a": nicEntry("a", true), "nic-b": nicEntry("b", true)}
	h.rescanned(nil, healthy)
	if ts := taintsOf(h.publishable(resourcesOf(healthy))); len(ts["nic-a"])+len(ts["nic-b"]) != 0 {
		t.Fatalf("healthy NICs tainted: %v", ts)
	}
	down := map[string]slices.Entry{"nic-a": nicEntry("a", false), "nic-b": nicEntry("b", true)}
	h.rescanned(healthy, down)
	h.changed(ctx)
	ts := taintsOf(h.publishable(resourcesOf(down)))
	if len(ts["nic-a"]) != 1 || ts["nic-a"][0].Key != "net.example.com/unhealthy" || ts["nic-a"][0].Value != "LinkDown" ||
		ts["nic-a"][0].Effect != resourceapi.DeviceTaintEffectNoExecute || ts["nic-a"][0].TimeAdded == nil {
		t.Fatalf("nic-a taints %+v, want net.example.com/unhealthy=LinkDown:NoExecute", ts["nic-a"])
	}
	if len(ts["nic-b"]) != 0 {
		t.Errorf("nic-b tainted: %+v", ts["nic-b"])
	}
	rep := h.report(down)
	for _, d := range rep.Devices {
		want := kubeletplugin.HealthStatusHealthy
		if d.DeviceName == "nic-a" {
			want = kubeletplugin.HealthStatusUnhealthy
			if !strings.HasPrefix(d.Message, "LinkDown: a: carrier off") {
				t.Errorf("nic-a message %q", d.Message)
			}
		}
		if d.Health != want || d.PoolName != "node-a" {
			t.Errorf("report %+v, want %s", d, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, health.FileName)); err != nil || !strings.Contains(string(b), `"taint":"net.example.com/unhealthy=LinkDown:NoExecute"`) {
		t.Errorf("health file %s (%v)", b, err)
	}

	// nic-b vanishes: it stays published, tainted lost, NoExecute.
	gone := map[string]slices.Entry{"nic-a": nicEntry("a", true)}
	h.rescanned(down, gone)
	ts = taintsOf(h.publishable(resourcesOf(gone)))
	if len(ts["nic-b"]) != 1 || ts["nic-b"][0].Value != "DeviceGone" || ts["nic-b"][0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("vanished nic-b: taints %+v, want DeviceGone:NoExecute on its ghost", ts["nic-b"])
	}
	// nic-a's link is back: still tainted for the hold-down, then not.
	if len(ts["nic-a"]) != 1 {
		t.Fatalf("nic-a's taint cleared before the hold-down: %v", ts["nic-a"])
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(taintsOf(h.publishable(resourcesOf(gone)))["nic-a"]) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("nic-a's taint did not clear after the hold-down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// nic-b comes back: healthy after the hold-down, not a ghost.
	h.rescanned(gone, healthy)
	time.Sleep(300 * time.Millisecond)
	if ts := taintsOf(h.publishable(resourcesOf(healthy))); len(ts["nic-b"]) != 0 {
		t.Errorf("nic-b back, still tainted after the hold-down: %v", ts["nic-b"])
	}
}

// An FPGA's AFU changing under a claim taints it; without a claim it is a
// reconfiguration like any other.
func TestAFUChangedUnderClaim(t *testing.T) {
	cfg := nodeconfig.Default()
	cfg.Health.HoldDown = "1h"
	h := newDeviceHealth(cfg, "node-a", "", t.TempDir(), nil)
	card := func(afu string) map[string]slices.Entry {
		return map[string]slices.Entry{
			"fpga-a": {Kind: names.KindFPGA, Device: resourceapi.Device{Name: "fpga-a"}, FPGA: &discovery.FPGA{PCIFunction: discovery.PCIFunction{Address: "0000:3b:00.0"}, AFUID: afu}},
			"fpga-b": {Kind: names.KindFPGA, Device: resourceapi.Device{Name: "fpga-b"}, FPGA: &discovery.FPGA{PCIFunction: discovery.PCIFunction{Address: "0000:3c:00.0"}, AFUID: afu}},
		}
	}
	h.records = func() (map[types.UID]prepare.ClaimRecord, error) {
		return map[types.UID]prepare.ClaimRecord{"c": {UID: "c", Devices: []prepare.PreparedDevice{{Pool: "node-a", Device: "fpga-a"}}}}, nil
	}
	h.rescanned(nil, card("aaaa"))
	h.rescanned(card("aaaa"), card("bbbb"))
	if s := h.tracker.Status("fpga-a"); !s.Tainted || s.Reason != "AFUChanged" {
		t.Errorf("fpga-a, held, AFU changed: %+v", s)
	}
	if s := h.tracker.Status("fpga-b"); s.Tainted {
		t.Errorf("fpga-b, not held, AFU changed: %+v", s)
	}
}

// The health metrics follow each device's taint: its state with reason and
// effect, and its changes.
func TestDeviceHealthMetrics(t *testing.T) {
	cfg := nodeconfig.Default()
	cfg.Health.HoldDown = "100ms"
	reg := prometheus.NewRegistry()
	h := newDeviceHealth(cfg, "node-a", "", t.TempDir(), health.NewMetrics(reg))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.tracker.Run(ctx)
	up := map[string]slices.Entry{"nic-a": nicEntry("a", true)}
	down := map[string]slices.Entry{"nic-a": nicEntry("a", false)}
	h.rescanned(nil, down)
	h.changed(ctx)
	if got := testutil.ToFloat64(h.metrics.State.WithLabelValues("nic-a", "nic", "LinkDown", "NoSchedule")); got != 1 {
		t.Errorf("state while down = %v, want 1 (degraded)", got)
	}
	h.rescanned(down, up)
	deadline := time.Now().Add(5 * time.Second)
	for h.tracker.Status("nic-a").Tainted && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	h.changed(ctx)
	if got := testutil.ToFloat64(h.metrics.State.WithLabelValues("nic-a", "nic", "", "")); got != 0 {
		t.Errorf("state once cleared = %v, want 0", got)
	}
	if n := testutil.CollectAndCount(h.metrics.State); n != 1 {
		t.Errorf("%d state series, want 1 (the old reason's removed)", n)
	}
	if got := testutil.ToFloat64(h.metrics.Changes.WithLabelValues("nic-a", "nic")); got != 2 {
		t.Errorf("changes = %v, want 2 (made, cleared)", got)
	}
}
