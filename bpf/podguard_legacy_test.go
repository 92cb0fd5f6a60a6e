package bpf

import (
	"errors"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Where the kernel has no TCX (before 6.6; make vmtest's 6.1, where the hook
// failed for every share), the pod guard is a cls_bpf filter on the share's
// interface: attached once however many times the hook runs, with no link
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
		if err := inNS(ns, func() error { return AttachPodGuard(dir, "cvlegacy", dev.Attrs().Index) }); err != nil {
			t.Fatal(err)
		}
	}
	filters, err := h.FilterList(dev, netlink.HANDLE_MIN_EGRESS)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.DirectAction {
			names = append(names, bf.Name)
		}
	}
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
