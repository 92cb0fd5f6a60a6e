package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// spoofModel is what classify_egress and pod_guard decide about a frame a
// pod sends through its share, written again in Go from the policy's
// allow-list (bpf/policy.h's header comment, issue 38) rather than from
// the C: the differential fuzzer holds the two to the same verdicts.
// vlan_present is never set by BPF_PROG_RUN, so an accelerated tag is not
// modelled. unchecked is a frame of no share's (it passes as it is).
type spoofModel struct {
	share   net.HardwareAddr
	pod     PodShare
	allowed map[netip.Addr]bool // the share's addresses in its VLAN
	// ethertypes are those its class allows besides modelEthertypes.
	ethertypes map[uint16]bool
	unchecked  bool
	// learned maps each MAC learned on the parent to its share, before the
	// frame; others are MACs that name shares or the node.
	learned map[string]string
	others  map[string]bool
}

// The fuzzed policy's bits: the class allows router advertisements, or
// modelClassEthertypes (PTP, and 0x88b5, the IEEE's local experimental).
const (
	policyRouter     = 1
	policyEthertypes = 2
)

var modelClassEthertypes = []uint16{0x88b5, 0x88f7}

// learnCap is LEARN_CAP: the MACs an allowMACChange share may send from
// besides its own.
const learnCap = 4

// mayChangeTo is whether an allowMACChange share may send from src: one
// learned for it, or a new one while it has fewer than learnCap, never
// another share's or the node's, nor one learned for another share.
func (m spoofModel) mayChangeTo(src net.HardwareAddr) bool {
	if owner, ok := m.learned[src.String()]; ok {
		return owner == m.share.String()
	}
	if m.others[src.String()] {
		return false
	}
	n := 0
	for _, owner := range m.learned {
		if owner == m.share.String() {
			n++
		}
	}
	return n < learnCap
}

// What the policy lets a pod send, as tables.
var (
	// modelEthertypes: IPv4, ARP, IPv6.
	modelEthertypes = map[uint16]bool{0x0800: true, 0x0806: true, 0x86dd: true}
	// modelIPv6Extensions: hop-by-hop, routing, fragment, destination
	// options; the policy walks modelIPv6ExtensionsMax of them.
	modelIPv6Extensions    = map[byte]bool{0: true, 43: true, 44: true, 60: true}
	modelIPv6ExtensionsMax = 4
	// modelNDTypes: router solicitation and advertisement, neighbour
	// solicitation and advertisement (redirect is refused with RA).
	modelRouterTypes = map[byte]bool{134: true, 137: true}
)

// eui64LinkLocal is the link-local address the kernel makes from mac.
func eui64LinkLocal(mac []byte) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfe, 0x80, 8: mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
}

func (m spoofModel) reason(f []byte) SpoofReason {
	if m.unchecked || len(f) < 14 {
		return 0
	}
	dst, src := f[0:6], f[6:12]
	if bytes.Equal(dst[:5], []byte{0x01, 0x80, 0xc2, 0, 0}) && dst[5] < 0x10 {
		return SpoofLinkLocal
	}
	if !bytes.Equal(src, m.share) && (!m.pod.AllowMACChange || !m.mayChangeTo(src)) {
		return SpoofSrcMAC
	}
	proto, off := binary.BigEndian.Uint16(f[12:14]), 14
	if m.pod.VLAN != 0 {
		if proto != 0x8100 || len(f) < 18 || int(binary.BigEndian.Uint16(f[14:16])&0x0fff) != m.pod.VLAN {
			return SpoofVLAN
		}
		proto, off = binary.BigEndian.Uint16(f[16:18]), 18
	}
	if proto == 0x8100 || proto == 0x88a8 {
		return SpoofVLAN
	}
	if m.ethertypes[proto] {
		return 0 // its class's: not looked into
	}
	if !modelEthertypes[proto] {
		return SpoofEthertype
	}
	switch {
	case proto == 0x0800 && m.pod.CheckIPv4:
		if len(f) < off+16 {
			return SpoofSrcIP
		}
		a := netip.AddrFrom4([4]byte(f[off+12 : off+16]))
		if a.IsUnspecified() {
			// A DHCP client's request only: UDP from 68 to 67.
			if len(f) < off+20 || f[off+9] != 17 {
				return SpoofSrcIP
			}
			l4 := off + int(f[off]&0x0f)*4
			if len(f) < l4+4 || binary.BigEndian.Uint16(f[l4:]) != 68 || binary.BigEndian.Uint16(f[l4+2:]) != 67 {
				return SpoofSrcIP
			}
			return 0
		}
		if !m.allowed[a] {
			return SpoofSrcIP
		}
	case proto == 0x0806 && m.pod.CheckIPv4:
		if len(f) < off+18 {
			return SpoofARP
		}
		a := f[off : off+18]
		spa := netip.AddrFrom4([4]byte(a[14:18]))
		if a[2] != 0x08 || a[3] != 0 || a[4] != 6 || a[5] != 4 || !bytes.Equal(a[8:14], src) || (!spa.IsUnspecified() && !m.allowed[spa]) {
			return SpoofARP
		}
	case proto == 0x86dd:
		return m.reason6(f, off, src)
	}
	return 0
}

