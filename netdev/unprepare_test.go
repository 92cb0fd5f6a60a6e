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

	"github.com/carve-dra/carve/netdev"
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

// Shares of one parent prepared and unprepared together, round after round
// (pods started and deleted in bursts), with a resident share keeping the
// devices: only a share's classes are made under the parent's lock, its
// flow children outside it and its unprepare's park without it, so every
// share must still get a block of its own, whole (each child of each
// direction present, under the share's class), and the parent end clean.
func TestBurstsOfSharesGetWholeBlocksOfTheirOwn(t *testing.T) {
	b := newBench(t)
	node, parent := b.nodeParent(t)
	b.add("resident", "10M", "10M", nil)
	const n = 12
	for round := range 3 {
		shares := make([]*share, n)
		undos := make([]json.RawMessage, n)
		errs := make(chan error, n)
		for i := range shares {
			go func() {
				// Two rates, so that parked blocks are taken at the
				// same rates and at others.
				rate := []string{"20M", "30M"}[(i+round)%2]
				a := b.alloc(fmt.Sprintf("burst%d-%d", round, i), rate, rate)
				prepared, err := b.p.Prepare(context.Background(), a, b.dev)
				shares[i], undos[i] = &share{alloc: a}, prepared.Undo
				errs <- err
			}()
		}
		for range shares {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		seen := map[[2]uint16]string{}
		for i, s := range shares {
			rec := record(t, undos[i])
			for d, dev := range []string{netdev.EgressShaperName(parent.Attrs().Index), "cvifb" + fmt.Sprint(parent.Attrs().Index)} {
				minor := []uint16{rec.EgressMinor, rec.IngressMinor}[d]
				if other, taken := seen[[2]uint16{uint16(d), minor}]; taken {
					t.Fatalf("round %d: %s and %s both have class 1:%x of %s", round, other, s.alloc.ShareKey(), minor, dev)
				}
				seen[[2]uint16{uint16(d), minor}] = s.alloc.ShareKey()
				if !rec.FlowClasses {
					continue // fq_codel leaves
				}
				l, err := node.LinkByName(dev)
				if err != nil {
					t.Fatal(err)
				}
				classes, err := node.ClassList(l, netlink.MakeHandle(1, 0))
				if err != nil {
					t.Fatal(err)
				}
				children := 0
				for _, c := range classes {
					if c.Attrs().Parent == netlink.MakeHandle(1, minor) {
						children++
					}
				}
				if children != netdev.FlowChildren {
					t.Errorf("round %d: share %s's class 1:%x on %s has %d children, want %d", round, s.alloc.ShareKey(), minor, dev, children, netdev.FlowChildren)
				}
			}
		}
		for i, s := range shares {
			go func() { errs <- b.p.Unprepare(context.Background(), s.alloc, undos[i]) }()
		}
		for range shares {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}
