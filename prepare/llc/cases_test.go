package llc_test

import (
	"context"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/slices/names"
)

// A share that does not fit is refused saying why, and leaves nothing.
func TestShareThatDoesNotFit(t *testing.T) {
	f, devs := fixture(t)
	p := newPreparer(f)
	ctx := context.Background()
	if _, err := p.Prepare(ctx, share("big", 0, waysQ(10)), devs[0]); err != nil {
		t.Fatal(err)
	}
	before, _ := f.ReadFile("schemata")
	_, err := p.Prepare(ctx, share("too-big", 0, waysQ(6)), devs[0])
	if err == nil || !strings.Contains(err.Error(), "no run of 6 free way(s) in cache domain 0") {
		t.Fatalf("error %v, want the share refused for want of ways", err)
	}
	after, _ := f.ReadFile("schemata")
	if string(before) != string(after) {
		t.Errorf("default group changed by a refused share: %q then %q", before, after)
	}
	if _, err := f.ReadFile(path.Join(llc.GroupName(share("too-big", 0, nil).ShareKey()), "schemata")); !os.IsNotExist(err) {
		t.Errorf("group of the refused share exists: %v", err)
	}
	// The other domain is untouched and has room.
	if _, err := p.Prepare(ctx, share("other", 1, waysQ(6)), devs[1]); err != nil {
		t.Errorf("a share of the other cache: %v", err)
	}
}

// With the CLOSIDs used up the kernel refuses the group: the error says so
// and the share's ways go back.
func TestOutOfCLOSIDs(t *testing.T) {
	tree := sysfstest.New(t.TempDir())
	tree.AddLLC(sysfstest.LLC{ID: 0, CPUs: []int{0}, Size: "16M", Ways: 16})
	tree.AddResctrl("ffff", 1, 2)
	f, devs := tree.ResctrlFS(), entries(t, tree.Root)
	p := newPreparer(f)
	ctx := context.Background()
	if _, err := p.Prepare(ctx, share("one", 0, waysQ(2)), devs[0]); err != nil {
		t.Fatal(err)
	}
	_, err := p.Prepare(ctx, share("two", 0, waysQ(2)), devs[0])
	if err == nil || !strings.Contains(err.Error(), "no CLOSID left") || !strings.Contains(err.Error(), "Out of CLOSIDs") {
		t.Fatalf("error %v, want no CLOSID left with the kernel's status", err)
	}
	if def := mask(t, f, "", 0); def != 0x3fff {
		t.Errorf("default group %x, want all but the first share's ways (3fff)", def)
	}
}

// A share's memory bandwidth cap becomes its MB schema, raised to
// min_bandwidth; its size, where it asks more than its ways, sets the ways.
func TestBandwidthAndSize(t *testing.T) {
	f, devs := fixture(t)
	p := newPreparer(f)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		consumed map[resourceapi.QualifiedName]resource.Quantity
		mb       string
		ways     int
	}{
		{"capped", map[resourceapi.QualifiedName]resource.Quantity{names.CapWays: resource.MustParse("1"), names.CapMemoryBandwidth: resource.MustParse("30")}, "MB:0=30", 1},
		{"below min", map[resourceapi.QualifiedName]resource.Quantity{names.CapWays: resource.MustParse("1"), names.CapMemoryBandwidth: resource.MustParse("5")}, "MB:0=10", 1},
		{"by size", map[resourceapi.QualifiedName]resource.Quantity{names.CapWays: resource.MustParse("1"), names.CapSize: resource.MustParse("5Mi")}, "", 3},
	} {
		a := share(tc.name, 0, tc.consumed)
		got, err := p.Prepare(ctx, a, devs[0])
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Edits.IntelRdt.MemBwSchema != tc.mb {
			t.Errorf("%s: memBwSchema %q, want %q", tc.name, got.Edits.IntelRdt.MemBwSchema, tc.mb)
		}
		sch, _ := f.ReadFile(path.Join(llc.GroupName(a.ShareKey()), "schemata"))
		if want := strings.TrimPrefix(tc.mb, "MB:"); want != "" && !strings.Contains(string(sch), "MB:"+want) {
			t.Errorf("%s: group schemata %q lacks %s", tc.name, sch, tc.mb)
		}
		if n := mask(t, f, llc.GroupName(a.ShareKey()), 0); popcount(n) != tc.ways {
			t.Errorf("%s: %d ways (%x), want %d", tc.name, popcount(n), n, tc.ways)
		}
	}
}

// Shares keep off the shareable bits (which I/O may evict); the default
// group may use them.
func TestSharesAvoidShareableBits(t *testing.T) {
	tree := sysfstest.New(t.TempDir())
	tree.AddLLC(sysfstest.LLC{ID: 0, CPUs: []int{0}, Size: "11M", Ways: 11})
	tree.AddResctrlShareable("7ff", "600", 1, 16)
	f, devs := tree.ResctrlFS(), entries(t, tree.Root)
	p := newPreparer(f)
	a := share("a", 0, waysQ(8))
	if _, err := p.Prepare(context.Background(), a, devs[0]); err != nil {
		t.Fatal(err)
	}
	if m := mask(t, f, llc.GroupName(a.ShareKey()), 0); m&0x600 != 0 {
		t.Errorf("share %x uses the shareable bits 600", m)
	}
	if def := mask(t, f, "", 0); def&0x600 != 0x600 {
		t.Errorf("default group %x, want it on the shareable bits", def)
	}
}

