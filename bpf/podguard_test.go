package bpf

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/carve-dra/carve/bpf/nettest"
)

// A pod guard is the policy for one share, whose MAC, parent and checks it
// carries in its frozen data: run on its own (BPF_PROG_RUN, as on the pod's
// interface), it passes the share's own frames, whatever socket sent them,
// and drops and counts what the share may not send, under the share.
// Unpinned, nothing of it is left.
func TestPodGuard(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	defer s.Close()
	const parent = 7 // the parent's ifindex on the node: not this namespace's
	share := mac1
	// The share's address in its VLAN (100); the same address without a
	// VLAN is another share's.
	if err := s.AllowAddr(parent, 100, netip.MustParseAddr("10.9.0.5"), share); err != nil {
		t.Fatal(err)
	}
	if err := s.AllowAddr(parent, 0, netip.MustParseAddr("10.9.0.5"), mac2); err != nil {
		t.Fatal(err)
	}
	if err := s.PinPodGuard("cvtest", PodShare{Parent: parent, MAC: share.String(), VLAN: 100, CheckIPv4: true}); err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(dir, "cvtest"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	gw := net.HardwareAddr{0x02, 0xee, 0, 0, 0, 1}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for _, c := range []struct {
		name   string
		frame  []byte
		reason SpoofReason
	}{
		{"own IPv4", ipFrame(gw, share, "10.9.0.5", "10.9.0.1", false), 0},
		{"own ARP request", arpFrame(share, share, 1, "10.9.0.5", "10.9.0.1"), 0},
		{"its own IPv6 link-local", ipFrame(gw, share, eui64LinkLocal(share).String(), "fe80::2", false), 0},
		{"a global IPv6 (SLAAC; IPv6 opened, no IPv6 addresses given)", ipFrame(gw, share, "2001:db8::1", "2001:db8::2", false), 0},
		{"another link-local", ipFrame(gw, share, "fe80::1", "fe80::2", false), SpoofSrcIP},
		{"DHCP", udpFrame(bcast, share, "0.0.0.0", "255.255.255.255", 68, 67), 0},
		{"the share's own VLAN, in the pod", ipFrame(gw, share, "10.9.0.5", "10.9.0.1", true), SpoofVLAN},
		{"another address", ipFrame(gw, share, "10.9.0.6", "10.9.0.1", false), SpoofSrcIP},
		{"ARP for another address", arpFrame(share, share, 2, "10.9.0.1", "10.9.0.7"), SpoofARP},
		{"another MAC", ipFrame(gw, mac2, "10.9.0.5", "10.9.0.1", false), SpoofSrcMAC},
		{"router advertisement", icmp6Frame(share, 134, eui64LinkLocal(share).String()), SpoofRouter},
	} {
		ret, _ := runCtx(t, prog, c.frame, skbCtx{Ifindex: 1})
		switch {
		case c.reason == 0 && ret != tcxNext:
			t.Errorf("%s: verdict %d, want passed", c.name, ret)
		case c.reason != 0 && ret != tcActShot:
			t.Errorf("%s: verdict %d, want dropped (%v)", c.name, ret, c.reason)
		}
	}
	drops, err := s.SpoofDrops()
	if err != nil {
		t.Fatal(err)
	}
	want := SpoofDrops{SpoofSrcMAC: 1, SpoofVLAN: 1, SpoofSrcIP: 2, SpoofARP: 1, SpoofRouter: 1}
	if got := drops[share.String()]; len(got) != len(want) {
		t.Errorf("drops of the share: %v, want %v (all: %v)", got, want, drops)
	} else {
		for r, n := range want {
			if got[r] != n {
				t.Errorf("drops of the share: %v, want %v", got, want)
			}
		}
	}
	if err := UnpinPodGuard(dir, "cvtest"); err != nil {
		t.Fatal(err)
	}
	if err := UnpinPodGuard(dir, "cvtest"); err != nil {
		t.Errorf("unpinning again: %v", err)
	}
	if _, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(dir, "cvtest"), nil); err == nil {
		t.Error("the pod guard is still pinned")
	}
}

