package bpf

import (
	"errors"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// Where the kernel has no TCX (before 6.6; make vmtest's 6.1, where the hook
// failed for every share), the pod guard is a cls_bpf filter on the share's
// interface even where the hook asks for a link: attached once however many times the hook runs, with no link
// pinned but its interface recorded in the link's stead, and gone with the
// interface.
func TestPodGuardWithoutTCX(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	defer s.Close()
	if err := s.PinPodGuard("cvlegacy", PodShare{Parent: 7, MAC: mac1.String(), CheckIPv4: true}); err != nil {
		t.Fatal(err)
	}
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	dev := addVeth(t, h, "net1", "peer", netns.None())
	forceLegacy = true
	defer func() { forceLegacy = false }()
	for range 2 { // every container of the pod runs the hook
		if err := inNS(ns, func() error { return AttachPodGuard(dir, "cvlegacy", dev.Attrs().Index, PodHookLink) }); err != nil {
			t.Fatal(err)
		}
	}
	names := directActionFilters(t, h, dev, netlink.HANDLE_MIN_EGRESS)
	if len(names) != 1 || names[0] != LegacyFilterName(podGuardProg) {
		t.Errorf("egress filters of the share's interface: %v, want one %s", names, LegacyFilterName(podGuardProg))
	}
	// No link to pin: the interface is recorded, for the nested-link
	// watch and carve shares.
	if ifindex, err := PodGuardIfindex(dir, "cvlegacy"); err != nil || ifindex != dev.Attrs().Index {
		t.Errorf("PodGuardIfindex = %d, %v; want %d", ifindex, err, dev.Attrs().Index)
	}
	if state, err := PodGuardState(dir, "cvlegacy"); err != nil || state != PodGuardAttached {
		t.Errorf("state %q, %v; want %q", state, err, PodGuardAttached)
	}
	if err := UnpinPodGuard(dir, "cvlegacy"); err != nil {
		t.Fatal(err)
	}
	if _, err := PodGuardIfindex(dir, "cvlegacy"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after UnpinPodGuard: %v, want not exist", err)
	}
}

// A share whose class does not let its pods have CAP_NET_ADMIN gets its
// pod guard and its ingress AQM's program as cls_bpf filters (no RCU grace
// period to wait for): one of each however many containers run the hook,
// and no link pinned. Where an older hook left TCX links, they are kept
// and no filter is added beside them.
func TestPodHookFilter(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	defer s.Close()
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	fresh := addVeth(t, h, "net1", "peer1", netns.None())
	older := addVeth(t, h, "net2", "peer2", netns.None())
	for _, name := range []string{"cvfilter", "cvolder"} {
		if err := s.PinPodGuard(name, PodShare{Parent: 7, MAC: mac1.String(), CheckIPv4: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := inNS(ns, func() error {
		if err := AttachPodGuard(dir, "cvolder", older.Attrs().Index, PodHookLink); err != nil {
			return err
		}
		return AttachDequeued(dir, older.Attrs().Index, PodHookLink)
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // every container of the pod runs the hook
		if err := inNS(ns, func() error {
			for _, c := range []struct {
				name string
				dev  netlink.Link
			}{{"cvfilter", fresh}, {"cvolder", older}} {
				if err := AttachPodGuard(dir, c.name, c.dev.Attrs().Index, PodHookFilter); err != nil {
					return err
				}
				if err := AttachDequeued(dir, c.dev.Attrs().Index, PodHookFilter); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	carveFilters := func(dev netlink.Link, hook uint32) []string {
		t.Helper()
		return directActionFilters(t, h, dev, hook)
	}
	if got := carveFilters(fresh, netlink.HANDLE_MIN_EGRESS); len(got) != 1 || got[0] != LegacyFilterName(podGuardProg) {
		t.Errorf("egress filters of the fresh share's interface: %v, want one %s", got, LegacyFilterName(podGuardProg))
	}
	if got := carveFilters(fresh, netlink.HANDLE_MIN_INGRESS); len(got) != 1 || got[0] != LegacyFilterName(shaperProgShareDequeued) {
		t.Errorf("ingress filters of the fresh share's interface: %v, want one %s", got, LegacyFilterName(shaperProgShareDequeued))
	}
	if _, err := os.Stat(PodGuardLinkPath(dir, "cvfilter")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a link pinned for a filter's guard: %v", err)
	}
	if ifindex, err := PodGuardIfindex(dir, "cvfilter"); err != nil || ifindex != fresh.Attrs().Index {
		t.Errorf("PodGuardIfindex = %d, %v; want %d", ifindex, err, fresh.Attrs().Index)
	}
	// Before 6.6 the older hook's "links" are cls_bpf filters themselves.
	for _, hook := range []uint32{netlink.HANDLE_MIN_EGRESS, netlink.HANDLE_MIN_INGRESS} {
		if got := carveFilters(older, hook); len(got) != 0 && !nettest.LacksTCX(t) {
			t.Errorf("filters added beside an older hook's links: %v", got)
		}
	}
	if ifindex, err := PodGuardIfindex(dir, "cvolder"); err != nil || ifindex != older.Attrs().Index {
		t.Errorf("the older hook's link: PodGuardIfindex = %d, %v; want %d", ifindex, err, older.Attrs().Index)
	}
}

// directActionFilters names dev's direct-action cls_bpf filters on hook
// (netlink.HANDLE_MIN_EGRESS or HANDLE_MIN_INGRESS): carve's kind.
func directActionFilters(t *testing.T, h *netlink.Handle, dev netlink.Link, hook uint32) []string {
	t.Helper()
	filters, err := h.FilterList(dev, hook)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.DirectAction {
			names = append(names, bf.Name)
		}
	}
	return names
}
