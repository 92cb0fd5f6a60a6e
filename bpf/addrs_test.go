package bpf

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/carve-dra/carve/bpf/nettest"
)

// skbCtx is struct __sk_buff (192 bytes) as BPF_PROG_RUN takes it in for a
// tc program (every field but mark, priority, ingress_ifindex, ifindex and a
// few further on must be zero) and gives it back, whole.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
	_                                                                           [37]uint32
}

// ipFrame is an Ethernet frame from srcMAC to dstMAC carrying an IPv4 or
// IPv6 header from src to dst, behind an 802.1Q tag where vlan is set.
func ipFrame(dstMAC, srcMAC net.HardwareAddr, src, dst string, vlan bool) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	f := append(append([]byte{}, dstMAC...), srcMAC...)
	if vlan {
		f = append(f, 0x81, 0x00, 0x00, 0x64)
	}
	if s.Is4() {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], 20)
		s4, d4 := s.As4(), d.As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], d4[:])
		return append(f, ip...)
	}
	f = append(f, 0x86, 0xdd)
	ip := make([]byte, 40)
	ip[0], ip[6], ip[7] = 0x60, 59, 64
	s16, d16 := s.As16(), d.As16()
	copy(ip[8:], s16[:])
	copy(ip[24:], d16[:])
	return append(f, ip...)
}

// runCtx runs prog on frame with ctx and returns its verdict and the
// priority it left.
func runCtx(t *testing.T, prog *ebpf.Program, frame []byte, ctx skbCtx) (int32, uint32) {
	t.Helper()
	var out skbCtx
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, ContextOut: &out})
	nettest.SkipIfLacks(t, err, nettest.BPF("BPF_PROG_RUN"))
	return int32(ret), out.Priority
}

