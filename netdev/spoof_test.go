package netdev_test

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
	"github.com/carve-dra/carve/prepare/hook"
)

// A pod cannot leave its share by what it puts in a frame. Raw frames
// (CAP_NET_RAW, which pods have by default) with a foreign source MAC, the
// neighbour's MAC, a forged source IP or an in-band VLAN tag are dropped
// on the parent before any reaches the wire, counted by reason, and never
// charged to the neighbour; after changing its interface's MAC
// (CAP_NET_ADMIN) the pod's traffic is dropped too. Its own frames pass.
func TestSpoofedFramesNeverLeave(t *testing.T) {
	b := newBench(t)
	a := b.add("spoofer", "20M", "20M", nil)
	n := b.add("neighbour", "500M", "", nil)
	srv, err := netlink.NewHandleAt(b.tp.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, _ := srv.LinkByName("peer0")
	srvMAC := peer.Attrs().HardwareAddr

	// rxBytes is what the server's end of the wire received while fn ran.
	rxBytes := func(fn func()) uint64 {
		t.Helper()
		quiet(t, b.tp.Server, "peer0")
		before, err := nettest.RxBytes(b.tp.Server, "peer0")
		if err != nil {
			t.Fatal(err)
		}
		fn()
		time.Sleep(100 * time.Millisecond) // what is queued drains
		after, _ := nettest.RxBytes(b.tp.Server, "peer0")
		return after - before
	}
	shareMAC, _ := net.ParseMAC(a.mac)
	neighbourMAC, _ := net.ParseMAC(n.mac)
	udp := func(src net.HardwareAddr, srcIP string) []byte {
		return nettest.UDPFrame(src, srvMAC, net.ParseIP(srcIP), net.ParseIP(b.tp.ServerIP), 1400)
	}
	for _, c := range []struct {
		name   string
		frame  []byte
		reason bpf.SpoofReason
	}{
		{"a MAC of no share", udp(net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}, a.ip), bpf.SpoofSrcMAC},
		{"the neighbour's MAC", udp(neighbourMAC, a.ip), bpf.SpoofSrcMAC},
		{"the neighbour's address", udp(shareMAC, n.ip), bpf.SpoofSrcIP},
		{"an address of no share", udp(shareMAC, "10.77.0.250"), bpf.SpoofSrcIP},
		{"an in-band VLAN tag", nettest.Tagged(udp(shareMAC, a.ip), 100), bpf.SpoofVLAN},
		{"ARP replies claiming the neighbour's address", nettest.ARPReply(shareMAC, srvMAC, net.ParseIP(n.ip), net.ParseIP(b.tp.ServerIP)), bpf.SpoofARP},
	} {
		before, _ := b.shaper.Stats()
		dropsBefore, _ := b.shaper.SpoofDrops()
		var sent int
		got := rxBytes(func() {
			sent, err = nettest.RawSend(a.pod, "net1", c.frame, time.Second)
			if err != nil {
				t.Fatal(err)
			}
		})
		after, _ := b.shaper.Stats()
		drops, _ := b.shaper.SpoofDrops()
		charged := after[egressKey(n.mac)].Bytes - before[egressKey(n.mac)].Bytes
		dropped := drops[a.mac][c.reason] - dropsBefore[a.mac][c.reason]
		t.Logf("raw frames from %s: %d sent, %d dropped as %v, the wire got %d bytes, the neighbour was charged %d", c.name, sent, dropped, c.reason, got, charged)
		if got > 20_000 { // a few stray ARP or ND frames at most
			t.Errorf("raw frames from %s: %d bytes reached the wire", c.name, got)
		}
		// A dropped frame fails the sender's send (the parent's
		// qdisc layer answers NET_XMIT_DROP), so sent counts what got
		// past the classifier: nothing.
		if dropped < 1000 || sent > 10 {
			t.Errorf("raw frames from %s: %d sent past the classifier, %d counted as %v drops", c.name, sent, dropped, c.reason)
		}
		if charged > 10_000 {
			t.Errorf("raw frames from %s: %d bytes charged to the neighbour's share", c.name, charged)
		}
	}
	// The drops are in the metrics, by reason, under the spoofer's claim.
	reg := prometheus.NewRegistry()
	reg.MustRegister(b.p)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	reported := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "carve_share_spoofed_frames_dropped_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["claim"] == "default/spoofer" {
				reported[labels["reason"]] = m.GetCounter().GetValue()
			}
		}
	}
	if reported["source-mac"] < 1000 || reported["source-ip"] < 1000 {
		t.Errorf("spoofed-frame drops in the metrics: %v", reported)
	}
	// Its own traffic still passes, held to its share.
	goodput, _ := b.measure(bpf.Egress, []*share{a}, 2*time.Second)
	if goodput[0] < 0.8*rate("20M") || goodput[0] > 1.1*rate("20M") { // passes; conformance is measured elsewhere
		t.Errorf("the pod's own TCP: %.1f Mbit/s, want its 20M share", goodput[0]/1e6)
	}

	// NET_ADMIN: the pod changes its interface's MAC; its class allows no
	// change, so what it sends from the new MAC never leaves.
	quiet(t, b.tp.Server, "peer0") // the TCP flow's tail has drained
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, _ := pod.LinkByName("net1")
	if err := pod.LinkSetHardwareAddr(net1, net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 2}); err != nil {
		t.Fatal(err)
	}
	got := rxBytes(func() {
		_, _ = nettest.RawFlood(a.pod, "net1", net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 2}, srvMAC, net.ParseIP(a.ip), net.ParseIP(b.tp.ServerIP), 1400, time.Second)
	})
	if got > 20_000 {
		t.Errorf("after changing its MAC the pod put %d bytes on the wire", got)
	}
	if learned, _ := b.shaper.Learned(); len(learned) != 0 {
		t.Errorf("learned %v for a share whose class allows no MAC change", learned)
	}
}

