package bpf

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// arpFrame is an ARP packet (oper 1 request, 2 reply) from srcMAC with
// sender sha/spa, asking for or telling tpa.
func arpFrame(srcMAC, sha net.HardwareAddr, oper uint16, spa, tpa string) []byte {
	f := append(append([]byte{}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), srcMAC...)
	f = append(f, 0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4)
	f = binary.BigEndian.AppendUint16(f, oper)
	s, t := netip.MustParseAddr(spa).As4(), netip.MustParseAddr(tpa).As4()
	f = append(append(f, sha...), s[:]...)
	f = append(append(f, 0, 0, 0, 0, 0, 0), t[:]...)
	return append(f, make([]byte, 18)...) // padding to 60 bytes
}

// ndFrame is an ICMPv6 neighbour advertisement (136) or solicitation (135)
// from src for target.
func ndFrame(srcMAC net.HardwareAddr, typ byte, src, target string) []byte {
	f := ipFrame(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, srcMAC, src, "ff02::1", false)
	f[14+6] = 58 // next header: ICMPv6
	binary.BigEndian.PutUint16(f[14+4:], 24)
	icmp := make([]byte, 24)
	icmp[0] = typ
	t := netip.MustParseAddr(target).As16()
	copy(icmp[8:], t[:])
	return append(f, icmp...)
}

// udpFrame is an IPv4 UDP datagram from src:sport to dst:dport.
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst string, sport, dport uint16) []byte {
	f := ipFrame(dstMAC, srcMAC, src, dst, false)
	binary.BigEndian.PutUint16(f[14+2:], 28)
	udp := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, sport), dport)
	return append(f, binary.BigEndian.AppendUint32(udp, 8<<16)...)
}

// ndOpt appends a neighbour discovery link-layer address option (1:
// source, 2: target) to an ICMPv6 frame.
func ndOpt(f []byte, typ byte, mac net.HardwareAddr) []byte {
	f = append(append(f, typ, 1), mac...)
	binary.BigEndian.PutUint16(f[14+4:], binary.BigEndian.Uint16(f[14+4:])+8)
	return f
}

// behindHopByHop puts an 8-byte hop-by-hop options header between an IPv6
// frame's header and its upper header.
func behindHopByHop(f []byte) []byte {
	out := append([]byte{}, f[:14+40]...)
	next := out[14+6]
	out[14+6] = 0
	binary.BigEndian.PutUint16(out[14+4:], binary.BigEndian.Uint16(f[14+4:])+8)
	out = append(out, next, 0, 1, 4, 0, 0, 0, 0) // PadN
	return append(out, f[14+40:]...)
}

// icmp6Frame is an ICMPv6 message of typ (code 0, 8 bytes, no options)
// from src.
func icmp6Frame(srcMAC net.HardwareAddr, typ byte, src string) []byte {
	f := ndFrame(srcMAC, typ, src, "::")
	binary.BigEndian.PutUint16(f[14+4:], 8)
	return f[:14+40+8]
}

