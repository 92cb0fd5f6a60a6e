package netdev_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf/nettest"
)

// Only traffic towards a share takes the parent's IFB; the node's own
// traffic on the same parent does not queue behind it.
func TestOnlyShareTrafficTakesTheIFB(t *testing.T) {
	b := newBench(t)
	s := b.add("ifb", "", "100M", nil)
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	addr, _ := netlink.ParseAddr("10.77.0.250/24") // the node's own address
	if err := node.AddrAdd(parent, addr); err != nil {
		t.Fatal(err)
	}
	// What the IFB's HTB has sent, from its qdisc's counters.
	ifbPackets := func() uint64 {
		t.Helper()
		ifb, err := node.LinkByName(fmt.Sprintf("cvifb%d", parent.Attrs().Index))
		if err != nil {
			t.Fatal(err)
		}
		qs, err := node.QdiscList(ifb)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Type() == "htb" && q.Attrs().Statistics != nil && q.Attrs().Statistics.Basic != nil {
				return uint64(q.Attrs().Statistics.Basic.Packets)
			}
		}
		t.Fatalf("no HTB with counters on the IFB: %v", qs)
		return 0
	}
	send := func(to string) {
		t.Helper()
		err := nettest.In(b.tp.Server, func() error {
			c, err := net.ListenPacket("udp", ":0")
			if err != nil {
				return err
			}
			defer c.Close()
			dst := &net.UDPAddr{IP: net.ParseIP(to), Port: 9}
			for range 100 {
				if _, err := c.WriteTo([]byte("carve"), dst); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if nettest.LacksTCX(t) {
		t.Skip("kernel lacks TCX: before 6.6 act_mirred takes all of the parent's ingress to the IFB (an IFB drops BPF-redirected frames before 6.4)")
	}
	before := ifbPackets()
	send("10.77.0.250")
	if n := ifbPackets() - before; n > 10 { // ARP and the like may pass
		t.Errorf("%d of 100 frames to the node itself went through the IFB", n)
	}
	before = ifbPackets()
	send(s.ip)
	if n := ifbPackets() - before; n < 100 {
		t.Errorf("only %d of 100 frames to the share went through the IFB", n)
	}
}