// A share whose DeviceClass sets allowMACChange keeps working after its pod
// changes its interface's MAC, both ways, and is still held to its share:
// the classifier learns the new MAC for its ingress.
func TestAllowedMACChangeStaysInItsShare(t *testing.T) {
	b := newBench(t)
	a := b.add("changer", "20M", "20M", &v1alpha1.NetworkConfig{Pools: []string{"test"}, AllowMACChange: true})
	limit := rate("20M")
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, _ := pod.LinkByName("net1")
	if err := pod.LinkSetHardwareAddr(net1, net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 2}); err != nil {
		t.Fatal(err)
	}
	goodput, _ := b.measure(bpf.Egress, []*share{a}, 2*time.Second)
	t.Logf("after changing its MAC: %.1f Mbit/s of TCP (share 20M)", goodput[0]/1e6)
	if goodput[0] < 0.8*limit || goodput[0] > 1.1*limit {
		t.Errorf("after changing its MAC the pod sent %.1f Mbit/s; want its 20M share", goodput[0]/1e6)
	}
	// Towards it too: the server learns the new MAC by ARP, the pod's
	// answer teaches the classifier, and its ingress class holds.
	if err := b.tp.Exec("srv", "ip", "neigh", "flush", "all").Run(); err != nil {
		t.Fatal(err)
	}
	goodput, _ = b.measure(bpf.Ingress, []*share{a}, 2*time.Second)
	t.Logf("towards it after changing its MAC: %.1f Mbit/s of TCP (share 20M)", goodput[0]/1e6)
	if goodput[0] < 0.8*limit || goodput[0] > 1.1*limit {
		t.Errorf("after changing its MAC the pod received %.1f Mbit/s; want its 20M share", goodput[0]/1e6)
	}
	learned, _ := b.shaper.Learned()
	if len(learned) != 1 || learned[0].MAC != "02:ba:d0:00:00:02" || learned[0].Share != a.mac {
		t.Errorf("learned MACs %v: want 02:ba:d0:00:00:02 for the share %s", learned, a.mac)
	}
}

// quiet waits until the wire into ifName in ns is quiet (under 2 KB in
// 200 ms: stray ARP and ND only), for at most 5 s.
func quiet(t *testing.T, ns netns.NsHandle, ifName string) {
	t.Helper()
	last, _ := nettest.RxBytes(ns, ifName)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		now, _ := nettest.RxBytes(ns, ifName)
		if now-last < 2048 {
			return
		}
		last = now
	}
	t.Fatalf("the wire into %s never went quiet", ifName)
}