// TestSpoofedFramesAreDropped runs a pod's frames through classify_egress
// with BPF_PROG_RUN (whose socket is in this netns, recorded as the pod's),
// on the loopback device standing in for the parent: a frame that claims
// to be anyone else's (source MAC, an in-band VLAN tag, an IPv4 or IPv6
// source, an ARP sender, an ND target outside the share's addresses) is
// dropped and counted by reason; the share's own frames pass in its class.
func TestSpoofedFramesAreDropped(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, class = 1, 0x10010
	share, neighbour := mac1, mac2
	for _, a := range []string{"10.9.0.5", "fd09::5"} {
		if err := s.AllowAddr(parent, 0, netip.MustParseAddr(a), share); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AllowAddr(parent, 0, netip.MustParseAddr("10.9.0.5"), neighbour); err == nil {
		t.Error("another share was allowed the share's address")
	}
	if err := s.SetShare(Ingress, neighbour, 0x10020); err != nil {
		t.Fatal(err)
	}
	setOwnPodShare(t, s, PodShare{Parent: parent, MAC: share.String(), ClassID: class, CheckIPv4: true, CheckIPv6: true})
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ll := eui64LinkLocal(share).String() // the share's own link-local address
	tagged := ipFrame(gw, share, "10.9.0.5", "10.9.0.1", true)
	for _, c := range []struct {
		name   string
		frame  []byte
		reason SpoofReason // 0: passes
	}{
		{"own IPv4", ipFrame(gw, share, "10.9.0.5", "10.9.0.1", false), 0},
		{"own IPv6", ipFrame(gw, share, "fd09::5", "fd09::1", false), 0},
		{"its own IPv6 link-local", ipFrame(gw, share, ll, "fe80::2", false), 0},
		{"another IPv6 link-local", ipFrame(gw, share, "fe80::1", "fe80::2", false), SpoofSrcIP},
		{"DHCP from 0.0.0.0", udpFrame(bcast, share, "0.0.0.0", "255.255.255.255", 68, 67), 0},
		{"ND solicitation with its own link-layer address", ndOpt(ndFrame(share, 135, ll, "fd09::1"), 1, share), 0},
		{"own ND advertisement behind a hop-by-hop header", behindHopByHop(ndFrame(share, 136, "fd09::5", "fd09::5")), 0},
		{"router solicitation", icmp6Frame(share, 133, ll), 0},
		{"own ARP request", arpFrame(share, share, 1, "10.9.0.5", "10.9.0.1"), 0},
		{"ARP probe", arpFrame(share, share, 1, "0.0.0.0", "10.9.0.5"), 0},
		{"own ND advertisement", ndFrame(share, 136, "fd09::5", "fd09::5"), 0},
		{"ND solicitation from its link-local", ndFrame(share, 135, ll, "fd09::1"), 0},
		{"ND advertisement for its link-local", ndFrame(share, 136, ll, ll), 0},
		{"forged source MAC", ipFrame(gw, net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}, "10.9.0.5", "10.9.0.1", false), SpoofSrcMAC},
		{"a neighbour's MAC", ipFrame(gw, neighbour, "10.9.0.5", "10.9.0.1", false), SpoofSrcMAC},
		{"in-band 802.1Q tag", tagged, SpoofVLAN},
		{"forged IPv4 source", ipFrame(gw, share, "10.9.0.6", "10.9.0.1", false), SpoofSrcIP},
		{"forged IPv6 source", ipFrame(gw, share, "fd09::6", "fd09::1", false), SpoofSrcIP},
		{"ARP reply claiming the gateway", arpFrame(share, share, 2, "10.9.0.1", "10.9.0.7"), SpoofARP},
		{"ARP with a foreign sender MAC", arpFrame(share, gw, 2, "10.9.0.5", "10.9.0.7"), SpoofARP},
		{"ND advertisement for the gateway", ndFrame(share, 136, ll, "fd09::1"), SpoofND},
		{"ND advertisement for the gateway's link-local", ndFrame(share, 136, ll, "fe80::1"), SpoofND},
		{"UDP from 0.0.0.0 that is no DHCP request", udpFrame(bcast, share, "0.0.0.0", "255.255.255.255", 5353, 53), SpoofSrcIP},
		{"ND advertisement for the gateway behind a hop-by-hop header", behindHopByHop(ndFrame(share, 136, ll, "fd09::1")), SpoofND},
		{"ND solicitation naming a foreign link-layer address", ndOpt(ndFrame(share, 135, ll, "fd09::1"), 1, gw), SpoofND},
		{"router advertisement", icmp6Frame(share, 134, ll), SpoofRouter},
		{"redirect", icmp6Frame(share, 137, ll), SpoofRouter},
		{"an unknown ethertype", append(append(append([]byte{}, bcast...), share...), append([]byte{0x88, 0xb5}, make([]byte, 46)...)...), SpoofEthertype},
		{"LLDP", append(append(append([]byte{}, 0x01, 0x80, 0xc2, 0, 0, 0x0e), share...), append([]byte{0x88, 0xcc}, make([]byte, 46)...)...), SpoofLinkLocal},
		{"PAUSE", append(append(append([]byte{}, 0x01, 0x80, 0xc2, 0, 0, 0x01), share...), append([]byte{0x88, 0x08}, make([]byte, 46)...)...), SpoofLinkLocal},
	} {
		ret, prio := runCtx(t, s.objs.ClassifyEgress, c.frame, skbCtx{Ifindex: parent})
		switch {
		case c.reason == 0 && (ret != tcxNext || prio != class):
			t.Errorf("%s: verdict %d, priority %#x; want it passed in the share's class %#x", c.name, ret, prio, class)
		case c.reason != 0 && ret != tcActShot:
			t.Errorf("%s: verdict %d; want it dropped (%v)", c.name, ret, c.reason)
		}
	}
	drops, err := s.SpoofDrops()
	if err != nil {
		t.Fatal(err)
	}
	want := SpoofDrops{SpoofSrcMAC: 2, SpoofVLAN: 1, SpoofSrcIP: 4, SpoofARP: 2, SpoofND: 4, SpoofEthertype: 1, SpoofLinkLocal: 2, SpoofRouter: 2}
	if got := drops[share.String()]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("drops = %v, want %v", got, want)
	}
	if l, _ := s.Learned(); len(l) != 0 {
		t.Errorf("learned %v from a share whose class allows no MAC change", l)
	}
	if err := s.DeletePodShares(share); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.AllowedAddrs(); len(a) != 0 {
		t.Errorf("allowed addresses left after the share went: %v", a)
	}
	if d, _ := s.SpoofDrops(); len(d) != 0 {
		t.Errorf("drop counts left after the share went: %v", d)
	}
}

