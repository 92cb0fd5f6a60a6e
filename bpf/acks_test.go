package bpf

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// tcpFrame is an Ethernet frame to dstMAC carrying a TCP segment from src
// to dst with the given flags and payload length. opts is the TCP options'
// length (a multiple of 4). A fragment sets IPv4's more-fragments bit; an
// IPv6 frame with hopByHop puts a hop-by-hop header before TCP.
func tcpFrame(dstMAC net.HardwareAddr, src, dst string, flags byte, payload, opts int, fragment, hopByHop bool) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	f := append(append([]byte{}, dstMAC...), 0x02, 0xee, 0, 0, 0, 1)
	tcp := make([]byte, 20+opts+payload)
	binary.BigEndian.PutUint16(tcp[0:], 5201)
	binary.BigEndian.PutUint16(tcp[2:], 40000)
	tcp[12] = byte((20+opts)/4) << 4
	tcp[13] = flags
	if s.Is4() {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20)
		ip[0], ip[8], ip[9] = 0x45, 64, 6
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		if fragment {
			ip[6] = 0x20
		}
		s4, d4 := s.As4(), d.As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], d4[:])
		return append(append(f, ip...), tcp...)
	}
	f = append(f, 0x86, 0xdd)
	ip := make([]byte, 40)
	ip[0], ip[6], ip[7] = 0x60, 6, 64
	l4 := tcp
	if hopByHop {
		ip[6] = 0 // hop-by-hop, then TCP
		l4 = append([]byte{6, 0, 1, 4, 0, 0, 0, 0}, tcp...)
	}
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	s16, d16 := s.As16(), d.As16()
	copy(ip[8:], s16[:])
	copy(ip[24:], d16[:])
	return append(append(f, ip...), l4...)
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
	tcpURG = 0x20
	tcpECE = 0x40
	tcpCWR = 0x80
)

// ackShares opens a classifier with two ingress shares on lo (ifindex 1,
// standing in for the parent): mac1 flow-isolated at rate bits/s, mac2 not.
func ackShares(t *testing.T, rate uint64) *Shaper {
	t.Helper()
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	const parent, ingressClass = 1, 0x10020
	if err := s.objs.IfbOf.Put(uint32(parent), uint32(7)); err != nil { // any IFB: the redirect is not carried out
		t.Fatal(err)
	}
	for _, m := range []net.HardwareAddr{mac1, mac2} {
		if err := s.SetShare(Ingress, m, ingressClass); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetShareQueue(Ingress, mac1, ShareQueue{BitsPerSec: rate, ClassIfindex: parent, Minor: 0x20}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPureACKsSkipTheIFB runs redirect_ingress (on lo, standing in for the
// parent) on frames towards a flow-isolated 10M share: pure ACKs, and only
// they, stay on the parent (verdict -1) and are counted as the share's;
// everything else, and pure ACKs past the budget or of a share without flow
// isolation, is redirected to the IFB (7).
func TestPureACKsSkipTheIFB(t *testing.T) {
	s := ackShares(t, 10e6)
	defer s.Close()

	cases := []struct {
		name string
		mac  net.HardwareAddr
		f    []byte
		skip bool
	}{
		{"IPv4 pure ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK, 0, 0, false, false), true},
		{"IPv4 pure ACK with timestamps and SACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK, 0, 20, false, false), true},
		{"IPv4 pure ACK with ECE and CWR", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK|tcpECE|tcpCWR, 0, 12, false, false), true},
		{"IPv6 pure ACK", mac1, tcpFrame(mac1, "fd09::1", "fd09::5", tcpACK, 0, 12, false, false), true},
		{"IPv4 ACK with a byte of data", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK, 1, 0, false, false), false},
		{"IPv6 ACK with data", mac1, tcpFrame(mac1, "fd09::1", "fd09::5", tcpACK, 1448, 12, false, false), false},
		{"IPv4 SYN-ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpSYN|tcpACK, 0, 20, false, false), false},
		{"IPv4 FIN-ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpFIN|tcpACK, 0, 0, false, false), false},
		{"IPv4 RST-ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpRST|tcpACK, 0, 0, false, false), false},
		{"IPv4 PSH-ACK, no data", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpPSH|tcpACK, 0, 0, false, false), false},
		{"IPv4 URG-ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpURG|tcpACK, 0, 0, false, false), false},
		{"IPv4 no ACK flag", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpECE, 0, 0, false, false), false},
		{"IPv4 fragment of a pure ACK", mac1, tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK, 0, 0, true, false), false},
		{"IPv6 pure ACK behind a hop-by-hop header", mac1, tcpFrame(mac1, "fd09::1", "fd09::5", tcpACK, 0, 0, false, true), false},
		{"UDP", mac1, ipFrame(mac1, net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}, "10.9.0.1", "10.9.0.5", false), false},
		{"IPv4 pure ACK to a share with no flow isolation", mac2, tcpFrame(mac2, "10.9.0.1", "10.9.0.5", tcpACK, 0, 0, false, false), false},
	}
	for _, c := range cases {
		before, _ := s.Stats()
		ret, _ := runCtx(t, s.objs.RedirectIngress, c.f, skbCtx{})
		after, _ := s.Stats()
		counted := after[Key{c.mac.String(), Ingress}].Packets - before[Key{c.mac.String(), Ingress}].Packets
		want, wantCounted := int32(7), uint64(0)
		if c.skip {
			want, wantCounted = -1, 1
		}
		if ret != want || counted != wantCounted {
			t.Errorf("%s: verdict %d, %d counted; want %d, %d", c.name, ret, counted, want, wantCounted)
		}
	}
}

// TestPureACKBudget: a share's pure ACKs skip its IFB at 1/16 of its rate,
// after a burst of 16 minimum frames; past that they are redirected, so a
// flood of empty ACKs towards a pod is shaped as its other frames are.
func TestPureACKBudget(t *testing.T) {
	const rate = 10e6
	s := ackShares(t, rate)
	defer s.Close()
	ack := tcpFrame(mac1, "10.9.0.1", "10.9.0.5", tcpACK, 0, 12, false, false)
	perSec := rate / 8 / 16            // bytes a second that may skip
	burst := 16 * 64 / perSec          // seconds of budget held
	cost := float64(len(ack)) / perSec // seconds a frame spends
	for _, flood := range []int{200, 2000} {
		time.Sleep(time.Duration(2 * burst * float64(time.Second))) // the budget refills
		t0 := time.Now()
		skipped := 0
		for range flood {
			if ret, _ := runCtx(t, s.objs.RedirectIngress, ack, skbCtx{}); ret == -1 {
				skipped++
			}
		}
		elapsed := time.Since(t0).Seconds()
		lo := int(burst / cost)
		hi := int((burst+elapsed)/cost) + 1
		t.Logf("%d pure ACKs of %d bytes in %.1f ms: %d skipped the IFB, want %d–%d", flood, len(ack), elapsed*1e3, skipped, lo, hi)
		if skipped < lo || skipped > hi {
			t.Errorf("%d pure ACKs in %.1f ms: %d skipped, want %d–%d", flood, elapsed*1e3, skipped, lo, hi)
		}
	}
}
