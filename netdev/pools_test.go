package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/carve-dra/carve/netdev/addrbook"

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

// Shares prepared at once, whose list of what other nodes hold is stale:
// the first free addresses here are another node's (it recorded them after
// the list), so each share's first candidates are refused by the API
// server's records and the next ones tried, outside the pools' lock. No
// share gets another node's address or one another share got, and each
// address is recorded as its share's.
func TestPoolCandidatesRecordedElsewhereAreSkipped(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	if _, err := b.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other-node"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := addrbook.New(addrbook.Options{Client: b.kube, Namespace: "carve-system", Node: "other-node"})
	theirs := map[netip.Addr]bool{}
	for a := netip.MustParseAddr("10.77.0.2"); len(theirs) < 6; a = a.Next() {
		if ok, err := other.Hold(ctx, "test", a, addrbook.Holder{Node: "other-node", Share: "cv" + a.String()}); err != nil || !ok {
			t.Fatalf("the other node's hold of %s: %v, %v", a, ok, err)
		}
		theirs[a] = true
	}
	var stale atomic.Bool
	stale.Store(true)
	b.kube.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return stale.Load(), &coordv1.LeaseList{}, nil
	})
	const shares = 8
	type result struct {
		key   string
		addrs []string
		err   error
	}
	results := make(chan result, shares)
	for i := range shares {
		a := b.alloc(fmt.Sprintf("stale%d", i), "", "")
		go func() {
			prepared, err := b.p.Prepare(ctx, a, b.dev)
			if err != nil {
				results <- result{err: err}
				return
			}
			var u struct {
				PoolAddrs []string `json:"poolAddresses"`
			}
			err = json.Unmarshal(prepared.Undo, &u)
			results <- result{key: a.ShareKey(), addrs: u.PoolAddrs, err: err}
		}()
	}
	got := map[netip.Addr]string{}
	for range shares {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if len(r.addrs) != 1 {
			t.Fatalf("share %s: pool addresses %v, want one", r.key, r.addrs)
		}
		a := netip.MustParsePrefix(r.addrs[0]).Addr()
		if theirs[a] {
			t.Errorf("share %s got %s, the other node's", r.key, a)
		}
		if k, dup := got[a]; dup {
			t.Errorf("%s given to shares %s and %s", a, k, r.key)
		}
		got[a] = r.key
	}
	stale.Store(false)
	held, err := b.book.Held(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	for a, key := range got {
		if held[a] != "bench-node/"+key {
			t.Errorf("%s is recorded as %q's, want bench-node/%s", a, held[a], key)
		}
	}
}