// A share given only IPv4 addresses, in a class that opens IPv6
// (openFamilies; the agent then leaves CheckIPv6 off), keeps the IPv6
// addresses its pod makes (SLAAC): IPv6 is unchecked, IPv4 checked.
func TestIPv4OnlyShareKeepsItsIPv6(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, class = 1, 0x10010
	if err := s.AllowAddr(parent, 0, netip.MustParseAddr("10.9.0.5"), mac1); err != nil {
		t.Fatal(err)
	}
	setOwnPodShare(t, s, PodShare{Parent: parent, MAC: mac1.String(), ClassID: class, CheckIPv4: true})
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	if ret, _ := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, mac1, "2001:db8::a8bb:ccff:fedd:eeff", "2001:db8::1", false), skbCtx{Ifindex: parent}); ret != tcxNext {
		t.Errorf("a SLAAC IPv6 source of an IPv4-only share: verdict %d, want passed", ret)
	}
	if ret, _ := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, mac1, "10.9.0.6", "10.9.0.1", false), skbCtx{Ifindex: parent}); ret != tcActShot {
		t.Errorf("a forged IPv4 source of an IPv4-only share: verdict %d, want dropped", ret)
	}
}

// A share whose class allows MAC changes sends from other MACs, which are
// learned for its ingress on that parent, at most LEARN_CAP of them, and
// never another share's MAC nor a parent's. Without an address set, any
// IP passes; tags are still dropped.
func TestMACChangeIsLearnedWithinItsCap(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, class = 1, 0x10010
	neighbour, local := mac2, net.HardwareAddr{0x02, 0x10, 0xca, 0, 0, 1}
	egressOnly := net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, 9} // a share with no ingress class
	if err := s.SetShare(Ingress, neighbour, 0x10020); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, egressOnly, 0x10030); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLocalMAC(parent, local); err != nil {
		t.Fatal(err)
	}
	setOwnPodShare(t, s, PodShare{Parent: parent, MAC: mac1.String(), ClassID: class, AllowMACChange: true})
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	// Another share's MAC, either direction, and the node's own: never
	// the pod's to send from.
	for _, src := range []net.HardwareAddr{neighbour, egressOnly, local} {
		if ret, _ := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, src, "192.0.2.9", "10.9.0.1", false), skbCtx{Ifindex: parent}); ret != tcActShot {
			t.Errorf("frame from %s: verdict %d, want dropped", src, ret)
		}
	}
	// Up to the cap, and again from a MAC learned: passed in the share's
	// class; past the cap, dropped.
	for i := range 6 {
		src := net.HardwareAddr{0x02, 0x77, 0, 0, 0, byte(i + 1)}
		ret, prio := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, src, "192.0.2.9", "10.9.0.1", false), skbCtx{Ifindex: parent})
		if i < 4 && (ret != tcxNext || prio != class) {
			t.Errorf("frame from changed MAC %d, %s: verdict %d, priority %#x; want passed in the share's class", i+1, src, ret, prio)
		}
		if i >= 4 && ret != tcActShot {
			t.Errorf("frame from changed MAC %d, %s, past the cap: verdict %d; want dropped", i+1, src, ret)
		}
	}
	if ret, prio := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, net.HardwareAddr{0x02, 0x77, 0, 0, 0, 2}, "192.0.2.9", "10.9.0.1", false), skbCtx{Ifindex: parent}); ret != tcxNext || prio != class {
		t.Errorf("a learned MAC again: verdict %d, priority %#x", ret, prio)
	}
	if d, _ := s.SpoofDrops(); d[mac1.String()][SpoofSrcMAC] != 5 {
		t.Errorf("drops %v: want 5 of source-mac (3 others', 2 past the cap)", d)
	}
	learned, err := s.Learned()
	if err != nil {
		t.Fatal(err)
	}
	if len(learned) != 4 {
		t.Errorf("learned %d MACs, want the cap of 4: %v", len(learned), learned)
	}
	for _, l := range learned {
		if l.Parent != parent || l.Share != mac1.String() || l.MAC == neighbour.String() || l.MAC == local.String() || l.MAC == egressOnly.String() {
			t.Errorf("learned %+v", l)
		}
	}
	if ret, _ := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, mac1, "192.0.2.9", "10.9.0.1", true), skbCtx{Ifindex: parent}); ret != tcActShot {
		t.Errorf("a tagged frame of a MAC-changing share: verdict %d, want dropped", ret)
	}
	if err := s.DeleteShare(Ingress, mac1); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.Learned(); len(l) != 0 {
		t.Errorf("learned MACs left after the share went: %v", l)
	}
}