// TestAddressKeyedShare checks the address lookup with BPF_PROG_RUN, on the
// loopback device (ifindex 1) standing in for the parent: a share found by
// address takes frames from its IPv4 and IPv6 addresses on egress and
// frames to them on ingress (on the IFB, and redirected there from the
// parent, to the parent's own MAC as ipvlan's are), and nothing else: not
// frames by its naming MAC, not another parent's, not the node's own
// address, not broadcast. A pod's netns still names its own share first.
func TestAddressKeyedShare(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, egressClass, ingressClass = 1, 0x10010, 0x10020
	share := mac1
	nodeMAC := net.HardwareAddr{0, 0, 0, 0, 0, 0} // lo's: PACKET_HOST
	peerMAC := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	for _, a := range []string{"10.9.0.5", "fd09::5"} {
		if err := s.SetShareAddr(parent, 0, netip.MustParseAddr(a), share); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetShareByAddress(Egress, share, egressClass); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShareByAddress(Ingress, share, ingressClass); err != nil {
		t.Fatal(err)
	}
	// The same address in VLAN 100 of the same parent is another share's.
	const vlanClass = 0x10030
	if err := s.SetShareAddr(parent, 100, netip.MustParseAddr("10.9.0.5"), mac2); err != nil {
		t.Fatalf("the same address in VLAN 100 for another share: %v", err)
	}
	if err := s.SetShareByAddress(Egress, mac2, vlanClass); err != nil {
		t.Fatal(err)
	}
	if err := s.objs.IfbOf.Put(uint32(parent), uint32(7)); err != nil {
		t.Fatal(err)
	}

	egress := []struct {
		name     string
		frame    []byte
		priority uint32
	}{
		{"IPv4 from the share's address", ipFrame(peerMAC, nodeMAC, "10.9.0.5", "10.9.0.1", false), egressClass},
		{"IPv6 from the share's address", ipFrame(peerMAC, nodeMAC, "fd09::5", "fd09::1", false), egressClass},
		{"IPv4 of the address in VLAN 100, another share's", ipFrame(peerMAC, nodeMAC, "10.9.0.5", "10.9.0.1", true), vlanClass},
		{"IPv4 from another address", ipFrame(peerMAC, nodeMAC, "10.9.0.6", "10.9.0.1", false), 0},
		{"IPv6 from another address", ipFrame(peerMAC, nodeMAC, "fd09::6", "fd09::1", false), 0},
		{"from the share's naming MAC", ipFrame(peerMAC, share, "10.9.0.6", "10.9.0.1", false), 0},
		{"to the share's address", ipFrame(peerMAC, nodeMAC, "10.9.0.1", "10.9.0.5", false), 0},
	}
	before, _ := s.Stats()
	for _, c := range egress {
		if ret, prio := runCtx(t, s.objs.ClassifyEgress, c.frame, skbCtx{}); ret != -1 || prio != c.priority {
			t.Errorf("egress, %s: verdict %d, priority %#x; want -1, %#x", c.name, ret, prio, c.priority)
		}
	}
	after, _ := s.Stats()
	if got := after[Key{share.String(), Egress}].Packets - before[Key{share.String(), Egress}].Packets; got != 2 {
		t.Errorf("egress: %d packets counted for the share, want 2", got)
	}
	if got := after[Key{mac2.String(), Egress}].Packets - before[Key{mac2.String(), Egress}].Packets; got != 1 {
		t.Errorf("egress: %d packets counted for the VLAN 100 share, want 1", got)
	}

	ingress := []struct {
		name       string
		frame      []byte
		parent     uint32
		priority   uint32
		redirected bool
	}{
		{"IPv4 to the share's address", ipFrame(nodeMAC, peerMAC, "10.9.0.1", "10.9.0.5", false), parent, ingressClass, true},
		{"IPv6 to the share's address", ipFrame(nodeMAC, peerMAC, "fd09::1", "fd09::5", false), parent, ingressClass, true},
		{"IPv4 to another MAC (a macvlan's)", ipFrame(peerMAC, nodeMAC, "10.9.0.1", "10.9.0.5", false), parent, ingressClass, true},
		{"IPv4 to the node's address", ipFrame(nodeMAC, peerMAC, "10.9.0.1", "10.9.0.6", false), parent, 0, false},
		{"IPv6 to the node's address", ipFrame(nodeMAC, peerMAC, "fd09::1", "fd09::6", false), parent, 0, false},
		{"IPv4 to the share's naming MAC", ipFrame(share, peerMAC, "10.9.0.1", "10.9.0.6", false), parent, 0, false},
		{"IPv4 broadcast", ipFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, peerMAC, "10.9.0.1", "10.9.0.5", false), parent, ingressClass, false},
		{"IPv4 to the address on another parent", ipFrame(nodeMAC, peerMAC, "10.9.0.1", "10.9.0.5", false), 2, 0, false},
	}
	for _, c := range ingress {
		// On the IFB the parent is the frame's ingress_ifindex.
		if ret, prio := runCtx(t, s.objs.ClassifyIngress, c.frame, skbCtx{IngressIfindex: c.parent}); ret != -1 || prio != c.priority {
			t.Errorf("IFB, %s: verdict %d, priority %#x; want -1, %#x", c.name, ret, prio, c.priority)
		}
		if c.parent != parent {
			continue // the redirect runs on the parent: lo here
		}
		want := int32(-1)
		if c.redirected {
			want = 7 // TC_ACT_REDIRECT
		}
		if ret, _ := runCtx(t, s.objs.RedirectIngress, c.frame, skbCtx{}); ret != want {
			t.Errorf("parent, %s: verdict %d, want %d", c.name, ret, want)
		}
	}

	// A pod's netns names its own share, whatever address it sends from,
	// and the parent's MAC its frames carry is not learned for an
	// address-keyed share.
	cookie, err := NetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetLocalMAC(parent, nodeMAC); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPodShare(PodShare{NetnsCookie: cookie, Parent: parent, MAC: mac2.String(), ClassID: 0x10030}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShareByAddress(Egress, mac2, 0x10030); err != nil {
		t.Fatal(err)
	}
	if _, prio := runCtx(t, s.objs.ClassifyEgress, ipFrame(peerMAC, nodeMAC, "10.9.0.5", "10.9.0.1", false), skbCtx{}); prio != 0x10030 {
		t.Errorf("a pod's frame from another share's address: priority %#x, want its own share's 0x10030", prio)
	}
	if learned, _ := s.Learned(); len(learned) != 0 {
		t.Errorf("learned %v from an address-keyed share's frames", learned)
	}
	if err := s.DeletePodShares(mac2); err != nil {
		t.Fatal(err)
	}

	// An address is one share's per parent; taking it again is a no-op.
	err = s.SetShareAddr(parent, 0, netip.MustParseAddr("fd09::5"), mac2)
	if !errors.Is(err, ErrAddrTaken) {
		t.Errorf("another share taking fd09::5: %v, want ErrAddrTaken", err)
	}
	if err := s.SetShareAddr(parent, 0, netip.MustParseAddr("fd09::5"), share); err != nil {
		t.Errorf("the same share again: %v", err)
	}
	if err := s.SetShareAddr(2, 0, netip.MustParseAddr("fd09::5"), mac2); err != nil {
		t.Errorf("the address on another parent: %v", err)
	}
	if keyed, _ := s.AddressKeyed(); !keyed[Key{share.String(), Egress}] || !keyed[Key{share.String(), Ingress}] {
		t.Errorf("address-keyed entries %v", keyed)
	}

	for range 2 { // idempotent
		if err := s.DeleteShareAddrs(share); err != nil {
			t.Fatal(err)
		}
	}
	left, _ := s.ShareAddrs()
	if len(left) != 2 || left[0].MAC != mac2.String() || left[1].MAC != mac2.String() {
		t.Errorf("after deleting the share's addresses: %v, want only %s's two (parent 2; parent 1, VLAN 100)", left, mac2)
	}
	if _, prio := runCtx(t, s.objs.ClassifyEgress, egress[0].frame, skbCtx{}); prio != 0 {
		t.Errorf("after deleting its addresses the share still takes its frames (priority %#x)", prio)
	}
}

// BenchmarkClassifyByAddress measures classify_egress per packet with
// BPF_PROG_RUN once a share is keyed by address: "hit" (the frame's source
// address is the share's) and "miss" (another address: what unshaped
// traffic pays on a node with address-keyed shares; BenchmarkClassify/miss
// is the same where there are none).
func BenchmarkClassifyByAddress(b *testing.B) {
	b.Run("hit", func(b *testing.B) { benchClassifyByAddress(b, "10.9.0.5", 0x10010) })
	b.Run("miss", func(b *testing.B) { benchClassifyByAddress(b, "10.9.0.6", 0) })
}

func benchClassifyByAddress(b *testing.B, src string, want uint32) {
	needRoot(b)
	s := openShaper(b, testPinDir(b))
	defer s.Close()
	if err := s.SetShareAddr(1, 0, netip.MustParseAddr("10.9.0.5"), mac1); err != nil {
		b.Fatal(err)
	}
	if err := s.SetShareByAddress(Egress, mac1, 0x10010); err != nil {
		b.Fatal(err)
	}
	frame := ipFrame(mac2, net.HardwareAddr{0, 0, 0, 0, 0, 0}, src, "10.9.0.1", false)
	frame = append(frame, make([]byte, 64-len(frame))...)
	var out skbCtx
	_, err := s.objs.ClassifyEgress.Run(&ebpf.RunOptions{Data: frame, Context: skbCtx{}, ContextOut: &out})
	nettest.SkipIfLacks(b, err, nettest.BPF("BPF_PROG_RUN"))
	if out.Priority != want {
		b.Fatalf("priority %#x, want %#x", out.Priority, want)
	}
	ret, per, err := s.objs.ClassifyEgress.Benchmark(frame, b.N, b.ResetTimer)
	if err != nil || int32(ret) != -1 {
		b.Fatalf("returned %d, %v; want TCX_NEXT (-1)", int32(ret), err)
	}
	b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
}

// An older agent recorded a VLAN share's addresses with no VLAN; the agent
// copies them into the share's VLAN at its start, in both address maps,
// once, keeping the untagged ones for programs an older agent loaded (and
// an older agent after a rollback); unprepare removes both. An address the
// VLAN already gives another share is not copied, and the copy says so.
func TestCopyAddrsToVLAN(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent = 1
	if err := s.SetShareAddr(parent, 0, netip.MustParseAddr("10.9.0.5"), mac1); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.9.0.5", "fd09::5"} {
		if err := s.AllowAddr(parent, 0, netip.MustParseAddr(a), mac1); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []int{3, 0} {
		if copied, err := s.CopyAddrsToVLAN(mac1, 100); err != nil || copied != want {
			t.Errorf("copy %d: %d copied, %v; want %d", i+1, copied, err, want)
		}
	}
	shareAddrs, _ := s.ShareAddrs()
	allowed, _ := s.AllowedAddrs()
	vlans := map[int]int{}
	for _, a := range append(shareAddrs, allowed...) {
		if a.MAC != mac1.String() {
			t.Errorf("after the copy: %+v, want only the share's entries", a)
		}
		vlans[a.VLAN]++
	}
	if len(shareAddrs) != 2 || len(allowed) != 4 || vlans[0] != 3 || vlans[100] != 3 {
		t.Errorf("after the copy: %v and %v, want each entry untagged and in VLAN 100", shareAddrs, allowed)
	}
	// mac2's 10.9.0.5 (of another parent, untagged) cannot go to VLAN 100
	// of this one: it is mac1's there.
	if err := s.AllowAddr(parent+1, 0, netip.MustParseAddr("10.9.0.5"), mac2); err != nil {
		t.Fatal(err)
	}
	if err := s.AllowAddr(parent+1, 100, netip.MustParseAddr("10.9.0.5"), mac1); err != nil {
		t.Fatal(err)
	}
	if copied, err := s.CopyAddrsToVLAN(mac2, 100); copied != 0 || !errors.Is(err, ErrAddrTaken) {
		t.Errorf("copying onto another share's address: %d copied, %v; want 0, ErrAddrTaken", copied, err)
	}
	// Unprepare removes every entry of the share, tagged or not.
	if err := s.DeletePodShares(mac1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteShareAddrs(mac1); err != nil {
		t.Fatal(err)
	}
	shareAddrs, _ = s.ShareAddrs()
	allowed, _ = s.AllowedAddrs()
	for _, a := range append(shareAddrs, allowed...) {
		if a.MAC == mac1.String() {
			t.Errorf("left after the share went: %+v", a)
		}
	}
}
