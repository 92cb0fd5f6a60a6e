package addrbook_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-dra/carve/netdev/addrbook"
)

func book(c kubernetes.Interface, node string, now func() time.Time) *addrbook.Book {
	return addrbook.New(addrbook.Options{Client: c, Namespace: "carve-system", Node: node, Now: now})
}

func holder(node, claim string) addrbook.Holder {
	return addrbook.Holder{Node: node, Share: claim + "-uid/net/s", ClaimNamespace: "default", ClaimName: claim, ClaimUID: types.UID(claim + "-uid")}
}

func addClaim(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	_, err := c.ResourceV1().ResourceClaims("default").Create(context.Background(),
		&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func addNode(t *testing.T, c kubernetes.Interface, name string, ready corev1.ConditionStatus, since time.Time) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: ready, LastTransitionTime: metav1.NewTime(since)}}}}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEachAddressOnce: the shares of three nodes, 30 a node, all taking
// addresses of one pool at once, each walking from the pool's start as the
// allocator does: every share gets an address, and no two the same.
func TestEachAddressOnce(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	var mu sync.Mutex
	got := map[netip.Addr]string{}
	for n := 1; n <= 3; n++ {
		addNode(t, c, fmt.Sprintf("node-%d", n), corev1.ConditionTrue, time.Now())
		for s := 0; s < 30; s++ {
			addClaim(t, c, fmt.Sprintf("c%d-%d", n, s))
		}
	}
	var wg sync.WaitGroup
	for n := 1; n <= 3; n++ {
		node := fmt.Sprintf("node-%d", n)
		b := book(c, node, nil)
		for s := 0; s < 30; s++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := holder(node, fmt.Sprintf("c%d-%d", n, s))
				for a := netip.MustParseAddr("10.80.0.2"); a.Less(netip.MustParseAddr("10.80.1.0")); a = a.Next() {
					ok, err := b.Hold(ctx, "seg", a, h)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						mu.Lock()
						if other, dup := got[a]; dup {
							t.Errorf("%s given to %s and %s", a, other, h.ClaimName)
						}
						got[a] = h.ClaimName
						mu.Unlock()
						return
					}
				}
				t.Errorf("%s got no address", h.ClaimName)
			}()
		}
	}
	wg.Wait()
	if len(got) != 90 {
		t.Errorf("%d distinct addresses, want 90", len(got))
	}
	held, err := book(c, "node-1", nil).HeldNow(ctx, "seg")
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 90 {
		t.Errorf("Held lists %d addresses, want 90", len(held))
	}
}

// TestHoldIsIdempotentAndReleaseIsTheHolders: the same share holds its
// address again (a prepare retried); another share cannot; only the holder's
// release frees it.
func TestHoldIsIdempotentAndReleaseIsTheHolders(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	addNode(t, c, "node-1", corev1.ConditionTrue, time.Now())
	addClaim(t, c, "a")
	b1, b2 := book(c, "node-1", nil), book(c, "node-2", nil)
	a := netip.MustParseAddr("10.80.0.2")
	for i := 0; i < 2; i++ {
		if ok, err := b1.Hold(ctx, "seg", a, holder("node-1", "a")); err != nil || !ok {
			t.Fatalf("hold %d: %v %v", i, ok, err)
		}
	}
	if ok, err := b2.Hold(ctx, "seg", a, holder("node-2", "b")); err != nil || ok {
		t.Fatalf("another share held a live share's address: %v %v", ok, err)
	}
	// Another node's agent, or another share, releasing it: no effect.
	if err := b2.Release(ctx, "seg", a, holder("node-2", "b").Share); err != nil {
		t.Fatal(err)
	}
	if err := b1.Release(ctx, "seg", a, "other-share"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b2.Hold(ctx, "seg", a, holder("node-2", "b")); ok {
		t.Fatal("released by a share that does not hold it")
	}
	if err := b1.Release(ctx, "seg", a, holder("node-1", "a").Share); err != nil {
		t.Fatal(err)
	}
	if ok, err := b2.Hold(ctx, "seg", a, holder("node-2", "b")); err != nil || !ok {
		t.Fatalf("not free after its holder released it: %v %v", ok, err)
	}
	// Another pool's record of the same address is its own.
	if ok, err := b1.Hold(ctx, "other-seg", a, holder("node-1", "a")); err != nil || !ok {
		t.Fatalf("the same address in another pool: %v %v", ok, err)
	}
}

// TestGoneHoldersAreFreed: a record whose claim is deleted, or whose node
// has not reported for ReclaimAfter, is swept (and may be taken over);
// one of a live claim on a Ready node, or on a node that stopped
// reporting only just now, stays.
func TestGoneHoldersAreFreed(t *testing.T) {
	c := fake.NewClientset()
	ctx := context.Background()
	now := time.Now()
	addNode(t, c, "live", corev1.ConditionTrue, now.Add(-time.Hour))
	addNode(t, c, "dead", corev1.ConditionUnknown, now.Add(-time.Minute))
	addNode(t, c, "dying", corev1.ConditionUnknown, now.Add(-5*time.Second))
	for _, cl := range []string{"live", "on-dead", "on-dying", "deleted"} {
		addClaim(t, c, cl)
	}
	clock := func() time.Time { return now }
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 80, 0, byte(i)}) }
	must := func(ok bool, err error) {
		t.Helper()
		if err != nil || !ok {
			t.Fatalf("hold: %v %v", ok, err)
		}
	}
	must(book(c, "live", clock).Hold(ctx, "seg", ip(2), holder("live", "live")))
	must(book(c, "dead", clock).Hold(ctx, "seg", ip(3), holder("dead", "on-dead")))
	must(book(c, "dying", clock).Hold(ctx, "seg", ip(4), holder("dying", "on-dying")))
	must(book(c, "live", clock).Hold(ctx, "seg", ip(5), holder("live", "deleted")))
	if err := c.ResourceV1().ResourceClaims("default").Delete(ctx, "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A live agent takes over the dead node's address at once.
	addClaim(t, c, "new")
	must(book(c, "live", clock).Hold(ctx, "seg", ip(3), holder("live", "new")))

	n, err := book(c, "live", clock).Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := book(c, "live", clock).HeldNow(ctx, "seg")
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{ip(2): "live/live-uid/net/s", ip(3): "live/new-uid/net/s", ip(4): "dying/on-dying-uid/net/s"}
	if n != 1 || len(held) != len(want) {
		t.Fatalf("swept %d, held %v; want 1 swept (the deleted claim's) and %v", n, held, want)
	}
	for a, h := range want {
		if held[a] != h {
			t.Errorf("%s held by %q, want %q", a, held[a], h)
		}
	}
	// Once the dying node has not reported for ReclaimAfter, its
	// address goes too.
	later := func() time.Time { return now.Add(addrbook.DefaultReclaimAfter) }
	if n, err := book(c, "live", later).Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep after ReclaimAfter: %d %v, want the dying node's 1", n, err)
	}
}
