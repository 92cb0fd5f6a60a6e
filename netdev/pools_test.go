package netdev_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// TestPoolAddressesRecorded: a share's address of a cluster-wide pool is
// recorded in the API server as the share's while it is prepared, recorded
// again by a restarted agent where the record is gone (an older carve's
// share, or one swept while the node was down), and freed on unprepare.
func TestPoolAddressesRecorded(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	s := b.add("rec", "", "", &v1alpha1.NetworkConfig{Pools: []string{"test"}})
	addr := netip.MustParseAddr(s.ip)
	held := func() map[netip.Addr]string {
		h, err := b.book.Held(ctx, "test")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	want := "bench-node/" + s.alloc.ShareKey()
	if h := held(); len(h) != 1 || h[addr] != want {
		t.Fatalf("records %v, want %s held by %s", h, addr, want)
	}
	if err := b.kube.CoordinationV1().Leases("carve-system").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	restarted := b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP)
	restarted.Restore([]prepare.Allocation{s.alloc}, []json.RawMessage{s.undo})
	if h := held(); len(h) != 1 || h[addr] != want {
		t.Fatalf("after a restart without the record: records %v, want %s held by %s again", h, addr, want)
	}
	if err := restarted.Unprepare(ctx, s.alloc, s.undo); err != nil {
		t.Fatal(err)
	}
	restarted.WaitReaped()
	if h := held(); len(h) != 0 {
		t.Errorf("after unprepare: records %v, want none", h)
	}
}
