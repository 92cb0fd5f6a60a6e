package app

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

// BenchmarkRescanLarge is the agent's whole rescan after a link event on
// the large node (see discovery.BenchmarkDiscoverLarge): discovery, and the
// slices built again and compared with those published where the inventory
// changed.
//   - nothing-changed: the event's link is as it was.
//   - link-flap: the link went down or came up again (alternately, the
//     change not timed), which changes whether it is offered for sharing.
func BenchmarkRescanLarge(b *testing.B) {
	tree := sysfstest.Large(b.TempDir())
	ctx := context.Background()
	const link = "ens3f0v7"
	newInventory := func(b *testing.B) *inventory {
		inv := &inventory{root: tree.Root, cfg: nodeconfig.Default(), node: "bench", metrics: prepare.NewMetrics(nil)}
		if _, err := inv.rescan(ctx, discovery.AnyChange()); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		return inv
	}
	b.Run("nothing-changed", func(b *testing.B) {
		inv := newInventory(b)
		for b.Loop() {
			if changed, err := inv.rescan(ctx, discovery.LinksChanged(link)); err != nil || changed {
				b.Fatalf("rescan: changed %v, %v", changed, err)
			}
		}
	})
	b.Run("link-flap", func(b *testing.B) {
		inv := newInventory(b)
		dir := tree.NetdevDir(link)
		up := true
		defer func() {
			tree.Write(filepath.Join(dir, "operstate"), "up")
			tree.Write(filepath.Join(dir, "carrier"), "1")
		}()
		for b.Loop() {
			b.StopTimer()
			up = !up
			state, carrier := "down", "0"
			if up {
				state, carrier = "up", "1"
			}
			tree.Write(filepath.Join(dir, "operstate"), state)
			tree.Write(filepath.Join(dir, "carrier"), carrier)
			b.StartTimer()
			if changed, err := inv.rescan(ctx, discovery.LinksChanged(link)); err != nil || !changed {
				b.Fatalf("rescan: changed %v, %v", changed, err)
			}
		}
	})
}
