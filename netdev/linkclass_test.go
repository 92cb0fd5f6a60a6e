package netdev_test

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/netdev"
)

// An HTB of carve's with no class at all (an agent stopped between making
// the qdisc and its link class) gets its link class when the device is
// next set up; one whose classes hang from the HTB itself (an older
// carve's) keeps that layout, and no link class appears under it.
func TestLinkClassIsAddedWhereNoneWasMade(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	for _, c := range []struct {
		name      string
		oldClass  bool // a class under the HTB itself, as an older carve made
		wantLink  bool
		wantCount int
	}{
		{"crashed", false, true, 1},
		{"older", true, false, 1},
	} {
		name := "lktest-" + c.name[:3]
		if err := node.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		link, err := node.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = node.LinkDel(link) })
		if err := node.QdiscAdd(netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})); err != nil {
			t.Fatal(err)
		}
		if c.oldClass {
			old := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.MakeHandle(1, 0), Handle: netlink.MakeHandle(1, 0x10)},
				netlink.HtbClassAttrs{Rate: 100e6, Ceil: 100e6, Buffer: 20000, Cbuffer: 20000})
			if err := node.ClassAdd(old); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 { // twice: idempotent
			if err := netdev.EnsureHTB(node, link, 1e9, 0); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		classes, err := node.ClassList(link, netlink.MakeHandle(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		hasLink := false
		for _, cl := range classes {
			hasLink = hasLink || cl.Attrs().Handle == netlink.MakeHandle(1, 1)
		}
		if hasLink != c.wantLink || len(classes) != c.wantCount {
			t.Errorf("%s: %d classes, link class 1:1 %v; want %d, %v", c.name, len(classes), hasLink, c.wantCount, c.wantLink)
		}
	}
}
