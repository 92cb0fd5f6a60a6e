package netdev_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/checkpoint"
)

// reapEntry is the on-disk form of a queued removal (netdev/reaper.go).
type reapEntry struct {
	Key          string `json:"key"`
	Parent       string `json:"parent,omitempty"`
	Link         string `json:"link"`
	EgressMinor  uint16 `json:"egressMinor,omitempty"`
	IngressMinor uint16 `json:"ingressMinor,omitempty"`
}

// An agent that crashed after Unprepare queued a share's removal, and before
// the reaper got to it, removes it at its next start.
func TestQueuedRemovalResumesAfterACrash(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	a := b.alloc("crashed", "100M", "100M")
	prepared, err := b.p.Prepare(ctx, a, b.dev)
	if err != nil {
		t.Fatal(err)
	}
	var u struct {
		Parent       string `json:"parent"`
		Link         string `json:"link"`
		EgressMinor  uint16 `json:"egressMinor"`
		IngressMinor uint16 `json:"ingressMinor"`
	}
	if err := json.Unmarshal(prepared.Undo, &u); err != nil {
		t.Fatal(err)
	}
	// What Unprepare leaves on disk before it returns; the crash comes
	// before the reaper runs.
	q, err := checkpoint.Open[reapEntry](filepath.Join(b.state, "netdev", "reaper"), "boot-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Update(func(m *checkpoint.Records[reapEntry]) error {
		m.Set(types.UID(a.ShareKey()), reapEntry{Key: a.ShareKey(), Parent: u.Parent, Link: u.Link, EgressMinor: u.EgressMinor, IngressMinor: u.IngressMinor})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	restarted := b.newPreparer("test", b.tp.Subnet, "")
	restarted.Restore(nil, nil)
	restarted.WaitReaped()
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	if _, err := node.LinkByName(u.Link); err == nil {
		t.Errorf("the share's interface %s is left on the node", u.Link)
	}
	if _, err := os.Stat(filepath.Join(b.state, "netdev", u.Link+".json")); !os.IsNotExist(err) {
		t.Errorf("attach spec left behind")
	}
	b.checkParentClean(t)
	if left, err := q.Read(); err != nil || len(left) != 0 {
		t.Errorf("reaper queue after the removal: %v %v", left, err)
	}
}

// A share prepared again right after its unprepare (a claim used again on
// the node) keeps what the new prepare made: the queued removal of the old
// one, with the same names, runs first and never after.
func TestPrepareAgainNeverCollidesWithItsRemoval(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	a := b.alloc("again", "100M", "100M")
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	for i := 0; i < 10; i++ {
		prepared, err := b.p.Prepare(ctx, a, b.dev)
		if err != nil {
			t.Fatalf("round %d: prepare: %v", i, err)
		}
		if err := b.p.Unprepare(ctx, a, prepared.Undo); err != nil {
			t.Fatalf("round %d: unprepare: %v", i, err)
		}
		if _, err := b.p.Prepare(ctx, a, b.dev); err != nil {
			t.Fatalf("round %d: prepare again: %v", i, err)
		}
		b.p.WaitReaped()
		// The hook makes the interface in the pod; the attach spec
		// it makes it from is what the old removal would take.
		if _, err := os.Stat(filepath.Join(b.state, "netdev", netdev.LinkName(a.ShareKey())+".json")); err != nil {
			t.Fatalf("round %d: the share's attach spec went with the old removal: %v", i, err)
		}
		if shares, _ := b.shaper.Shares(); len(shares) != 2 {
			t.Fatalf("round %d: classifier entries %v, want egress and ingress", i, shares)
		}
		if err := b.p.Unprepare(ctx, a, nil); err != nil {
			t.Fatalf("round %d: last unprepare: %v", i, err)
		}
	}
	b.checkParentClean(t)
}

// What carve set up on a parent and remembers is looked at again once it
// is gone: a prepare after someone removed the IFB and the egress shaper by
// hand fails at most once, and the next one sets them up again and holds.
func TestSetUpIsLookedAtAgainWhenGone(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	b.add("resident", "100M", "100M", nil)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	ifb, err := node.LinkByName("cvifb" + strconv.Itoa(parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.LinkDel(ifb); err != nil {
		t.Fatal(err)
	}
	shaper, err := node.LinkByName("cveg" + strconv.Itoa(parent.Attrs().Index))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.LinkDel(shaper); err != nil {
		t.Fatal(err)
	}
	a := b.alloc("after", "100M", "100M")
	if _, err := b.p.Prepare(ctx, a, b.dev); err != nil {
		t.Logf("first prepare after the removal: %v", err)
		if _, err := b.p.Prepare(ctx, a, b.dev); err != nil {
			t.Fatalf("second prepare after the removal: %v", err)
		}
	}
	if shaper, err := node.LinkByName("cveg" + strconv.Itoa(parent.Attrs().Index)); err != nil {
		t.Errorf("no egress shaper after prepare: %v", err)
	} else if q, _ := node.QdiscList(shaper); !hasKind(q, "htb") {
		t.Errorf("no HTB on the egress shaper after prepare: %v", q)
	}
	if _, err := node.LinkByName("cvifb" + strconv.Itoa(parent.Attrs().Index)); err != nil {
		t.Errorf("no IFB after prepare: %v", err)
	}
}

// A queue entry that names a link, parent or file carve would not have
// queued (the queue is root's, but a damaged or planted entry must not point
// the reaper elsewhere) removes only what the share's key names: a bystander
// interface on the node and a file outside the state directory stay.
func TestResumedQueueRemovesOnlyWhatTheKeyNames(t *testing.T) {
	b := newBench(t)
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	bystander := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bystander0"}, PeerName: "bystander1"}
	if err := node.LinkAdd(bystander); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside+".json", []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(filepath.Join(b.state, "netdev"), outside)
	if err != nil {
		t.Fatal(err)
	}
	q, err := checkpoint.Open[reapEntry](filepath.Join(b.state, "netdev", "reaper"), "boot-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Update(func(m *checkpoint.Records[reapEntry]) error {
		m.Set("a", reapEntry{Key: "a", Link: "bystander0", Parent: "bystander1", EgressMinor: 1, IngressMinor: 0xffff})
		m.Set("b", reapEntry{Key: "b", Link: rel, Parent: "../../etc"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	restarted := b.newPreparer("test", b.tp.Subnet, "")
	restarted.Restore(nil, nil)
	restarted.WaitReaped()
	for _, name := range []string{"bystander0", "bystander1"} {
		if _, err := node.LinkByName(name); err != nil {
			t.Errorf("the bystander %s was removed by a planted queue entry: %v", name, err)
		}
	}
	if _, err := os.Stat(outside + ".json"); err != nil {
		t.Errorf("a file outside the state directory was removed by a planted queue entry: %v", err)
	}
	if left, err := q.Read(); err != nil || len(left) != 0 {
		t.Errorf("reaper queue after the removal: %v %v", left, err)
	}
}
