package sharelist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/checkpoint"
)

// fakeNode is a node whose classifier counts 1 MB more per stats read on
// every share, so a measured rate is known.
type fakeNode struct {
	guards    map[string]string // pod guard states by link name
	sharesMap map[bpf.Key]uint32
	shapers   map[int]bpf.EgressShaperLinks
	pinned    []bpf.PinnedLink
	ifindex   map[string]int
	classes   map[int]map[uint32]uint64
	reads     int
	dumps     []int
	addrs     []bpf.AddrShare
	spoofed   map[string]bpf.SpoofDrops
	aqmStats  map[bpf.Key]bpf.AQMCounters
	queues    map[int]map[uint32]string
}

func (f *fakeNode) mapsErr() error                       { return nil }
func (f *fakeNode) podGuard(name string) (string, error) { return f.guards[name], nil }
func (f *fakeNode) shares() (map[bpf.Key]uint32, error)  { return f.sharesMap, nil }
func (f *fakeNode) rates() (map[string]uint64, error)    { return nil, nil }
func (f *fakeNode) spoofDrops() (map[string]bpf.SpoofDrops, error) {
	return f.spoofed, nil
}
func (f *fakeNode) aqm() (map[bpf.Key]bpf.AQMCounters, error)          { return f.aqmStats, nil }
func (f *fakeNode) classQueues(ifindex int) (map[uint32]string, error) { return f.queues[ifindex], nil }
func (f *fakeNode) links() ([]bpf.PinnedLink, error)                   { return f.pinned, nil }
func (f *fakeNode) netnsIno() uint64                                   { return 77 }
func (f *fakeNode) shareAddrs() ([]bpf.AddrShare, error)               { return f.addrs, nil }
func (f *fakeNode) legacyFilter(int, bool, string) bool                { return false }
func (f *fakeNode) egressShapers() (map[int]bpf.EgressShaperLinks, error) {
	return f.shapers, nil
}
func (f *fakeNode) stats() (map[bpf.Key]bpf.Counters, error) {
	f.reads++
	out := map[bpf.Key]bpf.Counters{}
	for k := range f.sharesMap {
		out[k] = bpf.Counters{Bytes: uint64(f.reads) * 1_000_000}
	}
	return out, nil
}
func (f *fakeNode) linkIndex(name string) (int, error) {
	if i, ok := f.ifindex[name]; ok {
		return i, nil
	}
	return 0, errors.New("Link not found")
}
func (f *fakeNode) classDrops(ifindex int) (map[uint32]uint64, error) {
	f.dumps = append(f.dumps, ifindex)
	return f.classes[ifindex], nil
}

