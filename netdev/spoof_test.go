package netdev_test

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
)

// A pod cannot leave its egress share by what it puts in a frame: raw
// frames with a foreign source MAC (CAP_NET_RAW, which pods have by
// default) and traffic after changing its interface's MAC (CAP_NET_ADMIN)
// are both held to its share, and are not charged to the neighbour whose
// MAC was forged.
func TestSpoofedSourceStaysInItsShare(t *testing.T) {
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
	limit := rate("20M")

	// rxRate is what the server received while fn ran, in bit/s.
	rxRate := func(fn func()) float64 {
		t.Helper()
		before, err := nettest.RxBytes(b.tp.Server, "peer0")
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		fn()
		time.Sleep(100 * time.Millisecond) // what is queued drains
		after, _ := nettest.RxBytes(b.tp.Server, "peer0")
		return float64(after-before) * 8 / time.Since(t0).Seconds()
	}
	neighbourMAC, _ := net.ParseMAC(n.mac)
	for _, c := range []struct {
		name string
		src  net.HardwareAddr
	}{
		{"a MAC of no share", net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}},
		{"the neighbour's MAC", neighbourMAC},
	} {
		before, _ := b.shaper.Stats()
		var sent int
		got := rxRate(func() {
			sent, err = nettest.RawFlood(a.pod, "net1", c.src, srvMAC, net.ParseIP(a.ip), net.ParseIP(b.tp.ServerIP), 1400, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
		})
		after, _ := b.shaper.Stats()
		charged := after[egressKey(n.mac)].Bytes - before[egressKey(n.mac)].Bytes
		t.Logf("raw frames from %s: %d sent, server got %.1f Mbit/s (share 20M); neighbour charged %d bytes", c.name, sent, got/1e6, charged)
		if got > 1.2*limit {
			t.Errorf("raw frames with %s: %.1f Mbit/s left the node, over the 20M share", c.name, got/1e6)
		}
		if charged > 100_000 {
			t.Errorf("raw frames with %s: %d bytes charged to the neighbour's share", c.name, charged)
		}
	}

	// NET_ADMIN: the pod changes its interface's MAC, then sends TCP.
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
	if goodput[0] > 1.1*limit {
		t.Errorf("after changing its MAC the pod sent %.1f Mbit/s, over its 20M share", goodput[0]/1e6)
	}
	// Towards it too: the server learns the new MAC by ARP, the pod's
	// answer teaches the classifier, and its ingress class holds.
	if err := b.tp.Exec("srv", "ip", "neigh", "flush", "all").Run(); err != nil {
		t.Fatal(err)
	}
	goodput, _ = b.measure(bpf.Ingress, []*share{a}, 2*time.Second)
	t.Logf("towards it after changing its MAC: %.1f Mbit/s of TCP (share 20M)", goodput[0]/1e6)
	if goodput[0] > 1.1*limit {
		t.Errorf("after changing its MAC the pod received %.1f Mbit/s, over its 20M share", goodput[0]/1e6)
	}
	if learned, _ := b.shaper.Learned(); learned["02:ba:d0:00:00:02"] != a.mac {
		t.Errorf("learned MACs %v: want 02:ba:d0:00:00:02 for the share %s", learned, a.mac)
	}
}

func egressKey(mac string) bpf.Key { return bpf.Key{MAC: mac, Dir: bpf.Egress} }