// Frames a pod sends with no socket of its own namespace (its kernel's ARP
// replies, frames it forwards) are found by source MAC, or by a MAC learned
// for the share, and get the share's guard (GuardShare): the same checks as
// its socket frames. BPF_PROG_RUN's frames carry this test's netns cookie,
// so a share with no pod entry for it stands for such frames.
func TestSocketlessFramesAreGuarded(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, class = 1, 0x10010
	shaped, unshaped, unguarded := mac1, mac2, net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, 3}
	for _, m := range []net.HardwareAddr{shaped, unshaped} {
		if err := s.AllowAddr(parent, 0, netip.MustParseAddr(map[string]string{shaped.String(): "10.9.0.5", unshaped.String(): "10.9.0.6"}[m.String()]), m); err != nil {
			t.Fatal(err)
		}
	}
	// Guarded before and after its class is set: neither write loses
	// the other's.
	if err := s.GuardShare(shaped, PodShare{CheckIPv4: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, shaped, class); err != nil {
		t.Fatal(err)
	}
	if err := s.GuardShare(unshaped, PodShare{VLAN: 7, CheckIPv4: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, unguarded, 0x10030); err != nil { // a pin of an older carve
		t.Fatal(err)
	}
	if got, _ := s.Shares(); len(got) != 2 || got[Key{MAC: unshaped.String(), Dir: Egress}] != 0 {
		t.Errorf("shares %v: want the two shaped ones, not the guard-only entry", got)
	}
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	for _, c := range []struct {
		name   string
		frame  []byte
		reason SpoofReason // 0: passes
		prio   uint32
	}{
		{"own address", ipFrame(gw, shaped, "10.9.0.5", "10.9.0.1", false), 0, class},
		{"own ARP reply", arpFrame(shaped, shaped, 2, "10.9.0.5", "10.9.0.1"), 0, class},
		{"forwarded from another source", ipFrame(gw, shaped, "192.0.2.9", "10.9.0.1", false), SpoofSrcIP, 0},
		{"ARP reply for an added address", arpFrame(shaped, shaped, 2, "10.9.0.1", "10.9.0.7"), SpoofARP, 0},
		{"in-band tag", ipFrame(gw, shaped, "10.9.0.5", "10.9.0.1", true), SpoofVLAN, 0},
		{"unshaped share's ARP reply for an added address", arpFrame(unshaped, unshaped, 2, "10.9.0.1", "10.9.0.7"), SpoofVLAN, 0},
		{"an older pin's share, unguarded", ipFrame(gw, unguarded, "192.0.2.9", "10.9.0.1", false), 0, 0x10030},
		{"the host's frame", ipFrame(gw, net.HardwareAddr{0x02, 0x10, 0, 0, 0, 1}, "192.0.2.9", "10.9.0.1", false), 0, 0},
	} {
		ret, prio := runCtx(t, s.objs.ClassifyEgress, c.frame, skbCtx{Ifindex: parent})
		switch {
		case c.reason == 0 && (ret != tcxNext || prio != c.prio):
			t.Errorf("%s: verdict %d, priority %#x; want passed at priority %#x", c.name, ret, prio, c.prio)
		case c.reason != 0 && ret != tcActShot:
			t.Errorf("%s: verdict %d; want dropped (%v)", c.name, ret, c.reason)
		}
	}
	drops, _ := s.SpoofDrops()
	if want := (SpoofDrops{SpoofSrcIP: 1, SpoofARP: 1, SpoofVLAN: 1}); fmt.Sprint(drops[shaped.String()]) != fmt.Sprint(want) {
		t.Errorf("drops of the shaped share %v, want %v", drops[shaped.String()], want)
	}
	if want := (SpoofDrops{SpoofVLAN: 1}); fmt.Sprint(drops[unshaped.String()]) != fmt.Sprint(want) {
		t.Errorf("drops of the unshaped share %v, want %v", drops[unshaped.String()], want)
	}

	// A pod whose class allows MAC changes takes another MAC: its socket
	// frames teach the classifier, and its socket-less frames from that
	// MAC are then the share's, guarded.
	changer := net.HardwareAddr{0x02, 0xca, 0x7e, 0, 0, 4}
	taken := net.HardwareAddr{0x02, 0x77, 0, 0, 0, 9}
	if err := s.AllowAddr(parent, 0, netip.MustParseAddr("10.9.0.8"), changer); err != nil {
		t.Fatal(err)
	}
	guard := PodShare{Parent: parent, MAC: changer.String(), ClassID: 0x10040, AllowMACChange: true, CheckIPv4: true}
	if err := s.GuardShare(changer, guard); err != nil {
		t.Fatal(err)
	}
	if err := s.SetShare(Egress, changer, 0x10040); err != nil {
		t.Fatal(err)
	}
	guard = setOwnPodShare(t, s, guard)
	if ret, _ := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, taken, "10.9.0.8", "10.9.0.1", false), skbCtx{Ifindex: parent}); ret != tcxNext {
		t.Fatalf("the pod's socket frame from its new MAC: verdict %d", ret)
	}
	k, _ := podKey(guard.NetnsCookie, parent)
	if err := s.objs.ShareNetns.Delete(&k); err != nil { // from here on, socket-less
		t.Fatal(err)
	}
	if ret, prio := runCtx(t, s.objs.ClassifyEgress, arpFrame(taken, taken, 2, "10.9.0.8", "10.9.0.1"), skbCtx{Ifindex: parent}); ret != tcxNext || prio != 0x10040 {
		t.Errorf("its kernel's ARP reply from the learned MAC: verdict %d, priority %#x; want passed in its class", ret, prio)
	}
	if ret, _ := runCtx(t, s.objs.ClassifyEgress, arpFrame(taken, taken, 2, "10.9.0.1", "10.9.0.8"), skbCtx{Ifindex: parent}); ret != tcActShot {
		t.Errorf("its kernel's ARP reply for an added address, from the learned MAC: verdict %d; want dropped", ret)
	}
	if err := s.DeleteShare(Egress, shaped); err != nil {
		t.Fatal(err)
	}
	if ret, prio := runCtx(t, s.objs.ClassifyEgress, ipFrame(gw, shaped, "192.0.2.9", "10.9.0.1", false), skbCtx{Ifindex: parent}); ret != tcxNext || prio != 0 {
		t.Errorf("after the share went: verdict %d, priority %#x; want passed, unclassified", ret, prio)
	}
}

// setOwnPodShare records p as the share of this test's own network
// namespace, whose cookie BPF_PROG_RUN's frames carry (they stand for a
// pod's socket frames), and returns it with the cookie set.
func setOwnPodShare(t testing.TB, s *Shaper, p PodShare) PodShare {
	t.Helper()
	cookie, err := NetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	p.NetnsCookie = cookie
	if err := s.SetPodShare(p); err != nil {
		t.Fatal(err)
	}
	return p
}
