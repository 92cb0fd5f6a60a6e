package bpf

import (
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf/nettest"
)

var (
	mac1 = net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, 1}
	mac2 = net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, 2}
)

func openShaper(t testing.TB, dir string) *Shaper {
	t.Helper()
	s, err := OpenShaper(dir)
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel cannot load the classifier: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMountBPFFSIdempotent(t *testing.T) {
	needRoot(t)
	for range 2 {
		if err := MountBPFFS(""); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := isBPFFS(DefaultBPFFS); err != nil || !ok {
		t.Fatalf("%s is not bpffs: %v", DefaultBPFFS, err)
	}
}

func TestPinnedMapsSurviveReopen(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	if err := s.SetShare(Egress, mac1, 0x10010); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Ingress, mac2, 0x10020); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, net.HardwareAddr{1, 2, 3}, 1); err == nil {
		t.Error("SetShare took a 3-byte MAC")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openShaper(t, dir)
	defer s.Close()
	got, err := s.Shares()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Key]uint32{
		{MAC: mac1.String(), Dir: Egress}:  0x10010,
		{MAC: mac2.String(), Dir: Ingress}: 0x10020,
	}
	if len(got) != len(want) || got[Key{mac1.String(), Egress}] != 0x10010 || got[Key{mac2.String(), Ingress}] != 0x10020 {
		t.Fatalf("after reopen: %v, want %v", got, want)
	}
	for range 2 { // deleting twice is fine
		if err := s.DeleteShare(Egress, mac1); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := s.Shares(); len(got) != 1 {
		t.Fatalf("after delete: %v", got)
	}
}

// TestAttachUpdateDetach: re-attaching after a restart swaps the program in
// the same pinned link; Detach removes it.
func TestAttachUpdateDetach(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	a := addVeth(t, h, "a", "b", netns.None())

	linkOf := func() *link.Info {
		t.Helper()
		paths, _ := filepath.Glob(filepath.Join(dir, "classify_egress-*"))
		if len(paths) != 1 {
			t.Fatalf("pinned links: %v", paths)
		}
		l, err := link.LoadPinnedLink(paths[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		info, err := l.Info()
		if err != nil {
			t.Fatal(err)
		}
		return info
	}

	s1 := openShaper(t, dir)
	defer s1.Close()
	attach(t, s1, ns, a.Attrs().Index, Egress)
	first := linkOf()
	if first.TCX() == nil || first.TCX().Ifindex != uint32(a.Attrs().Index) {
		t.Fatalf("link info %+v", first)
	}
	attach(t, s1, ns, a.Attrs().Index, Egress) // idempotent

	s2 := openShaper(t, dir) // "restart"
	defer s2.Close()
	attach(t, s2, ns, a.Attrs().Index, Egress)
	second := linkOf()
	if second.ID != first.ID || second.Program == first.Program {
		t.Fatalf("want same link %d with a new program: got link %d prog %d (was %d)",
			first.ID, second.ID, second.Program, first.Program)
	}

	attach(t, s2, ns, a.Attrs().Index, Ingress) // replaces egress
	if paths, _ := filepath.Glob(filepath.Join(dir, "classify_*")); len(paths) != 1 ||
		!strings.HasPrefix(filepath.Base(paths[0]), "classify_ingress-") {
		t.Fatalf("after direction swap: %v", paths)
	}

	if err := inNS(ns, func() error { return s2.Detach(a.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	if paths, _ := filepath.Glob(filepath.Join(dir, "classify_*")); len(paths) != 0 {
		t.Fatalf("pins left after Detach: %v", paths)
	}
}

// attach attaches in ns and skips unless the kernel took a TCX link.
func attach(t testing.TB, s *Shaper, ns netns.NsHandle, ifindex int, dir Direction) {
	t.Helper()
	if err := inNS(ns, func() error { return s.Attach(ifindex, dir) }); err != nil {
		t.Fatal(err)
	}
	_, name, _ := s.prog(dir)
	if paths, _ := filepath.Glob(filepath.Join(s.pinDir, name+"-*")); len(paths) == 0 {
		prog, _, _ := s.prog(dir)
		if !lacksTCX(t, prog) {
			t.Fatal("Attach fell back to cls_bpf, but the kernel has TCX")
		}
		t.Skip("kernel lacks TCX: Attach fell back to cls_bpf")
	}
}

// lacksTCX reports whether the kernel has no TCX: cilium/ebpf answers a
// TCX attach that fails with ErrNotSupported only then (an ifindex that
// does not exist gets ENODEV otherwise).
func lacksTCX(t testing.TB, prog *ebpf.Program) bool {
	t.Helper()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXEgress})
	if err == nil {
		l.Close()
		t.Fatal("TCX attach to ifindex MaxInt32 succeeded")
	}
	return nettest.KernelLacks(err, nettest.BPF("TCX"))
}

func TestLegacyFallback(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	ns, _ := newNS(t)
	h := nlHandle(t, ns)
	a := addVeth(t, h, "a", "b", netns.None())
	s := openShaper(t, dir)
	defer s.Close()

	forceLegacy = true
	defer func() { forceLegacy = false }()
	for range 2 { // the second replaces the first
		err := inNS(ns, func() error { return s.Attach(a.Attrs().Index, Egress) })
		if nettest.KernelLacks(err, nettest.Qdisc("clsact")) || nettest.KernelLacks(err, nettest.Filter("bpf")) {
			t.Skipf("kernel lacks clsact or cls_bpf: %v", err)
		}
		if err != nil {
			t.Fatalf("legacy attach: %v", err)
		}
	}
	filters, err := h.FilterList(a, netlink.HANDLE_MIN_EGRESS)
	if err != nil {
		t.Fatal(err)
	}
	if len(filters) != 1 {
		t.Fatalf("filters: %v", filters)
	}
	if bf, ok := filters[0].(*netlink.BpfFilter); !ok || !bf.DirectAction || bf.Name != "carve-classify_egress" {
		t.Fatalf("filter %+v", filters[0])
	}
	if err := inNS(ns, func() error { return s.Detach(a.Attrs().Index) }); err != nil {
		t.Fatal(err)
	}
	if filters, _ := h.FilterList(a, netlink.HANDLE_MIN_EGRESS); len(filters) != 0 {
		t.Fatalf("filters left: %v", filters)
	}
}

func TestCleanupDefunct(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	defer s.Close()
	ns, del := newNS(t)
	h := nlHandle(t, ns)
	a := addVeth(t, h, "a", "b", netns.None())
	attach(t, s, ns, a.Attrs().Index, Egress)
	// A share's pod guard on the other end, as the hook attaches it in a
	// pod; an older agent unprepared the share and left its pins.
	b, err := h.LinkByName("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PinPodGuard("cvguard", PodShare{Parent: 7, MAC: mac1.String()}); err != nil {
		t.Fatal(err)
	}
	if err := inNS(ns, func() error { return AttachPodGuard(dir, "cvguard", b.Attrs().Index, PodHookLink) }); err != nil {
		t.Fatal(err)
	}

	if removed, err := CleanupDefunct(dir); err != nil || len(removed) != 0 {
		t.Fatalf("live link removed: %v, %v", removed, err)
	}
	// Deleting the netns (last FD closed) unregisters its devices; the
	// kernel does it asynchronously.
	h.Close()
	del()
	deadline := time.Now().Add(10 * time.Second)
	for {
		removed, err := CleanupDefunct(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(removed) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("link not defunct 10s after its netns was closed: removed %v", removed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if paths, _ := filepath.Glob(filepath.Join(dir, "classify_*")); len(paths) != 0 {
		t.Fatalf("pins left: %v", paths)
	}
	if paths, _ := filepath.Glob(filepath.Join(dir, podGuardDir, "*")); len(paths) != 0 {
		t.Fatalf("pod guard pins left: %v", paths)
	}
	if _, err := os.Stat(filepath.Join(dir, "shares")); err != nil {
		t.Fatalf("map pin removed too: %v", err)
	}
}

// The classifier's room for shares is read from the object without
// privilege, and a loaded classifier has exactly that room: `carve discover`
// and the agent publish the same "shares" capacity.
func TestShareSlots(t *testing.T) {
	compiled, err := CompiledShareSlots()
	if err != nil {
		t.Fatal(err)
	}
	// shares and share_stats hold 4096 entries, two a share;
	// share_netns 4096, one a share.
	if compiled != 2048 {
		t.Errorf("CompiledShareSlots() = %d, want 2048", compiled)
	}
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	if got := s.ShareSlots(); got != compiled {
		t.Errorf("a loaded classifier's ShareSlots() = %d, the compiled %d", got, compiled)
	}
}
