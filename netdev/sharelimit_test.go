package netdev_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/slices/names"
)

// nodeState is what a prepare makes on the node, in words: the node's
// interfaces, the classes of every device, the classifier's entries and
// the attach specs.
func (b *bench) nodeState(t *testing.T) []string {
	t.Helper()
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	links, err := node.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, "link "+l.Attrs().Name)
		classes, _ := node.ClassList(l, 0)
		for _, c := range classes {
			out = append(out, fmt.Sprintf("class %s %x", l.Attrs().Name, c.Attrs().Handle))
		}
		qdiscs, _ := node.QdiscList(l)
		for _, q := range qdiscs {
			out = append(out, fmt.Sprintf("qdisc %s %s %x", l.Attrs().Name, q.Type(), q.Attrs().Handle))
		}
	}
	shares, err := b.shaper.Shares()
	if err != nil {
		t.Fatal(err)
	}
	for k := range shares {
		out = append(out, "classifier "+k.MAC+"/"+k.Dir.String())
	}
	specs, _ := filepath.Glob(filepath.Join(b.state, "netdev", "*.json"))
	for _, f := range specs {
		out = append(out, "spec "+filepath.Base(f))
	}
	sort.Strings(out)
	return out
}

// A parent at its limit (netdev.maxSharesPerNIC 2 here) refuses the next
// share before anything of it is made, saying which NIC, its limit and how
// many it holds; it takes a share again once one goes, and an agent that
// restarts counts the shares it takes back from the checkpoint.
func TestShareLimitRefusesPastIt(t *testing.T) {
	b := newBench(t)
	ctx := context.Background()
	b.p = b.newPreparerWith("  maxSharesPerNIC: 2\n")
	var allocs []prepare.Allocation
	var undos []json.RawMessage
	for _, name := range []string{"s1", "s2"} {
		a := b.alloc(name, "10M", "10M")
		prepared, err := b.p.Prepare(ctx, a, b.dev)
		if err != nil {
			t.Fatalf("prepare %s of 2: %v", name, err)
		}
		allocs, undos = append(allocs, a), append(undos, prepared.Undo)
	}
	t.Cleanup(func() {
		for i := range allocs {
			_ = b.p.Unprepare(context.Background(), allocs[i], undos[i])
		}
	})
	if n := netdev.HeldShares(b.p, b.tp.Parent); n != 2 {
		t.Errorf("the preparer counts %d shares on %s, want 2", n, b.tp.Parent)
	}

	before := b.nodeState(t)
	third := b.alloc("s3", "10M", "10M")
	_, err := b.p.Prepare(ctx, third, b.dev)
	want := fmt.Sprintf("NIC %s already holds 2 shares, its limit of 2", b.tp.Parent)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the third share of a parent limited to 2: %v, want %q", err, want)
	}
	t.Logf("refused: %v", err)
	if after := b.nodeState(t); !reflect.DeepEqual(before, after) {
		t.Errorf("the refused share changed the node:\nbefore %q\nafter  %q", before, after)
	}
	if _, err := os.Stat(filepath.Join(b.state, "netdev", netdev.LinkName(third.ShareKey())+".json")); !os.IsNotExist(err) {
		t.Errorf("the refused share has an attach spec (%v)", err)
	}
	if n := netdev.HeldShares(b.p, b.tp.Parent); n != 2 {
		t.Errorf("after the refusal the preparer counts %d shares, want 2", n)
	}

	// A device published with a smaller "shares" capacity is held to it.
	dev := b.dev
	dev.Device = resourceapi.Device{Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		names.CapShares: {Value: resource.MustParse("1")}}}
	if _, err := b.p.Prepare(ctx, third, dev); err == nil || !strings.Contains(err.Error(), "already holds 2 shares, its limit of 1") {
		t.Errorf("past a published capacity of 1: %v", err)
	}

	// One goes: the third fits.
	if err := b.p.Unprepare(ctx, allocs[0], undos[0]); err != nil {
		t.Fatal(err)
	}
	prepared, err := b.p.Prepare(ctx, third, b.dev)
	if err != nil {
		t.Fatalf("prepare once a share went: %v", err)
	}
	allocs[0], undos[0] = third, prepared.Undo

	// A restarted agent counts what the checkpoint holds.
	restarted := b.newPreparerWith("  maxSharesPerNIC: 2\n")
	restarted.Restore(allocs, undos)
	if n := netdev.HeldShares(restarted, b.tp.Parent); n != 2 {
		t.Errorf("the restarted preparer counts %d shares, want 2", n)
	}
	if _, err := restarted.Prepare(ctx, b.alloc("s4", "10M", "10M"), b.dev); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("after a restart, past the limit: %v, want %q", err, want)
	}
}
