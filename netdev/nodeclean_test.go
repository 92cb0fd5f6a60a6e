package netdev_test

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

// An uninstall removes carve's links from the node and nothing else: an
// IFB, an egress shaper pair, a share's interface and a parent's VLAN
// interface of carve's go; an operator's links, also one with a name like
// carve's of another kind, stay. A second run finds nothing.
func TestRemoveNodeLinks(t *testing.T) {
	tp := nettest.New(t)
	h, err := netlink.NewHandleAt(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	parent, err := h.LinkByName(tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	add := func(l netlink.Link) {
		t.Helper()
		if err := h.LinkAdd(l); err != nil {
			nettest.SkipIfLacks(t, err, nettest.LinkKind(l.Type()))
			t.Fatalf("add %s (%s): %v", l.Attrs().Name, l.Type(), err)
		}
	}
	attrs := func(name string) netlink.LinkAttrs {
		la := netlink.NewLinkAttrs()
		la.Name = name
		return la
	}
	add(&netlink.Ifb{LinkAttrs: attrs("cvifb7")})
	add(&netlink.Veth{LinkAttrs: attrs("cveg7"), PeerName: "cveg7r"})
	share := attrs("cv0123456789")
	share.ParentIndex = parent.Attrs().Index
	add(&netlink.Macvlan{LinkAttrs: share, Mode: netlink.MACVLAN_MODE_BRIDGE})
	// Not carve's: names of another kind, or not carve's names.
	add(&netlink.Veth{LinkAttrs: attrs("cvifb8"), PeerName: "op-peer"})
	add(&netlink.Ifb{LinkAttrs: attrs("cvegx")})
	add(&netlink.Ifb{LinkAttrs: attrs("ifb-op")})

	removed, err := netdev.RemoveNodeLinks(h)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	// A veth pair goes with whichever end comes first.
	if len(removed) != 3 || removed[0] != "cv0123456789" || !slices.Contains([]string{"cveg7", "cveg7r"}, removed[1]) || removed[2] != "cvifb7" {
		t.Errorf("removed %v, want cv0123456789, one end of cveg7 and cvifb7", removed)
	}
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, l := range links {
		left = append(left, l.Attrs().Name)
	}
	for _, gone := range []string{"cvifb7", "cveg7", "cveg7r", "cv0123456789"} {
		if slices.Contains(left, gone) {
			t.Errorf("%s is still there: %v", gone, left)
		}
	}
	for _, kept := range []string{tp.Parent, "cvifb8", "op-peer", "cvegx", "ifb-op"} {
		if !slices.Contains(left, kept) {
			t.Errorf("%s, not carve's, was removed: %v", kept, left)
		}
	}
	if again, err := netdev.RemoveNodeLinks(h); err != nil || len(again) != 0 {
		t.Errorf("again: %v, %v; want nothing", again, err)
	}
}

// A forced cleanup takes a share's interface from the pod that holds it,
// found by its MAC in whatever namespace a process has, and leaves the
// pod's other interfaces and the node's alone.
func TestRemoveShareLinksInPods(t *testing.T) {
	tp := nettest.New(t)
	pod := tp.NewPod("pod")
	ph, err := netlink.NewHandleAt(pod)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	mac := net.HardwareAddr{0x02, 0xc1, 0xea, 0x4e, 0x00, 0x01}
	la := netlink.NewLinkAttrs()
	la.Name, la.HardwareAddr = "net1", mac
	if err := ph.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	// A process in the pod's namespace, as a pod's containers are.
	sleeper := tp.Exec("pod", "sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	time.Sleep(100 * time.Millisecond)

	removed, err := netdev.RemoveShareLinksInPods("/", tp.Node, []string{"02:C1:EA:4E:00:01", "02:c1:ea:4e:00:99"})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 {
		t.Errorf("removed %v, want the pod's net1 alone", removed)
	}
	if _, err := ph.LinkByName("net1"); err == nil {
		t.Error("net1 is still in the pod")
	}
	if _, err := ph.LinkByName("lo"); err != nil {
		t.Errorf("the pod's lo: %v", err)
	}
}
