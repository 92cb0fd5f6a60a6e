package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
)

// A restarted agent whose checkpoint was lost keeps every share enforced
// (no classifier entry is deleted because the records are empty), and the
// kubelet's unprepare of the claim it no longer knows still removes the
// share's link, classes and entries, found from the attach spec.
func TestLostCheckpointNeitherUnshapesNorLeaks(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	a := b.alloc("lost", "100M", "100M")
	if _, err := b.p.Prepare(ctx, a, b.dev); err != nil {
		t.Fatal(err)
	}
	before, err := b.shaper.Shares()
	if err != nil || len(before) != 2 {
		t.Fatalf("classifier entries after prepare: %v %v", before, err)
	}
	restarted := b.newPreparer("test", b.tp.Subnet, "")
	restarted.Restore(nil, nil) // the checkpoint is empty
	if after, _ := b.shaper.Shares(); len(after) != len(before) {
		t.Fatalf("a restart with an empty checkpoint removed classifier entries: %v, then %v", before, after)
	}
	if err := restarted.UnprepareClaim(ctx, a.ClaimUID); err != nil {
		t.Fatal(err)
	}
	restarted.WaitReaped()
	if left, _ := b.shaper.Shares(); len(left) != 0 {
		t.Errorf("classifier entries left after unpreparing the unknown claim: %v", left)
	}
	node, _ := netlink.NewHandleAt(b.tp.Node)
	defer node.Close()
	if _, err := node.LinkByName(netdev.LinkName(a.ShareKey())); err == nil {
		t.Errorf("the share's link %s is left on the node", netdev.LinkName(a.ShareKey()))
	}
	if specs, _ := filepath.Glob(filepath.Join(b.state, "netdev", "*.json")); len(specs) != 0 {
		t.Errorf("attach specs left: %v", specs)
	}
	b.checkParentClean(t)
	// Another claim's uid finds nothing and is fine.
	if err := restarted.UnprepareClaim(ctx, "no-such-claim"); err != nil {
		t.Error(err)
	}
}

// Attach specs of an earlier boot are removed at start; this boot's stay.
func TestSpecsOfAnEarlierBootAreRemoved(t *testing.T) {
	b := newBench(t)
	dir := filepath.Join(b.state, "netdev")
	old := filepath.Join(dir, "cv0000000000.json")
	if err := os.WriteFile(old, []byte(`{"claimUID":"u-old","hostName":"cv0000000000","parent":"x","bootID":"an-earlier-boot"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(dir, "cv1111111111.json")
	if err := os.WriteFile(current, []byte(`{"claimUID":"u-now","hostName":"cv1111111111","parent":"x","bootID":"boot-now"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := b.newPreparerAt("boot-now")
	p.Restore(nil, nil)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the earlier boot's attach spec is still there (%v)", err)
	}
	if _, err := os.Stat(current); err != nil {
		t.Errorf("this boot's attach spec was removed: %v", err)
	}
}

// Two agents on one node (a rolling update) preparing shares of one parent
// at once never give two shares the same pool address or the same class.
func TestTwoAgentsNeverShareAddressesOrClasses(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	agents := []*netdev.NICPreparer{b.p, b.newPreparer("test", b.tp.Subnet, b.tp.ServerIP)}
	type result struct {
		addrs []string
		err   error
	}
	results := make(chan result, 16)
	for i := 0; i < 16; i++ {
		p := agents[i%2]
		a := b.alloc(fmt.Sprintf("ru%d", i), "10M", "")
		go func() {
			prepared, err := p.Prepare(ctx, a, b.dev)
			if err != nil {
				results <- result{err: err}
				return
			}
			var u struct {
				Addresses   []string `json:"addresses"`
				EgressMinor uint16   `json:"egressMinor"`
			}
			if err := json.Unmarshal(prepared.Undo, &u); err != nil {
				results <- result{err: err}
				return
			}
			results <- result{addrs: append(u.Addresses, fmt.Sprintf("class 1:%x", u.EgressMinor))}
		}()
	}
	seen := map[string]bool{}
	for i := 0; i < 16; i++ {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		for _, a := range r.addrs {
			if seen[a] {
				t.Errorf("%s given to two shares", a)
			}
			seen[a] = true
		}
	}
	if classes, _ := b.shaper.Shares(); len(classes) != 16 {
		t.Errorf("%d classifier entries, want 16", len(classes))
	}
}

// An IFB or egress shaper whose parent is gone (removed before its last
// share was unprepared) is removed when the agent starts, and the
// classifier forgets the shaper; a live parent's stay.
func TestOrphanShapersAreRemovedAtStart(t *testing.T) {
	b := newBench(t)
	b.add("live", "10M", "10M", nil)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "cvifb9999"
	if err := node.LinkAdd(&netlink.Ifb{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	la = netlink.NewLinkAttrs()
	la.Name = "cveg9999"
	if err := node.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "cveg9999r"}); err != nil {
		t.Fatal(err)
	}
	orphan, _ := node.LinkByName("cveg9999")
	back, _ := node.LinkByName("cveg9999r")
	err = nettest.In(b.tp.Node, func() error {
		return b.shaper.AttachEgressShaper(9999, orphan.Attrs().Index, back.Attrs().Index, orphan.Attrs().HardwareAddr)
	})
	if err != nil {
		t.Fatal(err)
	}
	parent, _ := node.LinkByName(b.tp.Parent)
	b.newPreparer("test", b.tp.Subnet, "").Restore(nil, nil)
	for _, name := range []string{"cvifb9999", "cveg9999", "cveg9999r"} {
		if _, err := node.LinkByName(name); err == nil {
			t.Errorf("%s, of a parent that is gone, is still there", name)
		}
	}
	shapers, err := b.shaper.EgressShapers()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := shapers[9999]; ok {
		t.Error("the classifier still sends the frames of a parent that is gone to its shaper")
	}
	if _, ok := shapers[parent.Attrs().Index]; !ok {
		t.Error("the classifier forgot the live parent's shaper")
	}
	for _, name := range []string{fmt.Sprintf("cvifb%d", parent.Attrs().Index), fmt.Sprintf("cveg%d", parent.Attrs().Index)} {
		if _, err := node.LinkByName(name); err != nil {
			t.Errorf("the live parent's %s was removed: %v", name, err)
		}
	}
}