// mayUse6 is whether a frame from src may carry a: the unspecified address
// and src's own link-local always; where the share was given IPv6
// addresses, one of them; else anything but another link-local.
func (m spoofModel) mayUse6(a netip.Addr, src []byte) bool {
	if a.IsUnspecified() || a == eui64LinkLocal(src) {
		return true
	}
	if m.pod.CheckIPv6 {
		return m.allowed[a]
	}
	b := a.As16()
	return b[0] != 0xfe || b[1]&0xc0 != 0x80 // not fe80::/10
}

func (m spoofModel) reason6(f []byte, off int, src []byte) SpoofReason {
	if len(f) < off+40 {
		return SpoofSrcIP
	}
	if !m.mayUse6(netip.AddrFrom16([16]byte(f[off+8:off+24])), src) {
		return SpoofSrcIP
	}
	end := off + 40 + int(binary.BigEndian.Uint16(f[off+4:]))
	next, at, fragmented := f[off+6], off+40, false
	for i := 0; i < modelIPv6ExtensionsMax && modelIPv6Extensions[next]; i++ {
		if len(f) < at+2 {
			return SpoofIPv6Headers
		}
		hdrNext, hdrLen := f[at], f[at+1]
		if next == 44 {
			fragmented, at = true, at+8
		} else {
			at += (int(hdrLen) + 1) * 8
		}
		next = hdrNext
	}
	if modelIPv6Extensions[next] {
		return SpoofIPv6Headers
	}
	if next != 58 {
		return 0
	}
	if fragmented || len(f) < at+4 {
		return SpoofND
	}
	typ := f[at]
	if modelRouterTypes[typ] && !m.pod.AllowRouterAdvertisements {
		return SpoofRouter
	}
	if typ < 133 || typ > 136 {
		return 0
	}
	opts := at + 8
	if typ == 134 {
		opts = at + 16 // a router advertisement's options
	}
	if typ == 135 || typ == 136 {
		if len(f) < at+24 {
			return SpoofND
		}
		if typ == 136 && !m.mayUse6(netip.AddrFrom16([16]byte(f[at+8:at+24])), src) {
			return SpoofND
		}
		opts = at + 24
	}
	// Link-layer address options (source 1, target 2): the frame's own MAC.
	for i := 0; i < 3; i++ {
		if opts >= end {
			return 0
		}
		if len(f) < opts+2 || f[opts+1] == 0 {
			return SpoofND
		}
		if f[opts] == 1 || f[opts] == 2 {
			if f[opts+1] != 1 || len(f) < opts+8 || !bytes.Equal(f[opts+2:opts+8], src) {
				return SpoofND
			}
		}
		opts += int(f[opts+1]) * 8
	}
	return 0
}

