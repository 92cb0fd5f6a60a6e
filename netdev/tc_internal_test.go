package netdev

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare"
)

// mq, the root of multi-queue NICs, may be replaced while its children are
// kernel defaults, not once an operator put their own under it.
func TestMQRootReplaceableOnlyWithDefaultChildren(t *testing.T) {
	tp := nettest.New(t)
	h, err := netlink.NewHandleAt(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	la := netlink.NewLinkAttrs()
	la.Name, la.NumTxQueues = "mq0", 4
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "mq1", PeerTxQLen: -1}); err != nil {
		t.Fatal(err)
	}
	link, _ := h.LinkByName("mq0")
	mq := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_ROOT,
		Handle: netlink.MakeHandle(0x70, 0)}, QdiscType: "mq"}
	if err := h.QdiscReplace(mq); err != nil {
		t.Fatalf("mq on a 4-queue veth: %v", err)
	}
	if _, err := checkRootReplaceable(h, link); err != nil {
		t.Errorf("mq with default children refused: %v", err)
	}
	child := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index,
		Parent: netlink.MakeHandle(0x70, 2), Handle: netlink.MakeHandle(0x71, 0)}, QdiscType: "bfifo"}
	if err := h.QdiscReplace(child); err != nil {
		t.Fatalf("bfifo under mq: %v", err)
	}
	if _, err := checkRootReplaceable(h, link); err == nil || !strings.Contains(err.Error(), "bfifo child") {
		t.Errorf("mq with an operator's bfifo child: %v, want refused", err)
	}
	if err := ensureHTB(h, link, 0, 0); err == nil {
		t.Errorf("ensureHTB replaced an mq holding an operator's bfifo")
	}
}

// A restored share's class minors are reserved on the devices that hold the
// classes: egress on the parent's egress shaper, ingress on the parent's IFB.
func TestRestoreReservesMinorsPerDevice(t *testing.T) {
	tp := nettest.New(t)
	p, err := NewNICPreparer(Options{HostNS: tp.Node, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := p.h.LinkByName(tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	a := prepare.Allocation{ClaimUID: "uid-r", Request: "net", Device: "nic-x"}
	raw, _ := json.Marshal(undoRecord{Parent: tp.Parent, Link: LinkName(a.ShareKey()), MAC: ShareMAC(a.ShareKey()).String(),
		EgressMinor: 0x20, IngressMinor: 0x30})
	p.Restore([]prepare.Allocation{a}, []json.RawMessage{raw})
	if got := p.minors[egressShaperName(parent.Attrs().Index)]; len(got) != 1 || got[0x20] != a.ShareKey() {
		t.Errorf("egress shaper's minors %v, want only 0x20", got)
	}
	if got := p.minors[ifbName(parent)]; len(got) != 1 || got[0x30] != a.ShareKey() {
		t.Errorf("IFB's minors %v, want only 0x30", got)
	}
}

// linkRef finds a link by name in the preparer's namespace, not the test's
// own, with the index LinkByName gives; a name no link has is an error.
func TestLinkRefInThePreparersNamespace(t *testing.T) {
	tp := nettest.New(t)
	// The parent's name is the node namespace's alone.
	if _, err := netlink.LinkByName(tp.Parent); err == nil {
		t.Skipf("the test's own namespace has a link %s too", tp.Parent)
	}
	p, err := NewNICPreparer(Options{HostNS: tp.Node, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	want, err := p.h.LinkByName(tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.linkRef(tp.Parent)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attrs().Index != want.Attrs().Index || got.Attrs().Name != tp.Parent {
		t.Errorf("linkRef(%s) = %d %q, want %d", tp.Parent, got.Attrs().Index, got.Attrs().Name, want.Attrs().Index)
	}
	if _, err := p.linkRef("cvnosuch0"); err == nil {
		t.Error("linkRef of a name no link has: no error")
	}
}
