package netdev_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// A share on VLAN 100 of a trunk (the parent; the server's end carries
// VLANs 100 and 200) is held to its rate both ways, and its frames leave
// tagged 100 and nothing else; what its pod sends tagged 200, in-band on
// its interface or through a VLAN device it makes there, is dropped and
// counted, so the server on VLAN 200 receives nothing. It needs 802.1Q,
// which the project's kernel lacks: make vmtest runs it on 6.12 and 6.1.
func TestVLANShareStaysOnItsVLAN(t *testing.T) {
	b := newBench(t)
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
	for _, vid := range []int{100, 200} {
		la := netlink.NewLinkAttrs()
		la.Name, la.ParentIndex = fmt.Sprintf("peer0.%d", vid), peer.Attrs().Index
		nettest.SkipIfLacks(t, srv.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: vid}), nettest.LinkKind("vlan"))
		l, _ := srv.LinkByName(la.Name)
		addr, _ := netlink.ParseAddr(fmt.Sprintf("10.%d.0.1/24", vid))
		if err := srv.AddrAdd(l, addr); err != nil {
			t.Fatal(err)
		}
		if err := srv.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	b.p = b.preparerFrom("apiVersion: carve.dev/v1alpha1\nkind: NodeConfig\nnetdev:\n  pools:\n"+
		"  - {name: v100, cidr: 10.100.0.0/24, gateway: 10.100.0.1, parent: "+b.tp.Parent+", vlan: 100}\n", "boot-test")
	a := b.add("tagged", "20M", "20M", &v1alpha1.NetworkConfig{VLAN: 100, Pools: []string{"v100"}})

	// rx is the server's received packets on its untagged end and on
	// each VLAN.
	rx := func() (all, v100, v200 uint64) {
		t.Helper()
		get := func(name string) uint64 {
			l, err := srv.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			return l.Attrs().Statistics.RxPackets
		}
		return get("peer0"), get("peer0.100"), get("peer0.200")
	}

	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		flow := nettest.Flow{From: a.pod, To: b.tp.Server, ToAddr: "10.100.0.1:5201"}
		if dir == bpf.Ingress {
			flow = nettest.Flow{From: b.tp.Server, To: a.pod, ToAddr: a.ip + ":5201"}
		}
		all0, tagged0, other0 := rx()
		res, err := nettest.RunFlows([]nettest.Flow{flow}, time.Second, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The flow's last frames (ACKs, FINs) may still be crossing
		// when the counters are read, one link after the other: read
		// until two reads agree, so that peer0's count is not taken
		// before its VLAN's (it read 695 against 699 tagged once).
		all, tagged, other := rx()
		for i := 0; i < 20; i++ {
			time.Sleep(50 * time.Millisecond)
			a2, t2, o2 := rx()
			if a2 == all && t2 == tagged && o2 == other {
				break
			}
			all, tagged, other = a2, t2, o2
		}
		ratio := res[0].Goodput() / rate("20M")
		t.Logf("%s of a 20M share on VLAN 100: goodput ratio %.3f; the server got %d packets, %d tagged 100, %d tagged 200",
			dir, ratio, all-all0, tagged-tagged0, other-other0)
		if lo, hi := nettest.GoodputBand(0.956*0.9, 0.956*1.1); ratio < lo || ratio > hi {
			t.Errorf("%s of a 20M share on VLAN 100: goodput ratio %.3f, want %.3f–%.3f", dir, ratio, lo, hi)
		}
		// A few of the node's own untagged frames (IPv6 router and
		// listener reports) may cross; the flow's were hundreds (GRO
		// super-packets: 722–847 in the 6.12 guest).
		if untagged := int64(all-all0) - int64(tagged-tagged0); tagged-tagged0 < 100 || untagged > 20 || untagged < 0 {
			t.Errorf("%s: the server got %d packets tagged 100 and %d others: the share's frames must leave tagged 100", dir, tagged-tagged0, untagged)
		}
		if other != other0 {
			t.Errorf("%s: the server's VLAN 200 received %d packets", dir, other-other0)
		}
	}

	shareMAC, _ := net.ParseMAC(a.mac)
	vlanDrops := func() uint64 {
		d, err := b.shaper.SpoofDrops()
		if err != nil {
			t.Fatal(err)
		}
		return d[a.mac][bpf.SpoofVLAN]
	}
	_, _, other0 := rx()

	// In-band: a frame the pod writes with a 200 tag of its own.
	before := vlanDrops()
	frame := nettest.Tagged(nettest.UDPFrame(shareMAC, srvMAC, net.ParseIP(a.ip), net.ParseIP("10.200.0.1"), 1400), 200)
	sent, err := nettest.RawSend(a.pod, "net1", frame, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	inBand := vlanDrops() - before
	t.Logf("in-band tag 200: %d sent past the guard, %d dropped as vlan-tag", sent, inBand)
	if inBand < 100 || sent > 10 {
		t.Errorf("in-band tag 200: %d frames sent past the guard, %d counted as vlan-tag drops", sent, inBand)
	}

	// Through a VLAN device the pod makes on its interface (NET_ADMIN),
	// with the server's MAC known so that UDP is sent, not only ARP.
	pod, err := netlink.NewHandleAt(a.pod)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	net1, err := pod.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "net1.200", net1.Attrs().Index
	if err := pod.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: 200}); err != nil {
		t.Fatalf("a VLAN device in the pod: %v", err)
	}
	sub, _ := pod.LinkByName("net1.200")
	addr, _ := netlink.ParseAddr("10.200.0.50/24")
	if err := pod.AddrAdd(sub, addr); err != nil {
		t.Fatal(err)
	}
	if err := pod.LinkSetUp(sub); err != nil {
		t.Fatal(err)
	}
	if err := pod.NeighAdd(&netlink.Neigh{LinkIndex: sub.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP("10.200.0.1"), HardwareAddr: srvMAC}); err != nil {
		t.Fatal(err)
	}
	before = vlanDrops()
	var written int
	err = nettest.In(a.pod, func() error {
		c, err := net.Dial("udp4", "10.200.0.1:9")
		if err != nil {
			return err
		}
		defer c.Close()
		payload := make([]byte, 1000)
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			if _, err := c.Write(payload); err == nil {
				written++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	viaDevice := vlanDrops() - before
	t.Logf("through the pod's net1.200: %d datagrams written, %d frames dropped as vlan-tag", written, viaDevice)
	if viaDevice < 100 {
		t.Errorf("through the pod's net1.200: %d datagrams written, only %d counted as vlan-tag drops", written, viaDevice)
	}
	time.Sleep(100 * time.Millisecond) // what is queued drains
	if _, _, other := rx(); other != other0 {
		t.Errorf("the server's VLAN 200 received %d packets from the pod's tagged frames", other-other0)
	}
}