func share(t *testing.T, cp *prepare.Checkpoint, uid, name string, egress, ingress string, u netdev.ShareRecord, completed bool) {
	t.Helper()
	id := types.UID("share-" + name)
	a := prepare.Allocation{ClaimUID: types.UID(uid), ClaimNamespace: "ns", ClaimName: name, Request: "net", Device: "nic-eth0",
		Kind: "nic", ShareID: &id, Consumed: map[resourceapi.QualifiedName]resource.Quantity{
			"egressBandwidth": resource.MustParse(egress), "ingressBandwidth": resource.MustParse(ingress)}}
	rec := prepare.ClaimRecord{UID: types.UID(uid), Namespace: "ns", Name: name, State: prepare.ClaimStarted, Allocations: []prepare.Allocation{a}}
	if completed {
		raw, _ := json.Marshal(u)
		rec.State, rec.Undo = prepare.ClaimCompleted, []json.RawMessage{raw}
		rec.Devices = []prepare.PreparedDevice{{Request: "net", Device: "nic-eth0", ShareID: &id,
			Network: &resourceapi.NetworkDeviceData{InterfaceName: "net1"}}}
	}
	if err := cp.Update(func(claims *prepare.Records) error { claims.Set(rec.UID, rec); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestNICSharesEnforcement(t *testing.T) {
	dir := t.TempDir()
	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Skip(err)
	}
	cp, err := prepare.OpenCheckpoint(dir, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := netdev.ShareRecord{Parent: "eth0", Link: "cv0000000001", MAC: "02:00:00:00:00:01", EgressMinor: 0x10, IngressMinor: 0x11}
	noClass := netdev.ShareRecord{Parent: "eth0", Link: "cv0000000002", MAC: "02:00:00:00:00:02", EgressMinor: 0x20}
	share(t, cp, "u1", "a-good", "100M", "50M", good, true)
	share(t, cp, "u2", "b-noclass", "100M", "0", noClass, true)
	share(t, cp, "u3", "c-started", "100M", "0", netdev.ShareRecord{}, false)

	ifb, shaper, back := netdev.IFBName(2), netdev.EgressShaperName(2), netdev.EgressReturnName(2)
	n := &fakeNode{
		sharesMap: map[bpf.Key]uint32{
			{MAC: good.MAC, Dir: bpf.Egress}: netdev.ClassHandle(0x10), {MAC: good.MAC, Dir: bpf.Ingress}: netdev.ClassHandle(0x11),
			{MAC: noClass.MAC, Dir: bpf.Egress}: netdev.ClassHandle(0x20),
		},
		pinned: []bpf.PinnedLink{{Program: "classify_egress", NetnsIno: 77, Ifindex: 2}, {Program: "classify_ingress", NetnsIno: 77, Ifindex: 9},
			{Program: "redirect_ingress", NetnsIno: 77, Ifindex: 2, Ingress: true},
			{Program: "return_shaped", NetnsIno: 77, Ifindex: 11, Ingress: true},
			{Program: "classify_egress", NetnsIno: 5, Ifindex: 4}}, // another namespace's
		shapers:  map[int]bpf.EgressShaperLinks{2: {Shaper: 10, Return: 11}},
		ifindex:  map[string]int{"eth0": 2, ifb: 9, "eth1": 4, shaper: 10, back: 11},
		classes:  map[int]map[uint32]uint64{10: {netdev.ClassHandle(0x10): 3}, 9: {netdev.ClassHandle(0x11): 4}},
		spoofed:  map[string]bpf.SpoofDrops{good.MAC: {bpf.SpoofSrcMAC: 5, bpf.SpoofARP: 2}},
		aqmStats: map[bpf.Key]bpf.AQMCounters{{MAC: good.MAC, Dir: bpf.Ingress}: {Drops: 10, Marks: 6}},
		queues:   map[int]map[uint32]string{10: {netdev.ClassHandle(0x10): "flows+codel"}, 9: {netdev.ClassHandle(0x11): "fq_codel"}},
	}
	src := &NICSource{StateDir: dir, Interval: 50 * time.Millisecond, node: n}
	rows, err := List(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("rows = %+v", rows)
	}
	a, b, c := rows[0], rows[1], rows[2]
	if !a.Enforced || a.Parent != "eth0" || a.Interface != "net1" || a.ShareID != "share-a-good" || a.EgressBandwidth != 100e6 || a.IngressBandwidth != 50e6 || a.Drops != 17 || a.Marks != 6 {
		t.Errorf("enforced share = %+v, want 17 drops (7 of its classes, 10 of its AQM) and 6 marks", a)
	}
	if a.EgressQueue != "flows+codel" || a.IngressQueue != "fq_codel" || queueOf(a) != "eg: flows+codel, in: fq_codel" {
		t.Errorf("queues %q, %q (%q)", a.EgressQueue, a.IngressQueue, queueOf(a))
	}
	if a.Spoofed["source-mac"] != 5 || a.Spoofed["arp-sender"] != 2 || len(b.Spoofed) != 0 {
		t.Errorf("spoofed frames dropped: %v, %v", a.Spoofed, b.Spoofed)
	}
	// 1 MB more in about 50 ms: about 160 Mbit/s, less as the interval
	// stretches on a busy machine.
	if a.EgressRate <= 0 || a.EgressRate > 160e6 || a.IngressRate <= 0 {
		t.Errorf("rates = %d, %d bit/s", a.EgressRate, a.IngressRate)
	}
	if b.Enforced || !strings.Contains(strings.Join(b.Problems, ";"), "class 1:20 missing on "+shaper) {
		t.Errorf("share without its class = %+v", b)
	}
	if c.Enforced || c.Problems[0] != "preparation not completed" {
		t.Errorf("started share = %+v", c)
	}
	if NotEnforced(rows) != 2 {
		t.Errorf("NotEnforced = %d", NotEnforced(rows))
	}
	// Only the devices holding shares are dumped, each once.
	if len(n.dumps) != 2 {
		t.Errorf("class dumps on %v, want eth0's egress shaper and IFB once each", n.dumps)
	}

	// Frames of eth0's limited shares not sent to its shaper, or not sent
	// back: not enforced.
	n.shapers = nil
	rows, _ = List(context.Background(), &NICSource{StateDir: dir, node: n})
	if rows[0].Enforced || !strings.Contains(strings.Join(rows[0].Problems, ";"), "does not send eth0's limited shares through "+shaper) {
		t.Errorf("share whose parent's frames skip the shaper = %+v", rows[0])
	}
	n.shapers = map[int]bpf.EgressShaperLinks{2: {Shaper: 10, Return: 11}}
	n.pinned = append(n.pinned[:3], n.pinned[4:]...)
	rows, _ = List(context.Background(), &NICSource{StateDir: dir, node: n})
	if rows[0].Enforced || !strings.Contains(strings.Join(rows[0].Problems, ";"), "return_shaped not attached to "+back) {
		t.Errorf("share whose shaped frames do not come back = %+v", rows[0])
	}

	// A link of another namespace does not count; neither does a missing one.
	n.pinned = n.pinned[3:]
	rows, _ = List(context.Background(), &NICSource{StateDir: dir, node: n})
	if rows[0].Enforced || !strings.Contains(strings.Join(rows[0].Problems, ";"), "classify_egress not attached to eth0") {
		t.Errorf("share without its link = %+v", rows[0])
	}

	var out bytes.Buffer
	if err := Write(&out, rows, "json"); err != nil {
		t.Fatal(err)
	}
	var decoded []map[string]any
	if err := json.Unmarshal(out.Bytes(), &decoded); err != nil || len(decoded) != 3 {
		t.Fatalf("json = %s (%v)", out.String(), err)
	}
	for _, key := range []string{"claim", "shareID", "parent", "interface", "egressBandwidth", "ingressBandwidth", "egressRate", "ingressRate", "drops", "enforced"} {
		if _, ok := decoded[0][key]; !ok {
			t.Errorf("json lacks %q: %v", key, decoded[0])
		}
	}
	out.Reset()
	if err := Write(&out, rows, "table"); err != nil || !strings.Contains(out.String(), "ns/a-good") || !strings.Contains(out.String(), "100M") {
		t.Errorf("table = %s (%v)", out.String(), err)
	}
	if err := Write(&out, rows, "xml"); err == nil {
		t.Error("xml accepted")
	}
}

// A share told apart by address (ipvlan) is enforced only while every one
// of its addresses names it on its parent.
func TestNICSharesAddressKeyed(t *testing.T) {
	dir := t.TempDir()
	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Skip(err)
	}
	cp, err := prepare.OpenCheckpoint(dir, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := netdev.ShareRecord{Parent: "eth0", Link: "cv0000000003", MAC: "02:00:00:00:00:03", EgressMinor: 0x30,
		Addresses: []string{"10.0.0.5/24", "fd00::5/64"}, AddressKeyed: true}
	share(t, cp, "u4", "d-ipvlan", "100M", "0", u, true)
	n := &fakeNode{
		sharesMap: map[bpf.Key]uint32{{MAC: u.MAC, Dir: bpf.Egress}: netdev.ClassHandle(0x30)},
		pinned:    []bpf.PinnedLink{{Program: "classify_egress", NetnsIno: 77, Ifindex: 2}},
		ifindex:   map[string]int{"eth0": 2},
		classes:   map[int]map[uint32]uint64{2: {netdev.ClassHandle(0x30): 0}},
		addrs: []bpf.AddrShare{{Parent: 2, Addr: netip.MustParseAddr("10.0.0.5"), MAC: u.MAC},
			{Parent: 3, Addr: netip.MustParseAddr("fd00::5"), MAC: u.MAC}}, // another parent's
	}
	rows, err := List(context.Background(), &NICSource{StateDir: dir, node: n})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Enforced || strings.Join(rows[0].Problems, ";") != "no classifier entry for address fd00::5 on eth0" {
		t.Errorf("share missing an address entry = %+v", rows)
	}
	n.addrs[1].Parent = 2
	rows, _ = List(context.Background(), &NICSource{StateDir: dir, node: n})
	if len(rows) != 1 || !rows[0].Enforced {
		t.Errorf("share with all its address entries = %+v", rows)
	}
}

// No state directory: no shares, nothing to complain about.
func TestNICSharesWithoutState(t *testing.T) {
	rows, err := List(context.Background(), &NICSource{StateDir: t.TempDir() + "/none", node: &fakeNode{}})
	if err != nil || len(rows) != 0 {
		t.Errorf("rows %+v, err %v", rows, err)
	}
}

// A share the agent gave a pod guard is enforced while its guard is
// pinned, waiting for the pod or attached; a guard whose interface went,
// or whose pin is gone, is a problem, whatever the share's bandwidth. A
// share an older agent made, without a guard, is not held to one.
func TestNICSharesPodGuard(t *testing.T) {
	dir := t.TempDir()
	bootID, err := checkpoint.ReadBootID("/")
	if err != nil {
		t.Skip(err)
	}
	cp, err := prepare.OpenCheckpoint(dir, bootID, nil)
	if err != nil {
		t.Fatal(err)
	}
	guards := map[string]string{}
	for i, c := range []struct{ name, state string }{
		{"a-attached", bpf.PodGuardAttached}, {"b-pending", bpf.PodGuardPending}, {"c-detached", bpf.PodGuardDetached}, {"d-unpinned", ""}, {"e-older", ""},
	} {
		link := fmt.Sprintf("cv00000000%02d", i)
		u := netdev.ShareRecord{Parent: "eth0", Link: link, MAC: fmt.Sprintf("02:00:00:00:01:%02x", i), PodGuard: c.name != "e-older"}
		share(t, cp, fmt.Sprintf("u%d", i), c.name, "0", "0", u, true)
		guards[link] = c.state
	}
	rows, err := List(context.Background(), &NICSource{StateDir: dir, node: &fakeNode{guards: guards, ifindex: map[string]int{"eth0": 2}}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		enforced bool
		guard    string
	}{"ns/a-attached": {true, "attached"}, "ns/b-pending": {true, "pending"}, "ns/c-detached": {false, "detached"}, "ns/d-unpinned": {false, ""}, "ns/e-older": {true, ""}}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if w := want[r.Claim]; r.Enforced != w.enforced || r.PodGuard != w.guard {
			t.Errorf("%s: enforced %v, guard %q, problems %v; want %v, %q", r.Claim, r.Enforced, r.PodGuard, r.Problems, w.enforced, w.guard)
		}
	}
}

// A share that may borrow shows its floor and ceiling each way, and the
// directions in which it is over its floor now; a hard cap shows its
// bandwidth alone, and never borrows.
func TestBorrowingRow(t *testing.T) {
	r := Row{Claim: "ns/b", EgressBandwidth: 100e6, EgressCeiling: 1e9, EgressRate: 240e6,
		IngressBandwidth: 300e6, IngressCeiling: 1e9, IngressRate: 287e6, Enforced: true}
	if got := borrowing(r); len(got) != 1 || got[0] != "egress" {
		t.Errorf("borrowing %v, want [egress] (ingress is at its floor)", got)
	}
	capped := Row{Claim: "ns/c", EgressBandwidth: 100e6, EgressRate: 101e6, Enforced: true}
	if got := borrowing(capped); len(got) != 0 {
		t.Errorf("a hard cap borrowing %v", got)
	}
	r.Borrowing = borrowing(r)
	var out strings.Builder
	if err := Write(&out, []Row{r, capped}, "table"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"BORROWING", "100M..1G", "300M..1G", "240M", "egress"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
