package netdev

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// A subscription that dies is made again, and the watcher signals a change
// for the events it may have missed; link events then flow again.
func TestWatchLinksResubscribes(t *testing.T) {
	var subscriptions atomic.Int32
	feeds := make(chan chan<- netlink.LinkUpdate, 4)
	subscribe := func(ch chan<- netlink.LinkUpdate, _ <-chan struct{}, _ netlink.LinkSubscribeOptions) error {
		subscriptions.Add(1)
		feeds <- ch
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, err := watchLinks(ctx, netns.None(), subscribe, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	first := <-feeds
	first <- linkUpdate("ens1f0v3")
	waitSignal(t, changed.C, "an event on the first subscription")
	if names, all := changed.Take(); all || len(names) != 1 || names[0] != "ens1f0v3" {
		t.Errorf("Take() = %v, %v; want [ens1f0v3], false", names, all)
	}
	close(first) // the socket failed: the subscription is gone
	var second chan<- netlink.LinkUpdate
	select {
	case second = <-feeds:
	case <-time.After(5 * time.Second):
		t.Fatal("the watcher did not subscribe again after its subscription ended")
	}
	waitSignal(t, changed.C, "the resubscription")
	// Events may have been lost meanwhile: every link may have changed.
	if _, all := changed.Take(); !all {
		t.Error("after a resubscription, Take() does not report every link changed")
	}
	second <- linkUpdate("ens1f0v4")
	waitSignal(t, changed.C, "an event on the second subscription")
	if names, all := changed.Take(); all || len(names) != 1 || names[0] != "ens1f0v4" {
		t.Errorf("Take() = %v, %v; want [ens1f0v4], false", names, all)
	}
	if n := subscriptions.Load(); n != 2 {
		t.Errorf("%d subscriptions, want 2", n)
	}
}

func waitSignal(t *testing.T, changed <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatalf("no change signalled after %s", what)
	}
}

// Events of carve's own links (a share's interface, an IFB, a VLAN) do not
// make the agent rediscover; any other link's do.
func TestWatchLinksIgnoresCarveLinks(t *testing.T) {
	feeds := make(chan chan<- netlink.LinkUpdate, 1)
	subscribe := func(ch chan<- netlink.LinkUpdate, _ <-chan struct{}, _ netlink.LinkSubscribeOptions) error {
		feeds <- ch
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, err := watchLinks(ctx, netns.None(), subscribe, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	feed := <-feeds
	for _, name := range []string{LinkName("ns/claim/req/share"), "cvifb7", "cv7.100"} {
		feed <- linkUpdate(name)
	}
	select {
	case <-changed.C:
		t.Fatal("a change was signalled for carve's own links")
	case <-time.After(100 * time.Millisecond):
	}
	feed <- linkUpdate("ens1f0v3")
	feed <- linkUpdate("cvifb7")
	feed <- linkUpdate("ens1f0v5")
	waitSignal(t, changed.C, "an event of a VF")
	// Both VFs' events, coalesced, may take two signals to arrive.
	got := map[string]bool{}
	for deadline := time.Now().Add(5 * time.Second); len(got) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		names, all := changed.Take()
		if all {
			t.Fatal("Take() reports every link changed after named events")
		}
		for _, n := range names {
			got[n] = true
		}
	}
	if len(got) != 2 || !got["ens1f0v3"] || !got["ens1f0v5"] {
		t.Errorf("links taken = %v, want ens1f0v3 and ens1f0v5 only", got)
	}
}

func linkUpdate(name string) netlink.LinkUpdate {
	return netlink.LinkUpdate{Link: &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: name}}}
}

// The kernel tells of a parent each time a child of it is added or removed,
// with nothing discovery reads changed: a share's prepare and unprepare then
// make no rediscovery. A real change of the parent (its MTU, its state) does.
func TestWatchLinksIgnoresAParentsChildrenComingAndGoing(t *testing.T) {
	tp := nettest.New(t)
	h, err := netlink.NewHandleAt(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changed, err := WatchLinks(ctx, tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	parent, _ := h.LinkByName(tp.Parent)
	// The first event of each link is news; make the parent known.
	if err := h.LinkSetMTU(parent, 1400); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, changed.C, "the parent's first event")
	drain := func() int {
		n := 0
		for {
			select {
			case <-changed.C:
				n++
			case <-time.After(300 * time.Millisecond):
				return n
			}
		}
	}
	drain()
	for i := 0; i < 5; i++ {
		la := netlink.NewLinkAttrs()
		la.Name, la.ParentIndex = "cv0123456789", parent.Attrs().Index
		child := &netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_VEPA}
		if err := h.LinkAdd(child); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkDel(child); err != nil {
			t.Fatal(err)
		}
	}
	if n := drain(); n != 0 {
		t.Errorf("%d rediscoveries signalled for a parent whose children came and went", n)
	}
	changed.Take()
	if err := h.LinkSetMTU(parent, 1300); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, changed.C, "the parent's MTU change")
	if names, all := changed.Take(); all || !slices.Contains(names, tp.Parent) {
		t.Errorf("Take() = %v, %v; want %s named", names, all, tp.Parent)
	}
}