func egressKey(mac string) bpf.Key { return bpf.Key{MAC: mac, Dir: bpf.Egress} }

// A pod with CAP_NET_ADMIN that adds an address of no share to its
// interface makes its own kernel answer ARP for that address. Those replies
// have no socket of the pod's (the kernel sends them), so the classifier
// finds them by source MAC; they get the same checks as the pod's socket
// frames, and a peer on the wire never learns the stolen address.
func TestKernelARPRepliesForAStolenAddressNeverLeave(t *testing.T) {
	b := newBench(t)
	a := b.add("thief", "20M", "20M", nil)
	const stolen = "10.77.0.250" // in the parent's subnet, no share's
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, _ := pod.LinkByName("net1")
	if err := pod.AddrAdd(net1, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(stolen), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	srv, err := netlink.NewHandleAt(b.tp.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, _ := srv.LinkByName("peer0")
	// resolved asks, from the server, who has addr (a datagram towards it
	// makes the server's kernel ARP), and returns the MAC the server then
	// holds for it, if any.
	resolved := func(addr string) net.HardwareAddr {
		t.Helper()
		if err := hook.InNetns(b.tp.Server, func() error {
			c, err := net.Dial("udp", net.JoinHostPort(addr, "9"))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("who"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			neighs, err := srv.NeighList(peer.Attrs().Index, netlink.FAMILY_V4)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range neighs {
				if n.IP.Equal(net.ParseIP(addr)) && len(n.HardwareAddr) == 6 && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
					return n.HardwareAddr
				}
			}
		}
		return nil
	}
	dropsBefore, _ := b.shaper.SpoofDrops()
	if mac := resolved(stolen); mac != nil {
		t.Errorf("the server learned the stolen address %s at %s: the pod's kernel's ARP reply left", stolen, mac)
	}
	drops, _ := b.shaper.SpoofDrops()
	dropped := drops[a.mac][bpf.SpoofARP] - dropsBefore[a.mac][bpf.SpoofARP]
	t.Logf("ARP replies for the stolen address dropped: %d", dropped)
	if dropped == 0 {
		t.Errorf("no ARP reply counted as dropped (%v)", drops[a.mac])
	}
	// The pod's own address still resolves: its kernel's replies for it
	// pass.
	if mac := resolved(a.ip); mac.String() != a.mac {
		t.Errorf("the server holds %v for the pod's own address %s; want its share's MAC %s", mac, a.ip, a.mac)
	}
}

// What a pod's kernel sends on its own, with no socket of the pod's, is
// checked too: on the pod's interface (the pod guard), where no frame's
// namespace need be known. A pod with CAP_NET_ADMIN (root in a test
// namespace), in a class that allows no MAC change, changes its MAC and
// takes an address of no share of its; the server's ARP request for that
// address gets the pod's kernel's reply, which never reaches the server,
// and the server never learns the pod's MAC for it. The reply is counted
// as the share's dropped frame. The same for a share with no bandwidth
// limit, which has no class on the parent at all, and for a whole-device
// claim (no share id). A pod gets CAP_NET_ADMIN only where its class sets
// allowNetAdmin, and then its guard is a TCX link (bpf.PodHookLink); the
// others' guard is a cls_bpf filter, which holds against such a pod just
// the same (the first case).
func TestSocketlessFramesOfAChangedMACNeverLeave(t *testing.T) {
	netAdmin := &v1alpha1.NetworkConfig{AllowNetAdmin: true}
	for _, c := range []struct {
		name, rate  string
		wholeDevice bool
		cfg         *v1alpha1.NetworkConfig
	}{
		{"share 20M, filter guard", "20M", false, nil},
		{"share 20M", "20M", false, netAdmin},
		{"share without a limit", "", false, netAdmin},
		{"whole device", "", true, netAdmin},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBench(t)
			var a *share
			if c.wholeDevice {
				alloc := b.alloc("kernel-arp", "", "")
				alloc.ShareID = nil
				alloc.Config, _ = json.Marshal(prepare.EffectiveConfig{Network: c.cfg})
				a = b.addAlloc("kernel-arp", alloc)
			} else {
				a = b.add("kernel-arp", c.rate, c.rate, c.cfg)
			}
			socketlessARPOfAChangedMAC(t, b, a)
		})
	}
}

func socketlessARPOfAChangedMAC(t *testing.T, b *bench, a *share) {
	// Before 6.6, and for a share whose class lets no pod have
	// CAP_NET_ADMIN, the guard is a cls_bpf filter with no link: its
	// interface is recorded instead, which cannot say when the interface
	// goes (bpf/podguard_legacy.go). Such a pod cannot delete it; its
	// namespace's end takes it, and the hook records it again in a
	// recreated sandbox.
	noTCX := nettest.LacksTCX(t) || !a.spec.AllowNetAdmin
	if st, err := bpf.PodGuardState(b.pinDir, a.spec.HostName); err != nil || st != bpf.PodGuardAttached {
		t.Errorf("the share's pod guard: %q, %v; want attached", st, err)
	}
	const stolen = "10.77.0.250"
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	changed := net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 3}
	if err := pod.LinkSetHardwareAddr(net1, changed); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(stolen + "/32")
	if err := pod.AddrAdd(net1, addr); err != nil {
		t.Fatal(err)
	}
	srv, err := netlink.NewHandleAt(b.tp.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, _ := srv.LinkByName("peer0")
	srvMAC := peer.Attrs().HardwareAddr
	// ARP requests from the server for the address, for 200 ms: the
	// pod's kernel answers each from its changed MAC.
	request := append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srvMAC...), 0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4, 0, 1)
	request = append(append(request, srvMAC...), net.ParseIP(b.tp.ServerIP).To4()...)
	request = append(append(request, 0, 0, 0, 0, 0, 0), net.ParseIP(stolen).To4()...)
	request = append(request, make([]byte, 18)...)
	quiet(t, b.tp.Server, "peer0")
	before, _ := b.shaper.SpoofDrops()
	got0 := rxPackets(t, pod, "net1")
	rx0, _ := nettest.RxBytes(b.tp.Server, "peer0")
	sent, err := nettest.RawSend(b.tp.Server, "peer0", request, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	rx1, _ := nettest.RxBytes(b.tp.Server, "peer0")
	got := rxPackets(t, pod, "net1") - got0
	after, _ := b.shaper.SpoofDrops()
	dropped := after[a.mac][bpf.SpoofSrcMAC] - before[a.mac][bpf.SpoofSrcMAC]
	t.Logf("%d ARP requests for %s, %d delivered to the pod: the server received %d bytes back; the pod's kernel's replies dropped as the share's: %d", sent, stolen, got, rx1-rx0, dropped)
	if rx1-rx0 > 1000 {
		t.Errorf("the pod's kernel's ARP replies from its changed MAC reached the server: %d bytes", rx1-rx0)
	}
	out, _ := b.tp.Exec("srv", "ip", "neigh", "show", stolen).CombinedOutput()
	if strings.Contains(string(out), changed.String()) {
		t.Errorf("the server learned the pod's changed MAC for %s: %s", stolen, out)
	}
	// The pod's kernel answers the requests delivered to it; how many
	// are delivered depends on the machine's load (a macvlan queues
	// broadcasts, and drops past its queue), so the replies counted
	// under the share are checked against those, not the requests sent.
	// A TCX drop is counted on no device, so the replies themselves
	// cannot be counted on net1.
	if got < 100 || dropped+10 < got {
		t.Errorf("%d of %d requests delivered to the pod; %d of its kernel's replies counted as dropped under the share", got, sent, dropped)
	}
	// The interface gone (its pod's namespace with it, say), the guard's
	// link says so: `carve shares` reports the share not enforced.
	if err := pod.LinkDel(net1); err != nil {
		t.Fatal(err)
	}
	if st, err := bpf.PodGuardState(b.pinDir, a.spec.HostName); err != nil || st != bpf.PodGuardDetached && !noTCX {
		t.Errorf("the pod guard of a deleted interface: %q, %v; want detached", st, err)
	}
}

// rxPackets is a link's received packets, in the namespace of h.
func rxPackets(t *testing.T, h *netlink.Handle, name string) uint64 {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil || l.Attrs().Statistics == nil {
		t.Fatalf("statistics of %s: %v", name, err)
	}
	return l.Attrs().Statistics.RxPackets
}
