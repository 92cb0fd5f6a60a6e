package llc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/cbm"
	"github.com/carve-dra/carve/discovery/sysfstest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/llc"
	"github.com/carve-dra/carve/prepare/llc/resctrl"
	"github.com/carve-dra/carve/slices"
	"github.com/carve-dra/carve/slices/names"
)

// fixture is a node with two 16-way caches and resctrl (min_cbm_bits 1,
// 16 CLOSIDs, MBA), through the fake filesystem that validates writes.
func fixture(t *testing.T) (*sysfstest.ResctrlFS, map[int]slices.Entry) {
	t.Helper()
	tree := sysfstest.New(t.TempDir())
	tree.AddLLC(sysfstest.LLC{ID: 0, CPUs: []int{0, 1}, Size: "32768K", Ways: 16})
	tree.AddLLC(sysfstest.LLC{ID: 1, CPUs: []int{2, 3}, Size: "32768K", Ways: 16})
	tree.AddResctrl("ffff", 1, 16)
	tree.AddMBA(10, 10)
	return tree.ResctrlFS(), entries(t, tree.Root)
}

func entries(t *testing.T, root string) map[int]slices.Entry {
	t.Helper()
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]slices.Entry{}
	for i := range inv.LLCs {
		l := &inv.LLCs[i]
		out[l.ID] = slices.Entry{Kind: names.KindLLC, LLC: l}
	}
	return out
}

func share(claim string, domain int, consumed map[resourceapi.QualifiedName]resource.Quantity) prepare.Allocation {
	return prepare.Allocation{ClaimUID: types.UID(claim), Request: "cache", Device: fmt.Sprintf("llc-%d", domain), Kind: names.KindLLC,
		ShareID: ptr.To(types.UID("share-" + claim)), Consumed: consumed}
}

