package netdev_test

import (
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-dra/carve/bpf"
	"github.com/carve-dra/carve/bpf/nettest"
	"github.com/carve-dra/carve/netdev"
	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// With netdev.unsharedFloorPercent, the node's own traffic on a NIC takes a
// class of its own beside the shares, assured its part of the link: a share
// borrowing the link and the node's bulk TCP on the same parent, both
// saturated, each keep their floors (300M and 5% of the 1G link) and share
// the link between them by their floors, each way; without a share sending, the node's
// traffic has the whole link. On this bench the "link" (a veth) would carry
// many times 1G: the link class is what makes it one, so the test shows
// the node's traffic inside carve's hierarchy, not a wire's contention.
func TestUnsharedTrafficHasItsClass(t *testing.T) {
	b := newBench(t)
	// What slices publishes for a 1G link with 5% for unshared traffic:
	// the link class takes it back to 1G.
	b.dev.Device = linkCapacity("950M")
	b.p = b.preparerConfig("test", b.tp.Subnet, b.tp.ServerIP, "boot-test", "  unsharedFloorPercent: 5\n")
	const met = limitMet
	borrower := b.add("borrower", "300M", "300M", &v1alpha1.NetworkConfig{Pools: []string{"test"}, MaxCeiling: "link"})
	// The node's own address on the parent.
	node, err := netlink.NewHandleAt(b.tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	parent, _ := node.LinkByName(b.tp.Parent)
	addNoDAD(t, node, parent, "10.77.0.254/24")
	shaper := netdev.EgressShaperName(parent.Attrs().Index)
	const link = 1e9
	for _, dir := range []bpf.Direction{bpf.Egress, bpf.Ingress} {
		if c, err := b.shaper.UnsharedClass(parent.Attrs().Index, dir); err != nil || c != netlink.MakeHandle(1, 2) {
			t.Errorf("%s: the parent's unshared class %#x, %v; want 1:2", dir, c, err)
		}
		hostFlow := nettest.Flow{From: b.tp.Node, To: b.tp.Server, ToAddr: net.JoinHostPort(b.tp.ServerIP, "5331")}
		shareFlow := nettest.Flow{From: borrower.pod, To: b.tp.Server, ToAddr: net.JoinHostPort(b.tp.ServerIP, "5332")}
		if dir == bpf.Ingress {
			hostFlow = nettest.Flow{From: b.tp.Server, To: b.tp.Node, ToAddr: "10.77.0.254:5331"}
			shareFlow = nettest.Flow{From: b.tp.Server, To: borrower.pod, ToAddr: net.JoinHostPort(borrower.ip, "5332")}
		}
		alone, err := nettest.RunFlows([]nettest.Flow{hostFlow}, time.Second, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := nettest.RunFlows([]nettest.Flow{hostFlow, shareFlow}, 2*time.Second, 3*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Goodput: 0.956 of L2 at the limit (limitMet).
		host, share := res[0].Goodput()/met, res[1].Goodput()/met
		t.Logf("%s: the node's TCP alone %.1f Mbit/s at L2; beside a borrowing share (floor 300M, ceiling the 1G link): node %.1f, share %.1f, together %.3f of the link",
			dir, alone[0].Goodput()/met/1e6, host/1e6, share/1e6, (host+share)/link)
		if a := alone[0].Goodput() / met; a < 0.95*link || a > 1.01*link {
			t.Errorf("%s: the node's traffic alone %.1f Mbit/s at L2, want the link (1G)", dir, a/1e6)
		}
		if share < 0.99*300e6 || host < 0.99*50e6 {
			t.Errorf("%s: the share %.1f and the node %.1f Mbit/s, want at least their floors, 300M and 50M", dir, share/1e6, host/1e6)
		}
		if sum := host + share; sum < 0.95*link || sum > 1.01*link {
			t.Errorf("%s: together %.3f of the link, want 0.95–1.01", dir, sum/link)
		}
		// The node's class borrows as a share does: the excess over the
		// floors splits by them, 50:300 (excess.go).
		if r := (host - 50e6) / (share - 300e6); r < 0.9/6 || r > 1.1/6 {
			t.Errorf("%s: the excess split %.3f between the node and the share, want their floors' 0.167 within 10%%", dir, r)
		}
	}
	out, _ := b.tp.Exec("node", "tc", "-s", "class", "show", "dev", shaper, "classid", "1:2").CombinedOutput()
	t.Logf("the egress shaper's unshared class:\n%s", out)
}
