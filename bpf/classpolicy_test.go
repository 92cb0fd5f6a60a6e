package bpf

import (
	"net"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// A class that lists more ethertypes lets its shares send frames of those
// (and only those: another unknown one is still dropped, a link-local
// destination and a foreign source MAC still are, whatever the type); a
// class that allows router advertisements lets its shares send those and
// redirects, with their link-layer options still the frame's own MAC. The
// same on the parent (classify_egress) and on the pod's own interface
// (pod_guard). The share's entries go with its pod entry.
func TestClassPolicyOpensOnlyWhatItLists(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent, class = 1, 0x10010
	share, other := mac1, mac2
	ll := eui64LinkLocal(share).String()
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	raw := func(dst, src net.HardwareAddr, proto ...byte) []byte {
		return append(append(append([]byte{}, dst...), src...), append(proto, make([]byte, 46)...)...)
	}
	ptp := raw(bcast, share, 0x88, 0xf7)
	ptpLinkLocal := raw(net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}, share, 0x88, 0xf7)
	ptpForged := raw(bcast, net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}, 0x88, 0xf7)
	experimental := raw(bcast, share, 0x88, 0xb5)
	ra, redirect := icmp6Frame(share, 134, ll), icmp6Frame(share, 137, ll)
	raForeignOption := ndOpt(raWithBody(share, ll), 1, net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1})
	raOwnOption := ndOpt(raWithBody(share, ll), 1, share)

	if err := s.AllowEthertypes(parent, share, []uint16{0x8100}); err == nil {
		t.Error("an 802.1Q tag was allowed as a share's ethertype")
	}
	if err := s.AllowEthertypes(parent, share, []uint16{0x05dc}); err == nil {
		t.Error("an 802.3 length was allowed as a share's ethertype")
	}
	type verdicts map[string]SpoofReason // frame name: 0 passes
	frames := map[string][]byte{"ptp": ptp, "ptp to 01:80:c2:00:00:0e": ptpLinkLocal, "ptp from a forged MAC": ptpForged,
		"0x88b5": experimental, "router advertisement": ra, "redirect": redirect,
		"router advertisement with a foreign link-layer option": raForeignOption, "router advertisement with its own link-layer option": raOwnOption}
	check := func(what string, pod PodShare, want verdicts) {
		t.Helper()
		setOwnPodShare(t, s, pod)
		if err := s.PinPodGuard("guard", pod); err != nil {
			t.Fatal(err)
		}
		guard := loadPinnedGuard(t, s, "guard")
		for name, reason := range want {
			for _, at := range []struct {
				where string
				run   func([]byte) (int32, uint32)
			}{
				{"parent", func(f []byte) (int32, uint32) { return runCtx(t, s.objs.ClassifyEgress, f, skbCtx{Ifindex: parent}) }},
				{"pod", func(f []byte) (int32, uint32) { return runCtx(t, guard, f, skbCtx{Ifindex: 1}) }},
			} {
				ret, _ := at.run(frames[name])
				if pass := ret == tcxNext; pass != (reason == 0) {
					t.Errorf("%s, %s on the %s: verdict %d, want %v", what, name, at.where, ret, map[bool]string{true: "passed", false: "dropped (" + reason.String() + ")"}[reason == 0])
				}
			}
		}
	}
	pod := PodShare{Parent: parent, MAC: share.String(), ClassID: class, CheckIPv4: true, CheckIPv6: true}
	check("the default class", pod, verdicts{"ptp": SpoofEthertype, "0x88b5": SpoofEthertype, "router advertisement": SpoofRouter, "redirect": SpoofRouter,
		"router advertisement with its own link-layer option": SpoofRouter})

	if err := s.AllowEthertypes(parent, share, []uint16{0x88f7}); err != nil {
		t.Fatal(err)
	}
	if err := s.AllowEthertypes(parent, other, []uint16{0x88b5}); err != nil {
		t.Fatal(err)
	}
	pod.AllowRouterAdvertisements = true
	check("a class with ethertypes [0x88F7] and allowRouterAdvertisements", pod, verdicts{
		"ptp": 0, "ptp to 01:80:c2:00:00:0e": SpoofLinkLocal, "ptp from a forged MAC": SpoofSrcMAC,
		"0x88b5":               SpoofEthertype, // another share's type, not this one's
		"router advertisement": 0, "redirect": 0, "router advertisement with its own link-layer option": 0,
		"router advertisement with a foreign link-layer option": SpoofND})

	if got, _ := s.Ethertypes(share); !slices.Equal(got, []uint16{0x88f7}) {
		t.Errorf("the share's ethertypes %#04x, want [0x88f7]", got)
	}
	// A class's list that shrank leaves none of the old.
	if err := s.AllowEthertypes(parent, share, nil); err != nil {
		t.Fatal(err)
	}
	pod.AllowRouterAdvertisements = false
	check("the class again without them", pod, verdicts{"ptp": SpoofEthertype, "router advertisement": SpoofRouter})
	if err := s.AllowEthertypes(parent, share, []uint16{0x88f7}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePodShares(share); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Ethertypes(share); len(got) != 0 {
		t.Errorf("ethertypes %#04x left after the share went", got)
	}
	if got, _ := s.Ethertypes(other); !slices.Equal(got, []uint16{0x88b5}) {
		t.Errorf("the other share's ethertypes %#04x, want [0x88b5] kept", got)
	}
}

// raWithBody is a router advertisement from the share's link-local src
// with its 16-byte body, to which options may be appended (ndOpt).
func raWithBody(mac net.HardwareAddr, src string) []byte {
	f := ndFrame(mac, 134, src, "::")
	f[14+4], f[14+5] = 0, 16
	return f[:14+40+16]
}

// loadPinnedGuard opens the pod guard the shaper pinned under name.
func loadPinnedGuard(t *testing.T, s *Shaper, name string) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(s.pinDir, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}