// A crash after the group was made, before the undo record: a restarted
// preparer takes the group's ways back from resctrl, gives them to no one
// else, and removes the group on rollback from the allocation alone.
func TestCrashBeforeRecord(t *testing.T) {
	f, devs := fixture(t)
	ctx := context.Background()
	a := share("crashed", 0, waysQ(4))
	if _, err := newPreparer(f).Prepare(ctx, a, devs[0]); err != nil {
		t.Fatal(err)
	}
	held := mask(t, f, llc.GroupName(a.ShareKey()), 0)
	p := newPreparer(f)
	p.Restore([]prepare.Allocation{a}, []json.RawMessage{nil})
	b := share("next", 0, waysQ(12))
	if _, err := p.Prepare(ctx, b, devs[0]); err == nil {
		t.Errorf("a share of 12 ways placed beside the crashed claim's 4 (%x): its ways were given away", held)
	}
	if err := p.Unprepare(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFile(path.Join(llc.GroupName(a.ShareKey()), "schemata")); !os.IsNotExist(err) {
		t.Errorf("crashed claim's group left after rollback: %v", err)
	}
	if def := mask(t, f, "", 0); def != 0xffff {
		t.Errorf("default group after rollback %x, want ffff", def)
	}
	if _, err := p.Prepare(ctx, b, devs[0]); err != nil {
		t.Errorf("12 ways after rollback: %v", err)
	}
}

// A whole cache needs nothing on the host; a share without resctrl is
// refused.
func TestWholeAndWithoutResctrl(t *testing.T) {
	_, devs := fixture(t)
	whole := share("w", 0, nil)
	whole.ShareID = nil
	got, err := llc.New(llc.Options{}).Prepare(context.Background(), whole, devs[0])
	if err != nil || got.Edits.IntelRdt != nil || len(got.Undo) != 0 {
		t.Errorf("whole cache = %+v, %v; want env only", got, err)
	}
	if _, err := llc.New(llc.Options{}).Prepare(context.Background(), share("s", 0, waysQ(1)), devs[0]); err == nil || !strings.Contains(err.Error(), "resctrl") {
		t.Errorf("share without resctrl: %v", err)
	}
}

func popcount(m uint64) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// The checkpoint is lost while two claims' shares run: a restarted
// preparer takes their ways back from the node's records, so a new share
// gets none of them and their groups keep their masks; the kubelet's
// unprepare of each lost claim (UnprepareClaim) removes that claim's group
// and record alone, and the last gives the default group everything back.
func TestCheckpointLostKeepsShares(t *testing.T) {
	f, devs := fixture(t)
	ctx := context.Background()
	state := t.TempDir()
	opts := llc.Options{FS: f, HookPath: "/var/lib/carve/bin/carve", StateDir: state}
	a, b := share("lost-a", 0, waysQ(4)), share("lost-b", 0, waysQ(4))
	first := llc.New(opts)
	for _, al := range []prepare.Allocation{a, b} {
		if _, err := first.Prepare(ctx, al, devs[0]); err != nil {
			t.Fatal(err)
		}
	}
	ma, mb := mask(t, f, llc.GroupName(a.ShareKey()), 0), mask(t, f, llc.GroupName(b.ShareKey()), 0)

	p := llc.New(opts)
	p.Restore(nil, nil)
	if _, err := p.Prepare(ctx, share("next", 0, waysQ(9)), devs[0]); err == nil {
		t.Error("a share of 9 ways placed beside the lost claims' 8: their ways were given away")
	}
	c := share("next", 0, waysQ(4))
	if _, err := p.Prepare(ctx, c, devs[0]); err != nil {
		t.Fatal(err)
	}
	mc := mask(t, f, llc.GroupName(c.ShareKey()), 0)
	if mc&(ma|mb) != 0 {
		t.Errorf("new share %x overlaps the lost claims' %x, %x", mc, ma, mb)
	}
	if got := mask(t, f, llc.GroupName(a.ShareKey()), 0); got != ma {
		t.Errorf("lost claim a's group %x after restart, want %x", got, ma)
	}
	if def := mask(t, f, "", 0); def&(ma|mb|mc) != 0 {
		t.Errorf("default group %x holds a share's ways", def)
	}

	if err := p.UnprepareClaim(ctx, a.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFile(path.Join(llc.GroupName(a.ShareKey()), "schemata")); !os.IsNotExist(err) {
		t.Errorf("lost claim a's group left: %v", err)
	}
	if got := mask(t, f, llc.GroupName(b.ShareKey()), 0); got != mb {
		t.Errorf("claim b's group %x after a's unprepare, want %x", got, mb)
	}
	if err := p.UnprepareClaim(ctx, b.ClaimUID); err != nil {
		t.Fatal(err)
	}
	if err := p.UnprepareClaim(ctx, b.ClaimUID); err != nil {
		t.Fatalf("again: %v", err)
	}
	if err := p.Unprepare(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	if def := mask(t, f, "", 0); def != 0xffff {
		t.Errorf("default group after the last share %x, want ffff", def)
	}
	if left, _ := filepath.Glob(filepath.Join(state, "llc", "*")); len(left) != 0 {
		t.Errorf("records left: %v", left)
	}
}
