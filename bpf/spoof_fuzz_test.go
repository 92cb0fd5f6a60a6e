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

// spoofModel is what classify_egress decides about a frame a pod sends
// through its share, written again in Go from the rules (SR-IOV spoofchk,
// extended to IP) rather than from the C: the differential fuzzer holds
// the two to the same verdicts. vlan_present is never set by BPF_PROG_RUN,
// so an accelerated tag is not modelled.
type spoofModel struct {
	share   net.HardwareAddr
	pod     PodShare
	allowed map[netip.Addr]bool
}

func (m spoofModel) reason(f []byte) SpoofReason {
	if len(f) < 14 {
		return 0
	}
	if src := net.HardwareAddr(f[6:12]); !bytes.Equal(src, m.share) && !m.pod.AllowMACChange {
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
	ok4 := func(b []byte) bool { a := netip.AddrFrom4([4]byte(b)); return a.IsUnspecified() || m.allowed[a] }
	own6 := func(b []byte) bool {
		a := netip.AddrFrom16([16]byte(b))
		return a.IsUnspecified() || a.IsLinkLocalUnicast() || (b[0] == 0xfe && b[1]&0xc0 == 0x80) || m.allowed[a]
	}
	switch {
	case proto == 0x0800 && m.pod.CheckIPv4:
		if len(f) < off+16 || !ok4(f[off+12:off+16]) {
			return SpoofSrcIP
		}
	case proto == 0x0806 && m.pod.CheckIPv4:
		if len(f) < off+18 {
			return SpoofARP
		}
		a := f[off : off+18]
		if a[2] != 0x08 || a[3] != 0 || a[4] != 6 || a[5] != 4 || !bytes.Equal(a[8:14], f[6:12]) || !ok4(a[14:18]) {
			return SpoofARP
		}
	case proto == 0x86dd && m.pod.CheckIPv6:
		if len(f) < off+40 || !own6(f[off+8:off+24]) {
			return SpoofSrcIP
		}
		if f[off+6] != 58 || len(f) < off+40+24 || f[off+40] != 136 {
			return 0
		}
		if !own6(f[off+48 : off+64]) {
			return SpoofND
		}
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
	allowed := map[netip.Addr]bool{}
	for _, a := range []string{"10.9.0.5", "fd09::5"} {
		allowed[netip.MustParseAddr(a)] = true
		if err := s.AllowAddr(parent, netip.MustParseAddr(a), share); err != nil {
			f.Fatal(err)
		}
	}
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	for _, seed := range [][]byte{
		ipFrame(gw, share, "10.9.0.5", "10.9.0.1", false),
		ipFrame(gw, share, "10.9.0.6", "10.9.0.1", false),
		ipFrame(gw, share, "10.9.0.5", "10.9.0.1", true),
		ipFrame(gw, share, "fd09::5", "fd09::1", false),
		ipFrame(gw, mac2, "10.9.0.5", "10.9.0.1", false),
		arpFrame(share, share, 2, "10.9.0.1", "10.9.0.5"),
		arpFrame(share, share, 1, "0.0.0.0", "10.9.0.5"),
		ndFrame(share, 136, "fe80::1", "fd09::1"),
		ndFrame(share, 135, "fe80::1", "fd09::1"),
	} {
		for _, flags := range []uint16{0, 1 << 12, 2 << 12, 4 << 12, 6 << 12, 7<<12 | 100} {
			f.Add(seed, flags)
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
			f.Add(seed, flags)
		}
	}
	f.Fuzz(func(t *testing.T, frame []byte, vlanFlags uint16) {
		if len(frame) < 14 || len(frame) > 2048 {
			return // BPF_PROG_RUN wants an Ethernet header; a frame is no larger
		}
		pod := PodShare{NetnsCookie: cookie, Parent: parent, MAC: share.String(), ClassID: class,
			VLAN: int(vlanFlags&0x0fff) % 4095, AllowMACChange: vlanFlags&(1<<12) != 0, CheckIPv4: vlanFlags&(2<<12) != 0, CheckIPv6: vlanFlags&(4<<12) != 0}
		model := spoofModel{share: share, pod: pod, allowed: allowed}
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
				model.pod.AllowMACChange, model.pod.VLAN, model.pod.CheckIPv4, model.pod.CheckIPv6 = true, 0, false, false
				wantClass = 0
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