// A pod guard holds no policy of its own: with the classifier's policy gone
// from the program array it fails closed, dropping even the share's own
// frames, and the policy run without the guard's handover drops too. Once
// an agent opens the classifier again, the guard pinned before passes the
// share's frames.
func TestPodGuardFailsClosedWithoutItsPolicy(t *testing.T) {
	needRoot(t)
	dir := testPinDir(t)
	s := openShaper(t, dir)
	defer s.Close()
	const parent = 7
	if err := s.PinPodGuard("cvclosed", PodShare{Parent: parent, MAC: mac1.String()}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = UnpinPodGuard(dir, "cvclosed") }()
	prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(dir, "cvclosed"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	own := ipFrame(mac2, mac1, "10.9.0.5", "10.9.0.1", false)
	if ret, _ := runCtx(t, prog, own, skbCtx{Ifindex: 1}); ret != tcxNext {
		t.Fatalf("the share's own frame: verdict %d, want passed", ret)
	}
	if ret, _ := runCtx(t, s.objs.PodGuardCheck, own, skbCtx{Ifindex: 1}); ret != tcActShot {
		t.Errorf("the policy without the guard's handover: verdict %d, want dropped", ret)
	}
	if err := s.objs.PodGuardPolicy.Delete(uint32(0)); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runCtx(t, prog, own, skbCtx{Ifindex: 1}); ret != tcActShot {
		t.Errorf("no policy in the array: verdict %d, want dropped", ret)
	}
	again := openShaper(t, dir)
	defer again.Close()
	if ret, _ := runCtx(t, prog, own, skbCtx{Ifindex: 1}); ret != tcxNext {
		t.Errorf("after the classifier is opened again: verdict %d, want passed", ret)
	}
}

// BenchmarkPodGuard measures pod_guard on the share's own IPv4 frame with
// BPF_PROG_RUN: what every frame a pod sends pays on its interface, on
// top of what the classifier costs it on the parent (BenchmarkClassify's
// pod rows).
func BenchmarkPodGuard(b *testing.B) {
	for _, checked := range []bool{false, true} {
		b.Run(map[bool]string{false: "mac-only", true: "addresses"}[checked], func(b *testing.B) {
			needRoot(b)
			dir := testPinDir(b)
			s := openShaper(b, dir)
			defer s.Close()
			const parent = 1
			if err := s.AllowAddr(parent, 0, netip.MustParseAddr("10.9.0.5"), mac1); err != nil {
				b.Fatal(err)
			}
			if err := s.PinPodGuard("cvbench", PodShare{Parent: parent, MAC: mac1.String(), CheckIPv4: checked, CheckIPv6: checked}); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = UnpinPodGuard(dir, "cvbench") }()
			prog, err := ebpf.LoadPinnedProgram(PodGuardProgramPath(dir, "cvbench"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer prog.Close()
			frame := make([]byte, 64)
			copy(frame, ipFrame(mac2, mac1, "10.9.0.5", "10.9.0.1", false))
			ret, per, err := prog.Benchmark(frame, b.N, b.ResetTimer)
			nettest.SkipIfLacks(b, err, nettest.BPF("BPF_PROG_RUN"))
			if int32(ret) != -1 {
				b.Fatalf("returned %d, want TCX_NEXT (-1)", int32(ret))
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/op")
		})
	}
}

// A pod's sandbox re-created takes the share's pod entry over: the old
// namespace's entry goes when the new one is recorded, by the sandbox's
// first hook (a pod of one container runs one), so re-creations never fill
// the map; another share's entries are left alone.
func TestARecreatedSandboxReplacesItsEntry(t *testing.T) {
	needRoot(t)
	s := openShaper(t, testPinDir(t))
	defer s.Close()
	const parent = 3
	for cookie := uint64(100); cookie < 110; cookie++ {
		// Sandboxes of one container and of two: every container
		// runs the hook.
		for range 2 - cookie%2 {
			if err := s.SetPodShare(PodShare{NetnsCookie: cookie, Parent: parent, MAC: mac1.String(), ClassID: 0x10010}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.SetPodShare(PodShare{NetnsCookie: 500, Parent: parent, MAC: mac2.String(), ClassID: 0x10020}); err != nil {
		t.Fatal(err)
	}
	all, err := s.PodShares()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]uint64{}
	for _, p := range all {
		got[p.MAC] = append(got[p.MAC], p.NetnsCookie)
	}
	if len(got[mac1.String()]) != 1 || got[mac1.String()][0] != 109 || len(got[mac2.String()]) != 1 {
		t.Errorf("pod entries after ten sandboxes of one share and one of another: %v; want the last sandbox's only", got)
	}
}

// BenchmarkPinPodGuard measures what a prepare pays for its share's pod
// guard: its load with the share's data and its pin (on-demand), or, from
// a pool holding one (pooled, as the agent runs), the write of its data,
// their freeze and the pin.
func BenchmarkPinPodGuard(b *testing.B) {
	needRoot(b)
	for _, pooled := range []bool{false, true} {
		b.Run(map[bool]string{false: "on-demand", true: "pooled"}[pooled], func(b *testing.B) {
			dir := testPinDir(b)
			s := openShaper(b, dir)
			defer s.Close()
			defer func() { _ = UnpinPodGuard(dir, "cvbench") }()
			if pooled {
				// The filler never runs: the loop puts a guard
				// in, untimed.
				if err := s.PreloadPodGuards(1, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				if pooled {
					b.StopTimer()
					g, err := s.loadGuard()
					if err != nil {
						b.Fatal(err)
					}
					s.pool.ready <- g
					b.StartTimer()
				}
				if err := s.PinPodGuard("cvbench", PodShare{Parent: 1, MAC: mac1.String(), CheckIPv4: true, CheckIPv6: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
