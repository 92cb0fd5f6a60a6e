package netdev_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// A pod with CAP_NET_ADMIN (root in a test namespace), in a class that
// allows it, nests links on its share's interface: the kernel puts each on the share's parent, the node's
// NIC, where a macvlan in source mode would receive frames meant for
// others. The agent's watch removes every such link within a second, made
// before it started or after, and counts it under the share's claim. The
// share's own interface stays, and so does a macvlan the pod nests on a
// link of its own (a veth pair inside the pod), which never touches the
// node's NIC, and a macvlan on another of the node's devices that was
// moved into the pod (another CNI's, say): only links on the lower device
// of the pod's own share are the watch's.
func TestNestedLinksAreRemoved(t *testing.T) {
	b := newBench(t)
	a := b.add("nester", "20M", "20M", &v1alpha1.NetworkConfig{Pools: []string{"test"}, AllowNetAdmin: true})
	// A share of a class that allows no NET_ADMIN is not watched: its
	// containers cannot nest a link (the hook refuses them).
	plain := b.add("plain", "20M", "20M", nil)
	plainPod, err := netlink.NewHandleAt(plain.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer plainPod.Close()
	plainNet1, err := plainPod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	if err := plainPod.LinkAdd(&netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "unwatched", ParentIndex: plainNet1.Attrs().Index}, Mode: netlink.MACVLAN_MODE_VEPA}); err != nil {
		t.Fatal(err)
	}
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	nest := func(name string, mode netlink.MacvlanMode, lower netlink.Link) {
		t.Helper()
		l := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: lower.Attrs().Index}, Mode: mode}
		if err := pod.LinkAdd(l); err != nil {
			t.Fatalf("nest %s on %s: %v", name, lower.Attrs().Name, err)
		}
	}
	// Made before the watch starts: found when it lists the pod's links.
	nest("early", netlink.MACVLAN_MODE_SOURCE, net1)
	if l, err := pod.LinkByName("early"); err != nil || l.Attrs().NetNsID < 0 {
		t.Fatalf("a macvlan nested on the share's interface: %v, %v; want its lower device in another namespace (the node's NIC)", l, err)
	}
	// A link of the pod's own, and a macvlan on it: not the node's.
	own := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "podv0"}, PeerName: "podv1"}
	if err := pod.LinkAdd(own); err != nil {
		t.Fatal(err)
	}
	podv0, _ := pod.LinkByName("podv0")
	nest("inpod", netlink.MACVLAN_MODE_BRIDGE, podv0)
	// Another CNI's macvlan on another device of the node, moved into
	// the pod: its lower device is in the node's namespace too, but not
	// the share's.
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nstother0"}, PeerName: "nstother1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := node.LinkByName("nstother0"); err == nil {
			_ = node.LinkDel(l)
		}
	})
	other, err := node.LinkByName("nstother0")
	if err != nil {
		t.Fatal(err)
	}
	if err := node.LinkAdd(&netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "othercni", ParentIndex: other.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE}); err != nil {
		t.Fatal(err)
	}
	othercni, err := node.LinkByName("othercni")
	if err != nil {
		t.Fatal(err)
	}
	if err := node.LinkSetNsFd(othercni, int(a.pod)); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var removed []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.p.WatchNestedLinks(ctx, netdev.NestedLinkOptions{Root: "/", Interval: 200 * time.Millisecond,
			OnRemoved: func(_ context.Context, claim, link, kind string) {
				mu.Lock()
				removed = append(removed, claim+" "+link+" "+kind)
				mu.Unlock()
			}})
	}()
	defer func() { cancel(); <-done }()

	gone := func(name string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			if _, err := pod.LinkByName(name); err != nil {
				return time.Since(start)
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("%s still in the pod after %v", name, within)
		return within
	}
	t.Logf("a nested macvlan made before the watch: gone after %v", gone("early", 2*time.Second))
	// Made while the pod is watched: each gone within a second.
	for i, mode := range []netlink.MacvlanMode{netlink.MACVLAN_MODE_SOURCE, netlink.MACVLAN_MODE_VEPA, netlink.MACVLAN_MODE_BRIDGE} {
		name := []string{"spy", "vepa1", "br1"}[i]
		nest(name, mode, net1)
		took := gone(name, time.Second)
		t.Logf("a nested macvlan (mode %d) made while watched: gone after %v", mode, took)
	}
	for _, name := range []string{"net1", "podv0", "inpod", "othercni"} {
		if _, err := pod.LinkByName(name); err != nil {
			t.Errorf("%s, not nested on the node's NIC, was removed: %v", name, err)
		}
	}
	if _, err := plainPod.LinkByName("unwatched"); err != nil {
		t.Errorf("a link in the pod of a class without allowNetAdmin was removed: %v", err)
	}
	// A link is counted and reported just after it is gone.
	var got []string
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got = append([]string(nil), removed...)
		mu.Unlock()
		if len(got) >= 4 {
			break
		}
	}
	if len(got) != 4 || got[0] != "default/nester early macvlan" {
		t.Errorf("removals reported: %q, want 4, the first \"default/nester early macvlan\"", got)
	}
	if n := b.p.NestedLinksRemoved()[a.mac]; n != 4 {
		t.Errorf("nested links counted under the share: %d, want 4", n)
	}
}
