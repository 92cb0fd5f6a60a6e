package agent

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/nodeconfig"
)

// A rescan reports a change exactly where the published slices changed,
// and its device index follows what discovery found, also where the slices
// do not carry it.
func TestRescanReportsChanges(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	inv := &inventory{root: tree.Root, cfg: nodeconfig.Default(), node: "node-a", metrics: prepare.NewMetrics(nil)}
	ctx := context.Background()
	rescan := func(c discovery.Changes) bool {
		t.Helper()
		changed, err := inv.rescan(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	nic := func() *slices.Entry {
		t.Helper()
		for _, e := range inv.devices() {
			if e.NIC != nil && e.NIC.Name == "ens1f0np0" {
				return &e
			}
		}
		t.Fatal("ens1f0np0 is not published")
		return nil
	}
	if !rescan(discovery.AnyChange()) {
		t.Error("the first rescan reports no change")
	}
	if rescan(discovery.AnyChange()) || rescan(discovery.LinksChanged("ens1f0np0")) {
		t.Error("a rescan that found nothing new reports a change")
	}
	dir := tree.NetdevDir("ens1f0np0")
	// Found anew but not published: the slices stay as they are.
	tree.Write(filepath.Join(dir, "operstate"), "unknown")
	if rescan(discovery.LinksChanged("ens1f0np0")) {
		t.Error("operstate unknown (the link still usable) changed the slices")
	}
	if got := nic().NIC.OperState; got != "unknown" {
		t.Errorf("operstate in the device index = %q, want unknown", got)
	}
	// A link that goes down is no longer offered for sharing.
	tree.Write(filepath.Join(dir, "operstate"), "down")
	tree.Write(filepath.Join(dir, "carrier"), "0")
	if !rescan(discovery.LinksChanged("ens1f0np0")) {
		t.Error("a link going down is not reported as a change")
	}
	if nic().NIC.LinkUsable() {
		t.Error("the device index still has ens1f0np0 up")
	}
}
