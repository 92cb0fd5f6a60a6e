package netdev_test

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// What a DeviceClass opens reaches the wire, through the real Prepare and
// hook, and only for its own shares: a pod of the default class sends PTP
// (0x88F7) frames and IPv6 router advertisements and none reach the
// server; a pod of a class with ethertypes [0x88F7] and
// allowRouterAdvertisements sends the same and they do, while its other
// unknown ethertype (0x88B5) is still dropped.
func TestClassPolicyOnTheWire(t *testing.T) {
	b := newBench(t)
	closed := b.add("closed", "20M", "20M", nil)
	opened := b.add("opened", "20M", "20M", &v1alpha1.NetworkConfig{Pools: []string{"test"},
		Ethertypes: []string{"0x88F7"}, AllowRouterAdvertisements: true})
	srv, err := netlink.NewHandleAt(b.tp.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, err := srv.LinkByName("peer0")
	if err != nil {
		t.Fatal(err)
	}
	srvMAC := peer.Attrs().HardwareAddr
	for _, s := range []*share{closed, opened} {
		mac, _ := net.ParseMAC(s.mac)
		for _, c := range []struct {
			name   string
			frame  []byte
			reason bpf.SpoofReason
			opens  bool // the opened class lets it through
		}{
			{"PTP (0x88F7)", rawFrame(srvMAC, mac, 0x88f7), bpf.SpoofEthertype, true},
			{"0x88B5", rawFrame(srvMAC, mac, 0x88b5), bpf.SpoofEthertype, false},
			{"a router advertisement", routerAdvertisement(mac), bpf.SpoofRouter, true},
		} {
			quiet(t, b.tp.Server, "peer0")
			before, _ := nettest.RxBytes(b.tp.Server, "peer0")
			dropsBefore, _ := b.shaper.SpoofDrops()
			sent, err := nettest.RawSend(s.pod, "net1", c.frame, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			after, _ := nettest.RxBytes(b.tp.Server, "peer0")
			drops, _ := b.shaper.SpoofDrops()
			got, dropped := after-before, drops[s.mac][c.reason]-dropsBefore[s.mac][c.reason]
			t.Logf("%s sends %s: %d sent, %d dropped as %v, the server got %d bytes", s.alloc.ClaimName, c.name, sent, dropped, c.reason, got)
			if s == opened && c.opens {
				if sent < 100 || got < uint64(sent)*uint64(len(c.frame))/2 || dropped != 0 {
					t.Errorf("%s, %s: %d sent, %d bytes at the server, %d dropped; want them through", s.alloc.ClaimName, c.name, sent, got, dropped)
				}
				continue
			}
			if got > 4096 || dropped < 100 {
				t.Errorf("%s, %s: %d bytes at the server, %d dropped as %v; want none through", s.alloc.ClaimName, c.name, got, dropped, c.reason)
			}
		}
	}
}

// rawFrame is a minimum-size frame of ethertype proto.
func rawFrame(dst, src net.HardwareAddr, proto uint16) []byte {
	f := make([]byte, 60)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], proto)
	return f
}

// routerAdvertisement is an IPv6 router advertisement from mac's own
// link-local address to all nodes, with a source link-layer option of mac.
func routerAdvertisement(mac net.HardwareAddr) []byte {
	f := make([]byte, 14+40+16+8)
	copy(f, []byte{0x33, 0x33, 0, 0, 0, 1})
	copy(f[6:], mac)
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], 16+8)
	ip[6], ip[7] = 58, 255
	copy(ip[8:], []byte{0xfe, 0x80, 8: mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
	copy(ip[24:], []byte{0xff, 0x02, 15: 1})
	ra := ip[40:]
	ra[0] = 134
	ra[4] = 64                            // hop limit
	binary.BigEndian.PutUint16(ra[6:], 0) // not a default router
	ra[16], ra[17] = 1, 1                 // source link-layer address
	copy(ra[18:], mac)
	return f
}
