package netdev_test

import (
	"context"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
)

// An operator's root qdisc on the parent is never touched: carve's shaper
// is a device of its own, so a limited share is prepared beside the
// operator's root, whatever its kind, and the root is left as it was.
func TestKeepsOperatorsRootQdisc(t *testing.T) {
	b := newBench(t)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	root := netlink.QdiscAttrs{LinkIndex: parent.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0x77, 0)}
	operators := map[string]netlink.Qdisc{
		"bfifo": &netlink.GenericQdisc{QdiscAttrs: root, QdiscType: "bfifo"},
		"pfifo": &netlink.GenericQdisc{QdiscAttrs: root, QdiscType: "pfifo"},
		"prio":  netlink.NewPrio(root),
		"fq":    &netlink.Fq{QdiscAttrs: root},
		"tbf":   &netlink.Tbf{QdiscAttrs: root, Rate: 1e9, Limit: 1e6, Buffer: 1e5},
	}
	tried := 0
	noTCX := nettest.LacksTCX(t)
	for kind, q := range operators {
		if err := node.QdiscReplace(q); err != nil {
			if !nettest.KernelLacks(err, nettest.Qdisc(kind)) {
				t.Fatalf("operator's %s root: %v", kind, err)
			}
			t.Logf("kernel lacks %s (%v): not tried", kind, err)
			continue
		}
		tried++
		t.Cleanup(func() { _ = node.QdiscDel(q) })
		a := b.alloc("op-"+kind, "100M", "100M")
		prepared, err := b.p.Prepare(context.Background(), a, b.dev)
		if err != nil {
			t.Errorf("with an operator's %s root: %v", kind, err)
			continue
		}
		qs, _ := node.QdiscList(parent)
		if noTCX { // before 6.6 carve's programs hang on a clsact beside the root
			qs = slices.DeleteFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" })
		}
		if len(qs) != 1 || qs[0].Type() != kind || qs[0].Attrs().Handle != root.Handle {
			t.Errorf("operator's %s root changed: %v", kind, qs)
		}
		if err := b.p.Unprepare(context.Background(), a, prepared.Undo); err != nil {
			t.Fatal(err)
		}
		if err := node.QdiscDel(q); err != nil {
			t.Fatal(err)
		}
	}
	if tried == 0 {
		t.Fatal("no operator qdisc could be made")
	}
}