// FuzzClassifyEgress runs fuzzed frames of a pod's share, under fuzzed
// share flags, through the compiled classifier with BPF_PROG_RUN and
// compares its verdict with spoofModel's: a frame the model drops must be
// dropped (and counted under the model's reason), one it passes must pass
// in the share's class.
func FuzzClassifyEgress(f *testing.F) {
	needRoot(f)
	s := openShaper(f, testPinDir(f))
	f.Cleanup(func() { s.Close() })
	const parent, class = 1, 0x10010
	share := mac1
	cookie, err := NetnsCookie()
	if err != nil {
		f.Fatal(err)
	}
	// The share's addresses in each VLAN it may be in (the fuzzed flags
	// choose it): in VLAN 100, others than untagged. 10.9.0.6 is
	// another share's in VLAN 100, and the share's untagged.
	allowed := map[int]map[netip.Addr]bool{}
	for vlan, addrs := range map[int][]string{0: {"10.9.0.5", "fd09::5", "10.9.0.6"}, 100: {"10.9.0.7", "fd09::7"}} {
		allowed[vlan] = map[netip.Addr]bool{}
		for _, a := range addrs {
			allowed[vlan][netip.MustParseAddr(a)] = true
			if err := s.AllowAddr(parent, vlan, netip.MustParseAddr(a), share); err != nil {
				f.Fatal(err)
			}
		}
	}
	if err := s.AllowAddr(parent, 100, netip.MustParseAddr("10.9.0.6"), mac2); err != nil {
		f.Fatal(err)
	}
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	for _, seed := range [][]byte{
		ipFrame(gw, share, "10.9.0.5", "10.9.0.1", false),
		ipFrame(gw, share, "10.9.0.6", "10.9.0.1", false),
		ipFrame(gw, share, "10.9.0.5", "10.9.0.1", true),
		ipFrame(gw, share, "10.9.0.7", "10.9.0.1", true),
		ipFrame(gw, share, "fd09::5", "fd09::1", false),
		ipFrame(gw, mac2, "10.9.0.5", "10.9.0.1", false),
		arpFrame(share, share, 2, "10.9.0.1", "10.9.0.5"),
		arpFrame(share, share, 1, "0.0.0.0", "10.9.0.5"),
		ndFrame(share, 136, "fe80::1", "fd09::1"),
		ndFrame(share, 135, "fe80::1", "fd09::1"),
		ndFrame(share, 136, eui64LinkLocal(share).String(), eui64LinkLocal(share).String()),
		ndOpt(ndFrame(share, 135, eui64LinkLocal(share).String(), "fd09::1"), 1, share),
		ndOpt(ndFrame(share, 135, eui64LinkLocal(share).String(), "fd09::1"), 1, gw),
		behindHopByHop(ndFrame(share, 136, "fd09::5", "fe80::1")),
		icmp6Frame(share, 134, eui64LinkLocal(share).String()),
		ndOpt(icmp6Frame(share, 134, eui64LinkLocal(share).String()), 1, gw),
		icmp6Frame(share, 137, eui64LinkLocal(share).String()),
		icmp6Frame(share, 133, eui64LinkLocal(share).String()),
		udpFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, share, "0.0.0.0", "255.255.255.255", 68, 67),
		udpFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, share, "0.0.0.0", "255.255.255.255", 5353, 53),
		append(append([]byte{0x01, 0x80, 0xc2, 0, 0, 0x0e}, share...), append([]byte{0x88, 0xcc}, make([]byte, 46)...)...),
		append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, share...), append([]byte{0x88, 0xb5}, make([]byte, 46)...)...),
		append(append([]byte{0x01, 0x1b, 0x19, 0, 0, 0}, share...), append([]byte{0x88, 0xf7}, make([]byte, 46)...)...),
		append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, share...), append([]byte{0x81, 0x00, 0, 100, 0x88, 0xb5}, make([]byte, 46)...)...),
	} {
		for _, flags := range []uint16{0, 1 << 12, 2 << 12, 4 << 12, 6 << 12, 7<<12 | 100} {
			for _, policy := range []uint8{0, policyRouter, policyEthertypes} {
				f.Add(seed, flags, policy)
			}
		}
	}
	// Bit 15 of the fuzzed flags (unused by netns_val) sends the frame
	// with no socket of the pod's: found by source MAC, or by a MAC
	// learned for the share, and checked by the share's guard.
	const socketless = 1 << 15
	if err := s.SetShare(Egress, share, class); err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{
		ipFrame(gw, share, "10.9.0.6", "10.9.0.1", false),
		arpFrame(share, share, 2, "10.9.0.1", "10.9.0.5"),
		ipFrame(gw, mac2, "10.9.0.5", "10.9.0.1", false),
	} {
		for _, flags := range []uint16{socketless, socketless | 2<<12, socketless | 3<<12 | 7} {
			f.Add(seed, flags, uint8(0))
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, vlanFlags uint16, policy uint8) {
		if len(frame) < 14 || len(frame) > 2048 {
			return // BPF_PROG_RUN wants an Ethernet header; a frame is no larger
		}
		pod := PodShare{NetnsCookie: cookie, Parent: parent, MAC: share.String(), ClassID: class,
			VLAN: int(vlanFlags&0x0fff) % 4095, AllowMACChange: vlanFlags&(1<<12) != 0, CheckIPv4: vlanFlags&(2<<12) != 0, CheckIPv6: vlanFlags&(4<<12) != 0,
			AllowRouterAdvertisements: policy&policyRouter != 0}
		model := spoofModel{share: share, pod: pod, allowed: allowed[pod.VLAN], ethertypes: map[uint16]bool{}}
		var types []uint16
		if policy&policyEthertypes != 0 {
			types = modelClassEthertypes
			for _, et := range types {
				model.ethertypes[et] = true
			}
		}
		if err := s.AllowEthertypes(parent, share, types); err != nil {
			t.Fatal(err)
		}
		wantClass := uint32(class)
		if vlanFlags&socketless == 0 {
			// The same share again: its entry's flags are replaced.
			if err := s.SetPodShare(pod); err != nil {
				t.Fatal(err)
			}
		} else {
			k, _ := podKey(cookie, parent)
			if err := s.objs.ShareNetns.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Fatal(err)
			}
			if err := s.GuardShare(share, pod); err != nil {
				t.Fatal(err)
			}
			// Found by its source MAC or a MAC learned for the
			// share (by earlier frames); any other is not the
			// share's and passes unclassified.
			learned, err := s.Learned()
			if err != nil {
				t.Fatal(err)
			}
			src, mine := net.HardwareAddr(frame[6:12]), bytes.Equal(frame[6:12], share)
			for _, l := range learned {
				mine = mine || (l.MAC == src.String() && l.Share == share.String())
			}
			if !mine {
				model.unchecked = true
				wantClass = 0
			}
		}
		model.learned, model.others = map[string]string{}, map[string]bool{}
		learnedNow, err := s.Learned()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range learnedNow {
			model.learned[l.MAC] = l.Share
		}
		var sk shaperShareKey
		var sv shaperShareVal
		for it := s.objs.Shares.Iterate(); it.Next(&sk, &sv); {
			if m := net.HardwareAddr(sk.Mac[:]).String(); m != share.String() {
				model.others[m] = true
			}
		}
		want := model.reason(frame)
		before, _ := s.SpoofDrops()
		var out skbCtx
		r, err := s.objs.ClassifyEgress.Run(&ebpf.RunOptions{Data: frame, Context: skbCtx{Ifindex: parent}, ContextOut: &out})
		if errors.Is(err, unix.EINVAL) {
			return // a frame BPF_PROG_RUN will not build an skb of (an IPv4 type without its header)
		}
		if err != nil {
			t.Fatal(err)
		}
		ret, prio := int32(r), out.Priority
		after, _ := s.SpoofDrops()
		switch {
		case want == 0 && (ret != tcxNext || prio != wantClass):
			t.Fatalf("frame % x, share %+v, socketless %v: the classifier gave verdict %d priority %#x (drops %v, before %v); the model passes it in class %#x", frame, pod, vlanFlags&socketless != 0, ret, prio, after[share.String()], before[share.String()], wantClass)
		case want != 0 && ret != tcActShot:
			t.Fatalf("frame % x, share %+v, socketless %v: the classifier gave verdict %d; the model drops it (%v)", frame, pod, vlanFlags&socketless != 0, ret, want)
		case want != 0 && after[share.String()][want] != before[share.String()][want]+1:
			t.Fatalf("frame % x, share %+v: dropped, but not counted as %v (drops %v)", frame, pod, want, after[share.String()])
		}
	})
}
