package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/netdev"
)

// A share an older carve held with a class on an HTB at the parent's root
// stays held when the parent gets its egress shaper: its class is copied
// there, since its frames now go there. Unprepared, its class goes from
// both, and the parent's HTB and the shaper with the last.
func TestOlderCarvesParentClassesAdopted(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	// What an older carve left: its HTB root and an old share's class.
	htb := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
	if err := node.QdiscAdd(htb); err != nil {
		t.Fatal(err)
	}
	const oldMinor = 0x20
	oldClass := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.MakeHandle(1, 0), Handle: netlink.MakeHandle(1, oldMinor)},
		netlink.HtbClassAttrs{Rate: 50e6, Ceil: 50e6, Buffer: 50000, Cbuffer: 50000, Quantum: 62500})
	if err := node.ClassAdd(oldClass); err != nil {
		t.Fatal(err)
	}
	old := b.alloc("old", "50M", "")
	oldUndo, _ := json.Marshal(netdev.ShareRecord{Parent: b.tp.Parent, Link: netdev.LinkName(old.ShareKey()), MAC: netdev.ShareMAC(old.ShareKey()).String(), EgressMinor: oldMinor})

	s := b.add("new", "100M", "", nil)
	shaper, err := node.LinkByName(fmt.Sprintf("cveg%d", parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	rates := map[uint16]uint64{}
	classes, _ := node.ClassList(shaper, netlink.MakeHandle(1, 0))
	for _, c := range classes {
		// Shares' classes, hanging from the shaper's link class, not
		// the link class itself or the new share's flow children.
		_, minor := netlink.MajorMinor(c.Attrs().Handle)
		if _, pminor := netlink.MajorMinor(c.Attrs().Parent); pminor != 1 || minor == 1 {
			continue
		}
		if h, ok := c.(*netlink.HtbClass); ok {
			rates[minor] = h.Rate * 8
		}
	}
	if rates[oldMinor] != 50e6 || len(rates) != 2 {
		t.Fatalf("egress shaper's classes (minor: bit/s) %v, want the old share's 1:%x at 50M beside the new one", rates, oldMinor)
	}

	ctx := context.Background()
	if err := b.p.Unprepare(ctx, old, oldUndo); err != nil {
		t.Fatal(err)
	}
	if err := b.p.Unprepare(ctx, s.alloc, nil); err != nil {
		t.Fatal(err)
	}
	b.checkParentClean(t)
}
