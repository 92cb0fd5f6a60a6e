package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/prepare"
)

// Unprepare removes the share's interface, classes, classifier entries and
// attach spec, and the parent's HTB and IFB once no share is left.
func TestUnprepareLeavesNothing(t *testing.T) {
	b := newBench(t)
	s := b.add("gone", "100M", "100M", nil)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	shaper, err := node.LinkByName(fmt.Sprintf("cveg%d", parent.Attrs().Index))
	if err != nil {
		t.Fatalf("no egress shaper while a share is prepared: %v", err)
	}
	if q, _ := node.QdiscList(shaper); !hasKind(q, "htb") {
		t.Fatalf("no HTB on the egress shaper while a share is prepared: %v", q)
	}
	// The pod goes first, taking its interface with it, as when the
	// kubelet unprepares after the sandbox is gone; then unprepare twice.
	pod, _ := netlink.NewHandleAt(s.pod)
	if _, err := pod.LinkByName("net1"); err != nil {
		t.Errorf("net1 not in the pod: %v", err)
	}
	pod.Close()
	for i := 0; i < 2; i++ {
		if err := b.p.Unprepare(context.Background(), s.alloc, nil); err != nil {
			t.Fatalf("unprepare %d: %v", i, err)
		}
	}
	shares, _ := b.shaper.Shares()
	if len(shares) != 0 {
		t.Errorf("classifier entries left: %v", shares)
	}
	b.checkParentClean(t)
	if _, err := os.Stat(filepath.Join(b.state, "netdev", s.spec.HostName+".json")); !os.IsNotExist(err) {
		t.Errorf("attach spec left behind")
	}
}

func hasKind(qs []netlink.Qdisc, kind string) bool {
	return slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == kind })
}

// checkParentClean fails t where carve's HTB, egress shaper or IFB is left
// on the parent, as it must be once none of its shares is prepared, or the
// classifier still sends the parent's frames to a shaper.
func (b *bench) checkParentClean(t *testing.T) {
	t.Helper()
	b.p.WaitReaped()
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	if q, _ := node.QdiscList(parent); hasKind(q, "htb") {
		t.Errorf("HTB left on the parent: %v", q)
	}
	for _, name := range []string{fmt.Sprintf("cveg%d", parent.Attrs().Index), fmt.Sprintf("cveg%dr", parent.Attrs().Index)} {
		if l, err := node.LinkByName(name); err == nil {
			qs, _ := node.QdiscList(l)
			t.Errorf("egress shaper %s left behind, with qdiscs %v", name, qs)
		}
	}
	if shapers, _ := b.shaper.EgressShapers(); len(shapers) > 0 {
		t.Errorf("classifier still sends frames to egress shapers: %v", shapers)
	}
	if ifb, err := node.LinkByName("cvifb" + fmt.Sprint(parent.Attrs().Index)); err == nil {
		classes, _ := node.ClassList(ifb, 0)
		t.Errorf("IFB left behind, with classes %v", classes)
	}
}

// Shares of one parent unprepared at the same time (the kubelet does this
// for pods deleted together) still leave the parent clean.
func TestConcurrentUnprepareLeavesParentClean(t *testing.T) {
	b := newBench(t)
	var shares []*share
	var undos []json.RawMessage
	for i := 0; i < 16; i++ {
		a := b.alloc(fmt.Sprintf("c%d", i), "50M", "50M")
		prepared, err := b.p.Prepare(context.Background(), a, b.dev)
		if err != nil {
			t.Fatal(err)
		}
		shares = append(shares, &share{alloc: a})
		undos = append(undos, prepared.Undo)
	}
	done := make(chan error)
	for i, s := range shares {
		go func(s *share, u json.RawMessage) { done <- b.p.Unprepare(context.Background(), s.alloc, u) }(s, undos[i])
	}
	for range shares {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	b.checkParentClean(t)
}

// After an agent restart (a new preparer restored from the records), the
// shares it did not prepare are unprepared in full, the parent's HTB and IFB
// included.
func TestUnprepareAfterRestart(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	var allocs []prepare.Allocation
	var undos []json.RawMessage
	for i, l := range []string{"100M", "300M"} {
		a := b.alloc(fmt.Sprintf("r%d", i), l, l)
		prepared, err := b.p.Prepare(ctx, a, b.dev)
		if err != nil {
			t.Fatal(err)
		}
		allocs, undos = append(allocs, a), append(undos, prepared.Undo)
	}
	restarted := b.newPreparer("test", b.tp.Subnet, "")
	restarted.Restore(allocs, undos)
	for i := range allocs {
		if err := restarted.Unprepare(ctx, allocs[i], undos[i]); err != nil {
			t.Fatal(err)
		}
	}
	restarted.WaitReaped()
	b.checkParentClean(t)
}