func waysQ(n int) map[resourceapi.QualifiedName]resource.Quantity {
	return map[resourceapi.QualifiedName]resource.Quantity{names.CapWays: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}

func mask(t *testing.T, f resctrl.FS, group string, domain int) uint64 {
	t.Helper()
	b, err := f.ReadFile(path.Join(group, "schemata"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := resctrl.ParseSchemata(string(b))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.Mask(domain)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newPreparer(f resctrl.FS) *llc.Preparer {
	return llc.New(llc.Options{FS: f, HookPath: "/var/lib/carve/bin/carve"})
}

// Two shares of one cache get disjoint contiguous masks; the default group
// keeps the rest, in that domain only; the CDI edits carry intelRdt and the
// hook; a restarted preparer, restored from the undo records, places a
// third share beside them; unprepare gives everything back.
func TestSharesAreDisjointAndSurviveRestart(t *testing.T) {
	f, devs := fixture(t)
	runShares(t, f, devs, 0)
}

// The same against the kernel's resctrl, where this machine has it.
func TestSharesOnRealResctrl(t *testing.T) {
	f := realResctrl(t)
	devs := entries(t, "/")
	for id, d := range devs {
		if d.LLC.Resctrl == nil {
			t.Fatalf("resctrl has L3 allocation, but discovery found none for cache %d", id)
		}
		runShares(t, f, devs, id)
		return
	}
	t.Fatal("resctrl has L3 allocation, but discovery found no L3")
}

func runShares(t *testing.T, f resctrl.FS, devs map[int]slices.Entry, domain int) {
	ctx := context.Background()
	in, err := resctrl.ReadL3Info(f)
	if err != nil {
		t.Fatal(err)
	}
	full := in.CBMMask
	p := newPreparer(f)
	a, b := share("a", domain, waysQ(in.MinCBMBits+1)), share("b", domain, waysQ(in.MinCBMBits))
	var undo []json.RawMessage
	masks := map[string]uint64{}
	for _, al := range []prepare.Allocation{a, b} {
		got, err := p.Prepare(ctx, al, devs[domain])
		if err != nil {
			t.Fatalf("prepare %s: %v", al.ClaimUID, err)
		}
		t.Cleanup(func() { _ = p.Unprepare(ctx, al, nil) })
		undo = append(undo, got.Undo)
		group := llc.GroupName(al.ShareKey())
		m := mask(t, f, group, domain)
		masks[group] = m
		rdt := got.Edits.IntelRdt
		if rdt == nil || rdt.ClosID != group || rdt.L3CacheSchema != fmt.Sprintf("L3:%d=%x", domain, m) {
			t.Errorf("intelRdt = %+v, want closID %s and the group's mask %x", rdt, group, m)
		}
		if len(got.Edits.Hooks) != 1 || got.Edits.Hooks[0].HookName != "createRuntime" ||
			!strings.Contains(strings.Join(got.Edits.Hooks[0].Args, " "), "hook resctrl-attach --resctrl /sys/fs/resctrl --group "+group) {
			t.Errorf("hooks = %+v", got.Edits.Hooks)
		}
		if env := strings.Join(got.Edits.Env, " "); !strings.Contains(env, "CARVE_CACHE_CLOS_ID="+group) ||
			!strings.Contains(env, "CARVE_CACHE_CACHE_MASK="+strconv.FormatUint(m, 16)) {
			t.Errorf("env = %s", env)
		}
	}
	ma, mb := masks[llc.GroupName(a.ShareKey())], masks[llc.GroupName(b.ShareKey())]
	if ma&mb != 0 || bits.OnesCount64(ma) != in.MinCBMBits+1 || bits.OnesCount64(mb) != in.MinCBMBits || !cbm.Contiguous(ma) || !cbm.Contiguous(mb) {
		t.Fatalf("masks %x and %x: want disjoint contiguous runs of %d and %d ways", ma, mb, in.MinCBMBits+1, in.MinCBMBits)
	}
	if def := mask(t, f, "", domain); def&(ma|mb) != 0 || def != full&^(ma|mb) {
		t.Errorf("default group %x, want the rest of %x without %x and %x", def, full, ma, mb)
	}
	for other := range devs {
		if other != domain && mask(t, f, "", other) != full {
			t.Errorf("default group in domain %d = %x, want it untouched (%x)", other, mask(t, f, "", other), full)
		}
	}

	// A restart: a new preparer knows the shares from their records.
	p = newPreparer(f)
	p.Restore([]prepare.Allocation{a, b}, undo)
	c := share("c", domain, waysQ(in.MinCBMBits))
	if _, err := p.Prepare(ctx, c, devs[domain]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Unprepare(ctx, c, nil) })
	mc := mask(t, f, llc.GroupName(c.ShareKey()), domain)
	if mc&(ma|mb) != 0 {
		t.Errorf("share after restart %x overlaps %x or %x", mc, ma, mb)
	}
	if got := mask(t, f, llc.GroupName(a.ShareKey()), domain); got != ma {
		t.Errorf("share a after restart = %x, want %x unchanged", got, ma)
	}

	for i, al := range []prepare.Allocation{a, b, c} {
		var u json.RawMessage
		if i < len(undo) {
			u = undo[i]
		}
		if err := p.Unprepare(ctx, al, u); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadFile(path.Join(llc.GroupName(al.ShareKey()), "schemata")); !os.IsNotExist(err) {
			t.Errorf("group of %s left after unprepare: %v", al.ClaimUID, err)
		}
	}
	if def := mask(t, f, "", domain); def != full {
		t.Errorf("default group after the last share = %x, want all of %x back", def, full)
	}
}

// realResctrl is the kernel's resctrl, mounted where the kernel has it; the
// test skips only where the kernel lacks it or the CPU has no L3
// allocation.
func realResctrl(t *testing.T) resctrl.FS {
	t.Helper()
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(fss), "\tresctrl\n") {
		t.Skip("this kernel lacks resctrl (no resctrl in /proc/filesystems)")
	}
	dir := resctrl.HostDir("/")
	if _, err := os.Stat(string(dir) + "/info"); os.IsNotExist(err) {
		if err := mount(string(dir)); err != nil {
			t.Fatalf("mount resctrl at %s: %v", dir, err)
		}
	}
	if _, err := os.Stat(string(dir) + "/info/L3"); os.IsNotExist(err) {
		t.Skip("resctrl is mounted but this CPU has no L3 allocation (no info/L3)")
	}
	return dir
}
