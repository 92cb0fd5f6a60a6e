package bpf

import (
	"errors"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Pinned reads what the agent's Shaper wrote and attached, without loading
// anything, and says plainly where nothing was ever pinned.
func TestPinnedReadsTheAgentsState(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	if _, err := OpenPinned(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenPinned of an empty directory: %v, want not exist", err)
	}
	s := openShaper(t, dir)
	defer s.Close()
	ns, _ := newNS(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dev := addVeth(t, h, "p0", "p1", netns.None())
	idx := dev.Attrs().Index
	if err := inNS(ns, func() error { return s.Attach(idx, Egress) }); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, mac1, 0x10010); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRate(mac2, 8_000_000); err != nil {
		t.Fatal(err)
	}

	p, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	shares, err := p.Shares()
	if err != nil || len(shares) != 1 || shares[Key{mac1.String(), Egress}] != 0x10010 {
		t.Errorf("Shares = %v, %v", shares, err)
	}
	if _, err := p.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	if rates, err := p.Rates(); err != nil || rates[mac2.String()] != 8_000_000 {
		t.Errorf("Rates = %v, %v", rates, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		t.Fatal(err)
	}
	links, err := p.PinnedLinks()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range links {
		found = found || l == PinnedLink{Program: shaperProgClassifyEgress, NetnsIno: st.Ino, Ifindex: idx}
	}
	switch {
	case !found && lacksTCX(t, s.objs.ClassifyEgress):
		// Before 6.6 (make vmtest's 6.1) a cls_bpf filter holds the
		// program, and there is no link to pin.
		filters, err := h.FilterList(dev, netlink.HANDLE_MIN_EGRESS)
		var bf *netlink.BpfFilter
		if len(filters) == 1 {
			bf, _ = filters[0].(*netlink.BpfFilter)
		}
		if err != nil || bf == nil || bf.Name != LegacyFilterName(shaperProgClassifyEgress) {
			t.Errorf("no TCX: filters %v (%v), want the classifier's cls_bpf filter", filters, err)
		}
	case !found:
		t.Errorf("PinnedLinks = %+v, want classify_egress on ifindex %d of netns %d", links, idx, st.Ino)
	}
	// Read-only: the listing cannot change the agent's maps.
	if err := p.shares.Put(&shaperShareKey{}, &shaperShareVal{Classid: 1}); err == nil {
		t.Error("a pinned map opened read-only took a write")
	}
}
