package netdev_test

import (
	"context"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/netdev/netdevtest"
)

// An operator's root qdisc that is not a kernel default is never replaced:
// the share is refused, naming the qdisc, and the root is left as it was.
// mq counts as a default only while its children are defaults too.
func TestRefusesOperatorsRootQdisc(t *testing.T) {
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
	for kind, q := range operators {
		if err := node.QdiscReplace(q); err != nil {
			if !netdevtest.KernelLacks(err, netdevtest.Qdisc(kind)) {
				t.Fatalf("operator's %s root: %v", kind, err)
			}
			t.Logf("kernel lacks %s (%v): not tried", kind, err)
			continue
		}
		tried++
		t.Cleanup(func() { _ = node.QdiscDel(q) })
		a := b.alloc("op-"+kind, "100M", "")
		_, err := b.p.Prepare(context.Background(), a, b.dev)
		if err == nil || !strings.Contains(err.Error(), kind+" root qdisc") {
			t.Errorf("with an operator's %s root: prepare returned %v, want a refusal naming it", kind, err)
		}
		qs, _ := node.QdiscList(parent)
		if !hasKind(qs, kind) || hasKind(qs, "htb") {
			t.Errorf("operator's %s root replaced: %v", kind, qs)
		}
		if l, err := node.LinkByName(netdev.LinkName(a.ShareKey())); err == nil {
			t.Errorf("refused share left its interface %s", l.Attrs().Name)
		}
		if err := node.QdiscDel(q); err != nil {
			t.Fatal(err)
		}
	}
	if tried == 0 {
		t.Fatal("no operator qdisc could be made")
	}
}
