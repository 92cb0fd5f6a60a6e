package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

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
		h, err := b.book.HeldNow(ctx, "test")
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
	held, err := b.book.HeldNow(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	for a, key := range got {
		if held[a] != "bench-node/"+key {
			t.Errorf("%s is recorded as %q's, want bench-node/%s", a, held[a], key)
		}
	}
}

// TestPoolWatchedRecordsLaggingAreListed: with the book's watched view of
// the records, a prepare reads what other nodes hold from it, not from a
// List; where that view still names addresses released since (a watch
// behind the API server) and so leaves the pool no address, the prepare
// lists the records before it gives up, and takes a released one.
func TestPoolWatchedRecordsLaggingAreListed(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	// A pool of six addresses (a /29 less its network and broadcast).
	b.p = b.preparer("small", "10.77.0.248/29", "", "boot-test")
	if _, err := b.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other-node"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := addrbook.New(addrbook.Options{Client: b.kube, Namespace: "carve-system", Node: "other-node"})
	var theirs []netip.Addr
	for a := netip.MustParseAddr("10.77.0.249"); a.Less(netip.MustParseAddr("10.77.0.255")); a = a.Next() {
		if ok, err := other.Hold(ctx, "small", a, addrbook.Holder{Node: "other-node", Share: "cv" + a.String()}); err != nil || !ok {
			t.Fatalf("the other node's hold of %s: %v, %v", a, ok, err)
		}
		theirs = append(theirs, a)
	}
	var lists atomic.Int32
	b.kube.PrependReactor("list", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	// The view, then stopped: it keeps what it saw, as a watch that
	// has not caught up does.
	watchCtx, stopWatch := context.WithCancel(ctx)
	if err := b.book.Watch(watchCtx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the records watched", func() bool {
		_, cached, err := b.book.Held(ctx, "small")
		return err == nil && cached
	})
	stopWatch()
	if held, _, _ := b.book.Held(ctx, "small"); len(held) != len(theirs) {
		t.Fatalf("the view holds %d records, want %d", len(held), len(theirs))
	}
	// Released, behind the view's back.
	freed := theirs[2]
	if err := other.Release(ctx, "small", freed, "cv"+freed.String()); err != nil {
		t.Fatal(err)
	}
	listsBefore := lists.Load()
	s := b.add("lagging", "", "", &v1alpha1.NetworkConfig{Pools: []string{"small"}})
	if s.ip != freed.String() {
		t.Errorf("the share got %q, want %s, the one address released", s.ip, freed)
	}
	if n := lists.Load() - listsBefore; n != 1 {
		t.Errorf("the prepare listed the records %d times, want once: after the view left it no address", n)
	}

	// A view that is current: no List at all.
	if err := b.book.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the records watched again", func() bool {
		held, cached, err := b.book.Held(ctx, "small")
		return err == nil && cached && len(held) == len(theirs)
	})
	if err := other.Release(ctx, "small", theirs[4], "cv"+theirs[4].String()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the release watched", func() bool {
		held, _, _ := b.book.Held(ctx, "small")
		return len(held) == len(theirs)-1
	})
	listsBefore = lists.Load()
	s = b.add("current", "", "", &v1alpha1.NetworkConfig{Pools: []string{"small"}})
	if s.ip != theirs[4].String() {
		t.Errorf("the share got %q, want %s", s.ip, theirs[4])
	}
	if n := lists.Load() - listsBefore; n != 0 {
		t.Errorf("the prepare listed the records %d times with a current view, want none", n)
	}
}

// eventually waits up to 10 s for cond, polling every 10 ms.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not after 10 s", what)
		}
	}
}
