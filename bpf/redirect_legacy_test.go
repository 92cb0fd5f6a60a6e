package bpf

import (
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

// Without TCX, the ingress redirect is act_mirred's on a u32 filter, not
// redirect_ingress's bpf_redirect, which an IFB before 6.4 drops (Debian's
// 6.1 in make vmtest: no frame reached an ingress share); made once however
// often it is attached, and removed by DetachRedirect. make vmtest's 6.1
// runs the netdev tests' traffic through it.
func TestLegacyRedirectThroughMirred(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	parent := addVeth(t, h, "nic0", "peer0", netns.None())
	la := netlink.NewLinkAttrs()
	la.Name = "cvifb"
	nettest.SkipIfLacks(t, h.LinkAdd(&netlink.Ifb{LinkAttrs: la}), nettest.LinkKind("ifb"))
	ifb, err := h.LinkByName("cvifb")
	if err != nil {
		t.Fatal(err)
	}
	forceLegacy = true
	defer func() { forceLegacy = false }()
	redirects := func() int {
		t.Helper()
		filters, err := h.FilterList(parent, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range filters {
			if IsLegacyRedirect(f) {
				n++
			} else if f.Type() == "u32" && f.Attrs().Priority == legacyPrio {
				t.Errorf("a u32 filter of carve's without its mirred action: %+v", f)
			}
		}
		return n
	}
	for range 2 {
		err := inNS(ns, func() error { return s.AttachRedirect(parent.Attrs().Index, ifb.Attrs().Index) })
		if nettest.KernelLacks(err, nettest.Filter("u32")) || nettest.KernelLacks(err, nettest.Filter("mirred")) {
			t.Skipf("kernel lacks u32 or mirred: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := redirects(); n != 1 {
		t.Errorf("%d mirred redirects on the parent's ingress, want 1", n)
	}
	if err := inNS(ns, func() error { return s.DetachRedirect(parent.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	if n := redirects(); n != 0 {
		t.Errorf("%d mirred redirects left after DetachRedirect", n)
	}
}
